"""The sweep: Ray Tune over the YAML's search space, one function trainable per
trial that builds and fits a Ray Train ``TorchTrainer`` (Train V2: Tune's report
callback propagates the workers' metrics; ``Tuner(TorchTrainer)`` is not used), or,
with ``resources.local_mode``, runs the same recipe in the trial actor itself
(`train_in_trial_actor`; Ray Train's local mode, reporting to Tune).

Search (`driver.search`): ``grid`` (Tune iterates the validated trial list of
`SweepConfig.trials`, expanded once when the sweep validated: ``tune.grid_search`` over
its points) or ``optuna`` (Tune's ``OptunaSearch`` over Tune domains, TPE by default, one
objective or several for a Pareto front; each sample applied to the base trial with
`config.apply_point`), optionally with ASHA early stopping. Faults: Train's
``FailureConfig`` restarts a trial's worker group from its latest checkpoint; Tune's
retries a trial, whose Train run (or local-mode trial: Tune's checkpoint) then resumes
from the same storage; a trial whose row is already ``completed`` is never rerun;
`resume_sweep` continues an interrupted sweep with ``Tuner.restore``. The driver removes
the placement groups that a dead trial's Train controller left behind, and its progress
watchdog fails the trials that wait for resources while no trial progresses
(`driver.watchdog`, ``fault_tolerance.stall_warn_s`` and ``stall_fail_s``).

Results land under ``<storage_path>/<name>/``: ``sweep.json`` (the validated
config, for ``--resume``), the Tune experiment (``tune/``), the Train runs
(``train/<trial_id>``), each run's worker-group state for the watchdog
(``worker_groups/<trial_id>.json``) and the Parquet tables (``trials``, ``metrics``,
``evals``) that `distillab.analysis.results.load` reads.

Console (``verbose``, `raystart.init_ray`, `driver.console`): at the default level a sweep
prints Tune's progress table when a trial changes status (`CalmReporter`), one line per finished
stage of each trial (`evals.suite.evaluate_stage`) and errors; Ray Train's INFO
logs, Hugging Face progress bars, Ray's known-harmless warnings and a rollout actor's
vLLM start-up notes stay out of it (the CLI's ``RAY_DEDUP_LOGS_SKIP_REGEX``,
`rollout.actor.quiet_vllm`; everything stays in Ray's session logs).
``verbose=2`` (``distillab sweep --verbose``) brings all of it back. Trackers
(`driver.trackers`): Tune's W&B and MLflow logger callbacks when the YAML's ``tracking`` section asks
(`tracker_callbacks`); Tune's own CSV and JSON loggers always, its TensorBoard
logger never (the Parquet tables are the results).

Lazy imports: the recipe (`distillab.recipe.distill`), `distillab.models` and
`distillab.rollout` (transformers, DeepSpeed, vLLM's client) are imported inside
the functions that use them (`train_fn` in the Train workers, `train_in_trial_actor`
in a local-mode trial actor, the OffPD set generation and the shared teacher service
(`distillab.recipe.teacher`) in the driver), so that the Tune
trial actor, which unpickles
`run_trial` and so imports this module, loads Ray Tune, Ray Train and torch only:
``python -c "import distillab.driver.sweep"`` takes 6.8–7.4 s of CPU (user) against
14.0–14.2 s with them at module top (``/usr/bin/time``, 2 cores shared with other
jobs), on the critical path of a trial's start.

    distillab sweep search_spaces/micro.yaml
    distillab sweep --resume runs/micro
"""

from __future__ import annotations

import gc
import json
import logging
import math
import os
import time
import traceback
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.fs as pafs
import ray
import ray.train
from ray import tune
from ray.train.torch import TorchConfig, TorchTrainer
from ray.tune.integration.ray_train import TuneReportCallback
from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback
from tqdm.auto import tqdm

from distillab.config import RuntimeContext, SweepConfig, TrialConfig, TrialLaunch
from distillab.driver.console import (
    TUNE_RESUME_HINT,
    CalmReporter,
    driver_console,
    drop_unraisable_sigterm_exits,
    trial_actor_console,
)
from distillab.driver.imports import without_unused_integrations
from distillab.driver.search import (
    POINT,
    FinalReportOptunaSearch,
    build_search,
    print_search_summary,
    search_trials,
    trial_of,
)
from distillab.driver.trackers import TUNE_PROCESS_KEYS, tracked_config, tracker_callbacks, trial_name
from distillab.driver.watchdog import RAY_PG_CLEANER, SweepWatch, WorkerGroupRecord, record_path
from distillab.recipe.telemetry import TrialTimes, print_time
from distillab.registry import OFFPD, REPORTER_COLUMNS
from distillab.tables import report_metrics, write_rows

log = logging.getLogger(__name__)

#: the sweep's public names, those of its concerns' modules (console, search, trackers) included
__all__ = [
    "POINT",
    "TEACHER_STATS_FILE",
    "TRACKER_PACKAGES",
    "TRAIN_BACKENDS",
    "TRAIN_BACKEND_ENV",
    "TRAIN_ENV",
    "TUNE_PROCESS_KEYS",
    "TUNE_RESUME_HINT",
    "TUNE_TRACKER_MODULES",
    "CalmReporter",
    "FinalReportOptunaSearch",
    "TrialTrainer",
    "build_search",
    "completed_trials",
    "driver_console",
    "drop_unraisable_sigterm_exits",
    "expected_trials",
    "precompute_offpd_rollouts",
    "print_completed_before",
    "print_search_summary",
    "resume_sweep",
    "run_sweep",
    "run_trial",
    "search_trials",
    "shared_teacher_service",
    "sweep_watch",
    "tracked_config",
    "tracker_callbacks",
    "train_backend",
    "train_fn",
    "train_in_trial_actor",
    "train_settings",
    "trial_actor_console",
    "trial_name",
    "trial_of",
]


def completed_trials(root: Path, trial_id: str | None = None) -> int:
    """How many rows of ``<root>/trials`` are ``completed`` (only ``trial_id``'s, if given)."""
    pattern = f"{trial_id}.parquet" if trial_id is not None else "*.parquet"
    files = list((root / "trials").glob(pattern)) if (root / "trials").exists() else []
    if not files:
        return 0
    # one scan per file: the rows of a union of grids (search.grids) differ in their config columns
    status = pl.concat([pl.scan_parquet(f).select("status") for f in files])
    return status.filter(pl.col("status") == "completed").select(pl.len()).collect().item()


def train_fn(config: dict) -> None:
    """The Train workers' function: `distill.train_loop_per_worker` of ``config``
    (``{"launch": config.TrialLaunch}``), imported here, in the worker (see the module
    docstring's lazy imports; without the integrations it never uses,
    `imports.without_unused_integrations`)."""
    with without_unused_integrations():
        from distillab.recipe.distill import train_loop_per_worker  # lazy: see the module docstring
    train_loop_per_worker(config)


#: Ray Train V2 settings of a trial's controller and workers, unless the environment sets them.
#: The controller polls its workers every RAY_TRAIN_HEALTH_CHECK_INTERVAL_S (Ray's default: 2 s) and
#: collects a `ray.train.report` only then, so a worker that reports waits up to that long, and so do
#: the start and the end of every run: 0.5 s keeps the wait below a micro step (issue 14 measured
#: 1.2 s per report at 2 s).
TRAIN_ENV = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5"}
#: ``DISTILLAB_TRAIN_BACKEND``: the ``torch.distributed`` backend of a trial's Train workers (`train_backend`)
TRAIN_BACKEND_ENV = "DISTILLAB_TRAIN_BACKEND"
#: its values: ``auto`` (Ray Train's choice: NCCL for workers that hold a GPU, gloo otherwise), ``gloo``, ``nccl``
TRAIN_BACKENDS = ("auto", "gloo", "nccl")


def train_backend() -> str | None:
    """``$DISTILLAB_TRAIN_BACKEND`` (default ``auto``) as ``TorchConfig``'s ``backend``: None for ``auto``.

    ``gloo`` is for a cluster whose nodes advertise GPUs that torch cannot use (Ray's resource
    flags on CPU hosts, tests/test_placement.py): the workers are placed and hold the GPUs Ray
    gives them exactly as with NCCL, and their process group is gloo's (DeepSpeed then runs on
    the CPU). Placement does not depend on it.

    Raises:
        ValueError: a value not in `TRAIN_BACKENDS` (the variable and the allowed values named)."""
    value = os.environ.get(TRAIN_BACKEND_ENV, "auto").strip().lower()
    if value not in TRAIN_BACKENDS:
        raise ValueError(f"{TRAIN_BACKEND_ENV} must be one of {', '.join(TRAIN_BACKENDS)}, "
                         f"got {os.environ[TRAIN_BACKEND_ENV]!r}")
    return None if value == "auto" else value


def train_settings(verbose: int = 1) -> dict[str, Any]:
    """What `run_trial` applies around each ``TorchTrainer`` (computed in the driver, Ray
    initialised): ``env``, `TRAIN_ENV` plus, on a one-node cluster, Ray Train's preemption
    watcher off (an actor per trial that can only watch its own node go), and a set
    `TRAIN_BACKEND_ENV` (checked by `train_backend`, raising ValueError); ``log_level``,
    Ray Train's console level (``WARNING``; ``INFO`` at ``verbose`` ≥ 2); ``quiet_exit``,
    whether the trial actor drops Ray's unraisable SIGTERM exits
    (`drop_unraisable_sigterm_exits`; not at ``verbose`` ≥ 2)."""
    env = dict(TRAIN_ENV)
    if train_backend() is not None:  # checked here, in the driver, before any trial; the trial actors read it
        env[TRAIN_BACKEND_ENV] = os.environ[TRAIN_BACKEND_ENV]
    if len([n for n in ray.nodes() if n.get("Alive")]) <= 1:
        env["RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"] = "0"
    return {"env": env, "log_level": "INFO" if verbose >= 2 else "WARNING", "quiet_exit": verbose < 2}




class TrialTrainer(TorchTrainer):
    """Ray Train's ``TorchTrainer`` without two of Train V2's default callbacks: Ray Data's
    ``DatasetManager`` (an actor, a process importing Ray Data, for every run, datasets or
    not; a trial passes none) and the ``PlacementGroupCleaner`` (a detached actor per run that
    asks the dashboard's state API whether the controller lives, and without a dashboard never
    learns it: the sweep's driver removes a dead controller's placement group instead,
    `watchdog.SweepWatch`). Reads Ray 2.60's private default-callback list; where that changes,
    nothing is dropped."""

    def _create_default_callbacks(self):
        callbacks = super()._create_default_callbacks()
        dropped = {RAY_PG_CLEANER} | (set() if self.datasets else {"DatasetsCallback"})
        return [c for c in callbacks if type(c).__name__ not in dropped]


def run_trial(params: dict[str, Any], trials: dict[str, TrialConfig], base: TrialConfig, ctx: RuntimeContext,
              settings: dict[str, Any] | None = None) -> None:
    """Tune function trainable: one distillation trial (`trial_of` the Tune config ``params``,
    with the sweep's ``trials`` and ``base`` (`search_trials`) and runtime context ``ctx``, all
    typed: `tune.with_parameters` hands them over) as a ``TorchTrainer`` fit of `train_fn` (a
    `TrialTrainer`, with `train_settings` ``settings``), plus its row in the ``trials`` table
    (``running`` at start; then ``completed`` or ``failed`` with the error, times and
    checkpoint). The trial travels on as one `config.TrialLaunch`.

    A trial whose row is already ``completed`` (Tune re-launching it after a driver
    crash) is not rerun: its final report is rebuilt from the ``evals`` table."""
    times = TrialTimes.launch_info()  # first line: how long this actor took to get here
    settings = settings or {"env": {}, "log_level": "INFO"}
    if settings.get("quiet_exit"):
        drop_unraisable_sigterm_exits()
    launch = TrialLaunch.of(trial_of(params, trials, base), ctx, times)
    trial, trial_id, root = launch.trial, launch.trial_id, Path(ctx.results_root)
    if completed_trials(root, trial_id):
        log.info("%s already completed; reporting its stored results", trial_id)
        tune.report({"step": trial.optimizer.steps, **report_metrics(root, trial_id), "skipped_rerun": 1})
        return
    for k, v in settings["env"].items():  # Ray Train hands the ones it knows on to its controller and workers
        os.environ.setdefault(k, v)
    record_path(root, trial_id).unlink(missing_ok=True)  # an earlier attempt's worker group: not this one's
    row: dict[str, Any] = {"trial_id": trial_id, "start_time": time.time(), "checkpoint": None, "error": None}
    row.update({k: (str(v) if isinstance(v, (list, dict)) else v) for k, v in trial.flat().items()})
    write_rows(root, "trials", [{**row, "status": "running", "end_time": math.nan}], key=trial_id)
    try:
        fit = _fit_in_trial_actor if ctx.resources.local_mode else _fit_worker_group
        row.update(status="completed", checkpoint=fit(launch, settings))
    except Exception as e:  # the row records the failure; Tune sees it too
        row.update(status="failed", error="".join(traceback.format_exception_only(type(e), e))[-4000:])
        raise
    finally:
        row["end_time"] = time.time()
        write_rows(root, "trials", [row], key=trial_id)


def _fit_worker_group(launch: TrialLaunch, settings: dict[str, Any]) -> str | None:
    """Run `train_fn` on a Ray Train worker group (a `TrialTrainer`, ``launch`` its
    ``train_loop_config``'s one value) whose reports reach Tune through ``TuneReportCallback``;
    returns the final checkpoint's path."""
    ctx, trial_id = launch.ctx, launch.trial_id
    res = ctx.resources
    trainer = TrialTrainer(
        train_fn,
        train_loop_config={"launch": launch},
        torch_config=TorchConfig(backend=train_backend()),
        scaling_config=ray.train.ScalingConfig(
            num_workers=res.num_workers, use_gpu=res.gpus_per_worker > 0,
            resources_per_worker={"CPU": res.cpus_per_worker, **({"GPU": res.gpus_per_worker} if res.gpus_per_worker else {})},
        ),
        run_config=ray.train.RunConfig(
            name=trial_id,  # same name + storage: a retried trial resumes this run's checkpoints
            storage_path=str(Path(ctx.results_root) / "train"),
            callbacks=[TuneReportCallback(), WorkerGroupRecord(ctx.results_root, trial_id)],
            failure_config=ray.train.FailureConfig(max_failures=ctx.fault_tolerance.worker_restarts),
            logging_config=ray.train.LoggingConfig(log_level=settings["log_level"]),
        ),
    )
    result = trainer.fit()
    _await_tune_reports()
    return result.checkpoint.path if result.checkpoint else None


def _fit_in_trial_actor(launch: TrialLaunch, settings: dict[str, Any]) -> str | None:
    """``resources.local_mode``: run the trial in this Tune trial actor
    (`train_in_trial_actor`); returns the final checkpoint's path (the newest
    ``checkpoint_*`` Tune persisted in the trial's directory of its storage)."""
    trial_actor_console(settings["log_level"])
    train_in_trial_actor(launch)
    storage = tune.get_context().get_storage()
    found = storage.storage_filesystem.get_file_info(pafs.FileSelector(storage.trial_fs_path, allow_not_found=True))
    saved = sorted(f.path for f in found if f.base_name.startswith("checkpoint_"))
    return saved[-1] if saved else None


def train_in_trial_actor(launch: TrialLaunch) -> None:
    """`distill.train_loop_per_worker` in the calling Tune trial actor (``resources.local_mode``;
    Ray Train's local mode, ``ScalingConfig(num_workers=0)``, runs the train function in-process
    the same way but keeps its reports from Tune): a one-process ``torch.distributed`` group
    (`optim.init_single_process_group`), then the recipe with a local-mode `session.RaySession`.
    ``launch``: the trial, as `train_loop_per_worker` receives it. The recipe is imported here, in the actor (see the
    module docstring's lazy imports)."""
    import torch  # lazy, with the recipe: see the module docstring

    with without_unused_integrations():
        from distillab.recipe.distill import run_worker
        from distillab.recipe.optim import init_single_process_group
        from distillab.recipe.session import RaySession

    init_single_process_group()
    times = TrialTimes(launch.times, in_trial_actor=True)
    try:
        run_worker(launch.trial, launch.ctx, launch.trial_id, RaySession(local_mode=True), times)
    finally:  # a reused trial actor runs the next trial: this one's engine, models and caches go now
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()






def _await_tune_reports(timeout_s: float = 300.0) -> None:
    """Return once Tune has taken every report Ray Train relayed for this trial.

    Ray 2.60 relays a Train run's reports to its Tune trainable through a queue actor
    that the trainable's main thread drains into a one-slot result queue. When the
    trainable's function returns while a report is still in that queue, its end marker
    takes the slot first and the main thread blocks forever relaying the report (seen
    here: both trials of a smoke sweep hung for 25 min after their last report once
    the driver took 8–20 s per result). Reads the session's private queue; returns at
    once where it moved."""
    try:
        from ray.train._internal.session import get_session

        queue = get_session()._inter_actor_queue
    except Exception:  # internals moved: Ray's default behaviour
        return
    deadline = time.time() + timeout_s
    while queue is not None and time.time() < deadline:
        if queue.empty():
            time.sleep(0.2)  # the main thread moves what it took into the result slot
            if queue.empty():
                return
        time.sleep(0.1)






def precompute_offpd_rollouts(sweep: SweepConfig, teacher_path: Path, threads: int | None = None) -> int:
    """Generate, before any trial starts, the OffPD rollout sets that the sweep's
    trials with ``rollout.offpd_reuse`` will read (`rollout.source.offpd_rollout_set`),
    each distinct set once, in a `rollout.actor.RolloutActor` of the configured engine
    with all ``threads`` (default: the machine's cores). Sets already cached are
    skipped. Ray must be initialised. Returns how many sets were generated (a
    progress bar over them on a terminal)."""
    from distillab.models import load_tokenizer  # lazy: see the module docstring
    from distillab.rollout.actor import resolve_engine, start_rollout_actor
    from distillab.rollout.source import offpd_rollout_path, offpd_rollout_set

    world = sweep.resources.num_workers
    todo: dict[Path, tuple[TrialConfig, int]] = {}
    for t in sweep.trials:
        if t.rollout.policy == OFFPD and t.rollout.offpd_reuse:
            for rank in range(world):
                path = offpd_rollout_path(sweep.shared_cache_dir(), t, teacher_path, rank, world)
                if not path.exists():
                    todo.setdefault(path, (t, rank))
    if not todo:
        print_time("OffPD sets", 0.0, 0, " (none to generate: cached, or no trial reuses one)")
        return 0
    threads = threads or max(1, os.cpu_count() or 1)
    tok = load_tokenizer(teacher_path)
    t0 = time.perf_counter()
    by_engine: dict[tuple, Any] = {}
    try:
        for path, (t, rank) in tqdm(todo.items(), desc="OffPD rollout sets", unit="set", disable=None):
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
    print_time("OffPD sets", time.perf_counter() - t0, 0)
    return len(todo)


#: The file in a sweep directory that holds the shared teacher service's request counts (`shared_teacher_service`).
TEACHER_STATS_FILE = "teacher_service.json"


@contextmanager
def shared_teacher_service(sweep: SweepConfig, root: Path, teacher_path: Path):
    """The sweep's teacher service while its trials run (``teacher.serve: shared`` in some trial;
    nothing otherwise): `teacher.start_teacher_service` (one actor per node, restarted by Ray if it
    dies, named `config.SweepConfig.teacher_service`, which the trials' `config.RuntimeContext` carries),
    then each actor's request counts per trial (`teacher.TeacherScorer.stats`) into
    ``<root>/teacher_service.json`` and the actors ended. Ray must be initialised."""
    name = sweep.teacher_service
    if name is None:
        yield
        return
    from distillab.recipe.teacher import service_stats, start_teacher_service, stop_teacher_service  # lazy: torch

    models = sorted({(t.precision, t.attn_implementation) for t in sweep.trials if t.teacher.serve == "shared"},
                    key=str)
    actors = start_teacher_service(name, teacher_path, sweep.resources.torch_threads, models)
    print(f"[teacher] shared teacher service {name}: {len(actors)} actor(s), one per node", flush=True)
    try:
        yield
    finally:
        try:
            stats = service_stats(actors)
            (root / TEACHER_STATS_FILE).write_text(json.dumps(stats, indent=1))
            served = sum(n for st in stats for n in st["requests"].values())
            print(f"[teacher] {served} request(s) answered for {len({t for st in stats for t in st['requests']})} "
                  f"trial(s)", flush=True)
        finally:
            stop_teacher_service(actors)


def _trainable(sweep: SweepConfig, ctx: RuntimeContext, verbose: int = 1):
    """`run_trial` with the sweep's validated trials (grid) and base trial (`search_trials`),
    the runtime context ``ctx``, its `train_settings` and its resources (typed objects: Tune
    keeps them in Ray's object store, outside the trials' Tune configs)."""
    trials, base = search_trials(sweep)
    fn = tune.with_parameters(run_trial, trials=trials, base=base, ctx=ctx, settings=train_settings(verbose))
    return tune.with_resources(fn, sweep.resources.trial_actor())




def run_sweep(sweep: SweepConfig, teacher_path: Path, student_path: Path, *, verbose: int = 1) -> Path:
    """Run every trial of the search with Ray Tune (Ray must be initialised). ``verbose``:
    Tune's verbosity (0 silent, 1 the calm console of the module docstring, 2 and 3
    Tune's per-result lines and Ray Train's INFO logs). Writes ``<root>/sweep.json``
    first (what ``--resume`` reads). Returns the sweep directory (results root)."""
    root = sweep.sweep_dir()
    root.mkdir(parents=True, exist_ok=True)
    sweep.save(root)
    driver_console(verbose)
    print_completed_before(root, sweep)
    precompute_offpd_rollouts(sweep, teacher_path)
    r = sweep.resources
    param_space, search_alg, scheduler, num_samples = build_search(sweep)
    searched = {f"{POINT}/{k}": k for k in sweep.search.grid_keys} | {k: k for k in sweep.search.space}
    reporter = CalmReporter(parameter_columns=searched, metric_columns=REPORTER_COLUMNS, max_report_frequency=300)
    tuner = tune.Tuner(
        _trainable(sweep, RuntimeContext.for_sweep(sweep, teacher_path, student_path), verbose),
        param_space=param_space,
        tune_config=tune.TuneConfig(
            # Optuna: its ConcurrencyLimiter holds the limit (Tune warns if both are given)
            max_concurrent_trials=None if search_alg is not None else r.max_concurrent_trials,
            num_samples=num_samples,
            search_alg=search_alg, scheduler=scheduler, trial_name_creator=trial_name(sweep),
            reuse_actors=True,  # a finished trial's actor runs the next one: no process start, no imports
        ),
        run_config=tune.RunConfig(
            name="tune", storage_path=str(root), progress_reporter=reporter, verbose=verbose,
            failure_config=tune.FailureConfig(max_failures=sweep.fault_tolerance.trial_retries),
            callbacks=[CSVLoggerCallback(), JsonLoggerCallback(), *tracker_callbacks(sweep, quiet=verbose < 2),
                       sweep_watch(sweep, root)],
        ),
    )
    with shared_teacher_service(sweep, root, teacher_path):
        return _fit(tuner, sweep, root)


def resume_sweep(root: str | Path, teacher_path: Path, student_path: Path, *, verbose: int = 1) -> Path:
    """Continue an interrupted sweep from ``<root>/tune`` with ``Tuner.restore``:
    finished trials are kept (and, having ``completed`` rows, never rerun),
    unfinished and errored ones resume from their latest checkpoints."""
    root = Path(root).resolve()
    sweep = SweepConfig.saved(root)
    if not tune.Tuner.can_restore(str(root / "tune")):
        raise FileNotFoundError(f"{root / 'tune'} holds no Tune experiment to resume")
    ctx = RuntimeContext.for_sweep(sweep, teacher_path, student_path)
    tuner = tune.Tuner.restore(str(root / "tune"), trainable=_trainable(sweep, ctx, verbose), resume_unfinished=True,
                               resume_errored=True)
    _watch_restored(tuner, sweep_watch(sweep, root))
    driver_console(verbose)
    print_completed_before(root, sweep)
    with shared_teacher_service(sweep, root, teacher_path):
        return _fit(tuner, sweep, root)


def sweep_watch(sweep: SweepConfig, root: Path) -> SweepWatch:
    """The sweep's `watchdog.SweepWatch` (placement groups of dead controllers; the progress
    watchdog of ``fault_tolerance``)."""
    return SweepWatch(root, sweep.fault_tolerance, trial_name(sweep), sweep.resources.trial_actor().get("CPU"))


def _watch_restored(tuner, watch: SweepWatch) -> None:
    """Put ``watch`` among the callbacks of a restored Tuner's run (in place of the one its
    saved run brought back: this sweep's folder and settings, and sweeps saved before it
    existed). Reads the Tuner's private run config; where that moved, the sweep runs unwatched
    and a warning says so."""
    try:
        run_config = tuner._local_tuner.get_run_config()
        run_config.callbacks = [c for c in run_config.callbacks or [] if not isinstance(c, SweepWatch)] + [watch]
    except Exception as e:  # noqa: BLE001 - Tune's internals moved
        log.warning("the resumed sweep runs without its watchdog (%s)", e)


def print_completed_before(root: Path, sweep: SweepConfig) -> None:
    """Say how many of the sweep's trials ``root`` holds ``completed`` before it runs: they
    are not rerun (`run_trial` reports their stored results), so that a sweep run again
    under the same ``name`` does not pass for a new one. Grid: the sweep's own trial ids;
    Optuna: every completed row there."""
    if sweep.search.kind == "optuna":
        done = completed_trials(root)
    else:
        done = sum(completed_trials(root, t.trial_id) for t in sweep.trials)
    if done:
        print(f"[sweep] {done} of {expected_trials(sweep)} trials already completed in {root}: their stored "
              f"results are reported, not rerun (a new --set name=... starts afresh)", flush=True)


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


#: the trackers' packages that Ray Tune imports as a sweep starts, only to count the callbacks it was
#: given for its usage statistics (``ray/air/_internal/usage.py``, `_count_callbacks`): 1.15 s (MLflow
#: 0.78, W&B 0.37, 2026-12-04) before the first trial starts. A sweep without ``tracking`` uses none of
#: them: `_fit` hides them from Tune (`imports.without_unused_integrations`).
TRACKER_PACKAGES = ("wandb", "mlflow", "comet_ml", "aim")
#: Tune's tracker modules, which keep ``None`` for a tracker package they did not find: forgotten after
#: a sweep that hid the packages, so that a later sweep in the same process with ``tracking`` loads them anew
TUNE_TRACKER_MODULES = ("ray.air.integrations.wandb", "ray.air.integrations.mlflow", "ray.air.integrations.comet",
                        "ray.tune.logger.aim")


def _fit(tuner, sweep: SweepConfig, root: Path) -> Path:
    # the objectives are in each trial's final report only; Tune's strict check would
    # reject the intermediate (per-10-steps) reports that lack them
    os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")
    # Ray's newer console output ignores a custom reporter; the classic one shows our columns
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    # Tune's CSV and JSON loggers are passed explicitly; its TensorBoard logger stays off (its
    # "Summary name ... is illegal" warnings for every key with '@'; the Parquet tables are the results)
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    _pin_train_coordinator_to_driver_node()
    t0 = time.perf_counter()
    untracked = sweep.tracking.wandb is None and sweep.tracking.mlflow is None
    with without_unused_integrations(TRACKER_PACKAGES, forget=TUNE_TRACKER_MODULES) if untracked else nullcontext():
        grid = tuner.fit()
    errors = [res.error for res in grid if res.error]
    done, want = completed_trials(root), expected_trials(sweep)
    unfinished = max(0, want - done - len(errors))  # interrupted, or never started (counted in report's n_failed)
    print(f"[sweep] {done} of {want} trials completed, {len(errors)} failed"
          + (f", {unfinished} unfinished" if unfinished else ""), flush=True)
    print_time("trials", time.perf_counter() - t0, 0)
    if done < want:
        print(f"[sweep] incomplete; continue with: distillab sweep --resume {root}", flush=True)
    if sweep.search.kind == "optuna":
        print_search_summary(root, sweep)
    return root


