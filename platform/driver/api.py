"""The functions of the Python API (`distillab.api` re-exports the first three) and of the
``distillab`` command that calls them: one code path for both.

    run_sweep(config_or_path, overrides, dry_run=...)   a sweep, as ``distillab sweep`` runs it → `SweepRun`
    load_results(path)                                  a sweep directory's tables, as ``distillab report`` reads them
    findings(path)                                      PROTOCOL.md §9's verdicts, as ``distillab findings`` decides them

and the steps ``distillab sweep`` and ``prepare`` share: `sweep_config` (the YAML, a built config or a
sweep directory, with dotted-key overrides), `static_checks` (every bad input before anything starts),
`preflight`, `prepare_models`, `plan` (the dry run), `print_tables`.

For developers: they live in the driver layer (the CLI, ``driver/cli.py``, imports them) and
`distillab.api` (``platform/api.py``, the one flat module above every layer) re-exports them.
Lazy imports: every ``distillab`` module but the standard-library-only `checks` and `environ`,
and ``ray``, are imported inside the function that uses them, as in `distillab.driver.cli` (which
imports this module at its top): ``import distillab.api`` takes 0.2 s, and ``distillab --help``
stays as fast, against 13 s with the sweep's modules (torch, transformers, DeepSpeed, Ray Tune) at
module top (``/usr/bin/time python -c "import distillab.api"`` vs ``python -c "import
distillab.driver.sweep, distillab.recipe.prepare, distillab.driver.plan, ray"``, 2 shared cores).
"""

from __future__ import annotations

import datetime
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from distillab.driver.checks import (  # the standard library only
    checkpoint_files_error,
    env_errors,
    number_errors,
    storage_error,
)
from distillab.driver.environ import env_defaults  # the standard library only
from distillab.driver.imports import without_unused_integrations  # the standard library only

#: `run_sweep`'s and ``distillab sweep``'s answer to a resume given a config or overrides as well
RESUME_ONLY = "--resume takes the sweep directory only (its sweep.json holds the config)"

if TYPE_CHECKING:  # names for the annotations only; imported where used (see the module docstring)
    import polars as pl

    from distillab.analysis.results import Results
    from distillab.analysis.verdicts import Verdict
    from distillab.config import SweepConfig

@dataclass(frozen=True)
class SweepRun:
    """What `run_sweep` returns.

    Attributes:
        config: the validated sweep (overrides applied; with ``resume``, the saved one).
        path: the results directory ``<storage_path>/<name>`` (absolute; `load_results` and
            `findings` read it); None for a dry run, which writes nothing.
        plan: the dry run's text (trials, placement, cost estimate, as ``distillab sweep
            --dry-run`` prints it); None for a run.
        placeable: whether every trial fits a node of the cluster (a run that starts always fits).
        trials_completed: trials with a result in ``path`` (0 for a dry run).
        trials_expected: trials the sweep runs (the grid's, or ``search.num_samples``).
    """

    config: SweepConfig
    path: Path | None
    plan: str | None
    placeable: bool
    trials_completed: int
    trials_expected: int

    @property
    def complete(self) -> bool:
        """Every trial completed (False for a dry run, interrupted sweeps and failed trials)."""
        return self.path is not None and self.trials_completed >= self.trials_expected


def sweep_config(config_or_path: Any, overrides: Mapping[str, Any] | None = None,
                 resume: bool = False) -> SweepConfig:
    """The validated sweep of a YAML path (`config.load_sweep`, ``overrides`` applied as its
    ``--set``), of a built `config.SweepConfig` (`config.with_overrides`) or, with ``resume``, of a
    sweep directory (its ``sweep.json``, `load_resumable`; no overrides).

    Raises:
        ConfigError: an invalid field, an unknown override key, a value a field does not allow
            (each named in the message), overrides with ``resume``, or no config given.
        FileNotFoundError: no such YAML file.
    """
    from distillab.config import ConfigError, SweepConfig, load_sweep, with_overrides  # lazy: see the docstring
    from distillab.tasks import registry  # noqa: F401  (every task module registers its config section first)

    if resume:
        if overrides or isinstance(config_or_path, SweepConfig):
            raise ConfigError(RESUME_ONLY)
        return load_resumable(config_or_path)
    if config_or_path is None:
        raise ConfigError("sweep needs a config YAML (or --resume PATH)")
    if isinstance(config_or_path, SweepConfig):
        return with_overrides(config_or_path, dict(overrides or {}))
    if not isinstance(config_or_path, (str, os.PathLike)):
        raise ConfigError(f"a sweep is a YAML path or a SweepConfig, got {type(config_or_path).__name__}")
    return load_sweep(config_or_path, dict(overrides or {}))


def load_resumable(path: str | os.PathLike[str]) -> SweepConfig:
    """The validated config of the sweep directory ``path`` (`config.SweepConfig.saved`).

    Raises:
        ConfigError: no ``sweep.json`` there, or it does not validate (the message starts ``--resume``).
    """
    from distillab.config import ConfigError, SweepConfig  # lazy: see the module docstring

    try:
        return SweepConfig.saved(path)
    except ConfigError as e:
        raise ConfigError(f"--resume {e}") from None


def static_checks(sweep: SweepConfig, flags: Mapping[str, float | None], run: bool,
                  results_dir: tuple[str, str | os.PathLike[str]] | None = None) -> None:
    """What `checks` can say without Ray or torch, every bad input in one line: the numeric
    ``flags`` (`checks.NUMBER_FLAGS`' destinations: ``threads``, ``nodes``, ...), the environment
    switches, the checkpoint folders' files (config, tokenizer and, for a ``run``, weights), a GGUF
    source's file (its package installed and holding it), and for a ``run`` (not a dry run, which
    plans from configs alone and writes nothing) ``results_dir`` (``(field, directory)``: a sweep's
    ``storage_path`` or its ``--resume`` directory), ``models.cache_dir`` and ``$DISTILLAB_CACHE``.

    Raises:
        ConfigError: every problem found, joined with "; ".
    """
    from distillab.config import ConfigError  # lazy: see the module docstring

    errors = number_errors(SimpleNamespace(**flags)) + env_errors()
    if run:
        dirs = {**dict([results_dir] if results_dir else []), "models.cache_dir": sweep.models.cache_dir}
        if os.environ.get("DISTILLAB_CACHE"):  # torch's compiled extensions (DeepSpeed's) go under it
            dirs["DISTILLAB_CACHE"] = os.environ["DISTILLAB_CACHE"]
        errors += [w for f, d in dirs.items() if (w := storage_error(d, f)) is not None]
    paths = {sweep.models.source_field(r): s.hf for r in ("teacher", "student") if (s := sweep.models.source(r)).hf}
    errors += [w for f, p in paths.items() if (w := checkpoint_files_error(p, f, run)) is not None]
    errors += [w for r in ("teacher", "student") if (w := sweep.models.source_error(r)) is not None]
    if errors:
        raise ConfigError("; ".join(errors))


def preflight(sweep: SweepConfig, note: bool = True) -> None:
    """The checks before anything runs: the checkpoints (`plan.check_checkpoints`: configs
    and tokenizers), the evaluated tasks' test splits (`plan.check_task_data`) and, with ``note``, the bf16-on-CPU note (printed). Imports `plan` and,
    through it, what ``prepare`` and the sweep need (without the integrations distillab never
    uses: `imports.without_unused_integrations`). Raises `config.ConfigError`."""
    with without_unused_integrations():
        from distillab.driver.plan import bf16_cpu_note, check_checkpoints, check_task_data  # lazy: module docstring
    check_checkpoints(sweep)  # before anything starts: configs and tokenizers only
    check_task_data(sweep)  # the evaluated tasks' test splits (a file of your own: there, long enough)
    said = bf16_cpu_note(sweep) if note else None
    if said is not None:
        print(f"distillab: {said}", file=sys.stderr)


def prepare_models(sweep: SweepConfig, threads: int | None = None, force: bool = False,
                   ray_s: float | None = None, started: float | None = None) -> tuple[Path, Path]:
    """``[time] start-up`` (since ``started``, `time.time`: the interpreter, imports, validation,
    checks) and, given ``ray_s`` (a sweep's: Ray started in those seconds), ``[time] ray.init``;
    then `prepare.prepare` (``threads``: torch threads; ``force``: retrain even if cached) and its
    ``[time]`` line. Returns the ``(teacher, student)`` checkpoint directories."""
    from distillab.recipe.prepare import prepare  # lazy: see the module docstring
    from distillab.recipe.telemetry import print_time

    if started is not None:
        print_time("start-up", time.time() - started)  # interpreter, imports, validation, checks
    if ray_s is not None:
        print_time("ray.init", ray_s, note=" (within the start-up above: Ray starts while the checks run)")
    t0 = time.perf_counter()
    out = prepare(sweep, threads=threads, force=force)
    print_time("prepare", time.perf_counter() - t0)
    return out


def plan(sweep: SweepConfig, nodes: int | None = None, node_cpus: float | None = None,
         node_gpus: float | None = None, throughput: float | None = None) -> tuple[str, bool]:
    """The dry run of `distillab.driver.plan.dry_run` on a cluster of ``nodes`` nodes of
    ``node_cpus`` CPUs and ``node_gpus`` GPUs each (default: this machine), the estimate at
    ``throughput`` TFLOP/s per GPU: ``(text, placeable)``. Raises `config.ConfigError` (a bad
    checkpoint)."""
    from distillab.driver.plan import Cluster, dry_run  # lazy: see the module docstring

    here = Cluster.this_machine()
    given = (nodes, node_cpus, node_gpus) != (None, None, None)
    cluster = Cluster(nodes or 1, node_cpus if node_cpus is not None else here.cpus,
                      node_gpus if node_gpus is not None else here.gpus,
                      "the given cluster" if given else here.source)
    return dry_run(sweep, cluster, throughput)


def run_sweep(config_or_path: Any, overrides: Mapping[str, Any] | None = None, *, dry_run: bool = False,
              resume: bool = False, address: str | None = None, dashboard: bool = True, verbose: bool = False,
              threads: int | None = None, force: bool = False, nodes: int | None = None,
              node_cpus: float | None = None, node_gpus: float | None = None, throughput: float | None = None,
              command: str | None = None, started: float | None = None) -> SweepRun:
    """Run a sweep as ``distillab sweep`` does: validate, check every input, start Ray (or connect
    to ``address``), prepare the micro models (cached), run the trials on Ray Tune, print the
    headline table and record the run in the results directory; or, with ``dry_run``, print and
    return the plan and start nothing.

    Args:
        config_or_path: a sweep YAML's path, a built `config.SweepConfig`, or with ``resume`` the
            directory of an interrupted sweep (``<storage_path>/<name>``, whose ``sweep.json`` holds
            its config).
        overrides: dotted config keys → values, applied on top (what ``--set KEY=VALUE`` gives the
            CLI, the values already parsed): ``{"search.grid.optimizer.lr": [1e-3]}``.
        dry_run: validate, check the checkpoints and plan (trials, placement on ``nodes`` x
            (``node_cpus``, ``node_gpus``), GPU-hours at ``throughput`` TFLOP/s); write nothing.
        resume: continue the interrupted sweep ``config_or_path`` (Tune's restore).
        address: a Ray cluster's address (default: ``RAY_ADDRESS`` or a new local Ray, with its
            dashboard unless ``dashboard`` is False). verbose: print everything Ray logs.
        threads, force: torch threads for ``prepare`` and whether to retrain cached micro models.
        command, started: what the run's record names as its command (default: this call) and the
            `time.time` its start-up is timed from (default: this call); the CLI gives its own.

    Returns:
        `SweepRun`: the results directory, the trials completed and expected (a sweep with failed
        or interrupted trials returns too: its results are kept), or the dry run's plan.

    Raises:
        ConfigError: an invalid config or override (unknown key, value not allowed: named with the
            allowed values), a bad number, a directory that cannot hold results, a bad checkpoint,
            or trials no node of the cluster can ever hold; all before any trial starts.
        FileNotFoundError: no such YAML, or a ``resume`` of a directory whose Tune state was never
            written.
    """
    started = time.time() if started is None else started
    # as the CLI: prepare's progress lines (an SFT step every 200) show in a notebook too; a no-op where the
    # caller has configured logging
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    env_defaults(verbose, local_ray=not address and not os.environ.get("RAY_ADDRESS"))
    sweep = sweep_config(config_or_path, overrides, resume)
    flags = {"threads": threads, "nodes": nodes, "node_cpus": node_cpus, "node_gpus": node_gpus,
             "throughput": throughput}
    results = ("--resume", config_or_path) if resume else ("storage_path", sweep.storage_path)
    static_checks(sweep, flags, run=not dry_run, results_dir=results)  # before Ray, prepare, torch's imports
    if dry_run:
        from distillab.driver.sweep import expected_trials  # lazy: see the module docstring

        text, placeable = plan(sweep, nodes, node_cpus, node_gpus, throughput)
        print(text)
        return SweepRun(sweep, None, text, placeable, 0, expected_trials(sweep))
    if command is None:  # the run's record (runs.json) names this call
        given = str(config_or_path) if isinstance(config_or_path, (str, os.PathLike)) else f"<sweep {sweep.name}>"
        command = f"distillab.api.run_sweep({given!r}" + (f", overrides={dict(overrides)!r}" if overrides else "") + (
            ", resume=True)" if resume else ")")
    ray_s = _start(sweep, address, dashboard, verbose)
    return _run(sweep, SimpleNamespace(resume=config_or_path if resume else None, threads=threads, force=force,
                                       verbose=verbose, command=command, started=started), ray_s)


def _start(sweep: SweepConfig, address: str | None, dashboard: bool, verbose: bool) -> float:
    """Ray up, in this, the main thread (where Ray installs its SIGTERM handler), while a second
    thread runs `preflight`: the checkpoint checks and, on the way, the imports of torch,
    transformers, DeepSpeed and Ray Tune. The two overlap (2.2 s of a one-trial run's 26 s,
    ``benchmarks/sweep_overhead.py --trials --steps 40``). A bad checkpoint still stops the run
    before anything is written or trained: Ray, already up, is shut down and `config.ConfigError`
    raised. So does a trial that no node of the connected cluster can ever hold
    (`_check_placeable`). Returns the seconds Ray took to start."""
    import ray  # lazy: see the module docstring

    from distillab.config import ConfigError
    from distillab.driver.raystart import init_ray

    perf0 = time.perf_counter()
    with _start_up_interrupts(), ThreadPoolExecutor(1, thread_name_prefix="preflight") as pool:
        checks = pool.submit(preflight, sweep)
        try:
            init_ray(address, dashboard=dashboard, verbose=2 if verbose else 1,
                     cpu_only=sweep.resources.gpus_per_worker == 0)
            ray_s = time.perf_counter() - perf0
            checks.result()
            _check_placeable(sweep)
        except ConfigError:
            ray.shutdown()
            raise
    return ray_s


@contextmanager
def _start_up_interrupts():
    """Ctrl-C during a sweep's start-up raises KeyboardInterrupt as usual and is also remembered:
    Python drops an exception raised inside a callback it cannot raise from (seen in CI: the
    SIGINT landed in logging's at-fork handler ``_releaseLock`` while Ray forked its processes,
    "Exception ignored", and the sweep ran on), so a remembered one is raised again when the
    start-up ends, before any trial (the CLI's ``main`` then exits 130)."""
    if threading.current_thread() is not threading.main_thread():  # signal handlers live in the main thread
        yield
        return
    hit: list[int] = []

    def interrupt(signum, frame):
        hit.append(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if hit:
        raise KeyboardInterrupt


def _check_placeable(sweep: SweepConfig) -> None:
    """Every trial's resources against the connected cluster's nodes (`plan.unplaceable`),
    before any trial: a trial no node can ever hold would wait for ever. Raises
    `config.ConfigError`."""
    from distillab.config import ConfigError  # lazy: see the module docstring
    from distillab.driver.plan import unplaceable
    from distillab.driver.raystart import node_resources

    why = unplaceable(sweep, node_resources())
    if why is not None:
        raise ConfigError(f"{why} (distillab sweep --dry-run --nodes N --node-cpus C --node-gpus G plans one)")


def _run(sweep: SweepConfig, how: SimpleNamespace, ray_s: float) -> SweepRun:
    """`run_sweep` once Ray is up and the checks passed: `prepare_models`, the sweep (or its
    resume, ``how.resume``), Ray down, the headline table, and the run's record in the sweep
    directory (`tables.record_run`: the command, its start, the code's git commit, the CPU model
    and bf16-product arithmetic (`models.arithmetic`), the stages' wall seconds). ``ray_s``:
    the seconds Ray took to start (`_start`); ``how``: `run_sweep`'s arguments."""
    import ray  # lazy: see the module docstring

    from distillab.driver.sweep import completed_trials, expected_trials, resume_sweep
    from distillab.driver.sweep import run_sweep as tune_sweep
    from distillab.models import arithmetic
    from distillab.recipe.telemetry import STAGE_SECONDS, print_time
    from distillab.tables import code_version, record_run

    STAGE_SECONDS.clear()  # this run's stages only (a notebook may run several)
    try:
        teacher, student = prepare_models(sweep, how.threads, how.force, ray_s, how.started)
        t1 = time.perf_counter()
        root = resume_sweep(how.resume, teacher, student, verbose=2 if how.verbose else 1) if how.resume else \
            tune_sweep(sweep, teacher, student, verbose=2 if how.verbose else 1)
    finally:
        t2 = time.perf_counter()
        ray.shutdown()
    print_time("sweep", ray_s + t2 - t1)  # Ray up to down, less prepare
    print_time("ray.shutdown", time.perf_counter() - t2)
    print_tables(load_results(root), full=False)
    print_time("total", time.time() - how.started, note=f"; results: {root}")
    done = completed_trials(root)
    started_at = datetime.datetime.fromtimestamp(how.started, datetime.timezone.utc).isoformat(timespec="seconds")
    record_run(root, {"command": how.command, "started": started_at, **code_version(), "cpus": os.cpu_count(),
                      **arithmetic(), "trials_completed": done, "seconds": dict(STAGE_SECONDS)})
    return SweepRun(sweep, Path(root), None, True, done, expected_trials(sweep))


def print_tables(res: Results, full: bool) -> None:
    """The headline table (`analysis.plots.summary_table`) or, with ``full``, every final metric
    (`analysis.results.final_table`), both with one row per swept configuration
    (`analysis.results.group_columns`: the study axes that vary, never the seed); then the mean RLVR
    training reward over the first and last 10 steps of each trial that had one."""
    from distillab.analysis.plots import summary_table  # lazy: see the module docstring
    from distillab.analysis.results import final_table, format_table, group_columns, rlvr_reward_summary

    table = final_table(res, group_by=group_columns(res)) if full else summary_table(res)
    print(format_table(table), flush=True)
    summary = rlvr_reward_summary(res)
    if summary.height:
        print("RLVR mean training reward, first 10 vs last 10 steps:")
        for r in summary.iter_rows(named=True):
            print(f"  {r['trial_id']}: {r['first']:.3f} -> {r['last']:.3f} ({r['change']:+.3f}, {r['steps']} steps)")


# --------------------------------------------------------------------------- results and findings


def not_sweeps(what: str, paths: Sequence[str | os.PathLike[str]]) -> OSError | None:
    """Why ``paths`` cannot be read as sweep directories, as the error to raise (its message
    starts with ``what``, the command or function that reads them), or None:
    `NotADirectoryError` for a file (e.g. the sweep's YAML), `FileNotFoundError` for a missing
    path or a directory with no ``sweep.json`` and no trials table."""
    from distillab.analysis.results import is_sweep_dir  # lazy: see the module docstring

    files = [str(p) for p in paths if Path(p).is_file()]
    if files:
        return NotADirectoryError(f"{what}: {', '.join(files)}: a file, not a sweep directory; {what} reads the "
                                  f"results a sweep wrote to <storage_path>/<name>/, e.g. runs/micro")
    missing = [str(p) for p in paths if not Path(p).is_dir()]
    if missing:
        return FileNotFoundError(f"{what}: no such sweep directory: {', '.join(missing)}")
    other = [str(p) for p in paths if not is_sweep_dir(p)]
    if other:
        return FileNotFoundError(f"{what}: not a sweep directory (no sweep.json, no trials table): "
                                 f"{', '.join(other)}; a sweep writes its results to <storage_path>/<name>/, "
                                 f"e.g. runs/micro")
    return None


def _paths(path: Any) -> list[str | os.PathLike[str]]:
    return [path] if isinstance(path, (str, os.PathLike)) else list(path)


def load_results(path: Any) -> Results:
    """The tables of a sweep directory, as ``distillab report`` reads them
    (`distillab.analysis.results.load`): ``trials``, ``metrics``, ``evals`` and ``samples``, each a
    ``polars.LazyFrame`` (``.collect()`` it; a missing table is empty, with its schema).

    Args:
        path: a sweep directory (``<storage_path>/<name>``, e.g. `SweepRun.path`), or a list of
            them: then concatenated, with a leading ``sweep`` column (the directory's name).

    Raises:
        FileNotFoundError: a path is missing, or a directory with no ``sweep.json`` and no trials table.
        NotADirectoryError: a path is a file (e.g. the sweep's YAML).
        ValueError: an empty list, or two directories with the same name.
    """
    from distillab.analysis.results import load  # lazy: see the module docstring

    paths = _paths(path)
    err = not_sweeps("load_results", paths)
    if err is not None:
        raise err
    return load(paths[0] if isinstance(path, (str, os.PathLike)) else paths)


@dataclass(frozen=True)
class Findings:
    """What `findings` returns: PROTOCOL.md §9's verdicts on F1–F5 and what they were decided on.

    Attributes:
        verdicts: ``{group: [Verdict, ...]}`` (`analysis.findings.decide`): ``"all"``, or one group
            per value of the ``by`` column; each `analysis.verdicts.Verdict` holds its clauses
            and their statistics.
        results: the tables they were decided on (`load_results`).
        sources: the sweep directories read. by, task: as given to `findings`.
    """

    verdicts: dict[str, list[Verdict]]
    results: Results
    sources: tuple[str, ...]
    by: str | None
    task: str

    @property
    def table(self) -> pl.DataFrame:
        """One row per group and finding: ``group``, ``finding`` (F1…F5), ``verdict`` ("reproduced",
        "not reproduced", "inconclusive"), ``confidence`` (§9.1: the share of redraws giving the
        same verdict, Float64; null when inconclusive), ``firm`` (confidence ≥ 0.9; null when
        inconclusive), ``replication`` (Float64), ``reason`` (one line, as findings.md's verdict
        table gives it) and ``claim`` (the finding's statement)."""
        import polars as pl  # lazy: see the module docstring

        from distillab.analysis.findings import FIRM, reason

        rows = [{"group": g, "finding": v.finding, "verdict": v.verdict, "confidence": v.confidence,
                 "firm": None if v.confidence is None else v.confidence >= FIRM, "replication": v.replication,
                 "reason": reason(v), "claim": v.claim} for g, vs in self.verdicts.items() for v in vs]
        schema = {"group": pl.String, "finding": pl.String, "verdict": pl.String, "confidence": pl.Float64,
                  "firm": pl.Boolean, "replication": pl.Float64, "reason": pl.String, "claim": pl.String}
        return pl.DataFrame(rows, schema=schema)

    def text(self) -> str:
        """The verdicts as ``distillab findings`` prints them (`analysis.findings.format_verdicts`)."""
        from distillab.analysis.findings import format_verdicts  # lazy: see the module docstring

        return format_verdicts(self.verdicts)

    def write(self, out_dir: str | os.PathLike[str]) -> dict[str, Path]:
        """Write ``<out_dir>/findings.md`` and its figures (`analysis.findings.write_findings`);
        returns ``{figure stem: png path, ..., "findings": md path}``. Raises OSError (an
        unwritable ``out_dir``)."""
        from distillab.analysis.findings import write_findings  # lazy: see the module docstring

        return write_findings(self.results, out_dir, self.verdicts, list(self.sources), by=self.by, task=self.task)

    def __str__(self) -> str:
        return self.text()


def findings(path: Any, *, by: str | None = None, only: Sequence[str] | None = None,
             task: str = "countdown3") -> Findings:
    """PROTOCOL.md §9's verdicts on findings F1–F5 of the sweep directory ``path``, each with its
    §9.1 confidence: the computation of ``distillab findings`` (`analysis.findings.decide`), as data.

    Args:
        path: a sweep directory or a list of them (as `load_results`).
        by: decide per value of a trials column: ``"sweep"`` (one group per directory) or a config
            column such as ``"loss.estimator"``; default one group, ``"all"``.
        only: the findings to decide (e.g. ``["F1", "F4"]``); default all five.
        task: the task acc, pass@1 and pass@10 are read on (§9: ``countdown3``).

    Returns:
        `Findings`: ``.table`` (a Polars frame: verdict, confidence and reason per finding),
        ``.verdicts`` (with every clause's statistics), ``.text()``, ``.write(out_dir)``.

    Raises:
        FileNotFoundError, NotADirectoryError: as `load_results`.
        ValueError: an unknown finding, ``by`` not a trials column, or ``task`` not scored for
            accuracy in these sweeps (each names the allowed values).
    """
    from distillab.analysis.findings import decide  # lazy: see the module docstring

    paths = _paths(path)
    err = not_sweeps("findings", paths)
    if err is not None:
        raise err
    res = load_results(path)
    result = decide(res, by=by, only=list(only) if only else None, task=task)
    return Findings(result, res, tuple(str(p) for p in paths), by, task)
