"""The evaluation suite run on every checkpoint (PROTOCOL.md §4), micro scale:

- in-distribution accuracy: one sample per test prompt at τ = ``id_temperature``
  on the first ``id_items`` Countdown-3 test items, and the same on Countdown-4E
  (harder-task generalisation, same checkpoint, no further training), Countdown-4
  when listed, and the multiple-choice task (``mcq_items`` > 0; task ``mcq``);
- coverage: pass@1 and pass@k from ``pass_n`` samples per prompt at the task's
  ``pass_temperature`` (unbiased estimator, `distillab.evals.metrics.pass_at_k`);
- style (teacher conditioning, ``evaluation.style``): ``style_share`` of the first
  Countdown task's answers (`distillab.evals.style`);
- OOD suite (`distillab.evals.ood`): the micro prior-skill tasks or, at full scale,
  lm-eval-harness tasks, and their unweighted mean (``ood_mean``; forgetting =
  after − before).

Each result is a row ``{task, metric, value, n}`` for the `evals` table.
Test splits come from ``tasks.test_seed``, the same for every trial; training
prompts are drawn from other seeds and exclude the test items.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from distillab.config import EvaluationConfig, TasksConfig
from distillab.evals.metrics import mean_pass_at_k
from distillab.evals.ood import ood_backend
from distillab.evals.style import style_share
from distillab.mcq import mcq_prompt_ids, mcq_test_split, score_mcq
from distillab.rollout import SamplingParams, TransformersEngine
from distillab.tasks import (
    CountdownProblem,
    CountdownSpec,
    countdown_user_text,
    generate_problems,
    render_prompt,
    score_countdown,
)

EVAL_TASKS = ("countdown3", "countdown4e")


def countdown_spec(tasks: TasksConfig, name: str) -> CountdownSpec:
    """The `CountdownSpec` of task ``name`` in ``tasks``."""
    c = getattr(tasks, name)
    return CountdownSpec(name, tuple(c.pool), c.n_operands, c.target_min, c.target_max)


def countdown_test_split(tasks: TasksConfig, name: str, n: int) -> list[CountdownProblem]:
    """The fixed test split of a Countdown task (seeded by ``tasks.test_seed``)."""
    offset = {"countdown3": 0, "countdown4e": 1}.get(name, 7)
    return generate_problems(countdown_spec(tasks, name), n, tasks.test_seed + offset)


def problem_key(problem: CountdownProblem) -> tuple[tuple[int, ...], int]:
    """(sorted operands, target): the identity of a Countdown instance (a multiset and a target)."""
    return tuple(sorted(problem.operands)), problem.target


def test_keys(tasks: TasksConfig, n: int, names: tuple[str, ...] = EVAL_TASKS) -> set[tuple[tuple[int, ...], int]]:
    """`problem_key` of every test item of the tasks ``names``, to keep them out of training."""
    return {problem_key(p) for name in names for p in countdown_test_split(tasks, name, n)}


def countdown_prompt_ids(tokenizer: PreTrainedTokenizerBase, tasks: TasksConfig, problem: CountdownProblem,
                         role: str = "student") -> list[int]:
    """Prompt token ids of a Countdown problem: the task's system prompt and user
    template, rendered with the tokenizer's chat template. ``role="teacher"`` uses
    the teacher's conditioning (``tasks.teacher_system_prompt`` /
    ``teacher_user_template``) where set.

    Raises:
        ValueError: ``role`` not "student" or "teacher".
    """
    if role not in ("student", "teacher"):
        raise ValueError(f"role must be 'student' or 'teacher', got {role!r}")
    system, template = tasks.system_prompt, tasks.user_template
    if role == "teacher":
        system = tasks.teacher_system_prompt if tasks.teacher_system_prompt is not None else system
        template = tasks.teacher_user_template if tasks.teacher_user_template is not None else template
    return render_prompt(tokenizer, system, countdown_user_text(problem, template, tasks.sort_operands))


@dataclass
class Evaluator:
    """Scores a model on the suite. ``batch_size`` is prompts × samples per generate
    call; ``ood`` is the OOD backend (default: the one ``cfg.ood_backend`` names)."""

    tokenizer: PreTrainedTokenizerBase
    tasks: TasksConfig
    cfg: EvaluationConfig
    batch_size: int = 512
    ood: Any = field(default=None)

    def __post_init__(self) -> None:
        if self.ood is None:
            self.ood = ood_backend(self.tasks, self.cfg, self.batch_size)

    def _prompts(self, problems: list[CountdownProblem]) -> list[list[int]]:
        return [countdown_prompt_ids(self.tokenizer, self.tasks, p) for p in problems]

    def _correct(self, engine: TransformersEngine, prompts: list[list[int]], score, sampling: SamplingParams
                 ) -> tuple[list[int], list[list[int]]]:
        """Correct samples per prompt (``score(text, i)`` for prompt i), and the completion ids."""
        roll = engine.generate(prompts, sampling)
        texts = self.tokenizer.batch_decode(roll.completion_ids, skip_special_tokens=False)
        counts = [0] * len(prompts)
        for k, text in enumerate(texts):
            counts[k // sampling.n] += int(score(text, k // sampling.n))
        return counts, roll.completion_ids

    def _accuracy_and_pass(self, engine, name: str, prompts: list[list[int]], score, seed: int
                           ) -> tuple[list[dict], list[list[int]]]:
        """Rows ``accuracy`` (one sample at ``id_temperature`` on the first ``id_items``
        prompts, or ``mcq_items`` for ``mcq``) and ``pass@k`` (``pass_n`` samples at the
        task's ``pass_temperature`` on the first ``pass_items``); and the accuracy
        samples' completion ids."""
        cfg = self.cfg
        n_acc = cfg.mcq_items if name == "mcq" else cfg.id_items
        sp = SamplingParams(cfg.id_temperature, cfg.top_p, cfg.max_tokens, 1, seed)
        correct, completions = self._correct(engine, prompts[:n_acc], score, sp)
        rows = [{"task": name, "metric": "accuracy", "value": sum(correct) / len(correct), "n": len(correct)}]
        sp = SamplingParams(cfg.pass_temperature.get(name, 1.0), cfg.top_p, cfg.max_tokens, cfg.pass_n, seed + 1)
        counts, _ = self._correct(engine, prompts[: cfg.pass_items], score, sp)
        rows += [{"task": name, "metric": f"pass@{k}", "value": mean_pass_at_k(counts, cfg.pass_n, k),
                  "n": len(counts)} for k in cfg.pass_k]
        return rows, completions

    def evaluate(self, model: PreTrainedModel, seed: int) -> list[dict]:
        """All rows of the suite for ``model`` (sampling seeded by ``seed``)."""
        cfg, tok = self.cfg, self.tokenizer
        engine = TransformersEngine(model, tok.eos_token_id, tok.pad_token_id, batch_size=self.batch_size)
        rows: list[dict] = []
        for i, name in enumerate(cfg.countdown_tasks):
            problems = countdown_test_split(self.tasks, name, max(cfg.id_items, cfg.pass_items))
            task_rows, completions = self._accuracy_and_pass(
                engine, name, self._prompts(problems), lambda t, j, ps=problems: score_countdown(t, ps[j]), seed + 101 * i)
            rows += task_rows
            if cfg.style is not None and i == 0:  # teacher conditioning: the student's answers in the teacher's style
                texts = tok.batch_decode(completions, skip_special_tokens=True)
                rows.append({"task": name, "metric": "style_share", "value": style_share(texts, cfg.style),
                             "n": len(texts)})
        if cfg.mcq_items:  # the second domain (tasks.mcq)
            items = mcq_test_split(self.tasks.mcq, cfg.mcq_test_items, self.tasks.test_seed)
            prompts = [mcq_prompt_ids(tok, self.tasks.mcq, it) for it in items]
            task_rows, _ = self._accuracy_and_pass(engine, "mcq", prompts, lambda t, j: score_mcq(t, items[j]),
                                                   seed + 404)
            rows += task_rows
        rows += self.ood.evaluate(model, tok, seed)
        return rows
