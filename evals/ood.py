"""The OOD suite (PROTOCOL.md §4, forgetting): one interface, three backends.

- `MicroSkillsBackend` (micro scale): exact-match accuracy on each prior-skill task
  the micro student was trained on before distillation (``tasks.ood_skills``);
- `LMEvalBackend` (full scale): lm-eval-harness tasks (the paper's seven by default,
  `distillab.config.PAPER_OOD_SUITE`), each scored by its standard metric on at most
  ``limit`` items;
- `PretrainedBackend` (a pretrained checkpoint on CPU, offline): the per-token loss and
  next-token accuracy of held-out English prose (`evals.prose`: Python's ``pydoc_data``
  topics, ``evaluation.prose``), then the prior-skill tasks of `MicroSkillsBackend` in the
  model's chat format.

Each returns rows ``{task: "ood/<name>", metric, value, n}`` and a last row
``{task: "ood", metric: "ood_mean"}``: the unweighted mean over the rows whose value is a
score in [0, 1], higher is better (every row but the prose ``loss``, which is in nats and
lower is better: it is reported as its own row, so its own after − before, and left out of
the mean). Forgetting is ``ood_mean`` after minus before (`distillab.registry.forgetting`);
the same difference of any single row is `distillab.analysis.results.stage_delta`.
`ood_backend(trial)` picks the backend from ``evaluation.ood_backend``.
"""

from __future__ import annotations

import os
from typing import Any, Protocol

from distillab.config import EvaluationConfig, LMEvalConfig, LMEvalTask, SeedsConfig, TasksConfig
from distillab.evals.prose import prose_documents, prose_rows
from distillab.evals.sampling import sample_batched
from distillab.rollout.engine import TransformersEngine
from distillab.rollout.types import SamplingParams
from distillab.tasks.countdown import SkillItem
from distillab.tasks.skills import SKILLS_TASK
from distillab.tasks.taskio import render


class OODBackend(Protocol):
    """What the evaluation suite calls at every stage."""

    def evaluate(self, model: Any, tokenizer: Any, seed: int) -> list[dict]:
        """Rows ``{task, metric, value, n}`` per OOD task, then the ``ood_mean`` row."""
        ...


def mean_row(rows: list[dict]) -> dict:
    """The ``ood_mean`` row: the unweighted mean of the per-task ``value`` s.

    Raises:
        ValueError: no rows.
    """
    if not rows:
        raise ValueError("the OOD suite produced no task rows")
    return {"task": "ood", "metric": "ood_mean", "value": sum(r["value"] for r in rows) / len(rows), "n": len(rows)}


def ood_items(tasks: TasksConfig, n: int) -> dict[str, list[SkillItem]]:
    """The micro OOD test items per prior skill (the prior skills' task, `tasks.skills`: ``n`` of each,
    seeded by ``tasks.test_seed``)."""
    items = SKILLS_TASK.test_items(tasks, n)
    return {skill: [it for it in items if it.task == skill] for skill in tasks.ood_skills}


class MicroSkillsBackend:
    """The prior skills' task (`tasks.skills.PriorSkillsTask`: add, mul, reverse, sort),
    ``cfg.ood_items`` items each, one sample at its plan's temperature (``cfg.ood_temperature``),
    scored by its verifier (exact match of the ``<answer>``); the skills are sampled in one call
    seeded with the stage seed + ``seeds.eval_ood_offset`` (skill j's seed would be +
    ``seeds.eval_ood`` · j: `evals.sampling`)."""

    def __init__(self, tasks: TasksConfig, cfg: EvaluationConfig, batch_size: int = 512,
                 seeds: SeedsConfig = SeedsConfig()):
        self.tasks, self.cfg, self.batch_size, self.seeds = tasks, cfg, batch_size, seeds

    def evaluate(self, model: Any, tokenizer: Any, seed: int) -> list[dict]:
        """Rows per skill and ``ood_mean``; the skills' prompts are sampled together
        (`evals.sampling.sample_batched`: one call, seeded as the first skill)."""
        engine = TransformersEngine(model, tokenizer.eos_token_id, tokenizer.pad_token_id, batch_size=self.batch_size)
        task, p = SKILLS_TASK, SKILLS_TASK.evaluation(self.tasks, self.cfg)
        skills = ood_items(self.tasks, p.test_items)
        requests = [([render(tokenizer, task.prompt(self.tasks, it)) for it in items],
                     SamplingParams(p.temperature, p.top_p, p.max_tokens, 1, self.seeds.eval_ood_seed(seed, j)))
                    for j, items in enumerate(skills.values())]
        rows = []
        for (skill, items), completions in zip(skills.items(), sample_batched(engine, requests, desc="OOD")):
            texts = tokenizer.batch_decode(completions, skip_special_tokens=False)
            acc = sum(task.score(t, it) for t, it in zip(texts, items)) / len(items)
            rows.append({"task": f"ood/{skill}", "metric": "accuracy", "value": acc, "n": len(items)})
        return rows + [mean_row(rows)] if rows else []


def lm_eval_rows(results: dict, tasks: tuple[LMEvalTask, ...]) -> list[dict]:
    """Rows from an lm-eval ``simple_evaluate`` result: each task's standard metric
    divided by its ``scale``, with ``n`` = the number of items it scored
    (``n-samples.effective``, or for a group the sum over its subtasks).

    Raises:
        KeyError: a task or its metric missing from ``results["results"]`` (the
            message lists the metrics that are there).
    """
    rows = []
    res = results["results"]
    for t in tasks:
        if t.task not in res:
            raise KeyError(f"lm-eval returned no result for task {t.task!r}; it has {sorted(res)}")
        got = res[t.task]
        if t.metric not in got or not isinstance(got[t.metric], (int, float)):
            have = sorted(k for k, v in got.items() if "," in k and isinstance(v, (int, float)))
            raise KeyError(f"lm-eval task {t.task!r} has no metric {t.metric!r}; it has {have}")
        rows.append({"task": f"ood/{t.task}", "metric": t.metric.split(",")[0],
                     "value": float(got[t.metric]) / t.scale, "n": _n_scored(results, t.task)})
    return rows


def _n_scored(results: dict, task: str) -> int:
    n = results.get("n-samples", {})
    if task in n:
        return int(n[task].get("effective", n[task].get("original", 0)))
    subtasks = results.get("group_subtasks", {}).get(task, [])
    return sum(_n_scored(results, s) for s in subtasks)


class LMEvalBackend:
    """lm-eval-harness tasks on the model in memory (``HFLM(pretrained=model)``), or on
    any ``lm_eval.api.model.LM`` passed to `run` (a vLLM-backed LM at full scale, a
    scripted LM in tests). Seeds: lm-eval's Python, NumPy, torch and few-shot seeds
    are all set from the stage seed.

    Raises (at construction, before any compute): ImportError naming the ``eval``
    extra when lm-eval is not installed.
    """

    def __init__(self, cfg: LMEvalConfig, device: str = "cpu"):
        try:
            import lm_eval  # noqa: F401
        except ImportError as e:
            raise ImportError("evaluation.ood_backend: lm_eval needs lm-eval-harness: "
                              "pip install -e '.[eval]'") from e
        self.cfg, self.device = cfg, device

    def run(self, lm: Any, seed: int) -> dict:
        """``simple_evaluate`` on every configured task with its item ``limit``; the raw result dict."""
        from lm_eval import simple_evaluate
        from lm_eval.tasks import TaskManager

        cfg = self.cfg
        if cfg.allow_code_execution:  # HumanEval's `evaluate` code_eval metric refuses to run without it
            os.environ["HF_ALLOW_CODE_EVAL"] = "1"
        manager = TaskManager(include_path=cfg.include_path) if cfg.include_path else TaskManager()
        return simple_evaluate(
            model=lm, tasks=[t.task for t in cfg.tasks], limit=cfg.limit, task_manager=manager,
            random_seed=seed, numpy_random_seed=seed, torch_random_seed=seed, fewshot_random_seed=seed,
            log_samples=False, bootstrap_iters=0, confirm_run_unsafe_code=cfg.allow_code_execution,
        )

    def evaluate(self, model: Any, tokenizer: Any, seed: int) -> list[dict]:
        from lm_eval.models.huggingface import HFLM

        kw = {"max_length": self.cfg.max_length} if self.cfg.max_length else {}
        lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=self.cfg.batch_size, device=self.device, **kw)
        rows = lm_eval_rows(self.run(lm, seed), self.cfg.tasks)
        return rows + [mean_row(rows)]


class PretrainedBackend:
    """The OOD suite of a pretrained checkpoint, offline: held-out prose (`evals.prose.prose_rows`
    on ``cfg.prose``: rows ``ood/prose`` ``loss`` in nats/token and ``next_token_accuracy``), then
    the prior skills exactly as `MicroSkillsBackend` scores them (its rows ``ood/<skill>``
    ``accuracy``; prompts rendered with the tokenizer's chat template, `tasks.taskio.render`).

    ``ood_mean`` is the unweighted mean of the prose next-token accuracy and the skills'
    accuracies (1 + len(``tasks.ood_skills``) values, each in [0, 1]); the prose loss is not in it
    (another unit, lower is better): its after − before is its own row's difference.
    """

    def __init__(self, tasks: TasksConfig, cfg: EvaluationConfig, batch_size: int = 512,
                 seeds: SeedsConfig = SeedsConfig()):
        self.skills, self.prose = MicroSkillsBackend(tasks, cfg, batch_size, seeds), cfg.prose
        self.texts = prose_documents(cfg.prose.documents)

    def evaluate(self, model: Any, tokenizer: Any, seed: int) -> list[dict]:
        """Rows of the prose, of each skill, then ``ood_mean`` (class docstring)."""
        rows = prose_rows(model, tokenizer, self.texts, self.prose) + self.skills.evaluate(model, tokenizer, seed)[:-1]
        return rows + [mean_row([r for r in rows if r["metric"] != "loss"])]


def ood_backend(tasks: TasksConfig, cfg: EvaluationConfig, batch_size: int = 512, device: str = "cpu",
                seeds: SeedsConfig = SeedsConfig()) -> OODBackend:
    """The backend named by ``cfg.ood_backend`` (``micro``, ``lm_eval`` or ``pretrained``)."""
    if cfg.ood_backend == "lm_eval":
        return LMEvalBackend(cfg.lm_eval, device=device)
    if cfg.ood_backend == "pretrained":
        return PretrainedBackend(tasks, cfg, batch_size, seeds)
    return MicroSkillsBackend(tasks, cfg, batch_size, seeds)


__all__ = ["OODBackend", "MicroSkillsBackend", "LMEvalBackend", "PretrainedBackend", "lm_eval_rows", "mean_row",
           "ood_backend", "ood_items"]
