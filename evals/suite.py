"""The evaluation suite run on every checkpoint (PROTOCOL.md §4), micro scale. It asks
each task the trial scores (`distillab.tasks.registry.scored`: a `tasks.base.Task` whose
evaluation items are > 0) for its test split, prompts, verifier and `tasks.base.EvalPlan`;
it never branches on a task's name.

- accuracy: one sample per test prompt at the plan's temperature (``id_temperature``) on the
  first ``items`` test items of each task: the Countdown variants of
  ``evaluation.countdown_tasks`` (Countdown-3 in distribution, Countdown-4E the harder-task
  generalisation on the same checkpoint, Countdown-4 when listed), the multiple-choice task
  (``mcq_items`` > 0; task ``mcq``), the long-reasoning math task (``math_items`` > 0; task
  ``math``, the last ``\\boxed{}`` checked by `distillab.tasks.math_task.score_math`) and any
  task a module registered (``evaluation.task_items``);
- coverage: pass@1 and pass@k from ``pass_n`` samples per prompt at the task's
  ``pass_temperature`` (unbiased estimator, `distillab.evals.metrics.pass_at_k`);
- style (teacher conditioning, ``evaluation.style``): ``style_share`` of the first
  task's answers (`distillab.evals.style`);
- OOD suite (`distillab.evals.ood`): the micro prior-skill tasks or, at full scale,
  lm-eval-harness tasks, and their unweighted mean (``ood_mean``; forgetting =
  after − before).

Each result is a row ``{task, metric, value, n}`` for the `evals` table; its
report key is ``eval/<stage>/<task>/<metric>`` (`distillab.registry`). For inspection,
the first `SAMPLES_PER_TASK` accuracy completions of each scored task (not the OOD
suite's), with their prompts and rewards (1 correct, 0 not), go to the ``samples``
table. Test splits come from `distillab.tasks.data.TaskData` (seeded by
``tasks.test_seed``, the same for every trial; training prompts exclude them); the
sampling seeds from ``trial.seeds`` (`config.SeedsConfig`).
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from distillab.config import EvaluationConfig, SeedsConfig, TasksConfig, TrialConfig, cache_key, checkpoint_identity
from distillab.evals.metrics import mean_pass_at_k, parameter_state, update_sparsity
from distillab.evals.ood import ood_backend
from distillab.evals.sampling import Request, sample_batched
from distillab.evals.style import style_share
from distillab.models import DTYPES
from distillab.registry import eval_key
from distillab.rollout.engine import TransformersEngine
from distillab.rollout.types import SamplingParams
from distillab.tables import atomic_write_bytes, write_rows
from distillab.tasks.base import Task
from distillab.tasks.data import TaskData
from distillab.tasks.registry import get, scored
from distillab.tasks.taskio import render

log = logging.getLogger(__name__)

#: how many completions of each task's accuracy request (one per test prompt, in test-split
#: order) an evaluation writes to the ``samples`` table, with their prompts and rewards
SAMPLES_PER_TASK = 8


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

    def requests(self, name: str, prompts: list[list[int]], seed: int) -> list[Request]:
        """Task ``name``'s two sampling requests (`evals.sampling.Request`) from its `tasks.base.EvalPlan`:
        one sample at its ``temperature`` of the first ``items`` prompts, for ``accuracy``;
        ``pass_n`` samples at its ``pass_temperature`` of the first ``pass_items``, for ``pass@k``
        (seed + ``seeds.eval_pass``)."""
        p = get(name).evaluation(self.tasks, self.cfg)
        pass_seed = self.seeds.eval_pass_seed(seed)
        return [(prompts[:p.items], SamplingParams(p.temperature, p.top_p, p.max_tokens, 1, seed)),
                (prompts[: p.pass_items], SamplingParams(p.pass_temperature, p.top_p, p.max_tokens, p.pass_n,
                                                         pass_seed))]

    def samples(self, name: str, prompts: list[list[int]], completions: list[list[int]],
                score: Callable[[str, int], bool]) -> list[dict]:
        """``samples`` rows ``{task, prompt, completion, reward}`` of the first `SAMPLES_PER_TASK`
        prompts of task ``name`` and their completions (ids) of the accuracy request, decoded
        as the scorer reads them (special tokens kept); reward 1.0 where ``score`` says correct."""
        tok, n = self.tokenizer, min(SAMPLES_PER_TASK, len(completions))
        texts = tok.batch_decode(completions[:n], skip_special_tokens=False)
        return [{"task": name, "prompt": tok.decode(prompts[i], skip_special_tokens=False), "completion": t,
                 "reward": float(score(t, i))} for i, t in enumerate(texts)]

    def rows(self, name: str, completions: list[list[list[int]]], score: Callable[[str, int], bool]) -> list[dict]:
        """Rows ``accuracy`` and ``pass@k`` of task ``name`` from the completion ids of its
        two `requests` (``score(text, i)``: is a completion of prompt i correct)."""
        p = get(name).evaluation(self.tasks, self.cfg)
        counts = []
        for comps, n in zip(completions, (1, p.pass_n)):
            texts = self.tokenizer.batch_decode(comps, skip_special_tokens=False)
            counts.append([sum(int(score(texts[i * n + j], i)) for j in range(n)) for i in range(len(texts) // n)])
        acc, passes = counts
        rows = [{"task": name, "metric": "accuracy", "value": sum(acc) / len(acc), "n": len(acc)}]
        return rows + [{"task": name, "metric": f"pass@{k}", "value": mean_pass_at_k(passes, p.pass_n, k),
                        "n": len(passes)} for k in p.pass_k]

    def _tasks(self, seed: int) -> list[tuple[Task, list[list[int]], Callable[[str, int], bool], int]]:
        """``(task, prompts, score, task seed)`` of every task the suite scores (`tasks.registry.scored`:
        the Countdown variants of ``evaluation.countdown_tasks``, then the others in registration
        order), at stage seed ``seed`` (`config.SeedsConfig.eval_task_seed`)."""
        out = []
        for task, index in scored(self.tasks, self.cfg):
            items = self.data.test_split(task.name)
            prompts = [render(self.tokenizer, task.prompt(self.tasks, it)) for it in items]
            out.append((task, prompts, lambda t, j, task=task, items=items: task.score(t, items[j]),
                        self.seeds.eval_task_seed(seed, task.name, index)))
        return out

    def evaluate(self, model: PreTrainedModel, seed: int, samples: list[dict] | None = None) -> list[dict]:
        """All rows of the suite for ``model`` (sampling seeded by ``seed``): every task's
        `requests` sampled together (`evals.sampling.sample_batched`: one call per
        sampling setting), scored (`rows`), then the OOD backend's rows. With a list
        ``samples``, each task's `samples` rows are appended to it."""
        cfg, tok = self.cfg, self.tokenizer
        engine = TransformersEngine(model, tok.eos_token_id, tok.pad_token_id, batch_size=self.batch_size)
        tasks = self._tasks(seed)
        requests = [r for task, prompts, _, task_seed in tasks for r in self.requests(task.name, prompts, task_seed)]
        done = sample_batched(engine, requests)
        rows: list[dict] = []
        for k, (task, prompts, score, _) in enumerate(tasks):
            rows += self.rows(task.name, done[2 * k: 2 * k + 2], score)
            if samples is not None:
                samples += self.samples(task.name, prompts, done[2 * k], score)
            if cfg.style is not None and k == 0:  # teacher conditioning: the student's answers in the teacher's style
                texts = tok.batch_decode(done[0], skip_special_tokens=True)
                rows.append({"task": task.name, "metric": "style_share", "value": style_share(texts, cfg.style),
                             "n": len(texts)})
        rows += self.ood.evaluate(model, tok, seed)
        return rows


def sparsity_rows(initial: dict, final: dict, taus, dtype: torch.dtype | None = None,
                  touched: dict | None = None) -> list[dict]:
    """Update sparsity S_τ (PROTOCOL.md §4; `evals.metrics.update_sparsity`, both weights
    rounded to ``dtype`` first when given) at each threshold τ of ``taus``: a row over
    all parameters (task ``params``, ``n`` = tensors) and one per tensor (task
    ``params/<tensor name>``, ``n`` = its elements; empty tensors skipped), metric
    ``sparsity@<τ>``. With ``touched`` (name → bool mask of the entries that had a
    nonzero gradient in some step, `optim.TouchedParameters`): ``params`` rows
    ``touched_share`` (touched entries / all entries, ``n`` = all entries) and
    ``sparsity_touched@<τ>`` (S_τ over the touched entries only, ``n`` = their count;
    left out when no entry was touched)."""
    rows = []
    for tau in taus:
        overall, per_tensor = update_sparsity(initial, final, tau, dtype=dtype)
        rows.append({"task": "params", "metric": f"sparsity@{tau:g}", "value": overall, "n": len(final)})
        rows += [{"task": f"params/{name}", "metric": f"sparsity@{tau:g}", "value": v, "n": final[name].numel()}
                 for name, v in per_tensor.items() if not math.isnan(v)]
    if touched is not None:
        total = sum(t.numel() for t in final.values())
        n_touched = sum(int(m.sum()) for name, m in touched.items() if name in final)
        rows.append({"task": "params", "metric": "touched_share", "value": n_touched / total, "n": total})
        for tau in taus if n_touched else ():
            overall, _ = update_sparsity(initial, final, tau, dtype=dtype, masks=touched)
            rows.append({"task": "params", "metric": f"sparsity_touched@{tau:g}", "value": overall, "n": n_touched})
    return rows


def pre_eval_path(cache_dir: str | Path, trial: TrialConfig, student_path: str | Path) -> Path:
    """Where the evaluation of the untrained student is kept: it depends only on the
    student checkpoint, the precision and attention implementation it is loaded with,
    the evaluation and task settings and the seeds, so every trial of a sweep that shares
    those reuses it (``<cache_dir>/pre-eval-<config.cache_key>.json``)."""
    uses = [t.name for t, _ in scored(trial.tasks, trial.evaluation)]
    key = cache_key("pre_eval", 4, student=checkpoint_identity(student_path),
                    precision=trial.precision, attn_implementation=trial.attn_implementation,
                    evaluation=trial.evaluation.model_dump(mode="json"),
                    tasks=trial.tasks.inputs(teacher=False, uses=uses), seed=trial.seed, seeds=trial.seeds.model_dump())
    return Path(cache_dir) / f"pre-eval-{key}.json"


def evaluate_stage(evaluator: Evaluator, model, trial: TrialConfig, trial_id: str, stage: str, step: int, root: Path,
                   init_state: dict | None = None, cache: Path | None = None,
                   touched: dict | None = None) -> dict[str, float]:
    """The evaluation of one stage of a trial: the suite (`Evaluator.evaluate`, seeded by
    ``trial.seed``; read from ``cache`` when that file exists, else written there), and
    with ``init_state`` the update sparsity against it at ``evaluation.sparsity_dtype``
    (`sparsity_rows`, with the ``touched`` masks when given), written to the ``evals``
    table, and the suite's `Evaluator.samples` rows to the ``samples`` table (both keyed
    ``<trial_id>__<stage>__<step>``; the cache keeps both). Returns the rows as report keys:
    ``{eval/<stage>/<task>/<metric>: value}``."""
    t0 = time.perf_counter()
    if cache is not None and cache.exists():  # the same model, settings and seed were evaluated already
        rows, samples = (json.loads(cache.read_text())[k] for k in ("rows", "samples"))
    else:
        samples = []
        rows = evaluator.evaluate(model, seed=trial.seed, samples=samples)
        if cache is not None:
            atomic_write_bytes(cache, json.dumps({"rows": rows, "samples": samples}).encode())
    if init_state is not None:
        final = parameter_state(model)
        rows += sparsity_rows(init_state, final, trial.evaluation.sparsity_taus,
                              DTYPES[trial.evaluation.sparsity_dtype], touched)
    for r in rows + samples:
        r.update(trial_id=trial_id, stage=stage, step=step)
    write_rows(root, "evals", rows, key=f"{trial_id}__{stage}__{step}")
    if samples:
        write_rows(root, "samples", samples, key=f"{trial_id}__{stage}__{step}")
    log.info("%s", stage_line(trial_id, stage, step, rows, time.perf_counter() - t0))
    return {eval_key(stage, r["task"], r["metric"]): r["value"] for r in rows}


def stage_line(trial_id: str, stage: str, step: int, rows: list[dict], seconds: float) -> str:
    """The console's one line for a finished stage of a trial: its headline rows (each
    Countdown and multiple-choice task's accuracy, the OOD mean, S_τ at the first τ)
    and the evaluation's seconds, e.g. ``[trial] onpd-forward-lr0.001-s42-0a1b2c3d
    distill step 400: countdown3 acc 0.155, countdown4e acc 0.000, ood_mean 0.005,
    sparsity@1e-06 0.018 (eval 3.2 s)``."""
    head = [f"{r['task']} acc {r['value']:.3f}" for r in rows if r["metric"] == "accuracy" and "/" not in r["task"]]
    head += [f"{r['metric']} {r['value']:.3f}" for r in rows if r["task"] == "ood" and r["metric"] == "ood_mean"]
    head += [f"{r['metric']} {r['value']:.3f}" for r in rows if r["task"] == "params"][:1]
    return f"[trial] {trial_id} {stage} step {step}: {', '.join(head)} (eval {seconds:.1f} s)"
