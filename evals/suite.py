"""The evaluation suite run on every checkpoint (PROTOCOL.md §4), micro scale:

- in-distribution accuracy: one sample per test prompt at τ = ``id_temperature``
  on the first ``id_items`` Countdown-3 test items, and the same on Countdown-4E
  (harder-task generalisation, same checkpoint, no further training);
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

    def _countdown_correct(
        self, engine: TransformersEngine, problems: list[CountdownProblem], sampling: SamplingParams
    ) -> tuple[list[int], list[list[int]]]:
        """Correct samples per problem, and the completion ids."""
        roll = engine.generate(self._prompts(problems), sampling)
        texts = self.tokenizer.batch_decode(roll.completion_ids, skip_special_tokens=False)
        counts = [0] * len(problems)
        for k, text in enumerate(texts):
            counts[k // sampling.n] += int(score_countdown(text, problems[k // sampling.n]))
        return counts, roll.completion_ids

    def evaluate(self, model: PreTrainedModel, seed: int) -> list[dict]:
        """All rows of the suite for ``model`` (sampling seeded by ``seed``)."""
        cfg, tok = self.cfg, self.tokenizer
        engine = TransformersEngine(model, tok.eos_token_id, tok.pad_token_id, batch_size=self.batch_size)
        rows: list[dict] = []
        for i, name in enumerate(cfg.countdown_tasks):
            problems = countdown_test_split(self.tasks, name, max(cfg.id_items, cfg.pass_items))
            sp = SamplingParams(cfg.id_temperature, cfg.top_p, cfg.max_tokens, 1, seed + 101 * i)
            correct, completions = self._countdown_correct(engine, problems[: cfg.id_items], sp)
            rows.append({"task": name, "metric": "accuracy", "value": sum(correct) / len(correct), "n": len(correct)})
            if cfg.style is not None and i == 0:  # teacher conditioning: the student's answers in the teacher's style
                texts = tok.batch_decode(completions, skip_special_tokens=True)
                rows.append({"task": name, "metric": "style_share", "value": style_share(texts, cfg.style),
                             "n": len(texts)})
            temp = cfg.pass_temperature.get(name, 1.0)
            sp = SamplingParams(temp, cfg.top_p, cfg.max_tokens, cfg.pass_n, seed + 101 * i + 1)
            counts, _ = self._countdown_correct(engine, problems[: cfg.pass_items], sp)
            for k in cfg.pass_k:
                rows.append(
                    {"task": name, "metric": f"pass@{k}", "value": mean_pass_at_k(counts, cfg.pass_n, k), "n": len(counts)}
                )
        rows += self.ood.evaluate(model, tok, seed)
        return rows
