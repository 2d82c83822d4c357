"""What a running trial tells the world: per-step metrics written to the ``metrics``
table in windows (`MetricsLog`) and reported to Ray as they close, the last
values exported as Ray gauges (`RayGauges`) for the dashboard's metrics endpoint,
and where its fixed cost went (`TrialTimes`). Key names come from `distillab.registry`.
The driver's stages (prepare, OffPD sets, trials, ...) print their wall time and keep it
for the sweep's run record (`print_time`, `STAGE_SECONDS`).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from ray.util.metrics import Gauge

from distillab.registry import gauges
from distillab.tables import write_rows

__all__ = ["MetricsLog", "RayGauges", "TrialTimes", "process_start_time", "quiet_report_log", "print_time",
           "STAGE_SECONDS"]

#: wall seconds of each stage of this process's command, in the order `print_time` saw them
STAGE_SECONDS: dict[str, float] = {}


def print_time(stage: str, seconds: float, digits: int = 1, note: str = "") -> None:
    """Print the console's ``[time] <stage>: <seconds> s<note>`` line (``digits`` decimals)
    and keep ``seconds`` in `STAGE_SECONDS` (a stage timed twice keeps the sum)."""
    STAGE_SECONDS[stage] = STAGE_SECONDS.get(stage, 0.0) + seconds
    print(f"[time] {stage}: {seconds:.{digits}f} s{note}", flush=True)


class MetricsLog:
    """The per-step metrics of one stage (``distill`` or ``rlvr``) of a trial.

    `add` keeps a step's metrics; `flush` writes the kept rows as one ``metrics``
    file keyed by the window's last step (``<trial_id>__<stage>__<step:07d>``; rank 0
    only, so a rerun window replaces its file) and forgets them. ``every``: the window
    length in steps (`due`)."""

    def __init__(self, root: str | Path, trial_id: str, stage: str, rank: int, every: int = 10):
        self.root, self.trial_id, self.stage, self.rank, self.every = Path(root), trial_id, stage, rank, every
        self.rows: list[dict] = []

    def add(self, step: int, metrics: dict[str, float]) -> None:
        """Keep ``metrics`` (key → value) of step ``step`` (1-based)."""
        self.rows += [{"trial_id": self.trial_id, "stage": self.stage, "step": step, "name": k, "value": float(v)}
                      for k, v in metrics.items()]

    def due(self, step: int, last: bool = False) -> bool:
        """True when a window closes after step ``step`` (every ``every`` steps, and the last)."""
        return step % self.every == 0 or last

    def flush(self, step: int, key: str | None = None) -> None:
        """Write the kept rows (rank 0) under ``key`` (default: the window's last step) and forget them."""
        if self.rank == 0:
            write_rows(self.root, "metrics", self.rows, key=key or f"{self.trial_id}__{self.stage}__{step:07d}")
        self.rows = []


class RayGauges:
    """Custom Ray metrics (``ray.util.metrics.Gauge``, tagged by ``trial_id``) for the
    dashboard's metrics endpoint (Prometheus names ``ray_distillab_*``): every key the
    registry exports as a gauge (`registry.gauges`: rollout tokens/s, forward and
    reverse KL, loss, RLVR reward)."""

    def __init__(self, trial_id: str):
        self.tags = {"trial_id": trial_id}
        self.gauges = {k: Gauge(name, description=f"distillab {k} (last step)", tag_keys=("trial_id",))
                       for k, name in gauges().items()}

    def set(self, metrics: dict[str, float]) -> None:
        """Set each gauge whose key is in ``metrics`` (other keys, and NaN values, are ignored)."""
        for k, g in self.gauges.items():
            if k in metrics and metrics[k] == metrics[k]:  # not NaN
                g.set(float(metrics[k]), tags=self.tags)


def quiet_report_log() -> None:
    """Ray Train V2 logs every ``ray.train.report`` at INFO on the console (a line per
    report per worker); keep it to warnings. Its logger is named by file path."""
    try:
        from ray.train.v2._internal.execution import context  # internal: skipped where it moved

        logging.getLogger(context.__file__).setLevel(logging.WARNING)
    except Exception:  # internal module moved: keep Ray's default logging
        pass



def process_start_time(pid: int | str = "self") -> float | None:
    """Unix time (s) at which process ``pid`` started, from Linux's ``/proc``: the 22nd field
    of ``/proc/<pid>/stat`` (clock ticks after boot) set against the time since boot now
    (``CLOCK_BOOTTIME``, the same clock), so that its resolution is one clock tick (10 ms);
    where that clock is missing, against ``btime`` of ``/proc/stat`` (whole seconds: up to 1 s
    off). None where ``/proc`` is not there."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # fields after "(comm)": state is field 3
        after_boot = ticks / os.sysconf("SC_CLK_TCK")
        if hasattr(time, "CLOCK_BOOTTIME"):
            return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - after_boot)
        btime = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                     if line.startswith("btime "))
        return btime + after_boot
    except (OSError, ValueError, StopIteration, IndexError):
        return None


class TrialTimes:
    """Where one run of a trial's train function spends its time outside the loop,
    as ``time/<phase>_s`` metrics (`distillab.registry`): ``trainable_import`` and
    ``worker_launch`` from ``launch`` (what the Tune trainable measured: its own
    import seconds and the unix time ``t_trial`` of its first line), ``worker_init``
    from this process's start, then the phases the recipe marks (`mark`).

    ``launch`` may be None (one process, no Tune): only the marked phases are kept.
    ``in_trial_actor`` (``resources.local_mode``: the trial runs in the Tune actor that
    measured ``launch``): no worker to launch; ``worker_init`` is the seconds since
    ``t_trial`` (the recipe's imports in a fresh actor, the process group)."""

    def __init__(self, launch: dict[str, float] | None = None, in_trial_actor: bool = False):
        self.last = time.time()
        self.seconds: dict[str, float] = {}
        started = process_start_time()
        if launch is not None:
            self.seconds["time/trainable_import_s"] = float(launch["trainable_import_s"])
            if in_trial_actor:
                self.seconds["time/worker_init_s"] = self.last - float(launch["t_trial"])
            elif started is not None:  # a worker started for an earlier attempt of this trial: launch < 0 is dropped
                launch_s = started - float(launch["t_trial"])
                if launch_s >= 0:
                    self.seconds["time/worker_launch_s"] = launch_s
                    self.seconds["time/worker_init_s"] = self.last - started

    def mark(self, phase: str) -> float:
        """Record the seconds since the previous mark (or since construction) as
        ``time/<phase>_s``; returns them."""
        now = time.time()
        self.seconds[f"time/{phase}_s"] = now - self.last
        self.last = now
        return self.seconds[f"time/{phase}_s"]

    @staticmethod
    def launch_info() -> dict[str, float]:
        """What a Tune trainable passes to its workers, at its first line: ``t_trial``
        (now) and ``trainable_import_s``: now − this process's start at its first trial,
        0 at the next ones of a reused actor (and where the start is unknown)."""
        global _LAUNCHED
        now, started = time.time(), process_start_time()
        first, _LAUNCHED = not _LAUNCHED, True
        return {"t_trial": now, "trainable_import_s": now - started if started is not None and first else 0.0}


#: whether this process ran a trial's `TrialTimes.launch_info` already (a reused Tune actor)
_LAUNCHED = False
