"""The sweep: Ray Tune over the YAML's search space, one function trainable per
trial that builds and fits a Ray Train ``TorchTrainer`` (Train V2: Tune's report
callback propagates the workers' metrics; ``Tuner(TorchTrainer)`` is not used).

Search: ``grid`` (Tune iterates the validated trial list of `SweepConfig.trials`,
expanded once when the sweep validated: ``tune.grid_search`` over its points) or
``optuna`` (Tune's ``OptunaSearch`` over Tune domains, TPE by default, one objective
or several for a Pareto front; each sample applied to the base trial with
`config.apply_point`), optionally with ASHA early stopping. Faults: Train's
``FailureConfig`` restarts a trial's worker group from its latest checkpoint; Tune's
retries a trial, whose Train run then resumes from the same storage; a trial whose
row is already ``completed`` is never rerun; `resume_sweep` continues an
interrupted sweep with ``Tuner.restore``.

Results land under ``<storage_path>/<name>/``: ``sweep.json`` (the validated
config, for ``--resume``), the Tune experiment (``tune/``), the Train runs
(``train/<trial_id>``) and the Parquet tables (``trials``, ``metrics``, ``evals``)
that `distillab.results.load` reads.

    distillab sweep search_spaces/micro.yaml
    distillab sweep --resume runs/micro
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
import traceback
from pathlib import Path
from typing import Any

import optuna
import polars as pl
import ray
import ray.train
from ray import tune
from ray.train.torch import TorchTrainer
from ray.tune.integration.ray_train import TuneReportCallback
from ray.tune.schedulers import ASHAScheduler
from ray.tune.search import ConcurrencyLimiter
from ray.tune.search.optuna import OptunaSearch

from distillab.config import RuntimeContext, SweepConfig, TrialConfig, apply_point, point_of
from distillab.distill import train_loop_per_worker
from distillab.models import load_tokenizer
from distillab.registry import REPORTER_COLUMNS
from distillab.results import load, pareto_front, report_metrics, trial_metrics, write_rows
from distillab.rollout import offpd_rollout_path, offpd_rollout_set, resolve_engine, start_rollout_actor

log = logging.getLogger(__name__)

#: the key of a grid sweep's Tune parameter: one point of `SweepConfig.trials` (its trial id and searched values)
POINT = "point"


def trial_of(params: dict[str, Any], trials: dict[str, dict], base: dict[str, Any]) -> TrialConfig:
    """The trial a Tune config stands for: a grid point's trial from the validated list
    ``trials`` (trial id → trial JSON), or an Optuna sample (dotted keys) applied to
    ``base`` with `config.apply_point`."""
    if POINT in params:
        return TrialConfig.model_validate(trials[params[POINT]["trial_id"]])
    return apply_point(base, {k: v for k, v in params.items() if k != "ctx"})


def completed_trials(root: Path, trial_id: str | None = None) -> int:
    """How many rows of ``<root>/trials`` are ``completed`` (only ``trial_id``'s, if given)."""
    pattern = f"{trial_id}.parquet" if trial_id is not None else "*.parquet"
    files = list((root / "trials").glob(pattern)) if (root / "trials").exists() else []
    if not files:
        return 0
    # one scan per file: the rows of a union of grids (search.grids) differ in their config columns
    status = pl.concat([pl.scan_parquet(f).select("status") for f in files])
    return status.filter(pl.col("status") == "completed").select(pl.len()).collect().item()


def run_trial(params: dict[str, Any], trials: dict[str, dict] | None = None, base: dict[str, Any] | None = None
              ) -> None:
    """Tune function trainable: one distillation trial (`trial_of` the Tune config; its
    `config.RuntimeContext` is ``params["ctx"]``) as a ``TorchTrainer`` fit, plus its row in
    the ``trials`` table (``running`` at start; then ``completed`` or ``failed`` with the
    error, times and checkpoint).

    A trial whose row is already ``completed`` (Tune re-launching it after a driver
    crash) is not rerun: its final report is rebuilt from the ``evals`` table."""
    ctx = RuntimeContext.model_validate(params["ctx"])
    trial = trial_of(params, trials or {}, base or {})
    trial_id, root, res = trial.trial_id, Path(ctx.results_root), ctx.resources
    if completed_trials(root, trial_id):
        log.info("%s already completed; reporting its stored results", trial_id)
        tune.report({"step": trial.optimizer.steps, **report_metrics(root, trial_id), "skipped_rerun": 1})
        return
    row: dict[str, Any] = {"trial_id": trial_id, "start_time": time.time(), "checkpoint": None, "error": None}
    row.update({k: (str(v) if isinstance(v, (list, dict)) else v) for k, v in trial.flat().items()})
    write_rows(root, "trials", [{**row, "status": "running", "end_time": math.nan}], key=trial_id)
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"trial": trial.model_dump(mode="json"), "trial_id": trial_id,
                           "ctx": ctx.model_dump(mode="json")},
        scaling_config=ray.train.ScalingConfig(
            num_workers=res.num_workers, use_gpu=res.gpus_per_worker > 0,
            resources_per_worker={"CPU": res.cpus_per_worker, **({"GPU": res.gpus_per_worker} if res.gpus_per_worker else {})},
        ),
        run_config=ray.train.RunConfig(
            name=trial_id,  # same name + storage: a retried trial resumes this run's checkpoints
            storage_path=str(root / "train"),
            callbacks=[TuneReportCallback()],
            failure_config=ray.train.FailureConfig(max_failures=ctx.fault_tolerance.worker_restarts),
        ),
    )
    try:
        result = trainer.fit()
        row.update(status="completed", checkpoint=result.checkpoint.path if result.checkpoint else None)
    except Exception as e:  # the row records the failure; Tune sees it too
        row.update(status="failed", error="".join(traceback.format_exception_only(type(e), e))[-4000:])
        raise
    finally:
        row["end_time"] = time.time()
        write_rows(root, "trials", [row], key=trial_id)


def init_ray(address: str | None, dashboard: bool, num_cpus: int | None = None) -> None:
    """Connect to ``address`` (or ``RAY_ADDRESS``, set by ``ray job submit``), else
    start a local Ray whose dashboard binds to 127.0.0.1."""
    # offline unless the caller says otherwise (HF_HUB_OFFLINE=0 lets lm-eval fetch its hub datasets)
    env = {"env_vars": {"HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"), "TOKENIZERS_PARALLELISM": "false"}}
    if address or os.environ.get("RAY_ADDRESS"):
        ray.init(address=address, runtime_env=env)
    else:
        ray.init(
            address="local",
            num_cpus=num_cpus,
            include_dashboard=dashboard,
            dashboard_host="127.0.0.1",
            runtime_env=env,
        )


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


def precompute_offpd_rollouts(sweep: SweepConfig, teacher_path: Path, threads: int | None = None) -> int:
    """Generate, before any trial starts, the OffPD rollout sets that the sweep's
    trials with ``rollout.offpd_reuse`` will read (`rollout.offpd_rollout_set`),
    each distinct set once, in a `rollout.RolloutActor` of the configured engine
    with all ``threads`` (default: the machine's cores). Sets already cached are
    skipped. Ray must be initialised. Returns how many sets were generated."""
    world = sweep.resources.num_workers
    todo: dict[Path, tuple[TrialConfig, int]] = {}
    for t in sweep.trials:
        if t.rollout.policy == "offpd" and t.rollout.offpd_reuse:
            for rank in range(world):
                path = offpd_rollout_path(sweep.shared_cache_dir(), t, teacher_path, rank, world)
                if not path.exists():
                    todo.setdefault(path, (t, rank))
    if not todo:
        print("[time] OffPD sets: 0 s (none to generate: cached, or no trial reuses one)", flush=True)
        return 0
    threads = threads or max(1, os.cpu_count() or 1)
    tok = load_tokenizer(teacher_path)
    t0 = time.perf_counter()
    by_engine: dict[tuple, Any] = {}
    try:
        for path, (t, rank) in todo.items():
            r = t.rollout
            engine = resolve_engine(r.engine, batched=True)
            key = (engine, r.vllm_max_model_len, r.vllm_kv_cache_gib)
            if key not in by_engine:
                by_engine[key] = start_rollout_actor(
                    engine, teacher_path, tok.eos_token_id, tok.pad_token_id, threads=threads, num_gpus=0.0,
                    **({"seed": t.seed, "max_model_len": r.vllm_max_model_len, "kv_cache_gib": r.vllm_kv_cache_gib,
                        "gpu_memory_utilization": r.vllm_gpu_memory_utilization} if engine == "vllm" else {}),
                )
            actor = by_engine[key]
            offpd_rollout_set(t, teacher_path, tok, rank, world, sweep.shared_cache_dir(),
                              generate_many=lambda jobs, a=actor: ray.get(a.generate_many.remote(jobs)))
    finally:
        for actor in by_engine.values():
            ray.kill(actor)
    engines = ", ".join(sorted({k[0] for k in by_engine}))
    print(f"[rollouts] OffPD reuse: {len(todo)} rollout set(s) generated with {engines} under "
          f"{sweep.shared_cache_dir()}", flush=True)
    print(f"[time] OffPD sets: {time.perf_counter() - t0:.0f} s", flush=True)
    return len(todo)


def _trainable(sweep: SweepConfig):
    """`run_trial` with the sweep's validated trials (grid) or base trial (Optuna) and its resources."""
    trials = {t.trial_id: t.model_dump(mode="json") for t in sweep.trials} if sweep.search.kind == "grid" else {}
    fn = tune.with_parameters(run_trial, trials=trials, base=sweep.trial.model_dump(mode="json"))
    return tune.with_resources(fn, {"CPU": sweep.resources.trial_cpus})


def run_sweep(sweep: SweepConfig, teacher_path: Path, student_path: Path, *, verbose: int = 1) -> Path:
    """Run every trial of the search with Ray Tune (Ray must be initialised).
    Writes ``<root>/sweep.json`` first (what ``--resume`` reads). Returns the sweep
    directory (results root)."""
    root = sweep.sweep_dir()
    root.mkdir(parents=True, exist_ok=True)
    (root / "sweep.json").write_text(json.dumps(sweep.model_dump(mode="json"), indent=1))
    precompute_offpd_rollouts(sweep, teacher_path)
    r = sweep.resources
    param_space, search_alg, scheduler, num_samples = build_search(sweep)
    param_space["ctx"] = RuntimeContext.for_sweep(sweep, teacher_path, student_path).model_dump(mode="json")
    searched = {f"{POINT}/{k}": k for k in sweep.search.grid_keys} | {k: k for k in sweep.search.space}
    reporter = tune.CLIReporter(
        parameter_columns=searched, metric_columns=REPORTER_COLUMNS, max_report_frequency=30,
    )
    tuner = tune.Tuner(
        _trainable(sweep),
        param_space=param_space,
        tune_config=tune.TuneConfig(
            # Optuna: its ConcurrencyLimiter holds the limit (Tune warns if both are given)
            max_concurrent_trials=None if search_alg is not None else r.max_concurrent_trials,
            num_samples=num_samples,
            search_alg=search_alg, scheduler=scheduler,
        ),
        run_config=tune.RunConfig(
            name="tune", storage_path=str(root), progress_reporter=reporter, verbose=verbose,
            failure_config=tune.FailureConfig(max_failures=sweep.fault_tolerance.trial_retries),
        ),
    )
    return _fit(tuner, sweep, root)


def resume_sweep(root: str | Path, teacher_path: Path, student_path: Path, *, verbose: int = 1) -> Path:
    """Continue an interrupted sweep from ``<root>/tune`` with ``Tuner.restore``:
    finished trials are kept (and, having ``completed`` rows, never rerun),
    unfinished and errored ones resume from their latest checkpoints."""
    root = Path(root).resolve()
    sweep = SweepConfig.model_validate(json.loads((root / "sweep.json").read_text()))
    if not tune.Tuner.can_restore(str(root / "tune")):
        raise FileNotFoundError(f"{root / 'tune'} holds no Tune experiment to resume")
    tuner = tune.Tuner.restore(
        str(root / "tune"), trainable=_trainable(sweep), resume_unfinished=True, resume_errored=True,
    )
    return _fit(tuner, sweep, root)


def _pin_train_coordinator_to_driver_node() -> None:
    """Create Ray Train's detached autoscaling-coordinator actor on the driver's node
    (the head, under ``ray job submit``) before any trial does.

    Ray 2.60 creates it, once per cluster, with a hard node affinity to the node of
    the first Train controller; if a trial's controller ran on a worker node that is
    later lost, the actor cannot restart and every later Train run on the cluster
    fails to start its workers (measured in tests/test_faults.py). A private Ray API:
    skipped silently where it moved."""
    try:
        from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
            get_or_create_autoscaling_coordinator,
        )

        get_or_create_autoscaling_coordinator()
    except Exception as e:  # an internal module moved or changed: Ray's default behaviour
        log.debug("could not pre-create Ray Train's autoscaling coordinator: %s", e)


def expected_trials(sweep: SweepConfig) -> int:
    """How many trials the sweep runs: the grid's size, or ``search.num_samples``."""
    return sweep.search.num_samples if sweep.search.kind == "optuna" else len(sweep.trials)


def _fit(tuner, sweep: SweepConfig, root: Path) -> Path:
    # the objectives are in each trial's final report only; Tune's strict check would
    # reject the intermediate (per-10-steps) reports that lack them
    os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")
    # Ray's newer console output ignores a custom reporter; the classic one shows our columns
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    _pin_train_coordinator_to_driver_node()
    t0 = time.perf_counter()
    grid = tuner.fit()
    errors = [res.error for res in grid if res.error]
    done, want = completed_trials(root), expected_trials(sweep)
    print(f"[sweep] {done} of {want} trials completed, {len(errors)} failed", flush=True)
    print(f"[time] trials: {time.perf_counter() - t0:.0f} s", flush=True)
    if done < want:
        print(f"[sweep] incomplete; continue with: distillab sweep --resume {root}", flush=True)
    if sweep.search.kind == "optuna":
        print_search_summary(root, sweep)
    return root


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
