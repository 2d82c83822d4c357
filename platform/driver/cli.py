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
import logging
import os
import shlex
import sys
import threading
import time

import yaml

from distillab.driver.api import (  # its imports of distillab's modules and ray are lazy, as here
    RESUME_ONLY,
    findings,
    load_results,
    not_sweeps,
    preflight,
    prepare_models,
    print_tables,
    run_sweep,
    static_checks,
    sweep_config,
)
from distillab.driver.checks import NUMBER_FLAGS, storage_error  # the standard library only
from distillab.driver.environ import env_defaults  # the standard library only


def help_text(doc: str) -> str:
    """``distillab --help``'s description: the module docstring up to its paragraph for
    developers (from "For developers:"), reST's double backquotes printed as single ones."""
    return doc.split("\n\nFor developers:")[0].strip().replace("``", "`")


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
    env_defaults(getattr(args, "verbose", False),
                 local_ray=args.cmd == "sweep" and not args.address and not os.environ.get("RAY_ADDRESS"))
    if args.cmd == "report":
        return _report(args)
    if args.cmd == "findings":
        return _findings(args)
    from distillab.config import ConfigError  # lazy: see the module docstring

    try:
        if args.cmd == "sweep":
            return _sweep(args)
        return _prepare(args)
    except (ConfigError, FileNotFoundError) as e:
        print(f"distillab: {e}", file=sys.stderr)
        return 2


def _flags(args) -> dict:
    """The numeric flags of ``args`` by their destinations (`checks.NUMBER_FLAGS`)."""
    return {dest: getattr(args, dest, None) for dest, _, _ in NUMBER_FLAGS.values()}


def _prepare(args) -> int:
    """``distillab prepare``: the checks of `api.static_checks` and `api.preflight`, then
    `api.prepare_models`. Raises `config.ConfigError`, FileNotFoundError (a missing YAML)."""
    sweep = sweep_config(args.config, parse_overrides(args.set))
    static_checks(sweep, _flags(args), run=True)  # before anything starts (prepare, the imports of torch)
    preflight(sweep, note=False)
    from distillab.recipe.telemetry import process_start_time  # lazy: see the module docstring

    teacher, student = prepare_models(sweep, args.threads, args.force, started=process_start_time())
    print(f"teacher: {teacher}\nstudent: {student}")
    return 0


def _sweep(args) -> int:
    """``distillab sweep``: `api.run_sweep` with the flags; exit 0, or 1 when trials failed or the
    sweep was interrupted (a dry run: when the trials can never be placed on the cluster). Raises
    `config.ConfigError`, FileNotFoundError (exit 2 in `_main`)."""
    if args.resume and (args.config or args.set):
        from distillab.config import ConfigError  # lazy: see the module docstring

        raise ConfigError(RESUME_ONLY)
    overrides = parse_overrides(args.set)
    from distillab.recipe.telemetry import process_start_time  # lazy: see the module docstring

    run = run_sweep(args.resume or args.config, overrides, dry_run=args.dry_run, resume=bool(args.resume),
                    address=args.address, dashboard=not args.no_dashboard, verbose=args.verbose,
                    threads=args.threads, force=args.force, nodes=args.nodes, node_cpus=args.node_cpus,
                    node_gpus=args.node_gpus, throughput=args.throughput,
                    command=shlex.join(["distillab", *sys.argv[1:]]), started=process_start_time())
    if args.dry_run:
        return 0 if run.placeable else 1
    return 0 if run.complete else 1  # interrupted or failed trials


def _add_dry_run_args(sw: argparse.ArgumentParser) -> None:
    sw.add_argument("--dry-run", action="store_true",
                    help="validate, check the checkpoints, print the trials, their placement and a GPU-hour "
                         "estimate; start nothing (exit 1 if the trials can never be placed on the cluster)")
    sw.add_argument("--nodes", type=int, default=None, help="--dry-run: nodes of the cluster (default: this machine)")
    sw.add_argument("--node-cpus", type=float, default=None, help="--dry-run: CPUs per node")
    sw.add_argument("--node-gpus", type=float, default=None, help="--dry-run: GPUs per node")
    sw.add_argument("--throughput", type=float, default=None, metavar="TFLOPS",
                    help="--dry-run: effective TFLOP/s per GPU for the estimate (default: distillab.driver.plan.ASSUMED_TFLOPS)")


def _bad_paths(cmd: str, paths: list[str], out: str | None, flag: str) -> bool:
    """Print why ``paths`` are not sweep directories (`api.not_sweeps`) or ``out`` cannot hold
    what ``cmd`` writes (``flag``); True if so."""
    err = not_sweeps(cmd, paths)
    why = f"{err}" if err is not None else (storage_error(out, f"{cmd} {flag}") if out else None)
    if why is not None:
        print(f"distillab: {why}", file=sys.stderr)
    return why is not None


def _report(args) -> int:
    """``distillab report``: `api.load_results`, the headline table (``--full``: every final metric),
    RLVR rewards (`api.print_tables`), and with ``--plots`` the figures."""
    from distillab.analysis.plots import write_report  # lazy: see the module docstring

    if _bad_paths("report", args.path, args.plots, "--plots"):
        return 2
    res = load_results(args.path if len(args.path) > 1 else args.path[0])
    print_tables(res, full=args.full)
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
    """``distillab findings``: `api.findings`, its verdicts with their statistics printed, then
    findings.md and figures (`api.Findings.write`)."""
    from distillab.recipe.telemetry import print_time  # lazy: see the module docstring

    t0 = time.perf_counter()
    if _bad_paths("findings", args.path, args.out, "--out"):
        return 2
    try:
        result = findings(args.path if len(args.path) > 1 else args.path[0], by=args.by,
                          only=args.only.split(",") if args.only else None, task=args.task)
    except ValueError as e:  # an unknown --by column, finding or task
        print(f"distillab: findings: {e}", file=sys.stderr)
        return 2
    if args.task != "countdown3":
        print(f"acc, pass@1 and pass@10 are read on task {args.task} in place of Countdown-3 (--task {args.task}); "
              "the rules are otherwise PROTOCOL.md §9's as written")
    print(result.text())
    written = result.write(args.out or args.path[0])
    print(f"findings: {written['findings']}")
    print_time("findings", time.perf_counter() - t0, 0)
    return 0


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
