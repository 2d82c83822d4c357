"""The ``distillab`` command.

    distillab prepare search_spaces/micro.yaml      # train + cache the micro teacher/student
    distillab sweep   search_spaces/micro.yaml      # prepare (cached) + Ray Tune sweep + report
    distillab sweep   --resume runs/micro           # continue an interrupted sweep (Tuner.restore)
    distillab sweep   search_spaces/micro.yaml --dry-run   # check, place and cost the sweep; start nothing
    distillab report  runs/micro                    # headline metrics per configuration, mean ± SEM
    distillab report  runs/micro --full             # every stage × task × metric
    distillab report  runs/micro --plots docs/figures   # + figures (PNG) and summary.md
    distillab findings runs/micro_findings          # PROTOCOL.md §9 verdicts on F1-F5, findings.md + figures

A sweep's console is calm by default: the Tune progress table, one line per finished
stage of each trial, errors and the closing tables; Ray's known-harmless lines are
dropped before they print (they stay in Ray's session logs) and Ray Train logs warnings
only. ``--verbose`` prints everything.

For developers: the dropped lines are `HARMLESS_RAY_LINES`; the stage lines are
`NEVER_DEDUPLICATED_LINES` (printed as they arrive, in order). Lazy imports: every
``distillab`` module (config, plan, prepare, sweep, results, plots) and
``ray`` are imported inside the subcommand that uses them, so that ``distillab --help``
and a mistyped command answer at once: 0.04-0.08 s, against 13-17 s with them at
module top (they pull in torch, transformers, DeepSpeed, Ray Tune and matplotlib;
``/usr/bin/time distillab --help`` vs ``python -c "import distillab.driver.cli,
distillab.driver.sweep, distillab.recipe.prepare, distillab.analysis.plots, ray"``, 2 shared cores).
The import-order test (tests/test_imports.py) allows them here only.
"""

from __future__ import annotations

import argparse
import atexit
import datetime
import logging
import os
import shlex
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import yaml

from distillab.driver.checks import (  # the standard library only
    checkpoint_files_error,
    env_errors,
    number_errors,
    storage_error,
)
from distillab.driver.imports import without_unused_integrations  # the standard library only: no cost at start-up

#: Lines of Ray's forwarded worker logs that a calm console drops (``RAY_DEDUP_LOGS_SKIP_REGEX``, read
#: when ray is imported; Ray's session logs keep them). Each is known to be harmless:
HARMLESS_RAY_LINES = (
    # Ray Train's PlacementGroupCleaner asks the state API, which the dashboard serves, about its
    # controller every second; without a dashboard (--no-dashboard) it cannot, and says so each time
    r"Failed to query Ray Train Controller actor state",
    # the raylet's note that more worker processes started than it expects at once: every trial
    # starts several actors (Tune trial, Train controller and its helpers, workers)
    r"PYTHON worker processes have been started on node",
    # Ray core's note that an actor would not survive losing its constructor's arguments: Ray Train's
    # PreemptionWatcher (restarted with its run instead) and, with tracking.wandb, Ray's W&B logging actor
    r"Actor with class name: '(?:PreemptionWatcher|_WandbLoggingActor)' .*constructor arguments in the object store",
    # wandb's deprecation note on the `reinit=True` that Ray's WandbLoggerCallback passes
    r"wandb: WARNING Using a boolean value for 'reinit' is deprecated",
    # DeepSpeed's print after loading its CPU shared-memory collective (compiled once, loaded by every worker)
    r"DeepSpeed deepspeed\.ops\.comm\.deepspeed_shm_comm_op built successfully",
    # abseil's trace of a mutex wait in Ray's core worker (seen from Ray Train's PlacementGroupCleaner):
    # "[mutex.cc : 452] RAW: Lock blocking 0x... @": a debug note, not an error
    r"\[mutex\.cc : \d+\] RAW: Lock blocking",
)


#: Lines of Ray's forwarded worker logs that are never deduplicated (``RAY_DEDUP_LOGS_ALLOW_REGEX``, read
#: when ray is imported): a trial's stage line (`evals.suite.stage_line`). Ray's deduplicator keys a
#: line on its words without digits, so two trials' lines for one stage look alike: from a second
#: process within ``RAY_DEDUP_LOGS_AGG_WINDOW_S`` (5 s) it held the line back (it printed after the
#: sweep's end), and from a third it would print one "[repeated Nx across cluster]" line for them all
NEVER_DEDUPLICATED_LINES = (r"\[trial\] ",)


def any_of(patterns: tuple[str, ...]) -> str:
    """One regular expression matching any of ``patterns`` (Ray's ``RAY_DEDUP_LOGS_*_REGEX`` take one)."""
    return "|".join(f"(?:{p})" for p in patterns)


def help_text(doc: str) -> str:
    """``distillab --help``'s description: the module docstring up to its paragraph for
    developers (from "For developers:"), reST's double backquotes printed as single ones."""
    return doc.split("\n\nFor developers:")[0].strip().replace("``", "`")


#: files that exist where a GPU driver is loaded (NVIDIA's; ROCm's kernel driver): without them torch sees no GPU
GPU_DRIVER_FILES = ("/proc/driver/nvidia/version", "/dev/kfd")


def _env_defaults(verbose: bool = False, local_ray: bool = False) -> None:
    cache = Path(os.environ.get("DISTILLAB_CACHE", ".cache")).resolve()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(cache / "torch_extensions"))
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    if not any(Path(d).exists() for d in GPU_DRIVER_FILES):  # no GPU driver: DeepSpeed's CPU accelerator, said
        os.environ.setdefault("DS_ACCELERATOR", "cpu")      # before anything imports it (else it warns on each run)
    # token authentication, Ray's default for a new local cluster, said before ray is imported (so
    # without its "Token authentication is enabled"); once imported (main() called in-process, as in
    # the tests), Ray has read its mode and a new one would reach only the cluster's processes
    if local_ray and "ray" not in sys.modules:
        os.environ.setdefault("RAY_AUTH_MODE", "token")
    if not sys.stdout.isatty():  # a file or a pipe: Ray's worker-log prefixes without ANSI colour codes
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")
    if verbose:  # every line of every worker, undeduplicated
        os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    else:
        os.environ.setdefault("RAY_DEDUP_LOGS_SKIP_REGEX", any_of(HARMLESS_RAY_LINES))
        os.environ.setdefault("RAY_DEDUP_LOGS_ALLOW_REGEX", any_of(NEVER_DEDUPLICATED_LINES))
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # micro models load in milliseconds
        os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # tracking.mlflow: its store's set-up notes
        # Tune's "The `on_step_begin` operation took 0.697 s, which may be a performance bottleneck"
        # (its default threshold is 0.5 s; on a loaded machine the driver shares the cores with the
        # trials): said from 5 s on, where a driver stall is worth a line
        os.environ.setdefault("TUNE_WARN_THRESHOLD_S", "5")


def parse_overrides(pairs: list[str]) -> dict:
    """``--set`` pairs ``KEY=VALUE`` → ``{dotted key: value}``, each value read as YAML
    (safe loading: ``true``, ``1e-3``, ``[a, b]``, ``{k: v}``). Raises `config.ConfigError`
    for a pair without ``=`` or a value that is not YAML (a syntax error, a key given twice)."""
    from distillab.config import ConfigError, load_yaml, yaml_error_line  # lazy: see the module docstring

    out = {}
    for p in pairs:
        if "=" not in p:
            raise ConfigError(f"--set expects KEY=VALUE (e.g. --set trial.loss.kind=reverse), got {p!r}")
        k, v = p.split("=", 1)
        try:
            out[k] = load_yaml(v)  # safe loading, duplicate keys refused
        except yaml.YAMLError as e:
            raise ConfigError(f"--set {p}: the value is not valid YAML: {yaml_error_line(e)}") from None
    return out


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="distillab", description=help_text(__doc__ or ""),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    helps = {"prepare": "train and cache the sweep's micro teacher and student (skipped when cached)",
             "sweep": "prepare, then run the Ray Tune sweep and print the report (--dry-run: plan only)"}
    for name in ("prepare", "sweep"):
        p = sub.add_parser(name, help=helps[name])
        p.add_argument("config", nargs="?" if name == "sweep" else None, help="sweep YAML")
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field (dotted)")
        p.add_argument("--threads", type=int, default=None, help="torch threads for prepare (default: all cores)")
        p.add_argument("--force", action="store_true", help="retrain the micro models even if cached")
        p.add_argument("--verbose", action="store_true",
                       help="print everything Ray, Ray Train and Tune log (default: the calm console)")
    sw = sub.choices["sweep"]
    sw.add_argument("--address", default=None, help="Ray cluster address (default: RAY_ADDRESS or a local Ray)")
    sw.add_argument("--no-dashboard", action="store_true", help="local Ray without the dashboard")
    sw.add_argument("--resume", metavar="PATH", default=None,
                    help="continue an interrupted sweep from its directory (<storage_path>/<name>); no config needed")
    _add_dry_run_args(sw)
    rp = sub.add_parser("report", help="a sweep's results: the headline table, --full, --plots")
    rp.add_argument("path", nargs="+", help="sweep directories (<storage_path>/<name>)")
    rp.add_argument("--plots", metavar="DIR", default=None,
                    help="also write the figures (PNG) and summary.md into DIR")
    rp.add_argument("--full", action="store_true",
                    help="the full table: every stage x task x metric (default: the headline table)")
    fd = sub.add_parser("findings", help="decide PROTOCOL.md §9's verdicts on findings F1-F5")
    fd.add_argument("path", nargs="+", help="sweep directories (<storage_path>/<name>)")
    fd.add_argument("--out", metavar="DIR", default=None, help="where findings.md and the figures go "
                    "(default: the first sweep directory)")
    fd.add_argument("--by", metavar="COLUMN", default=None, help="decide per value of a trials column: sweep "
                    "(one group per directory) or a config column such as loss.estimator (ablations)")
    fd.add_argument("--task", metavar="NAME", default="countdown3",
                    help="the task acc, pass@1 and pass@10 are read on (default countdown3, as PROTOCOL.md §9; "
                         "math for search_spaces/micro_math.yaml)")
    fd.add_argument("--only", metavar="F1,F4", default=None, help="decide only these findings")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``distillab`` console script. Ctrl-C before the sweep runs (Tune
    handles its own) ends with one line and exit status 130."""
    args = _parser().parse_args(argv)
    try:
        return _main(args)
    except KeyboardInterrupt:
        if "ray" in sys.modules and sys.modules["ray"].is_initialized():
            sys.modules["ray"].shutdown()
        print("distillab: interrupted (Ctrl-C); nothing half-written (a sweep already under way continues with "
              "distillab sweep --resume <storage_path>/<name>)", file=sys.stderr)
        return 130


def _main(args) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    _env_defaults(getattr(args, "verbose", False),
                  local_ray=args.cmd == "sweep" and not args.address and not os.environ.get("RAY_ADDRESS"))
    if args.cmd == "report":
        return _report(args)
    if args.cmd == "findings":
        return _findings(args)
    from distillab.config import ConfigError  # lazy: see the module docstring

    try:
        sweep = _load(args)
        static_checks(args, sweep)  # before anything starts (Ray, prepare, the imports of torch)
    except (ConfigError, FileNotFoundError) as e:
        print(f"distillab: {e}", file=sys.stderr)
        return 2
    if getattr(args, "dry_run", False):
        return _dry_run(args, sweep)
    if args.cmd == "prepare":
        try:
            _preflight(sweep, note=False)
        except ConfigError as e:
            print(f"distillab: {e}", file=sys.stderr)
            return 2
        teacher, student = _prepare(args, sweep)
        print(f"teacher: {teacher}\nstudent: {student}")
        return 0
    return _sweep(args, sweep)


def _load(args):
    """The validated sweep config of ``args``: the YAML with its ``--set`` overrides, or with
    ``--resume`` the sweep directory's ``sweep.json``. Raises `config.ConfigError`."""
    from distillab.config import ConfigError, load_sweep  # lazy: see the module docstring
    from distillab.tasks import registry  # noqa: F401  (lazy: every task module registers its section first)

    resume = getattr(args, "resume", None)
    if resume:
        if args.config or args.set:
            raise ConfigError("--resume takes the sweep directory only (its sweep.json holds the config)")
        return load_resumable(resume)
    if not args.config:
        raise ConfigError("sweep needs a config YAML (or --resume PATH)")
    return load_sweep(args.config, parse_overrides(args.set))


def static_checks(args, sweep) -> None:
    """What `checks` can say without Ray or torch, every bad input in one line: the numeric
    flags, the environment switches, the checkpoint folders' files (config, tokenizer and,
    for a run, weights), a GGUF source's file (its package installed and holding it), and for a run (not ``--dry-run``, which plans from configs alone and
    writes nothing) ``storage_path`` (or the ``--resume`` directory), ``models.cache_dir`` and
    ``$DISTILLAB_CACHE``. Raises `config.ConfigError`."""
    from distillab.config import ConfigError  # lazy: see the module docstring

    errors, run = number_errors(args) + env_errors(), not getattr(args, "dry_run", False)
    if run:
        resume = getattr(args, "resume", None)
        dirs = {"models.cache_dir": sweep.models.cache_dir}
        if args.cmd == "sweep":
            dirs = {"--resume" if resume else "storage_path": resume or sweep.storage_path, **dirs}
        if os.environ.get("DISTILLAB_CACHE"):  # torch's compiled extensions (DeepSpeed's) go under it
            dirs["DISTILLAB_CACHE"] = os.environ["DISTILLAB_CACHE"]
        errors += [w for f, d in dirs.items() if (w := storage_error(d, f)) is not None]
    paths = {sweep.models.source_field(r): s.hf for r in ("teacher", "student") if (s := sweep.models.source(r)).hf}
    errors += [w for f, p in paths.items() if (w := checkpoint_files_error(p, f, run)) is not None]
    errors += [w for r in ("teacher", "student") if (w := sweep.models.source_error(r)) is not None]
    if errors:
        raise ConfigError("; ".join(errors))


def _preflight(sweep, note: bool = True) -> None:
    """The checks before anything runs: the checkpoints (`plan.check_checkpoints`: configs
    and tokenizers) and, with ``note``, the bf16-on-CPU note (printed). Imports `plan` and,
    through it, what ``prepare`` and the sweep need (without the integrations distillab never
    uses: `imports.without_unused_integrations`). Raises `config.ConfigError`."""
    with without_unused_integrations():
        from distillab.driver.plan import bf16_cpu_note, check_checkpoints  # lazy: see the module docstring
    check_checkpoints(sweep)  # before anything starts: configs and tokenizers only
    said = bf16_cpu_note(sweep) if note else None
    if said is not None:
        print(f"distillab: {said}", file=sys.stderr)


def _prepare(args, sweep, ray_s: float | None = None):
    """``[time] start-up`` (interpreter, imports, validation, checks) and, given ``ray_s``
    (a sweep's: Ray started in those seconds, `_sweep`), ``[time] ray.init``; then
    `prepare.prepare` and its ``[time]`` line. Returns ``(teacher, student)`` directories."""
    from distillab.recipe.prepare import prepare  # lazy: see the module docstring
    from distillab.recipe.telemetry import print_time, process_start_time

    started = process_start_time()
    if started is not None:
        print_time("start-up", time.time() - started)  # interpreter, imports, validation, checks
    if ray_s is not None:
        print_time("ray.init", ray_s, note=" (within the start-up above: Ray starts while the checks run)")
    t0 = time.perf_counter()
    out = prepare(sweep, threads=args.threads, force=args.force)
    print_time("prepare", time.perf_counter() - t0)
    return out


def _add_dry_run_args(sw: argparse.ArgumentParser) -> None:
    sw.add_argument("--dry-run", action="store_true",
                    help="validate, check the checkpoints, print the trials, their placement and a GPU-hour "
                         "estimate; start nothing (exit 1 if the trials can never be placed on the cluster)")
    sw.add_argument("--nodes", type=int, default=None, help="--dry-run: nodes of the cluster (default: this machine)")
    sw.add_argument("--node-cpus", type=float, default=None, help="--dry-run: CPUs per node")
    sw.add_argument("--node-gpus", type=float, default=None, help="--dry-run: GPUs per node")
    sw.add_argument("--throughput", type=float, default=None, metavar="TFLOPS",
                    help="--dry-run: effective TFLOP/s per GPU for the estimate (default: distillab.driver.plan.ASSUMED_TFLOPS)")


def _dry_run(args, sweep) -> int:
    """``distillab sweep --dry-run``: the plan of `distillab.driver.plan.dry_run`; exit 2 for a bad
    checkpoint, 1 when the trials can never be placed on the cluster, else 0."""
    from distillab.config import ConfigError  # lazy: see the module docstring
    from distillab.driver.plan import Cluster, dry_run

    here = Cluster.this_machine()
    given = (args.nodes, args.node_cpus, args.node_gpus) != (None, None, None)
    cluster = Cluster(args.nodes or 1, args.node_cpus if args.node_cpus is not None else here.cpus,
                      args.node_gpus if args.node_gpus is not None else here.gpus,
                      "the given cluster" if given else here.source)
    try:
        text, placeable = dry_run(sweep, cluster, args.throughput)
    except ConfigError as e:
        print(f"distillab: {e}", file=sys.stderr)
        return 2
    print(text)
    return 0 if placeable else 1


def _not_sweeps(cmd: str, paths: list[str]) -> str | None:
    """Why ``paths`` cannot be read as sweep directories (missing, or no sweep.json and no
    trials table), or None."""
    from distillab.analysis.results import is_sweep_dir  # lazy: see the module docstring

    files = [p for p in paths if Path(p).is_file()]
    if files:  # e.g. the sweep's YAML
        return (f"distillab: {cmd}: {', '.join(files)}: a file, not a sweep directory; {cmd} reads the results a "
                f"sweep wrote to <storage_path>/<name>/, e.g. runs/micro")
    missing = [p for p in paths if not Path(p).is_dir()]
    if missing:
        return f"distillab: {cmd}: no such sweep directory: {', '.join(missing)}"
    other = [p for p in paths if not is_sweep_dir(p)]
    if other:
        return (f"distillab: {cmd}: not a sweep directory (no sweep.json, no trials table): {', '.join(other)}; "
                f"a sweep writes its results to <storage_path>/<name>/, e.g. runs/micro")
    return None


def _report(args) -> int:
    """``distillab report``: the headline table (``--full``: every final metric), RLVR
    rewards, and with ``--plots`` the figures."""
    from distillab.analysis.plots import write_report  # lazy: see the module docstring
    from distillab.analysis.results import load

    why = _not_sweeps("report", args.path) or (storage_error(args.plots, "report --plots") if args.plots else None)
    if why is not None:
        print(why if why.startswith("distillab:") else f"distillab: {why}", file=sys.stderr)
        return 2
    res = load(args.path if len(args.path) > 1 else args.path[0])
    _print_tables(res, full=args.full)
    if args.plots:
        try:
            written = write_report(res, args.plots)  # grouped by the swept config fields
        except OSError as e:  # the folder went away or became unwritable since the check
            print(f"distillab: report --plots: {args.plots}: {e.strerror or e}", file=sys.stderr)
            return 2
        print(f"figures: {', '.join(str(p) for k, p in written.items() if k != 'summary')}")
        print(f"summary: {written['summary']}")
    return 0


def _findings(args) -> int:
    """``distillab findings``: the verdicts with their statistics, then findings.md and figures."""
    from distillab.analysis.findings import decide, format_verdicts, write_findings  # lazy: see the module docstring
    from distillab.analysis.results import load
    from distillab.recipe.telemetry import print_time

    t0 = time.perf_counter()
    why = _not_sweeps("findings", args.path) or (storage_error(args.out, "findings --out") if args.out else None)
    if why is not None:
        print(why if why.startswith("distillab:") else f"distillab: {why}", file=sys.stderr)
        return 2
    res = load(args.path if len(args.path) > 1 else args.path[0])
    try:
        result = decide(res, by=args.by, only=args.only.split(",") if args.only else None, task=args.task)
    except ValueError as e:  # an unknown --by column, finding or task
        print(f"distillab: findings: {e}", file=sys.stderr)
        return 2
    if args.task != "countdown3":
        print(f"acc, pass@1 and pass@10 are read on task {args.task} in place of Countdown-3 (--task {args.task}); "
              "the rules are otherwise PROTOCOL.md §9's as written")
    print(format_verdicts(result))
    written = write_findings(res, args.out or args.path[0], result, args.path, by=args.by, task=args.task)
    print(f"findings: {written['findings']}")
    print_time("findings", time.perf_counter() - t0, 0)
    return 0


def _sweep(args, sweep) -> int:
    """``distillab sweep``: Ray up, `prepare`, the sweep (or its resume), Ray down, the
    report, and the run's record in the sweep directory (`tables.record_run`: the command,
    its start, the code's git commit, the CPU model and bf16-product arithmetic
    (`models.arithmetic`), the stages' wall seconds).

    Ray starts in this, the main thread (where Ray installs its SIGTERM handler), while a
    second thread runs `_preflight`: the checkpoint checks and, on the way, the imports of
    torch, transformers, DeepSpeed and Ray Tune. The two overlap (issue 14: 2.2 s of a
    one-trial run's 26 s, ``benchmarks/sweep_overhead.py --trials --steps 40``). A bad
    checkpoint still stops the run before anything is written or trained: Ray, already up,
    is shut down and the exit status is 2. So does a trial that no node of the connected
    cluster can ever hold (`_check_placeable`; what `static_checks` can say without Ray was
    said before it started). Exit 1 when trials failed or the sweep was interrupted."""
    import ray  # lazy: see the module docstring

    from distillab.config import ConfigError
    from distillab.driver.raystart import init_ray

    verbose, perf0, wall0 = 2 if args.verbose else 1, time.perf_counter(), time.time()
    with _start_up_interrupts(), ThreadPoolExecutor(1, thread_name_prefix="preflight") as pool:
        checks = pool.submit(_preflight, sweep)
        try:
            init_ray(args.address, dashboard=not args.no_dashboard, verbose=verbose,
                     cpu_only=sweep.resources.gpus_per_worker == 0)
            ray_s = time.perf_counter() - perf0
            checks.result()
            _check_placeable(sweep)
        except ConfigError as e:
            ray.shutdown()
            print(f"distillab: {e}", file=sys.stderr)
            return 2
    try:
        return _run_sweep(args, sweep, verbose, ray_s, perf0, wall0)
    finally:
        ray.shutdown()


@contextmanager
def _start_up_interrupts():
    """Ctrl-C during a sweep's start-up raises KeyboardInterrupt as usual and is also remembered:
    Python drops an exception raised inside a callback it cannot raise from (seen in CI: the
    SIGINT landed in logging's at-fork handler ``_releaseLock`` while Ray forked its processes,
    "Exception ignored", and the sweep ran on), so a remembered one is raised again when the
    start-up ends, before any trial (`main` then exits 130)."""
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


def _check_placeable(sweep) -> None:
    """Every trial's resources against the connected cluster's nodes (`plan.unplaceable`),
    before any trial: a trial no node can ever hold would wait for ever. Raises
    `config.ConfigError`."""
    from distillab.config import ConfigError  # lazy: see the module docstring
    from distillab.driver.plan import unplaceable
    from distillab.driver.raystart import node_resources

    why = unplaceable(sweep, node_resources())
    if why is not None:
        raise ConfigError(f"{why} (distillab sweep --dry-run --nodes N --node-cpus C --node-gpus G plans one)")


def _run_sweep(args, sweep, verbose: int, ray_s: float, perf0: float, wall0: float) -> int:
    """`_sweep` once Ray is up and the checks passed (``ray_s``: seconds of Ray's start,
    from ``perf0``/``wall0``, `time.perf_counter`/`time.time` when it began)."""
    import ray  # lazy: see the module docstring

    from distillab.analysis.results import load
    from distillab.driver.sweep import completed_trials, expected_trials, resume_sweep, run_sweep
    from distillab.models import arithmetic
    from distillab.recipe.telemetry import STAGE_SECONDS, print_time, process_start_time
    from distillab.tables import code_version, record_run

    teacher, student = _prepare(args, sweep, ray_s)
    t1 = time.perf_counter()
    try:
        root = resume_sweep(args.resume, teacher, student, verbose=verbose) if args.resume else \
            run_sweep(sweep, teacher, student, verbose=verbose)
    except FileNotFoundError as e:  # --resume of a directory whose Tune state was never written
        print(f"distillab: {e}", file=sys.stderr)
        return 2
    finally:
        t2 = time.perf_counter()
        ray.shutdown()
    print_time("sweep", ray_s + t2 - t1)  # Ray up to down, less prepare
    print_time("ray.shutdown", time.perf_counter() - t2)
    _print_tables(load(root), full=False)
    started = process_start_time()
    t0 = perf0 - (wall0 - started) if started is not None else perf0  # perf_counter at the process's start
    print_time("total", time.perf_counter() - t0, note=f"; results: {root}")
    done = completed_trials(root)
    started_at = datetime.datetime.fromtimestamp(started or wall0, datetime.timezone.utc).isoformat(timespec="seconds")
    record_run(root, {"command": shlex.join(["distillab", *sys.argv[1:]]), "started": started_at, **code_version(),
                      "cpus": os.cpu_count(), **arithmetic(), "trials_completed": done, "seconds": dict(STAGE_SECONDS)})
    return 0 if done >= expected_trials(sweep) else 1  # interrupted or failed trials


def _print_tables(res, full: bool) -> None:
    """The headline table (`analysis.plots.summary_table`) or, with ``full``, every final metric
    (`analysis.results.final_table`), both with one row per swept configuration
    (`analysis.results.group_columns`: the study axes that vary, never the seed); then the RLVR rewards."""
    from distillab.analysis.plots import summary_table  # lazy: see the module docstring
    from distillab.analysis.results import final_table, format_table, group_columns

    table = final_table(res, group_by=group_columns(res)) if full else summary_table(res)
    print(format_table(table), flush=True)
    _print_rlvr_rewards(res)


def _print_rlvr_rewards(res) -> None:
    """Mean RLVR training reward over the first and last 10 steps of each trial that had one."""
    from distillab.analysis.results import rlvr_reward_summary  # lazy: see the module docstring

    summary = rlvr_reward_summary(res)
    if summary.height:
        print("RLVR mean training reward, first 10 vs last 10 steps:")
        for r in summary.iter_rows(named=True):
            print(f"  {r['trial_id']}: {r['first']:.3f} -> {r['last']:.3f} ({r['change']:+.3f}, {r['steps']} steps)")


def load_resumable(path: str):
    """The validated config of the sweep directory ``path`` (`config.SweepConfig.saved`).

    Raises:
        ConfigError: no ``sweep.json`` there, or it does not validate (the message starts ``--resume``).
    """
    from distillab.config import ConfigError, SweepConfig  # lazy: see the module docstring

    try:
        return SweepConfig.saved(path)
    except ConfigError as e:
        raise ConfigError(f"--resume {e}") from None


def run() -> None:
    """The ``distillab`` console script (and ``python -m distillab.driver.cli``): `main`, then the
    process ends at once with its exit status.

    Python's own end of a process that has imported torch, transformers, DeepSpeed and Ray
    frees every object of every module one by one: 1.5-1.7 s after the work is done (``python
    -c "import distillab.driver.plan"`` against the same ending in ``os._exit(0)``, 2026-12-04; its
    ``atexit`` handlers take 0.03 s of it). `run` first does what that ending does for the
    work's sake: it waits for any thread still running, runs the ``atexit`` handlers (Ray's
    shutdown, the trackers' and logging's flushes) and flushes stdout and stderr; then
    ``os._exit``. An exception out of `main` ends the process the usual way, with its traceback."""
    status = main()
    for t in threading.enumerate():
        if t is not threading.current_thread() and not t.daemon:
            t.join()
    atexit._run_exitfuncs()  # CPython's own atexit runner: the handlers, in their order, each once
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status or 0)


if __name__ == "__main__":
    run()
