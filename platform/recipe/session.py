"""How the recipe talks to its runner: a `Session` gives a worker its rank and world size,
the checkpoint to resume from, ``report`` (metrics and, optionally, a checkpoint directory)
and Ray gauges. `RaySession` runs inside a Ray Train worker or a Tune trial actor,
`LocalSession` in one process (tests/test_golden.py runs the recipe with it).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

import ray.train
import ray.tune

from distillab.recipe.telemetry import RayGauges


class Session(Protocol):
    """What the recipe needs from its runner: this worker's ``rank`` and the ``world``
    size, `restore` (``load(directory)`` of the checkpoint to resume from, or None),
    `report` (metrics and, optionally, a checkpoint directory the session may delete
    afterwards) and `gauges` (Ray gauges, or None)."""

    rank: int
    world: int

    def restore(self, load: Callable[[Path], Any]) -> Any: ...

    def report(self, metrics: dict[str, float], checkpoint: Path | None = None) -> None: ...

    def gauges(self, trial_id: str) -> RayGauges | None: ...


class RaySession:
    """`Session` inside a Ray Train worker (``ray.train.get_context`` / ``get_checkpoint`` /
    ``report``). Every rank passes the checkpoint directory it wrote (rank 0 the weights,
    each rank its training state; Ray Train merges them into one checkpoint), removed once Ray
    copied it. ``local_mode`` (`sweep.train_in_trial_actor`): rank 0 of 1, the calls on ``ray.tune``."""

    def __init__(self, local_mode: bool = False):
        self.api, ctx = (ray.tune, None) if local_mode else (ray.train, ray.train.get_context())
        self.rank, self.world = (0, 1) if ctx is None else (ctx.get_world_rank(), ctx.get_world_size())

    def restore(self, load: Callable[[Path], Any]) -> Any:
        ckpt = self.api.get_checkpoint()
        if ckpt is None:
            return None
        with ckpt.as_directory() as d:
            return load(Path(d))

    def report(self, metrics: dict[str, float], checkpoint: Path | None = None) -> None:
        wrote = checkpoint is not None and any(Path(checkpoint).iterdir())
        ckpt = self.api.Checkpoint.from_directory(str(checkpoint)) if wrote else None
        self.api.report(metrics, checkpoint=ckpt)
        if checkpoint is not None:
            shutil.rmtree(checkpoint, ignore_errors=True)

    def gauges(self, trial_id: str) -> RayGauges | None:
        return RayGauges(trial_id)


@dataclass
class LocalSession:
    """`Session` of one process (rank 0 of 1): keeps every report in ``reports``, resumes
    from ``resume_from`` (a checkpoint directory) when given, no gauges."""

    resume_from: str | Path | None = None
    reports: list[dict[str, float]] = field(default_factory=list)
    rank: int = 0
    world: int = 1

    def restore(self, load: Callable[[Path], Any]) -> Any:
        return None if self.resume_from is None else load(Path(self.resume_from))

    def report(self, metrics: dict[str, float], checkpoint: Path | None = None) -> None:
        self.reports.append(dict(metrics))
        if checkpoint is not None:
            shutil.rmtree(checkpoint, ignore_errors=True)

    def gauges(self, trial_id: str) -> None:
        return None
