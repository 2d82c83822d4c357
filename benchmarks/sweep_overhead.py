"""Where a trial's fixed cost goes (issue 14), on this machine.

Two measurements, each in fresh processes:

1. **Per-trial fixed cost in a sweep**: the smoke sweep (search_spaces/smoke.yaml: tiny
   models, 4 steps, so start-up dominates) as a grid over N seeds, N = 2 and 8, 2
   trials at a time, through `sweep.run_sweep`. Per trial (mean ± sd over its trials):
   the phases `telemetry.TrialTimes` writes to the ``metrics`` table (``time/*_s``,
   `distillab.registry`) and the remainder of the trial's wall time (its ``trials``
   row: end − start):

       trainable   Tune trial actor: process start → the trainable's first line
       launch      → the Train worker's process start (controller, placement group)
       init        → the train function's first line (imports, torch.distributed)
       setup       → the first step (models, evaluation before training, DeepSpeed)
       loop        the training loop (time/train_s)
       eval        the evaluation after training
       ckpt+report → the final report (the final checkpoint written)
       teardown    → the trial's end (checkpoint persisted, worker group and controller stopped)

   ``fixed`` = everything but the loop = trainable + wall − loop (issue 14's target:
   ≤ 12 s on the micro models; the smoke models here are smaller still). Then the CPU
   seconds per trial of every process the sweep started, by kind (`CpuSampler`): on a
   machine shared with other jobs wall times swing with the load, CPU seconds much less.

2. **One whole single-trial sweep through the CLI** (``distillab sweep``, a subprocess,
   ``--no-dashboard``): ``--steps`` (40) steps at 16 prompts × 32 new tokens on the
   micro models when ``distillab prepare search_spaces/micro.yaml`` has cached them
   (else the smoke models, and it says so): the process's wall time and its
   breakdown (the CLI's ``[time]`` lines and the trial's phases). ``--trl-seconds S``
   prints the ratio to TRL's whole run of the same setting (benchmarks/peer_trl.py
   measures it; issue 14's target: ≤ 1.5×).

    python benchmarks/sweep_overhead.py                      # ~6 min on 2 idle cores
    python benchmarks/sweep_overhead.py --trials 2 --steps 40 --trl-seconds 15.2
    python benchmarks/sweep_overhead.py --code /path/to/tree # time another checkout's code (A/B)
    python benchmarks/sweep_overhead.py --set resources.local_mode=true   # trials in their Tune actors
    python benchmarks/sweep_overhead.py --phases runs/calib_lr_low runs/calib_rlvr   # sweeps that ran already
    python benchmarks/sweep_overhead.py --phases runs/micro --baseline 581   # and the loops' bound on the sweep

``--code DIR`` runs every measurement with ``DIR``'s ``platform/``, ``ops/`` and
``evals/`` as the ``distillab`` package (a copy of another commit, e.g. ``git archive
main platform ops evals | tar -x -C DIR``; a module only this checkout has still
resolves here): phases that code does not record print as ``-``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PHASES = ("trainable", "launch", "init", "setup", "loop", "eval", "ckpt+report", "teardown")
KEYS = {"trainable": "time/trainable_import_s", "launch": "time/worker_launch_s", "init": "time/worker_init_s",
        "setup": "time/setup_s", "loop": "time/train_s", "eval": "time/eval_distill_s"}


def trial_phases(root: Path) -> list[dict[str, float]]:
    """Per trial of the sweep at ``root``: the seconds of each of `PHASES` (NaN where not
    recorded), ``wall`` (its ``trials`` row) and ``fixed`` (trainable + wall − loop)."""
    import polars as pl

    from distillab.analysis.results import load

    res = load(root)
    rows = res.trials.select("trial_id", (pl.col("end_time") - pl.col("start_time")).alias("wall")).collect()
    m = res.metrics.filter(pl.col("name").str.starts_with("time/")).collect()
    nan = float("nan")
    out = []
    for tid, wall in rows.iter_rows():
        got = dict(m.filter(pl.col("trial_id") == tid).select("name", "value").iter_rows())
        p = {name: got.get(key, nan) for name, key in KEYS.items()}
        finish = got.get("time/finish_s", nan)
        p["ckpt+report"] = finish - p["eval"]
        p["teardown"] = wall - sum(p[k] for k in ("launch", "init", "setup", "loop")) - finish
        p["wall"], p["trial_id"] = wall, tid
        p["fixed"] = (0.0 if p["trainable"] != p["trainable"] else p["trainable"]) + wall - p["loop"]
        out.append(p)
    return out


def _env(code: Path | None) -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if code is not None:  # the other tree's sources as the `distillab` package, ahead of the editable install
        pkg = Path(tempfile.mkdtemp(prefix="distillab-code-"))
        shutil.copytree(code / "platform", pkg / "distillab")
        for sub in ("ops", "evals"):
            shutil.copytree(code / sub, pkg / "distillab" / sub)
        env["PYTHONPATH"] = os.pathsep.join([str(pkg), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


class CpuSampler(threading.Thread):
    """CPU seconds (user + system, from ``/proc``) of every process under this one, by
    kind (a Ray actor's class, ``ray::TrainController``, ..., or its program name),
    sampled every ``every`` seconds until `stop`: a process's last sample is its total.
    Unlike wall time this hardly depends on what else the machine runs."""

    def __init__(self, every: float = 0.25):
        super().__init__(daemon=True)
        self.every, self.last, self.kind, self.done = every, {}, {}, threading.Event()
        self.tick = os.sysconf("SC_CLK_TCK")

    def _scan(self) -> None:
        parent = {}
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    stat = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
                    parent[int(d)] = (int(stat[1]), (int(stat[11]) + int(stat[12])) / self.tick)
                except (OSError, IndexError, ValueError):
                    pass
        me = os.getpid()
        for pid, (ppid, cpu) in parent.items():
            p, hops = ppid, 0
            while p not in (me, 0, 1) and p in parent and hops < 10:
                p, hops = parent[p][0], hops + 1
            if p != me:
                continue
            if self.kind.get(pid, "python") in ("python", "ray::IDLE"):  # a Ray worker names itself once it has a job
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
                except OSError:
                    continue
                if not cmd.strip():  # a zombie (or kernel thread) has no command line: keep its last sample
                    continue
                kind = cmd.split(".")[0] if cmd.startswith("ray::") else Path(cmd.split()[0]).name
                self.kind[pid] = "python" if kind.startswith("python") else kind
            self.last[pid] = cpu

    def run(self) -> None:
        while not self.done.wait(self.every):
            self._scan()

    def stop(self) -> dict[str, float]:
        """Stop; CPU seconds by kind."""
        self.done.set()
        self.join()
        out: dict[str, float] = {}
        for pid, cpu in self.last.items():
            out[self.kind[pid]] = out.get(self.kind[pid], 0.0) + cpu
        return out


def grid(n: int, storage: Path, out: Path, sets: list[str]) -> None:
    """Measurement 1 in this process: the smoke grid over ``n`` seeds (with the
    ``--set`` pairs ``sets``); writes the phases and the CPU seconds of the sweep's
    processes to ``out``."""
    import ray

    from distillab.driver.cli import parse_overrides
    from distillab.config import load_sweep
    from distillab.recipe.prepare import prepare
    from distillab.driver.sweep import run_sweep

    sweep = load_sweep(REPO / "search_spaces" / "smoke.yaml", {
        "name": f"overhead{n}", "storage_path": str(storage), "models.cache_dir": str(REPO / ".cache" / "models"),
        "search.grid": {"seed": list(range(n))}, **parse_overrides(sets),
    })
    teacher, student = prepare(sweep, threads=1)
    sampler = CpuSampler()
    sampler.start()
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    try:
        t0, c0 = time.perf_counter(), time.process_time()
        root = run_sweep(sweep, teacher, student, verbose=0)
        wall, driver = time.perf_counter() - t0, time.process_time() - c0
    finally:
        ray.shutdown()
    cpu = {**sampler.stop(), "driver (Tune)": driver}
    out.write_text(json.dumps({"n": n, "sweep_wall": wall, "trials": trial_phases(root), "cpu": cpu}))


def _micro_prepared() -> bool:
    from distillab.config import load_sweep
    from distillab.recipe.prepare import prepare_key

    sweep = load_sweep(REPO / "search_spaces" / "micro.yaml", {"models.cache_dir": str(REPO / ".cache" / "models")})
    cache = Path(sweep.models.cache_dir)
    return all((cache / f"{role}-{prepare_key(sweep, role)}").is_dir() for role in ("teacher", "student"))


def single(steps: int, storage: Path, env: dict[str, str], extra: list[str]) -> dict:
    """Measurement 2: one ``distillab sweep`` subprocess of a single ``steps``-step OnPD
    trial (``extra``: more ``--set`` pairs)."""
    micro = _micro_prepared()
    config = REPO / "search_spaces" / ("micro.yaml" if micro else "smoke.yaml")
    sets = {"name": "single", "storage_path": str(storage), "models.cache_dir": str(REPO / ".cache" / "models"),
            "search.grid": "{rollout.policy: [onpd]}", "trial.optimizer.steps": steps,
            "trial.optimizer.prompts_per_step": 16, "trial.rollout.max_tokens": 32, "resources.max_concurrent_trials": 1}
    cmd = [sys.executable, "-m", "distillab.driver.cli", "sweep", str(config), "--no-dashboard"]
    for kv in [f"{k}={v}" for k, v in sets.items()] + extra:
        cmd += ["--set", kv]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"distillab sweep failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    times = {k: float(v) for k, v in re.findall(r"^\[time\] ([a-z.\- ]+): ([0-9.]+) s", proc.stdout, re.M)}
    lines = len((proc.stdout + proc.stderr).splitlines())
    return {"models": config.stem, "wall": wall, "cli": times, "lines": lines,
            "trial": trial_phases(storage / "single")[0]}


def _fmt(values: list[float]) -> str:
    vals = [v for v in values if v == v]
    if not vals:
        return f"{'-':>11}"
    return f"{statistics.mean(vals):6.1f} ±{statistics.pstdev(vals):4.1f}"


def report_grid(rows: list[dict]) -> None:
    print(f"per-trial seconds, smoke models, 4 steps, 2 trials at a time (mean ± sd over the trials):")
    print(f"{'trials':>6} {'sweep s':>8} " + " ".join(f"{p:>11}" for p in PHASES) + f" {'fixed':>11}")
    for r in rows:
        t = r["trials"]
        print(f"{r['n']:>6} {r['sweep_wall']:>8.1f} " + " ".join(_fmt([x[p] for x in t]) for p in PHASES)
              + " " + _fmt([x["fixed"] for x in t]))
    for r in rows:
        cpu = sorted(r["cpu"].items(), key=lambda kv: -kv[1])
        print(f"CPU seconds per trial by process ({r['n']} trials, {sum(r['cpu'].values()) / r['n']:.1f} in all): "
              + ", ".join(f"{k} {v / r['n']:.1f}" for k, v in cpu if v / r["n"] >= 0.05))
    if len(rows) > 1:
        a, b = rows[0], rows[-1]
        print(f"sweep wall time {b['n']} vs {a['n']} trials: {b['sweep_wall'] / a['sweep_wall']:.2f}x "
              f"({b['n'] / a['n']:.0f}x the trials)")


def report_single(s: dict, steps: int, trl: float | None) -> None:
    t, cli = s["trial"], s["cli"]
    print(f"\nwhole single-trial sweep (`distillab sweep`, {s['models']} models, OnPD, {steps} steps, "
          f"16 prompts x 32 tokens): {s['wall']:.1f} s, {s['lines']} console lines")
    start = cli.get("start-up", float("nan"))
    parts = [("CLI start-up, imports and checks", start), ("prepare (cached)", cli.get("prepare", float("nan")))]
    in_sweep = cli.get("sweep", float("nan")) - cli.get("ray.init", 0.0)
    parts += [(f"trial: {p}", t[p]) for p in PHASES]
    parts += [("Tune outside the trial (set-up, results, shutdown)", in_sweep - t["wall"] - t["trainable"])]
    known = sum(v for _, v in parts if v == v)
    parts += [("report and exit", s["wall"] - known)]
    # Ray starts in the CLI's main thread while another imports and checks (driver.api._start): its time is inside the start-up's
    parts.insert(1, ("  of which ray.init, beside the imports and checks", cli.get("ray.init", float("nan"))))
    for name, v in parts:
        print(f"  {name:<52} {v:6.1f} s" if v == v else f"  {name:<52}      -")
    print(f"  fixed cost of the trial (all but the loop): {t['fixed']:.1f} s")
    if trl:
        print(f"  whole sweep / TRL's whole run ({trl:.1f} s): {s['wall'] / trl:.2f}x")


def report_phases(roots: list[Path], baseline: float | None = None) -> None:
    """``--phases``: per trial of sweeps that already ran, the seconds of each of `PHASES`,
    its wall time and ``fixed`` (`trial_phases`; ``-`` where a phase was not recorded: a
    reused Tune actor records no trainable import); then per sweep its `loop_bound`."""
    cols = ("wall", *PHASES, "fixed")
    print(f"{'sweep':<24} {'trial':<44} " + " ".join(f"{c:>11}" for c in cols))
    for root in roots:
        for t in trial_phases(root):
            cells = " ".join(f"{t[c]:>11.1f}" if t[c] == t[c] else f"{'-':>11}" for c in cols)
            print(f"{root.name:<24} {t['trial_id'][:44]:<44} {cells}")
    for root in roots:
        line = loop_bound(root, trial_phases(root), baseline)
        if line:
            print(line)


def loop_bound(root: Path, trials: list[dict], baseline: float | None = None) -> str | None:
    """The sweep at ``root`` against the least wall time its loops leave: if every trial's
    fixed cost were zero and its loop (``time/train_s``) unchanged, the trials could not
    finish in less than max(Σ loop / c, longest loop) on ``c`` concurrent trials (the
    sweep's ``resources.max_concurrent_trials``; the makespan bound of c equal machines),
    after the OffPD sets that run before them. None when the sweep recorded no
    ``runs.json`` seconds (`tables.record_run`) or no loop. ``baseline``: another sweep's
    wall seconds to print both as multiples of."""
    from distillab.tables import run_records

    runs = run_records(root)
    loops = [t["loop"] for t in trials if t["loop"] == t["loop"]]
    if not runs or not loops:
        return None
    sec = runs[-1]["seconds"]
    conc = json.loads((root / "sweep.json").read_text())["resources"]["max_concurrent_trials"]
    sets = sec.get("OffPD sets", 0.0)
    bound = max(sum(loops) / conc, max(loops)) + sets
    line = (f"{root.name}: sweep {sec['sweep']:.1f} s (OffPD sets {sets:.1f} s, trials {sec['trials']:.1f} s); "
            f"its loops alone, {conc} at a time: >= {bound - sets:.1f} s, so with no fixed cost at all the sweep "
            f"would take >= {bound:.1f} s ({bound / sec['sweep']:.2f}x of it)")
    if baseline:
        line += f"; against {baseline:.1f} s: the sweep {sec['sweep'] / baseline:.2f}x, the bound {bound / baseline:.2f}x"
    return line


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, nargs="*", default=[2, 8], help="grid sizes of measurement 1 (none: skip)")
    ap.add_argument("--steps", type=int, default=40, help="steps of measurement 2 (0: skip)")
    ap.add_argument("--trl-seconds", type=float, default=None, help="TRL's whole run of measurement 2's setting")
    ap.add_argument("--code", type=Path, default=None, help="time another checkout's platform/ ops/ evals/")
    ap.add_argument("--phases", type=Path, nargs="+", metavar="DIR",
                    help="only print the per-trial phases of sweeps that already ran (their directories)")
    ap.add_argument("--baseline", type=float, default=None, metavar="SECONDS",
                    help="--phases: another sweep's wall seconds (e.g. the same study at an older commit) to "
                         "print each sweep and its loop bound as multiples of")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for every measured sweep, as distillab sweep's "
                         "(e.g. resources.local_mode=true)")
    ap.add_argument("--grid-one", nargs=3, metavar=("N", "STORAGE", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.phases:
        report_phases(args.phases, args.baseline)
        return 0
    if args.grid_one:
        grid(int(args.grid_one[0]), Path(args.grid_one[1]), Path(args.grid_one[2]), args.set)
        return 0
    env = _env(args.code)
    rows = []
    sets = [a for kv in args.set for a in ("--set", kv)]
    with tempfile.TemporaryDirectory() as d:
        for n in args.trials:
            out = Path(d) / f"grid{n}.json"
            subprocess.run([sys.executable, __file__, "--grid-one", str(n), d, str(out), *sets], env=env, check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)
            rows.append(json.loads(out.read_text()))
        s = single(args.steps, Path(d), env, args.set) if args.steps else None
    if rows:
        report_grid(rows)
    if s is not None:
        report_single(s, args.steps, args.trl_seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
