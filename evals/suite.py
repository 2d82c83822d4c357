"""The evaluation suite run on every checkpoint (PROTOCOL.md §4), micro scale:

- in-distribution accuracy: one sample per test prompt at τ = ``id_temperature``
  on the first ``id_items`` Countdown-3 test items, and the same on Countdown-4E
  (harder-task generalisation, same checkpoint, no further training), Countdown-4
  when listed, the multiple-choice task (``mcq_items`` > 0; task ``mcq``) and the
  long-reasoning math task (``math_items`` > 0; task ``math``, the last ``\\boxed{}``
  checked by `distillab.math_task.score_math`);
- coverage: pass@1 and pass@k from ``pass_n`` samples per prompt at the task's
  ``pass_temperature`` (unbiased estimator, `distillab.evals.metrics.pass_at_k`);
- style (teacher conditioning, ``evaluation.style``): ``style_share`` of the first
  Countdown task's answers (`distillab.evals.style`);
- OOD suite (`distillab.evals.ood`): the micro prior-skill tasks or, at full scale,
  lm-eval-harness tasks, and their unweighted mean (``ood_mean``; forgetting =
  after − before).

Each result is a row ``{task, metric, value, n}`` for the `evals` table; its
report key is ``eval/<stage>/<task>/<metric>`` (`distillab.registry`). Test splits
come from `distillab.tasks.TaskData` (seeded by ``tasks.test_seed``, the same for
every trial; training prompts exclude them); the sampling seeds from
``trial.seeds`` (`config.SeedsConfig`).
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from distillab.config import EvaluationConfig, SeedsConfig, TasksConfig, TrialConfig, cache_key, checkpoint_identity
from distillab.evals.metrics import mean_pass_at_k, update_sparsity
from distillab.evals.ood import ood_backend
from distillab.evals.style import style_share
from distillab.math_task import math_prompt_ids, score_math
from distillab.mcq import mcq_prompt_ids, score_mcq
from distillab.registry import eval_key
from distillab.results import atomic_write_bytes, write_rows
from distillab.rollout import SamplingParams, TransformersEngine
from distillab.tasks import CountdownProblem, TaskData, countdown_prompt_ids, score_countdown

log = logging.getLogger(__name__)


@dataclass
class Evaluator:
    """Scores a model on the suite. ``batch_size`` is prompts × samples per generate
    call; ``ood`` is the OOD backend (default: the one ``cfg.ood_backend`` names);
    ``seeds``: the trial's `config.SeedsConfig` (the evaluation's seed offsets)."""

    tokenizer: PreTrainedTokenizerBase
    tasks: TasksConfig
    cfg: EvaluationConfig
    batch_size: int = 512
    ood: Any = field(default=None)
    seeds: SeedsConfig = SeedsConfig()

    def __post_init__(self) -> None:
        if self.ood is None:
            self.ood = ood_backend(self.tasks, self.cfg, self.batch_size, seeds=self.seeds)
        self.data = TaskData(self.tasks, self.cfg, seeds=self.seeds)

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
        n_acc = {"mcq": cfg.mcq_items, "math": cfg.math_items}.get(name, cfg.id_items)
        sp = SamplingParams(cfg.id_temperature, cfg.top_p, cfg.max_tokens, 1, seed)
        correct, completions = self._correct(engine, prompts[:n_acc], score, sp)
        rows = [{"task": name, "metric": "accuracy", "value": sum(correct) / len(correct), "n": len(correct)}]
        sp = SamplingParams(cfg.pass_temperature.get(name, 1.0), cfg.top_p, cfg.max_tokens, cfg.pass_n,
                            seed + self.seeds.eval_pass)
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
            problems = self.data.test_split(name)
            task_rows, completions = self._accuracy_and_pass(
                engine, name, self._prompts(problems), lambda t, j, ps=problems: score_countdown(t, ps[j]),
                seed + self.seeds.eval_task * i)
            rows += task_rows
            if cfg.style is not None and i == 0:  # teacher conditioning: the student's answers in the teacher's style
                texts = tok.batch_decode(completions, skip_special_tokens=True)
                rows.append({"task": name, "metric": "style_share", "value": style_share(texts, cfg.style),
                             "n": len(texts)})
        if cfg.mcq_items:  # the second domain (tasks.mcq)
            items = self.data.test_split("mcq")
            prompts = [mcq_prompt_ids(tok, self.tasks.mcq, it) for it in items]
            task_rows, _ = self._accuracy_and_pass(engine, "mcq", prompts, lambda t, j: score_mcq(t, items[j]),
                                                   seed + self.seeds.eval_mcq)
            rows += task_rows
        if cfg.math_items:  # the long-reasoning domain (tasks.math)
            problems = self.data.test_split("math")
            prompts = [math_prompt_ids(tok, self.tasks.math, it) for it in problems]
            task_rows, _ = self._accuracy_and_pass(engine, "math", prompts, lambda t, j: score_math(t, problems[j]),
                                                   seed + self.seeds.eval_mcq)
            rows += task_rows
        rows += self.ood.evaluate(model, tok, seed)
        return rows


def sparsity_rows(initial: dict, final: dict, taus) -> list[dict]:
    """Update sparsity S_τ (PROTOCOL.md §4; `evals.metrics.update_sparsity`) at each
    threshold τ of ``taus``: a row over all parameters (task ``params``, ``n`` = tensors)
    and one per tensor (task ``params/<tensor name>``, ``n`` = its elements; empty
    tensors skipped), metric ``sparsity@<τ>``."""
    rows = []
    for tau in taus:
        overall, per_tensor = update_sparsity(initial, final, tau)
        rows.append({"task": "params", "metric": f"sparsity@{tau:g}", "value": overall, "n": len(final)})
        rows += [{"task": f"params/{name}", "metric": f"sparsity@{tau:g}", "value": v, "n": final[name].numel()}
                 for name, v in per_tensor.items() if not math.isnan(v)]
    return rows


def pre_eval_path(cache_dir: str | Path, trial: TrialConfig, student_path: str | Path) -> Path:
    """Where the evaluation of the untrained student is kept: it depends only on the
    student checkpoint, the evaluation and task settings and the seeds, so every trial
    of a sweep that shares those reuses it (``<cache_dir>/pre-eval-<config.cache_key>.json``)."""
    key = cache_key("pre_eval", 2, student=checkpoint_identity(student_path),
                    evaluation=trial.evaluation.model_dump(mode="json"),
                    tasks=trial.tasks.inputs(teacher=False, mcq=trial.evaluation.mcq_items > 0,
                                             math=trial.evaluation.math_items > 0),
                    seed=trial.seed, seeds=trial.seeds.model_dump())
    return Path(cache_dir) / f"pre-eval-{key}.json"


def evaluate_stage(evaluator: Evaluator, model, trial: TrialConfig, trial_id: str, stage: str, step: int, root: Path,
                   init_state: dict | None = None, cache: Path | None = None) -> dict[str, float]:
    """The evaluation of one stage of a trial: the suite (`Evaluator.evaluate`, seeded by
    ``trial.seed``; read from ``cache`` when that file exists, else written there), and
    with ``init_state`` the update sparsity against it (`sparsity_rows`), written to the
    ``evals`` table (key ``<trial_id>__<stage>__<step>``). Returns the rows as report
    keys: ``{eval/<stage>/<task>/<metric>: value}``."""
    t0 = time.perf_counter()
    if cache is not None and cache.exists():  # the same model, settings and seed were evaluated already
        rows = json.loads(cache.read_text())
    else:
        rows = evaluator.evaluate(model, seed=trial.seed)
        if cache is not None:
            atomic_write_bytes(cache, json.dumps(rows).encode())
    if init_state is not None:
        final = {k: v.detach().float() for k, v in model.state_dict().items()}
        rows += sparsity_rows(init_state, final, trial.evaluation.sparsity_taus)
    for r in rows:
        r.update(trial_id=trial_id, stage=stage, step=step)
    write_rows(root, "evals", rows, key=f"{trial_id}__{stage}__{step}")
    log.info("%s eval %s step %d in %.1f s", trial_id, stage, step, time.perf_counter() - t0)
    return {eval_key(stage, r["task"], r["metric"]): r["value"] for r in rows}
