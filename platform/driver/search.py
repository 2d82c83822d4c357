"""The sweep's search: a grid (Tune iterates the validated trials of `SweepConfig.trials`) or
Optuna over Tune domains, optionally with ASHA (`build_search`); the trial a Tune config stands
for (`trial_of`); the best trial or the Pareto front of an Optuna search (`print_search_summary`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import polars as pl
from ray import tune
from ray.tune.schedulers import ASHAScheduler
from ray.tune.search import ConcurrencyLimiter
from ray.tune.search.optuna import OptunaSearch

from distillab.analysis.results import load, pareto_front, trial_metrics
from distillab.config import SweepConfig, TrialConfig, apply_point, point_of

#: the key of a grid sweep's Tune parameter: one point of `SweepConfig.trials` (its trial id and searched values)
POINT = "point"


def trial_of(params: dict[str, Any], trials: dict[str, TrialConfig], base: TrialConfig) -> TrialConfig:
    """The trial a Tune config stands for: a grid point's trial, as it is, from the validated
    trials ``trials`` (trial id → `TrialConfig`), or an Optuna sample (dotted keys: Tune
    samples plain values) applied to ``base`` with `config.apply_point`, the one place a
    trial goes to JSON and back (the sample is validated in its trial)."""
    if POINT in params:
        return trials[params[POINT]["trial_id"]]
    return apply_point(base.model_dump(mode="json"), params)


def search_trials(sweep: SweepConfig) -> tuple[dict[str, TrialConfig], TrialConfig]:
    """What `trial_of` reads for ``sweep``: its validated trials by id (grid; none for Optuna)
    and its base trial."""
    return ({t.trial_id: t for t in sweep.trials} if sweep.search.kind == "grid" else {}), sweep.trial


def _tune_domain(domain):
    if domain.uniform is not None:
        return tune.uniform(*domain.uniform)
    if domain.loguniform is not None:
        return tune.loguniform(*domain.loguniform)
    if domain.int_ is not None:
        return tune.randint(domain.int_[0], domain.int_[1] + 1)  # Tune's upper bound is exclusive
    return tune.choice(list(domain.choice))


class FinalReportOptunaSearch(OptunaSearch):
    """Tune's ``OptunaSearch``, told only by reports that carry the objectives (a
    trial's final report): intermediate training reports are skipped instead of
    raising ``KeyError`` in ``on_trial_result`` (single objective)."""

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        metrics = self.metric if isinstance(self.metric, list) else [self.metric]
        if all(m in result for m in metrics):
            super().on_trial_result(trial_id, result)


def build_search(sweep: SweepConfig):
    """``(param_space, search_alg, scheduler, num_samples)`` for the Tuner: the grid as
    ``tune.grid_search`` over the points of `SweepConfig.trials` (``{"point": {"trial_id",
    <searched key>: value, ...}}``), or Optuna over Tune domains (the sampler and seed
    from ``search``; several objectives give a multi-objective study)."""
    s = sweep.search
    scheduler = None
    if s.scheduler is not None:
        sc = s.scheduler
        scheduler = ASHAScheduler(
            time_attr="step", metric=sc.metric, mode=sc.mode, grace_period=sc.grace_period,
            max_t=sc.max_t or sweep.trial.optimizer.steps, reduction_factor=sc.reduction_factor,
        )
    if s.kind == "grid":
        points = [{"trial_id": t.trial_id, **point_of(t, s.grid_keys)} for t in sweep.trials]
        return {POINT: tune.grid_search(points)}, None, scheduler, 1
    samplers = {
        "tpe": lambda: optuna.samplers.TPESampler(seed=s.seed),
        "random": lambda: optuna.samplers.RandomSampler(seed=s.seed),
        "nsga2": lambda: optuna.samplers.NSGAIISampler(seed=s.seed),
    }
    metrics, modes = zip(*s.objectives)
    multi = len(metrics) > 1
    searcher = FinalReportOptunaSearch(
        metric=list(metrics) if multi else metrics[0],
        mode=list(modes) if multi else modes[0],
        sampler=samplers[s.sampler](),
        seed=s.seed,
    )
    searcher = ConcurrencyLimiter(searcher, max_concurrent=sweep.resources.max_concurrent_trials)
    return {k: _tune_domain(d) for k, d in s.space.items()}, searcher, scheduler, s.num_samples


def print_search_summary(root: Path, sweep: SweepConfig) -> None:
    """Print the best trial (one objective) or the Pareto front (several), from the
    sweep's Parquet results (finished trials, including ones of earlier runs)."""
    objectives = sweep.search.objectives
    df = trial_metrics(load(root))
    cols = [c for c in ["trial_id", *sweep.search.space] if c in df.columns]
    missing = [m for m, _ in objectives if m not in df.columns]
    if df.is_empty() or missing:
        print(f"[search] no completed trial reports {missing or 'the objectives'}", flush=True)
        return
    with pl.Config(fmt_str_lengths=120, tbl_rows=200, tbl_cols=20, tbl_width_chars=250):
        if len(objectives) == 1:
            (m, mode), = objectives
            best = df.sort(m, descending=mode == "max", nulls_last=True).head(1)
            print(f"[search] best trial by {m} ({mode}):", flush=True)
            print(best.select(*cols, m), flush=True)
        else:
            front = pareto_front(df, objectives).filter(pl.col("pareto"))
            print(f"[search] Pareto front over {objectives} ({front.height} of {df.height} trials):", flush=True)
            print(front.select(*cols, *[m for m, _ in objectives]).sort(objectives[0][0]), flush=True)
