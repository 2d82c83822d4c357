"""A seeded chaos test of a sweep (issue 34, item 4): kill at random, many times, the
processes of a running sweep, and check that its results are exactly those of an
undisturbed run.

It runs a micro-shaped grid on the smoke models (search_spaces/smoke.yaml): seed x LR x
rollout policy, few steps, ``optimizer.checkpoint_every`` set so that a resume is exact.
The sweep runs twice at once, into two folders: once without faults (the reference), and
once while a seeded RNG SIGKILLs, one at a time after a random pause, a Ray Train worker
(``ray::RayTrainWorker``), a Tune trial actor (``ray::ImplicitFunc``: the trial's function
trainable, whose Train controller and workers go with it) or the ``distillab sweep`` driver
itself with the local Ray it started (then ``distillab sweep --resume DIR``), until the
sweep completes. A worker or trial actor is killed only while some trial not yet completed
has a registered checkpoint (`past_checkpoint`; else, under load, most kills land in a
trial's start-up and no trial ever resumes mid-way); the driver at any time. Only processes
of the drivers this script started are killed (found by their session id), never others on
the host.

Then it checks (`check_sweep`):
- each table holds every row once: ``trials`` one ``completed`` row per trial, ``metrics``
  one per (trial, stage, step, name), ``evals`` one per (trial, stage, step, task, metric),
  ``samples`` the reference's count per (trial, stage, step, task); no row lost against the
  reference and none extra (but the ``resume/*`` metrics a resumed trial logs);
- every trial's evals equal the reference's bitwise, and so do its per-step ``loss``;
- every Parquet file under the sweep folder reads and every JSON file parses (a JSON-lines
  file line by line); the hidden temporary files of interrupted atomic writes are counted;
- the sweep never stalled: its progress watchdog (`STALL`: trials waiting for resources while
  none reports a step) failed no trial (`stalls`; the lines it said are counted).

The undisturbed run depends on the grid, steps and checkpoint interval, not on the kills: one
(``--reference-only``) serves every seed (``--reference DIR``), and each chaos run then has
the machine to itself.

    python scripts/chaos.py --trials 20 --kills 10 --seed 0 --pause 10 40 --out .cache/chaos/run
    python scripts/chaos.py --trials 20 --reference-only --out .cache/chaos/ref      # the undisturbed run alone
    python scripts/chaos.py --trials 20 --kills 10 --seed 7 --pause 10 40 --reference .cache/chaos/ref --out .cache/chaos/seed7
    python scripts/chaos.py --trials 4 --kills 4 --seed 1 --pause 5 20 --out .cache/chaos/small
    python scripts/chaos.py --check --out .cache/chaos/run             # the checks again, of runs done

Exit 0 when every check passes, 1 otherwise; the figures are printed either way.
"""

from __future__ import annotations

import argparse
import json
import os
import pickletools
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq

from distillab.analysis.results import Results, load
from distillab.tables import run_records

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "search_spaces" / "smoke.yaml"
NAME = "chaos"

#: the row identity of each table: a resumed or retried trial must not write one twice
KEYS: dict[str, tuple[str, ...]] = {
    "trials": ("trial_id",),
    "metrics": ("trial_id", "stage", "step", "name"),
    "evals": ("trial_id", "stage", "step", "task", "metric"),
}
#: the samples table holds several rows per key (completions of a prompt): compared by count
SAMPLE_KEY = ("trial_id", "stage", "step", "task")
#: metrics only a resumed trial logs (where it restarted from): not in the reference
RESUME_ONLY = "resume/"
#: the process titles of what a kill may hit, by kind (the driver is the session leader)
TITLES = {"worker": "ray::RayTrainWorker", "actor": "ray::ImplicitFunc"}
KINDS = ("worker", "actor", "driver")
#: the first byte of a pickle of protocol 2 or later
PICKLE = b"\x80"
#: the sweeps' progress watchdog (`distillab.driver.watchdog`): a stall is said after 5 min and its waiting trials
#: fail after 20 (the driver then exits and is resumed), so that a wedge shows as a problem within the hour's timeout
STALL = {"fault_tolerance.stall_warn_s": 300, "fault_tolerance.stall_fail_s": 1200}
#: the chaos driver's log lines of the watchdog: a stall said, a trial failed, placement groups of dead controllers removed
STALL_SAID, STALL_FAILED = "[watchdog] no trial reported a step", "[watchdog] failed trial"
REMOVED = re.compile(r"removed (\d+) placement group\(s\) of dead")


@dataclass
class Chaos:
    """The run's settings: grid size (``trials``, a multiple of 4: seeds x 2 LRs x 2 policies),
    kills, RNG seed, the pause between kills (seconds, uniform), steps and checkpoint interval."""

    trials: int = 20
    kills: int = 10
    seed: int = 0
    out: Path = REPO / ".cache" / "chaos" / "run"
    pause: tuple[float, float] = (8.0, 30.0)
    steps: int = 40
    every: int = 10
    timeout_s: float = 3600.0
    #: an earlier run's ``--out`` whose ``reference/`` is used instead of running the undisturbed sweep again
    reference: Path | None = None
    #: ``resources.cpus_per_worker`` of both sweeps (None: the config's); more than half the machine's CPUs
    #: fits one worker group at a time, so that one placement group left behind holds every later trial
    cpus_per_worker: float | None = None


@dataclass
class Figures:
    kills: Counter = field(default_factory=Counter)
    restarts: int = 0
    reference_s: float = 0.0
    chaos_s: float = 0.0
    log: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------------------
# the sweep and its processes
# --------------------------------------------------------------------------------------


def sweep_command(cfg: Chaos, storage: Path) -> list[str]:
    """``distillab sweep`` of the chaos grid on the smoke models into ``storage/chaos``."""
    if cfg.trials % 4 or cfg.trials < 4:
        raise ValueError(f"trials must be a positive multiple of 4 (seeds x 2 LRs x 2 policies), got {cfg.trials}")
    seeds = list(range(1, cfg.trials // 4 + 1))
    grid = f"{{seed: {seeds}, optimizer.lr: [1.0e-3, 3.0e-3], rollout.policy: [offpd, onpd]}}"
    sets = {"name": NAME, "storage_path": str(storage), "models.cache_dir": str(REPO / ".cache" / "models"),
            "search.grid": grid, "trial.optimizer.steps": cfg.steps, "trial.optimizer.checkpoint_every": cfg.every,
            "fault_tolerance.worker_restarts": 4 * cfg.kills, "fault_tolerance.trial_retries": 4 * cfg.kills,
            "resources.max_concurrent_trials": 2, **STALL}
    if cfg.cpus_per_worker is not None:
        sets["resources.cpus_per_worker"] = cfg.cpus_per_worker
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    return [sys.executable, "-m", "distillab.driver.cli", "sweep", str(SMOKE), *args, "--no-dashboard"]


def start(cmd: list[str], log: Path) -> subprocess.Popen:
    """A driver in a session of its own: it and the local Ray it starts share its session id."""
    with log.open("a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n")
        f.flush()
        return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO)


def session_pids(sid: int, title: str | None = None) -> list[int]:
    """PIDs of the processes in session ``sid`` (whose command line starts with ``title``)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text().rsplit(")", 1)[1].split()
            if int(stat[3]) != sid:
                continue
            if title is not None:
                cmd = (d / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
                if not cmd.startswith(title):
                    continue
            out.append(int(d.name))
        except (OSError, ValueError, IndexError):
            continue
    return sorted(out)


def kill_session(sid: int) -> int:
    """SIGKILL every process of session ``sid`` (a driver and its Ray); returns how many."""
    n = 0
    for pid in session_pids(sid):
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, signal.SIGKILL)
            n += 1
        except ProcessLookupError:
            pass
    return n


def resume_command(cfg: Chaos, storage: Path) -> list[str]:
    """``--resume`` where Tune saved its experiment; else the first command again (a driver killed
    before Tune wrote its state: completed trials are not rerun either way)."""
    root = storage / NAME
    if list((root / "tune").glob("experiment_state-*.json")):
        return [sys.executable, "-m", "distillab.driver.cli", "sweep", "--resume", str(root), "--no-dashboard"]
    return sweep_command(cfg, storage)


def past_checkpoint(root: Path) -> bool:
    """Whether a trial not yet completed has a checkpoint that Ray Train registered (its run's
    ``train/<trial_id>/checkpoint_manager_snapshot.json``): a kill of a worker or trial actor
    now makes a trial resume mid-way, from that checkpoint."""
    try:
        done = set(load(root).trials.filter(pl.col("status") == "completed").collect()["trial_id"])
    except Exception:  # noqa: BLE001 - a table being written by a live sweep: try again
        return False
    for f in (root / "train").glob("*/checkpoint_manager_snapshot.json"):
        try:
            if f.parent.name not in done and json.loads(f.read_text()).get("checkpoint_results"):
                return True
        except (OSError, ValueError):
            continue
    return False


def completed(root: Path) -> int:
    try:
        return load(root).trials.filter(pl.col("status") == "completed").select(pl.len()).collect().item()
    except Exception:  # noqa: BLE001 - a table being written by a live sweep: not complete yet
        return 0


# --------------------------------------------------------------------------------------
# the runs
# --------------------------------------------------------------------------------------


def start_reference(cfg: Chaos) -> subprocess.Popen:
    """The sweep once, undisturbed, into ``out/reference``: a driver in its own session, which
    the kills never touch; it runs beside the chaos run (`finish_reference` waits for it)."""
    return start(sweep_command(cfg, cfg.out / "reference"), cfg.out / "reference.log")


def finish_reference(cfg: Chaos, driver: subprocess.Popen, t0: float, figures: Figures) -> Path:
    """Wait for `start_reference`'s driver; returns its sweep folder."""
    try:
        rc = driver.wait(timeout=max(1.0, cfg.timeout_s - (time.time() - t0)))
    finally:
        kill_session(driver.pid)
    root = cfg.out / "reference" / NAME
    runs = root / "runs.json"  # written as its driver ends, maybe long before the chaos run does
    figures.reference_s = (runs.stat().st_mtime if runs.exists() else time.time()) - t0
    if rc != 0 or completed(root) != cfg.trials:
        raise RuntimeError(f"the undisturbed sweep failed (exit {rc}); see {cfg.out / 'reference.log'}")
    return root


def shared_reference(cfg: Chaos, figures: Figures) -> Path:
    """``cfg.reference``'s undisturbed sweep (an earlier ``--reference-only`` or chaos run's
    ``--out``), its wall seconds from its ``runs.json`` (`tables.run_records`).

    Raises:
        RuntimeError: it does not hold ``cfg.trials`` completed trials."""
    root = cfg.reference / "reference" / NAME
    if completed(root) != cfg.trials:
        raise RuntimeError(f"--reference {cfg.reference}: {root} holds {completed(root)} completed trials, "
                           f"not the {cfg.trials} of this grid")
    figures.reference_s = sum(r.get("seconds", {}).get("total", 0.0) for r in run_records(root))
    return root


def kill_one(kind: str, driver: subprocess.Popen) -> int | None:
    """SIGKILL one process of ``kind`` in ``driver``'s session (the driver: all of them);
    returns the PID hit, None when there is none of that kind right now."""
    if kind == "driver":
        kill_session(driver.pid)
        driver.wait(timeout=120)
        return driver.pid
    pids = session_pids(driver.pid, TITLES[kind])
    if not pids:
        return None
    pid = pids[0]
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return None
    return pid


def run_chaos(cfg: Chaos, figures: Figures) -> Path:
    """The sweep into ``out/chaos`` under ``cfg.kills`` seeded kills (every kind at least once
    where ``kills >= 3``), restarting the driver whenever it is gone, until every trial completed."""
    rng = random.Random(cfg.seed)
    plan = [KINDS[i % len(KINDS)] for i in range(cfg.kills)]
    rng.shuffle(plan)
    storage, log = cfg.out / "chaos", cfg.out / "chaos.log"
    root, t0 = storage / NAME, time.time()
    driver = start(sweep_command(cfg, storage), log)
    next_kill = time.time() + rng.uniform(*cfg.pause)
    try:
        while completed(root) < cfg.trials or driver.poll() is None:
            if time.time() - t0 > cfg.timeout_s:
                raise TimeoutError(f"the chaos sweep did not complete in {cfg.timeout_s:.0f} s; see {log}")
            if driver.poll() is not None:  # it ended (killed, or exited with trials failed): resume
                figures.restarts += 1
                figures.log.append(f"{time.time() - t0:7.1f} s  restart (driver exit {driver.returncode})")
                driver = start(resume_command(cfg, storage), log)
            elif plan and time.time() >= next_kill and (plan[0] == "driver" or past_checkpoint(root)):
                pid = kill_one(plan[0], driver)
                if pid is not None:
                    figures.kills[plan[0]] += 1
                    figures.log.append(f"{time.time() - t0:7.1f} s  kill {plan.pop(0)} pid {pid}")
                    next_kill = time.time() + rng.uniform(*cfg.pause)
            time.sleep(0.5)
    finally:
        kill_session(driver.pid)
    figures.chaos_s = time.time() - t0
    return root


# --------------------------------------------------------------------------------------
# the checks
# --------------------------------------------------------------------------------------


def duplicated_rows(frame: pl.DataFrame, keys: tuple[str, ...]) -> pl.DataFrame:
    """The keys that ``frame`` holds more than once, with their count ``len``."""
    return frame.group_by(keys).len().filter(pl.col("len") > 1).sort(keys)


def missing_rows(frame: pl.DataFrame, reference: pl.DataFrame, keys: tuple[str, ...]) -> pl.DataFrame:
    """The keys of ``reference`` that ``frame`` lacks."""
    return reference.select(keys).unique().join(frame.select(keys).unique(), on=keys, how="anti").sort(keys)


def unequal_values(frame: pl.DataFrame, reference: pl.DataFrame, keys: tuple[str, ...]) -> pl.DataFrame:
    """Rows of ``reference`` whose ``value`` ``frame`` holds with other bits (NaN equals NaN
    of the same bits; a missing row is `missing_rows`' business), with both values."""
    both = reference.select(*keys, "value").join(frame.select(*keys, "value"), on=keys, suffix="_run")
    a = both["value"].to_numpy().astype(np.float64).view(np.int64)
    b = both["value_run"].to_numpy().astype(np.float64).view(np.int64)
    return both.filter(pl.Series(a != b)).sort(keys)


def corrupt_files(root: Path) -> list[tuple[str, str]]:
    """Files under ``root`` that do not read: a Parquet file pyarrow cannot read, a ``.json``
    file that is neither JSON nor JSON lines, a pickle (``.pkl``, or a ``.json`` that is one:
    Tune's ``basic-variant-state-*.json``) whose opcodes stop short of its end. Returns (path
    relative to root, error)."""
    bad = []
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.suffix not in (".parquet", ".json", ".pkl"):
            continue
        try:
            if path.suffix == ".parquet":
                pq.read_table(path)
            elif path.suffix == ".pkl" or path.read_bytes()[:1] == PICKLE:
                _parse_pickle(path.read_bytes())
            else:
                _parse_json(path.read_text())
        except Exception as e:  # noqa: BLE001 - any failure to read is the finding
            bad.append((str(path.relative_to(root)), f"{type(e).__name__}: {e}"[:200]))
    return bad


def _parse_json(text: str) -> None:
    try:
        json.loads(text)
    except json.JSONDecodeError:  # Tune's result.json: one JSON object per line
        for line in text.splitlines():
            if line.strip():
                json.loads(line)


def _parse_pickle(data: bytes) -> None:
    """Walk a pickle's opcodes without running them (`pickletools.genops`): a truncated one
    raises; so do bytes after its STOP."""
    end = max(pos for _, _, pos in pickletools.genops(data))
    if end + 1 != len(data):
        raise ValueError(f"{len(data) - end - 1} bytes after the pickle's STOP")


def leftover_temporaries(root: Path) -> list[str]:
    """Hidden temporary files of atomic writes (`tables.atomic_write_bytes`) a kill interrupted:
    readers skip them; counted, not an error."""
    return sorted(str(p.relative_to(root)) for p in root.rglob(".*.tmp"))


def row_problems(run: Results, ref: Results) -> tuple[dict[str, int], list[str]]:
    """Rows checked per table, and every lost, duplicated, extra or not-completed row of ``run``
    against ``ref`` (`KEYS`; ``samples`` by count per `SAMPLE_KEY`)."""
    checked, problems = {}, []
    for table, keys in KEYS.items():
        frame, reference = getattr(run, table).collect(), getattr(ref, table).collect()
        if table == "metrics":
            frame = frame.filter(~pl.col("name").str.starts_with(RESUME_ONLY))
        checked[table] = frame.height
        for what, bad in (("duplicated", duplicated_rows(frame, keys)), ("lost", missing_rows(frame, reference, keys)),
                          ("extra", missing_rows(reference, frame, keys))):
            if bad.height:
                problems.append(f"{table}: {bad.height} {what} key(s), e.g. {bad.head(3).rows()}")
    trials = run.trials.collect()
    if not (trials["status"] == "completed").all():
        problems.append(f"trials: not completed: {trials.filter(pl.col('status') != 'completed')['trial_id'].to_list()}")
    samples = [r.samples.group_by(SAMPLE_KEY).len().collect() for r in (run, ref)]
    checked["samples"] = int(samples[0]["len"].sum())
    diff = samples[0].join(samples[1], on=SAMPLE_KEY, how="full", coalesce=True, suffix="_ref").filter(
        pl.col("len").fill_null(0) != pl.col("len_ref").fill_null(0))
    if diff.height:
        problems.append(f"samples: {diff.height} (trial, stage, step, task) with another row count, e.g. {diff.head(3).rows()}")
    return checked, problems


def value_problems(run: Results, ref: Results) -> tuple[list[str], list[str], list[str]]:
    """The run's completed trials whose evals and per-step ``loss`` equal the reference's bitwise,
    those that do not, and a line per unequal trial."""
    evals = unequal_values(run.evals.collect(), ref.evals.collect(), KEYS["evals"])
    loss = [r.metrics.filter(pl.col("name") == "loss").collect() for r in (run, ref)]
    losses = unequal_values(loss[0], loss[1], KEYS["metrics"])
    # only the trials the run completed are compared (a trial not completed is `row_problems`' business)
    ids = run.trials.filter(pl.col("status") == "completed").select("trial_id").collect()["trial_id"].sort().to_list()
    unequal = sorted(set(evals["trial_id"]) | set(losses["trial_id"]))
    lines = [f"{t}: {evals.filter(pl.col('trial_id') == t).height} eval(s), "
             f"{losses.filter(pl.col('trial_id') == t).height} loss step(s) differ, e.g. "
             f"{(evals.filter(pl.col('trial_id') == t).head(2).rows() or losses.filter(pl.col('trial_id') == t).head(2).rows())}"
             for t in unequal]
    return [t for t in ids if t not in unequal], unequal, lines


def check_sweep(root: Path, reference: Path) -> dict:
    """Every check of the module docstring of the sweep folder ``root`` against ``reference``."""
    run, ref = load(root), load(reference)
    checked, problems = row_problems(run, ref)
    equal, unequal, lines = value_problems(run, ref)
    corrupt = corrupt_files(root)
    problems += lines + [f"corrupt: {p}: {e}" for p, e in corrupt]
    starts = run.metrics.filter(pl.col("name") == RESUME_ONLY + "start_step").collect()
    return {"rows": checked, "equal": equal, "unequal": unequal, "corrupt": corrupt,
            "resumes": starts.select("trial_id", pl.col("value").cast(pl.Int64)).sort("trial_id").rows(),
            "temporaries": leftover_temporaries(root), "problems": problems}


def stalls(log: Path) -> dict:
    """The watchdog's lines in the chaos run's console log ``log``: ``said`` (a stall: trials
    waiting for resources while none progressed), ``failed`` (a trial it failed) and
    ``removed`` (how many placement groups of dead actors, killed trials' Train controllers, the
    drivers removed),
    and a problem per trial failed: a sweep that had to be unwedged did not survive the kills."""
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    said = [x.strip() for x in lines if STALL_SAID in x]
    failed = [x.strip() for x in lines if STALL_FAILED in x]
    removed = sum(int(m[1]) for x in lines if (m := REMOVED.search(x)))
    return {"said": said, "failed": failed, "removed": removed,
            "problems": [f"the watchdog failed a stalled trial: {x}" for x in failed]}


def checks(root: Path, reference: Path, out: Path) -> dict:
    """`check_sweep` of ``root`` against ``reference``, and the watchdog's `stalls` in ``out/chaos.log``."""
    result = check_sweep(root, reference)
    result["stalls"] = stalls(out / "chaos.log")
    result["problems"] += result["stalls"]["problems"]
    return result


# --------------------------------------------------------------------------------------
# the command
# --------------------------------------------------------------------------------------


def print_run(cfg: Chaos, figures: Figures) -> None:
    kinds = ", ".join(f"{k} {figures.kills[k]}" for k in KINDS)
    print(f"[chaos] seed {cfg.seed}, {cfg.trials} trials x {cfg.steps} steps (checkpoint every {cfg.every})")
    for line in figures.log:
        print(f"[chaos]   {line}")
    print(f"[chaos] kills: {sum(figures.kills.values())} ({kinds}); driver restarts: {figures.restarts}")
    shared = f" (the shared run {cfg.reference}, alone)" if cfg.reference else " (beside the chaos run)"
    print(f"[chaos] wall: undisturbed {figures.reference_s:.0f} s{shared}, under chaos {figures.chaos_s:.0f} s",
          flush=True)


def print_check(result: dict) -> None:
    print("[chaos] rows checked: " + ", ".join(f"{t} {n}" for t, n in result["rows"].items()))
    print(f"[chaos] trials equal to the undisturbed run (evals and per-step loss, bitwise): "
          f"{len(result['equal'])}; unequal: {len(result['unequal'])}")
    res = result["resumes"]
    print(f"[chaos] trial resumes logged (resume/start_step): {len(res)}, {sum(v > 0 for _, v in res)} from a "
          f"checkpoint (steps {sorted(v for _, v in res)})")
    print(f"[chaos] files corrupt: {len(result['corrupt'])}; temporaries left by interrupted writes: "
          f"{len(result['temporaries'])}")
    if "stalls" in result:
        st = result["stalls"]
        print(f"[chaos] placement groups of dead controllers removed: {st['removed']}; stalls said by the watchdog: "
              f"{len(st['said'])}; trials it failed: {len(st['failed'])}")
    for p in result["problems"]:
        print(f"[chaos] PROBLEM {p}")
    print(f"[chaos] {'PASS' if not result['problems'] else 'FAIL'}", flush=True)


def parse_args(argv: list[str] | None) -> tuple[Chaos, str]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=20, help="grid size, a multiple of 4 (default 20)")
    p.add_argument("--kills", type=int, default=10, help="SIGKILLs in all (default 10)")
    p.add_argument("--seed", type=int, default=0, help="the RNG of what is killed and when (default 0)")
    p.add_argument("--out", type=Path, default=Chaos.out, help="folder of both runs (emptied first)")
    p.add_argument("--pause", type=float, nargs=2, default=Chaos.pause, metavar=("MIN", "MAX"),
                   help="seconds between kills, uniform (default 8 30)")
    p.add_argument("--steps", type=int, default=Chaos.steps, help="steps per trial (default 40)")
    p.add_argument("--every", type=int, default=Chaos.every, help="checkpoint interval (default 10)")
    p.add_argument("--check", action="store_true", help="only the checks, of the runs already in --out")
    p.add_argument("--reference", type=Path, default=None, metavar="DIR",
                   help="use DIR/reference (an earlier --out of the same grid) as the undisturbed run")
    p.add_argument("--reference-only", action="store_true", help="only the undisturbed run, into --out/reference")
    p.add_argument("--cpus-per-worker", type=float, default=None,
                   help="resources.cpus_per_worker of both sweeps (default: the config's, 0.99)")
    a = p.parse_args(argv)
    cfg = Chaos(a.trials, a.kills, a.seed, a.out.resolve(), tuple(a.pause), a.steps, a.every,
                reference=a.reference.resolve() if a.reference else None, cpus_per_worker=a.cpus_per_worker)
    return cfg, "check" if a.check else "reference" if a.reference_only else "run"


def main(argv: list[str] | None = None) -> int:
    cfg, mode = parse_args(argv)
    if mode == "check":
        result = checks(cfg.out / "chaos" / NAME, (cfg.reference or cfg.out) / "reference" / NAME, cfg.out)
        print_check(result)
        return 0 if not result["problems"] else 1
    shutil.rmtree(cfg.out, ignore_errors=True)
    cfg.out.mkdir(parents=True)
    figures, t0 = Figures(), time.time()
    if mode == "reference":
        finish_reference(cfg, start_reference(cfg), t0, figures)
        print(f"[chaos] undisturbed run: {cfg.trials} trials x {cfg.steps} steps in {figures.reference_s:.0f} s "
              f"({cfg.out / 'reference' / NAME})", flush=True)
        return 0
    reference = shared_reference(cfg, figures) if cfg.reference else start_reference(cfg)
    try:
        root = run_chaos(cfg, figures)
    except BaseException:
        if not cfg.reference:
            kill_session(reference.pid)
        raise
    if not cfg.reference:
        reference = finish_reference(cfg, reference, t0, figures)
    print_run(cfg, figures)
    result = checks(root, reference, cfg.out)
    print_check(result)
    return 0 if not result["problems"] else 1


if __name__ == "__main__":
    sys.exit(main())
