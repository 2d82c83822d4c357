"""The sweep's watch over its cluster (issue 48): placement groups that a dead Train controller
left behind are removed, and a sweep that stops making progress says why, then fails the trials
that wait, so that it always ends or progresses.

**Placement groups of dead controllers** (`remove_orphaned_placement_groups`). A trial's Train
controller, an actor owned by the Tune trial actor, creates the placement group of the trial's
worker group. When the trial actor dies (a crash, an OOM kill, a SIGKILL), the controller and
its workers die with it, but Ray keeps a placement group until its creating actor *and* that
actor's job are dead: the group, with the CPUs and GPUs of a worker group, stays reserved for
as long as the sweep's driver runs. Ray Train starts a detached ``PlacementGroupCleaner`` actor
per run for this, which asks the state API (served by the dashboard) whether the controller is
alive; without a dashboard (``distillab sweep --no-dashboard``) every question fails and it never
removes anything. On a 2-core machine two such leftovers (two killed trial actors) held both
cores and every later trial waited for its worker group for ever (``WorkerGroupStartupTimeoutError``
every 60 s; the chaos test with seed 7, issue 48). The sweep's driver asks Ray's GCS instead,
every `REAP_EVERY_S`: a placement group of this job, not detached, whose creating actor is dead,
is removed (`SweepWatch`); `sweep.TrialTrainer` leaves Ray's cleaner out (a detached actor process
per run that this replaces). So is the group of a controller that is still alive while its trial
actor is dead (`gone_actors`: Ray has not ended it yet; the controller is ended first). A
worker-group record written by a controller that is gone does not count as its trial waiting:
after a trial was failed, a ``--resume`` in the same Ray found the failed run's ``waiting`` record
while the trial's new controller started, took it for the resumed trial's and failed that too.
The GCS's placement-group and actor tables (creator, liveness, owner) are private Ray
structures (``ray._private.state``); where they moved, nothing is removed and the sweep runs as
before (tests/test_sweep.py builds its records, tests/test_faults.py reads a live one).

**Progress watchdog** (`SweepWatch`, ``fault_tolerance.stall_warn_s`` and ``stall_fail_s``).
Progress is a trial's report of a step (a Tune result: every 10 steps, at a checkpoint and at its
end, `recipe.distill.log_step`), a trial completing, or a trial's worker group placed (it got its
resources: a slow start-up that follows is not a stall). A trial *waits for resources* while
its Train controller asks for its worker group's placement group and holds none placed
(`WorkerGroupRecord`: each run's controller writes ``<root>/worker_groups/<trial id>.json``; the
GCS says which placement groups are placed); the start of its workers once placed is not waiting.
When no trial has progressed for ``stall_warn_s`` seconds while trials wait, the driver prints one
line: which trials wait, for what, for how long, and who holds that resource (`cluster_holders`).
When the stall reaches ``stall_fail_s``, each trial that has waited that long too is failed with
that line: its Tune trial actor is ended (its controller, workers and placement group go with it),
Tune does not retry it in this run, and its ``trials`` row says ``failed`` with the line as its
``error``. The other trials go on; the sweep ends as usual, and ``distillab sweep --resume``
(a new Ray, for a local one) runs the failed trials again. Both limits count the driver's own
monotonic clock and need the stall *and* the wait: a loaded machine that is slow, not stuck,
reports steps and is never failed.

**Stuck workers** (`SweepWatch.fail_silent`, ``fault_tolerance.silent_fail_s``). A trial whose
worker group is placed but which reports no step for ``silent_fail_s`` (default an hour), while
no trial progressed for as long, is failed the same way with a line that names it: its workers
hold their resources and wait on something that will not come (a lock file left by a killed
process held every later worker of a test run, issue 48; `recipe.optim.load_shm_comm_op` fixed
that cause). A stage that runs longer than that without a step report needs a higher limit.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl
import ray
from ray import tune
from ray.train.v2._internal.execution.callback import ControllerCallback, WorkerGroupCallback
from ray.util.placement_group import PlacementGroup, remove_placement_group

from distillab.tables import atomic_write_bytes, write_rows

if TYPE_CHECKING:  # the Train controller imports this module for `WorkerGroupRecord`: no config package there
    from distillab.config import FaultToleranceConfig

log = logging.getLogger(__name__)

#: the folder of a sweep that holds each Train run's worker-group record (`WorkerGroupRecord`)
RECORDS = "worker_groups"
#: seconds between two searches for the placement groups of dead controllers
REAP_EVERY_S = 5.0
#: seconds between two checks of the sweep's progress
CHECK_EVERY_S = 2.0
#: the `WorkerGroupRecord` states of a worker group that got its resources: its placing counts as progress
PLACED = ("placed", "running")
#: Ray Train V2's default callback that starts a detached PlacementGroupCleaner actor per run
#: (`sweep.TrialTrainer` leaves it out: `SweepWatch` removes the groups of dead controllers)
RAY_PG_CLEANER = "PlacementGroupCleanerCallback"


# --------------------------------------------------------------------------------------
# in the Train controller: what the trial's worker group is doing
# --------------------------------------------------------------------------------------


def record_path(root: str | Path, trial_id: str) -> Path:
    """``<root>/worker_groups/<trial_id>.json``: the trial's `WorkerGroupRecord`."""
    return Path(root) / RECORDS / f"{trial_id}.json"


class WorkerGroupRecord(ControllerCallback, WorkerGroupCallback):
    """A Ray Train callback (it runs in the trial's Train controller) that keeps
    `record_path` up to date: ``{"state", "controller", "at", ...}`` with ``state``
    ``starting`` (the controller started), ``waiting`` (it asks for its worker group's
    placement group, again after each of Ray Train's 60-s timeouts; ``wants``:
    ``{"workers": n, "resources": {"CPU": 0.99, ...}}``, the resources of each worker),
    ``placed`` (the group is placed, its workers start), ``running`` (``placement_group``: its
    id, hex), ``stopped`` (the group shut down, e.g. to restart after a worker failed) or
    ``finished``;
    ``controller`` is the controller's actor id (hex), ``at`` the time (Unix seconds).
    Written atomically (`tables.atomic_write_bytes`); a write that fails is logged and
    skipped (a callback that raises would count as a failure of the run)."""

    def __init__(self, root: str | Path, trial_id: str):
        self.path = record_path(root, trial_id)

    def after_controller_start(self, train_run_context) -> None:
        self._write("starting")

    def before_worker_group_start(self, worker_group_context) -> None:
        self._write("waiting", wants={"workers": worker_group_context.num_workers,
                                      "resources": dict(worker_group_context.resources_per_worker)})

    def before_init_train_context(self, workers) -> dict:
        self._write("placed")
        return {}

    def after_worker_group_start(self, worker_group) -> None:
        pg = worker_group.get_worker_group_state().placement_group_handle.placement_group
        self._write("running", placement_group=pg.id.hex())

    def after_worker_group_shutdown(self, worker_group_context) -> None:
        self._write("stopped")

    def after_controller_finish(self, result) -> None:
        self._write("finished")

    def _write(self, state: str, **extra: Any) -> None:
        record = {"state": state, "controller": ray.get_runtime_context().get_actor_id(), "at": time.time(), **extra}
        try:
            atomic_write_bytes(self.path, json.dumps(record).encode())
        except OSError as e:
            log.warning("could not write %s: %s", self.path, e)


def read_record(root: str | Path, trial_id: str) -> dict | None:
    """The trial's `WorkerGroupRecord` (None where there is none or it does not parse)."""
    try:
        return json.loads(record_path(root, trial_id).read_text())
    except (OSError, ValueError):
        return None


# --------------------------------------------------------------------------------------
# in the driver: placement groups, and who holds what
# --------------------------------------------------------------------------------------


def _gcs_table(read: Callable[[Any], list], message: str, what: str) -> list | None:
    """The rows of one of the cluster GCS's tables, each parsed as ``gcs_pb2.<message>``, read
    through Ray's private ``ray._private.state`` (``read``: its accessor → the raw rows); None
    where that moved (logged at debug level, naming ``what``)."""
    try:
        from ray._private.state import state  # private: see the module docstring
        from ray.core.generated import gcs_pb2

        parse = getattr(gcs_pb2, message).FromString
        return [parse(raw) for raw in read(state._connect_and_get_accessor())]
    except Exception as e:  # noqa: BLE001 - Ray's internals moved: nothing is removed, named or taken for gone
        log.debug("could not read the %s: %s", what, e)
        return None


def placement_groups() -> list | None:
    """Every placement group the cluster's GCS knows (``gcs_pb2.PlacementGroupTableData``:
    its id, state, bundles, creating job and actor, whether those are dead, whether it is
    detached); None where Ray's private table moved (`_gcs_table`)."""
    return _gcs_table(lambda gcs: gcs.get_placement_group_table(), "PlacementGroupTableData", "placement groups")


def _state(pg) -> str:
    return type(pg).PlacementGroupState.Name(pg.state)


def _creator(pg) -> str | None:
    """The creating actor's id (hex), None when a driver (a job, not an actor) created it."""
    actor = ray.ActorID(pg.creator_actor_id) if len(pg.creator_actor_id) == ray.ActorID.size() else None
    return None if actor is None or actor.is_nil() else actor.hex()


def actors() -> list | None:
    """Every actor the cluster's GCS knows (``gcs_pb2.ActorTableData``: its id, state, the
    worker it runs in, the worker that owns it); None where Ray's private table moved
    (`_gcs_table`)."""
    return _gcs_table(lambda gcs: gcs.get_actor_table(None, None), "ActorTableData", "actors")


def _dead(actor) -> bool:
    return type(actor).ActorState.Name(actor.state) == "DEAD"


def gone_actors(table: list) -> frozenset[str]:
    """The ids (hex) of the actors of ``table`` (`actors`) that are dead, or alive while the
    actor that owns them is dead: a Train controller whose Tune trial actor was killed. Ray ends
    such an actor once it learns of its owner's death, but until then it may ask for, get and
    hold a placement group, and write its trial's `WorkerGroupRecord` over the one of the
    controller that replaced it. An actor owned by a driver (no actor runs in its owner's
    worker) is never gone while alive."""
    dead_workers = {a.address.worker_id for a in table if _dead(a)}
    alive_workers = {a.address.worker_id for a in table if not _dead(a)}
    return frozenset(a.actor_id.hex() for a in table
                     if _dead(a) or (a.owner_address.worker_id in dead_workers
                                     and a.owner_address.worker_id not in alive_workers))


def orphaned(pgs: list, job_id: str, gone: frozenset[str] = frozenset()) -> list:
    """The placement groups of ``pgs`` (`placement_groups`) that the job ``job_id`` (hex)
    created from an actor that is dead, or in ``gone`` (`gone_actors`: alive, its owner dead),
    not detached and not removed yet: nothing can use them any more, yet Ray keeps them until
    the job ends (module docstring)."""
    return [pg for pg in pgs if _state(pg) != "REMOVED" and not pg.is_detached and pg.creator_job_id.hex() == job_id
            and _creator(pg) is not None and (pg.creator_actor_dead or _creator(pg) in gone)]


def _kill_actor(actor_id: str) -> None:
    """End the actor ``actor_id`` (hex) without a handle, as ``ray.kill`` does (no restart)."""
    core_worker = ray._private.worker.global_worker.core_worker  # private: ray.kill wants a handle
    core_worker.kill_actor(ray.ActorID(bytes.fromhex(actor_id)), True)


def remove_orphaned_placement_groups() -> list[str]:
    """Remove this job's placement groups whose creating actor is dead or gone (`orphaned`),
    ending a gone creator first (`gone_actors`: else it asks for another); returns their ids
    (hex). Ray must be initialised."""
    pgs = placement_groups()
    removed: list[str] = []
    if not pgs:
        return removed
    for pg in orphaned(pgs, ray.get_runtime_context().get_job_id(), gone_actors(actors() or [])):
        try:
            if not pg.creator_actor_dead:
                _kill_actor(_creator(pg))
            remove_placement_group(PlacementGroup(ray.PlacementGroupID(pg.placement_group_id)))
            removed.append(pg.placement_group_id.hex())
        except Exception as e:  # noqa: BLE001 - removed meanwhile, or the GCS is busy: tried again later
            log.debug("could not remove placement group %s: %s", pg.placement_group_id.hex(), e)
    if removed:
        log.info("removed %d placement group(s) of dead actors (a killed trial's Train controller): %s", len(removed),
                 ", ".join(removed))
    return removed


def _amounts(resources: dict[str, float]) -> str:
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(resources.items())) + "}"


def cluster_holders(resource: str, controllers: dict[str, str], trial_actor_cpus: float | None = None) -> str:
    """Who holds ``resource`` (``"CPU"``, ``"GPU"``, ...) in the cluster now, as one clause:
    ``"CPU 2 of 2 in use: 0.99 by trial t1's worker group, 0.99 by placement group 3f2a… of
    actor 9c1e… (alive; no trial controller), 0.02 by 2 Tune trial actors"``. A placement
    group is named by its creator: a trial's controller (``controllers``: controller actor id
    (hex) → trial id), a driver (Tune's trial actors when its bundle holds ``trial_actor_cpus``
    CPUs, else "the driver"), another job, or another actor (alive or dead); what is in use
    outside placement groups is one last item. Ray must be initialised."""
    total, free = ray.cluster_resources().get(resource, 0.0), ray.available_resources().get(resource, 0.0)
    items: dict[str, list[float]] = {}
    job = ray.get_runtime_context().get_job_id()
    for pg in placement_groups() or []:
        amount = sum(b.unit_resources.get(resource, 0.0) for b in pg.bundles)
        if _state(pg) != "CREATED" or amount <= 0:
            continue
        creator = _creator(pg)
        if pg.creator_job_id.hex() != job:
            who = f"placement group {pg.placement_group_id.hex()[:8]} of job {pg.creator_job_id.hex()}"
        elif creator is None:
            who = "Tune trial actor" if trial_actor_cpus is not None and math.isclose(amount, trial_actor_cpus) \
                else f"placement group {pg.placement_group_id.hex()[:8]} of the driver"
        elif creator in controllers:
            who = f"trial {controllers[creator]}'s worker group"
        else:
            who = (f"placement group {pg.placement_group_id.hex()[:8]} of actor {creator[:8]} "
                   f"({'dead' if pg.creator_actor_dead else 'alive; no trial controller'})")
        items.setdefault(who, []).append(amount)
    parts = [f"{sum(v):g} by {len(v)} {who}s" if who == "Tune trial actor" and len(v) > 1 else f"{sum(v):g} by {who}"
             for who, v in items.items()]
    outside = (total - free) - sum(sum(v) for v in items.values())
    if outside > 1e-6:
        parts.append(f"{outside:g} by actors or tasks outside placement groups")
    return f"{resource} {total - free:g} of {total:g} in use" + (": " + ", ".join(parts) if parts else "")


# --------------------------------------------------------------------------------------
# in the driver: the watch itself
# --------------------------------------------------------------------------------------


class SweepWatch(tune.Callback):
    """A Ray Tune callback in the sweep's driver: every `REAP_EVERY_S` it removes the placement
    groups of dead controllers (`remove_orphaned_placement_groups`), and every `CHECK_EVERY_S`
    it checks the sweep's progress against ``fault_tolerance``'s ``stall_warn_s`` and
    ``stall_fail_s`` (module docstring): one line (`stall_line`) when trials wait while none
    progresses, then the waiting trials failed (`fail_trial`).

    ``root``: the sweep directory; ``trial_id_of``: a Tune trial's distillab trial id
    (`sweep.trial_name`); ``trial_actor_cpus``: the CPUs of a Tune trial actor (to name their
    placement groups); ``clock`` (monotonic seconds) and ``say`` (the console: print) for tests.
    Its state starts afresh in `setup`, as a resumed sweep's Tuner brings back a pickled copy."""

    def __init__(self, root: str | Path, fault_tolerance: FaultToleranceConfig, trial_id_of: Callable[[Any], str],
                 trial_actor_cpus: float | None = None, clock: Callable[[], float] = time.monotonic,
                 say: Callable[[str], None] | None = None):
        self.root, self.limits, self.trial_id_of = Path(root), fault_tolerance, trial_id_of
        self.trial_actor_cpus, self._clock, self._say_to = trial_actor_cpus, clock, say
        self.setup()

    def _say(self, line: str) -> None:
        if self._say_to is not None:
            self._say_to(line)
        else:  # print as it is now (Tune's console may have replaced it), never a pickled copy
            print(line, flush=True)

    def setup(self, **info) -> None:
        now = self._clock()
        self._progress_at, self._reaped_at, self._checked_at = now, -math.inf, -math.inf
        self._waiting_since: dict[str, float] = {}
        self._placed_at: dict[str, float] = {}
        self._trial_progress_at: dict[str, float] = {}
        self._said: frozenset[str] = frozenset()
        self._failing: dict[str, str] = {}
        self._retries_set = False

    def on_step_begin(self, iteration: int, trials: list, **info) -> None:
        now = self._clock()
        if not self._retries_set:  # a resumed sweep: a trial saved while `fail_trial` had lowered it gets them back
            self._retries_set = True
            for trial in trials:
                trial.max_failures = self.limits.trial_retries
        if now - self._reaped_at >= REAP_EVERY_S:
            self._reaped_at = now
            remove_orphaned_placement_groups()
        if now - self._checked_at >= CHECK_EVERY_S:
            self._checked_at = now
            self.check(trials, now)

    def on_trial_result(self, iteration: int, trials: list, trial, result: dict, **info) -> None:
        self._progress_at = self._trial_progress_at[self.trial_id_of(trial)] = self._clock()

    def on_trial_complete(self, iteration: int, trials: list, trial, **info) -> None:
        self._progress_at = self._clock()

    def on_trial_error(self, iteration: int, trials: list, trial, **info) -> None:
        if self._failing.pop(self.trial_id_of(trial), None) is not None:
            trial.max_failures = self.limits.trial_retries  # its saved state keeps the sweep's setting

    def check(self, trials: list, now: float) -> None:
        """Say `stall_line` once per set of waiting trials while the stall lasts past the
        first limit; past ``stall_fail_s``, fail each trial that has waited that long."""
        warn = self.limits.stall_warn_s if self.limits.stall_warn_s is not None else math.inf
        fail = self.limits.stall_fail_s if self.limits.stall_fail_s is not None else math.inf
        running = [(t, self.trial_id_of(t)) for t in trials if t.status == "RUNNING"]
        records = [(t, tid, read_record(self.root, tid)) for t, tid in running]
        placed_at = {tid: rec.get("at") for _, tid, rec in records if rec and rec.get("state") in PLACED}
        for tid, at in placed_at.items():
            if self._placed_at.get(tid) != at:  # a worker group got its resources: the cluster is not stuck
                self._progress_at = self._trial_progress_at[tid] = now
        self._placed_at = placed_at
        self.fail_silent(records, now)
        waiting = [(t, tid, rec) for t, tid, rec in records if rec and rec.get("state") == "waiting"]
        if waiting:  # not those whose group is placed (its workers start): only the GCS knows at once,
            # nor those whose record a gone controller wrote (`gone_actors`: its trial's new one may run)
            placed = {_creator(pg) for pg in placement_groups() or [] if _state(pg) == "CREATED"}
            gone = gone_actors(actors() or [])
            waiting = [(t, tid, rec) for t, tid, rec in waiting if rec.get("controller") not in placed | gone]
        ids = frozenset(tid for _, tid, _ in waiting)
        self._waiting_since = {tid: self._waiting_since.get(tid, now) for tid in ids}
        stalled = now - self._progress_at
        if not waiting or stalled < min(warn, fail):
            self._said = frozenset()
            return
        controllers = {rec["controller"]: tid for _, tid, rec in records if rec and rec.get("controller")}
        line = self.stall_line([(tid, rec) for _, tid, rec in waiting], stalled, now, controllers)
        if ids != self._said:
            self._said = ids
            self._say(line)
        if stalled >= fail:
            for trial, tid, _ in waiting:
                if tid not in self._failing and now - self._waiting_since[tid] >= fail:
                    self.fail_trial(trial, tid, line)

    def fail_silent(self, records: list, now: float) -> None:
        """Fail each running trial whose worker group is placed but which has reported no step
        for ``silent_fail_s`` (since its group was placed or its last report) while no trial
        progressed for as long: its workers hold their resources and are stuck (a worker that
        waits on a lock its dead holder left, issue 48). ``records``: ``(trial, trial id,
        WorkerGroupRecord or None)`` of the running trials. The line names the trial, its
        silence and its placement group; `fail_trial` says it with the failure."""
        limit = self.limits.silent_fail_s
        if limit is None or now - self._progress_at < limit:
            return
        for trial, tid, rec in records:
            silent = now - self._trial_progress_at.get(tid, now)
            if tid in self._placed_at and tid not in self._failing and silent >= limit:
                group = (rec or {}).get("placement_group") or "not yet named"
                self.fail_trial(trial, tid, f"[watchdog] trial {tid} reported no step for {silent:.0f} s with its "
                                            f"workers started (placement group {group}) and no trial progressed for "
                                            f"{now - self._progress_at:.0f} s: its workers hold their resources and "
                                            f"are stuck")

    def stall_line(self, waiting: list[tuple[str, dict]], stalled: float, now: float,
                   controllers: dict[str, str]) -> str:
        """The one line: ``[watchdog] no trial reported a step for 612 s; waiting for resources:
        t1 (a worker group of 1 × {CPU: 0.99}, 605 s); held: CPU 2 of 2 in use: ...``
        (`cluster_holders` for each resource the waiting trials ask for)."""
        wanted, parts = set(), []
        for tid, rec in sorted(waiting, key=lambda w: w[0]):
            wants = rec.get("wants") or {}
            res = wants.get("resources") or {}
            wanted |= set(res)
            parts.append(f"{tid} (a worker group of {wants.get('workers', '?')} × {_amounts(res)}, "
                         f"{now - self._waiting_since.get(tid, now):.0f} s)")
        held = "; ".join(cluster_holders(r, controllers, self.trial_actor_cpus) for r in sorted(wanted))
        return (f"[watchdog] no trial reported a step for {stalled:.0f} s; waiting for resources: "
                f"{', '.join(parts)}; held: {held or 'unknown'}")

    def fail_trial(self, trial, trial_id: str, line: str) -> None:
        """Fail ``trial`` (a running Tune trial that waits, or whose workers are stuck) with ``line``:
        its Tune trial actor ended (``ray.kill``; its controller, workers and placement group go
        with it), Tune told not to retry it in this run (its ``max_failures`` set to the failures it has had, put
        back in `on_trial_error`), and its ``trials`` row ``failed`` with ``line`` as ``error``.
        Reads Tune's private ``trial.temporary_state.ray_actor`` and ``trial.run_metadata``; where
        they moved, the trial is left as it is and the console says so."""
        actor = getattr(getattr(trial, "temporary_state", None), "ray_actor", None)
        failures = getattr(getattr(trial, "run_metadata", None), "num_failures", None)
        if actor is None or failures is None:
            self._say(f"[watchdog] cannot fail trial {trial_id} (Tune's trial has no actor handle or failure "
                      f"count here); it keeps waiting")
            return
        self._failing[trial_id] = line
        trial.max_failures = failures  # Tune's should_recover (failures + 1 <= max_failures): this failure is its last
        ray.kill(actor)
        fail_row(self.root, trial_id, line)
        self._say(f"[watchdog] failed trial {trial_id} (distillab sweep --resume {self.root} runs it again): {line}")


def fail_row(root: Path, trial_id: str, error: str) -> None:
    """Mark the trial's row of the ``trials`` table ``failed`` with ``error`` and an end time
    (the row `sweep.run_trial` wrote as the trial started; none: nothing to mark)."""
    path = root / "trials" / f"{trial_id}.parquet"
    if not path.exists():
        return
    row = pl.read_parquet(path).row(0, named=True)
    row.update(status="failed", error=error, end_time=time.time())
    write_rows(root, "trials", [row], key=trial_id)
