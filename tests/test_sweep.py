"""Real micro trials through Ray Tune → Ray Train (DeepSpeed) → Parquet results.

Uses the session's ``smoke_sweep`` (tests/conftest.py): search_spaces/smoke.yaml,
2 trials (OffPD forward KL, OnPD forward KL) on a local Ray."""

import json
import re
import time
from pathlib import Path

import polars as pl
import pytest

from distillab.config import load_sweep

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_micro_trials_through_tune(smoke_sweep):
    from distillab.analysis.results import load

    sweep = load_sweep(REPO / "search_spaces" / "smoke.yaml")
    steps = sweep.trial.optimizer.steps
    res = load(smoke_sweep)
    trials = res.trials.collect().sort("rollout.policy")
    assert trials.height == 2  # one row per configuration
    assert trials["rollout.policy"].to_list() == ["offpd", "onpd"]
    for row in trials.iter_rows(named=True):
        assert row["status"] == "completed", row["error"]
        assert (Path(row["checkpoint"]) / "model.safetensors").exists()
        assert row["end_time"] > row["start_time"]

    metrics = res.metrics.collect()
    for tid in trials["trial_id"]:
        loss = metrics.filter((pl.col("trial_id") == tid) & (pl.col("name") == "loss")).sort("step")
        assert loss["step"].to_list() == list(range(1, steps + 1))  # each step exactly once
        assert loss["value"].is_finite().all() and (loss["value"] >= 0).all()
        gn = metrics.filter((pl.col("trial_id") == tid) & (pl.col("name") == "grad_norm"))["value"]
        assert gn.len() == steps and (gn > 0).all() and gn.is_finite().all()
        fkl = metrics.filter((pl.col("trial_id") == tid) & (pl.col("name") == "kl/forward"))["value"]
        # forward KL is the optimised loss here (seq_mean vs token mean differ only by weighting)
        assert (fkl >= 0).all()

    evals = res.evals.collect()
    for tid in trials["trial_id"]:
        for stage, step in (("pre", 0), ("distill", steps)):
            got = evals.filter((pl.col("trial_id") == tid) & (pl.col("stage") == stage) & (pl.col("step") == step))
            keys = set(zip(got["task"], got["metric"]))
            for task in ("countdown3", "countdown4e"):
                assert {(task, "accuracy"), (task, "pass@1"), (task, "pass@2")} <= keys
            assert {("ood", "ood_mean"), ("params", "sparsity@1e-06"), ("params", "sparsity@1e-08")} <= keys
            assert got["value"].is_between(0, 1).all()
            sp = dict(zip(got["metric"], got["value"]))
            if stage == "pre":
                assert sp["sparsity@1e-06"] == 1.0  # nothing has moved yet
            else:  # 4 AdamW steps at lr 1e-3 move most weights by more than 1e-6
                assert sp["sparsity@1e-08"] <= sp["sparsity@1e-06"] < 0.5


@pytest.mark.slow
def test_local_mode_trials_equal_the_worker_groups(smoke_sweep, tmp_path):
    """``distillab sweep search_spaces/smoke.yaml --set resources.local_mode=true``: the
    same two smoke trials run in their Tune trial actors (no Train worker group) give
    the session's smoke sweep's numbers exactly (every per-step metric but the
    wall-clock ones, every evaluation row), a final checkpoint (Tune's) holding the
    student's weights, and the same calm console: one line per finished stage of each
    trial, no Tune checkpoint notes."""
    import subprocess
    import sys

    from distillab.analysis.results import load
    from distillab.tables import run_records

    cmd = [sys.executable, "-m", "distillab.driver.cli", "sweep", str(REPO / "search_spaces" / "smoke.yaml"), "--no-dashboard"]
    sets = (f"storage_path={tmp_path}", f"models.cache_dir={REPO / '.cache' / 'models'}", "resources.local_mode=true")
    for kv in sets:
        cmd += ["--set", kv]
    t_run = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800)
    t_run = time.perf_counter() - t_run
    assert proc.returncode == 0, proc.stdout[-4000:]
    local, group = load(tmp_path / "smoke"), load(smoke_sweep)
    trials = local.trials.collect()
    assert trials["status"].to_list() == ["completed"] * 2, trials["error"].to_list()
    for path in trials["checkpoint"]:
        assert Path(path).parent.parent == tmp_path / "smoke" / "tune" and (Path(path) / "model.safetensors").exists()
    assert sorted(trials["trial_id"]) == sorted(group.trials.collect()["trial_id"])
    timed = pl.col("name").str.starts_with("time/") | pl.col("name").str.contains("tokens_per_s|_s$")
    keys = ["trial_id", "stage", "step", "name"]
    m_local, m_group = (r.metrics.filter(~timed).collect().sort(keys) for r in (local, group))
    assert m_local.height > 50 and m_local.select(*keys, "value").equals(m_group.select(*keys, "value"))
    keys = ["trial_id", "stage", "step", "task", "metric"]
    e_local, e_group = (r.evals.collect().sort(keys) for r in (local, group))
    assert e_local.height > 50 and e_local.select(*keys, "value").equals(e_group.select(*keys, "value"))
    lines = proc.stdout.splitlines()
    assert len(lines) <= 60 and "Checkpoint successfully created" not in proc.stdout, proc.stdout
    for tid in trials["trial_id"]:
        for stage in ("pre step 0:", "distill step 4:"):
            assert len([x for x in lines if f"[trial] {tid} {stage}" in x]) == 1, proc.stdout
    # [time] total counts from the process's start: at least start-up + prepare + sweep + ray.shutdown, less
    # ray.init, which the sweep's seconds count and which ran inside the start-up (beside its imports and
    # checks); and it is the total kept in the sweep's run record
    times = {m[1]: float(m[2]) for m in re.finditer(r"^\[time\] ([\w. -]+): ([\d.]+) s", proc.stdout, re.M)}
    parts = ("start-up", "prepare", "sweep", "ray.shutdown")
    assert set(parts) | {"total", "ray.init"} <= set(times), times
    assert times["ray.init"] <= times["start-up"] + 0.1, times
    assert times["total"] >= sum(times[k] for k in parts) - times["ray.init"] - 0.25, times
    assert times["total"] <= t_run, (times, t_run)  # and no more than the process ran
    # the [time] line prints one decimal (telemetry.print_time): the record's seconds within half a unit of it
    assert run_records(tmp_path / "smoke")[-1]["seconds"]["total"] == pytest.approx(times["total"], abs=0.05)


@pytest.fixture(scope="module")
def divergence_and_estimator_sweep(run_locally, tmp_path_factory):
    """One smoke sweep, a union of two grids (lean for CI: one local Ray, 6 trials):
    OffPD ``loss.kind: [forward, reverse, jsd]`` with ``loss.beta`` 0.5, 3 steps; and OnPD
    reverse KL ``loss.estimator: [full, topk, k3]`` (the cell every estimator applies to)
    with the oracle at both of 2 steps. Returns ``(sweep, results)``."""
    from distillab.analysis.results import load

    tmp_path = tmp_path_factory.mktemp("divergences")
    sweep = load_sweep(REPO / "search_spaces" / "smoke.yaml", {
        "storage_path": str(tmp_path), "models.cache_dir": str(REPO / ".cache" / "models"),
        "search.grid": None, "search.grids": [
            {"set": {"rollout.policy": "offpd", "loss.beta": 0.5, "optimizer.steps": 3},
             "grid": {"loss.kind": ["forward", "reverse", "jsd"]}},
            {"set": {"rollout.policy": "onpd", "loss.kind": "reverse", "loss.top_k": 4, "loss.oracle_every": 1,
                     "optimizer.steps": 2, "optimizer.warmup_steps": 1},
             "grid": {"loss.estimator": ["full", "topk", "k3"]}}],
        "trial.evaluation.countdown_tasks": ["countdown3"], "trial.evaluation.id_items": 2,
        "trial.evaluation.pass_items": 1, "trial.evaluation.ood_items": 1, "trial.evaluation.sparsity_touched": False,
        "resources.local_mode": True})
    return sweep, load(run_locally(sweep))


@pytest.mark.slow
def test_smoke_grid_over_the_divergence(divergence_and_estimator_sweep):
    """``loss.kind: [forward, reverse, jsd]`` with one ``loss.beta``: three trials complete,
    the JSD trial is named by its β, and each trains on its own divergence (β is read by
    jsd only, so forward and reverse runs differ from it)."""
    sweep, res = divergence_and_estimator_sweep
    assert [t.trial_id.split("-")[1] for t in sweep.trials[:3]] == ["forward", "reverse", "jsd0.5"]
    trials = res.trials.collect().filter(pl.col("rollout.policy") == "offpd").sort("loss.kind")
    assert trials["loss.kind"].to_list() == ["forward", "jsd", "reverse"]
    assert (trials["status"] == "completed").all(), trials["error"].to_list()
    assert trials["loss.beta"].to_list() == [0.5] * 3
    by_kind = dict(zip(trials["trial_id"], trials["loss.kind"]))
    loss = res.metrics.filter((pl.col("name") == "loss") & (pl.col("step") == 1)
                              & pl.col("trial_id").is_in(list(by_kind))).collect()
    first = {by_kind[t]: v for t, v in zip(loss["trial_id"], loss["value"])}
    assert len(first) == 3 and all(v >= 0 for v in first.values())
    # the same OffPD rollouts at step 1 (same seed, same teacher): JSD(0.5) is bounded by log 2 per token
    assert first["jsd"] <= 0.6932 and first["jsd"] != first["forward"] and first["jsd"] != first["reverse"]


@pytest.mark.slow
def test_smoke_grid_over_the_estimators(divergence_and_estimator_sweep):
    """``loss.estimator: [full, topk, k3]`` (OnPD reverse KL) with the oracle at both of 2 steps:
    three trials complete, named by their estimator; at steps 1 and 2 each logs estimator/bias
    and estimator/grad_cos: 0 and 1 for full, a real gap for the others; figure (h) draws them."""
    from distillab.analysis.plots import fig_estimator, figure_notes

    sweep, res = divergence_and_estimator_sweep
    assert [t.trial_id.split("-lr")[0] for t in sweep.trials[3:]] == [
        "onpd-reverse", "onpd-reverse-topk4-teacher", "onpd-reverse-k3"]
    trials = res.trials.collect().filter(pl.col("rollout.policy") == "onpd")
    assert trials.height == 3 and (trials["status"] == "completed").all(), trials["error"].to_list()
    by_id = dict(zip(trials["trial_id"], trials["loss.estimator"]))
    m = res.metrics.filter(pl.col("name").str.starts_with("estimator/")).collect()
    for name in ("estimator/bias", "estimator/grad_cos"):
        rows = m.filter(pl.col("name") == name)
        assert sorted(set(rows["step"].to_list())) == [1, 2] and rows.height == 6  # the OnPD trials only
        vals = {(by_id[t], s): v for t, s, v in zip(rows["trial_id"], rows["step"], rows["value"])}
        for step in (1, 2):
            if name == "estimator/bias":
                assert abs(vals[("full", step)]) < 1e-5 and abs(vals[("topk", step)]) > 1e-5
            else:
                assert vals[("full", step)] == pytest.approx(1.0, abs=1e-5)
                assert -1.0 <= vals[("k3", step)] < 0.999 and vals[("topk", step)] < 0.999999
    assert figure_notes(fig_estimator(res)) == []


# --------------------------------------------------------------------------------------
# the watchdog's logic (driver/watchdog.py), on hand-made placement groups and trials
# --------------------------------------------------------------------------------------

JOB, OTHER_JOB = "01000000", "02000000"


def _pg(n: int, state: str = "CREATED", *, creator: int | None = 7, dead: bool = True, job: str = JOB,
        detached: bool = False, cpus: float = 0.99):
    """A GCS placement-group record: id ``n``, created by actor ``creator`` (None: a driver) of ``job``."""
    import ray
    from ray.core.generated import gcs_pb2

    pg = gcs_pb2.PlacementGroupTableData(
        placement_group_id=bytes([n]) * 18, state=gcs_pb2.PlacementGroupTableData.PlacementGroupState.Value(state),
        creator_job_id=bytes.fromhex(job), creator_actor_dead=dead, is_detached=detached,
        creator_actor_id=bytes([creator]) * ray.ActorID.size() if creator is not None else ray.ActorID.nil().binary())
    pg.bundles.add().unit_resources["CPU"] = cpus
    return pg


def test_orphaned_placement_groups_are_this_jobs_with_a_dead_creating_actor() -> None:
    """`watchdog.orphaned`: of six groups only the one this job created from an actor now dead
    (not detached, not removed) is orphaned; a driver's (Tune's trial actors'), a live actor's,
    a detached one, another job's and a removed one stay."""
    from distillab.driver.watchdog import orphaned

    pgs = [_pg(1), _pg(2, creator=None), _pg(3, dead=False), _pg(4, detached=True), _pg(5, job=OTHER_JOB),
           _pg(6, "REMOVED"), _pg(7, "PENDING")]
    assert [pg.placement_group_id[0] for pg in orphaned(pgs, JOB)] == [1, 7]  # a pending one would be placed later


def _actor(n: int, state: str, worker: int, owner: int):
    """A GCS actor record: id ``n``, running in worker ``worker``, owned by worker ``owner``."""
    import ray
    from ray.core.generated import gcs_pb2

    a = gcs_pb2.ActorTableData(actor_id=bytes([n]) * ray.ActorID.size(),
                               state=gcs_pb2.ActorTableData.ActorState.Value(state))
    a.address.worker_id = bytes([worker]) * 28
    a.owner_address.worker_id = bytes([owner]) * 28
    return a


def test_gone_actors_are_dead_or_owned_by_a_dead_actor() -> None:
    """`watchdog.gone_actors`: a killed Tune trial actor (1, in worker 11, owned by the driver's
    worker 10) is gone, and so is its still-alive controller (2, owned by worker 11); a live trial
    actor (3) and its controller (4) are not, nor is an actor the driver owns (5: no actor runs in
    worker 10); `orphaned` then takes the gone controller's group too, not the live one's."""
    import ray

    from distillab.driver.watchdog import gone_actors, orphaned

    table = [_actor(1, "DEAD", 11, 10), _actor(2, "ALIVE", 12, 11), _actor(3, "ALIVE", 13, 10),
             _actor(4, "ALIVE", 14, 13), _actor(5, "ALIVE", 15, 10)]
    gone = gone_actors(table)
    assert gone == {bytes([1]).hex() * ray.ActorID.size(), bytes([2]).hex() * ray.ActorID.size()}
    pgs = [_pg(1, creator=2, dead=False), _pg(2, creator=4, dead=False), _pg(3, creator=1)]
    assert [pg.placement_group_id[0] for pg in orphaned(pgs, JOB, gone)] == [1, 3]


def test_cluster_holders_name_each_placement_groups_creator(monkeypatch) -> None:
    """`watchdog.cluster_holders` on 4 CPUs, 0.03 free: a trial's worker group, a dead actor's
    group, two Tune trial actors (a driver's 0.01-CPU groups), another job's group and what is
    in use outside placement groups (3.97 in use, 3.0 of it in placed groups: 0.97); a pending
    group holds nothing."""
    import ray

    import distillab.driver.watchdog as w

    pgs = [_pg(1, creator=9, dead=False), _pg(2), _pg(3, creator=None, cpus=0.01), _pg(4, creator=None, cpus=0.01),
           _pg(5, job=OTHER_JOB, cpus=1.0), _pg(6, "PENDING")]
    monkeypatch.setattr(w, "placement_groups", lambda: pgs)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 4.0})
    monkeypatch.setattr(ray, "available_resources", lambda: {"CPU": 0.03})
    monkeypatch.setattr(ray, "get_runtime_context", lambda: type("C", (), {"get_job_id": lambda self: JOB})())
    held = w.cluster_holders("CPU", {bytes([9]).hex() * ray.ActorID.size(): "t1"}, trial_actor_cpus=0.01)
    assert held == ("CPU 3.97 of 4 in use: 0.99 by trial t1's worker group, 0.99 by placement group 02020202 of "
                    "actor 07070707 (dead), 0.02 by 2 Tune trial actors, 1 by placement group 05050505 of job "
                    "02000000, 0.97 by actors or tasks outside placement groups")


def _trial(tmp_path, tid: str, state: str | None, controller: str = "c1", status: str = "RUNNING"):
    """A Tune trial as `SweepWatch` sees it, its trials row (running) and its worker-group record."""
    from types import SimpleNamespace

    from distillab.driver.watchdog import record_path
    from distillab.tables import atomic_write_bytes, write_rows

    write_rows(tmp_path, "trials", [dict(trial_id=tid, status="running", start_time=1.0, end_time=float("nan"),
                                         checkpoint=None, error=None, seed=1)], key=tid)
    if state is not None:
        record = {"state": state, "controller": controller, "at": 0.0,
                  "wants": {"workers": 1, "resources": {"CPU": 0.99}}}
        atomic_write_bytes(record_path(tmp_path, tid), json.dumps(record).encode())
    killed = []
    trial = SimpleNamespace(status=status, tid=tid, max_failures=3, run_metadata=SimpleNamespace(num_failures=1),
                            temporary_state=SimpleNamespace(ray_actor=SimpleNamespace(kill=lambda: killed.append(tid))))
    return trial, killed


def test_sweep_watch_says_once_then_fails_the_waiting_trial(tmp_path, monkeypatch) -> None:
    """`SweepWatch` with warn 60 s, fail 300 s on a fake clock: t1 waits for its worker group,
    t2 runs (its controller holds a placed group), t3 is pending in Tune. Nothing is said before
    60 s without a step; at 60 s one line names t1 alone (for 60 s: the watch first saw it
    waiting at 0), and is not said again while the set is the same; a step report resets the
    stall, and so does t2's worker group placed anew; 300 s after that t1 (waiting 500 s) is failed: its Tune actor killed, Tune told its failure
    is its last (max_failures = the 1 failure it had), its row failed with the line; the error
    puts the sweep's trial_retries back."""
    import ray

    import distillab.driver.watchdog as w
    from distillab.config import FaultToleranceConfig
    from distillab.driver.watchdog import record_path
    from distillab.tables import atomic_write_bytes

    t1, killed = _trial(tmp_path, "t1", "waiting", controller="c1")
    t2, _ = _trial(tmp_path, "t2", "running", controller="c2")
    t3, _ = _trial(tmp_path, "t3", None, status="PENDING")
    monkeypatch.setattr(w, "placement_groups", lambda: [_pg(1, creator=2, dead=False)])
    monkeypatch.setattr(w, "_creator", lambda pg: "c2")  # t2's controller holds a placed group
    monkeypatch.setattr(w, "cluster_holders", lambda r, controllers, cpus: f"{r} held, controllers {controllers}")
    monkeypatch.setattr(ray, "kill", lambda actor: actor.kill())
    monkeypatch.setattr(w, "remove_orphaned_placement_groups", list)  # no Ray here
    monkeypatch.setattr(w, "actors", list)
    clock, said = [0.0], []
    watch = w.SweepWatch(tmp_path, FaultToleranceConfig(trial_retries=3, stall_warn_s=60, stall_fail_s=300),
                         lambda t: t.tid,
                         clock=lambda: clock[0], say=said.append)
    trials = [t1, t2, t3]

    def at(t: float) -> None:
        clock[0] = t
        watch.check(trials, t)

    at(0.0)
    at(59.0)
    assert said == []
    at(60.0)
    line = ("[watchdog] no trial reported a step for 60 s; waiting for resources: t1 (a worker group of 1 × "
            "{CPU: 0.99}, 60 s); held: CPU held, controllers {'c1': 't1', 'c2': 't2'}")
    assert said == [line]
    at(120.0)
    assert said == [line] and killed == []  # the same set: not said again
    watch.on_trial_result(0, trials, t2, {})   # t2 reports a step at 120 s: the stall starts again
    at(179.0)
    assert said == [line]
    atomic_write_bytes(record_path(tmp_path, "t2"), json.dumps({"state": "placed", "controller": "c2", "at": 1.0}).encode())
    at(200.0)  # t2's worker group placed anew (e.g. after a restart): progress too
    at(499.0)  # a new stall, said anew; not failed yet
    again = line.replace("for 60 s", "for 299 s").replace("60 s);", "499 s);")
    assert killed == [] and said == [line, again]
    at(500.0)  # 300 s without a step or a placing, t1 waiting 500 s
    fail_line = line.replace("for 60 s", "for 300 s").replace("60 s);", "500 s);")
    assert killed == ["t1"] and t1.max_failures == 1
    failed = f"[watchdog] failed trial t1 (distillab sweep --resume {tmp_path} runs it again): {fail_line}"
    assert said == [line, again, failed]
    row = pl.read_parquet(tmp_path / "trials" / "t1.parquet").row(0, named=True)
    assert (row["status"], row["error"]) == ("failed", fail_line) and row["end_time"] > 0
    at(501.0)
    assert killed == ["t1"]  # failed once
    watch.on_trial_error(0, trials, t1)
    assert t1.max_failures == 3  # the sweep's trial_retries, as Tune saves it
    t1.max_failures = 1  # saved while lowered (the driver killed in between), then resumed:
    watch.setup()
    watch.on_step_begin(0, trials)
    assert [t.max_failures for t in trials] == [3, 3, 3]  # the sweep's setting again, for every trial


def test_sweep_watch_ignores_a_record_that_a_gone_controller_wrote(tmp_path, monkeypatch) -> None:
    """t1's record says ``waiting`` but its controller c1 is gone (`watchdog.gone_actors`: its
    trial actor was killed and a new controller may run the trial): with warn 60 s and fail 300 s
    nothing is said or failed in 400 s without a step; the same record from a live c1 is failed at 300 s."""
    import ray

    import distillab.driver.watchdog as w
    from distillab.config import FaultToleranceConfig

    t1, killed = _trial(tmp_path, "t1", "waiting", controller="c1")
    monkeypatch.setattr(w, "placement_groups", list)
    monkeypatch.setattr(w, "actors", list)
    monkeypatch.setattr(w, "cluster_holders", lambda r, controllers, cpus: f"{r} held")
    monkeypatch.setattr(ray, "kill", lambda actor: actor.kill())
    for gone, failed in ((frozenset({"c1"}), []), (frozenset(), ["t1"])):
        monkeypatch.setattr(w, "gone_actors", lambda table, gone=gone: gone)
        said: list[str] = []
        watch = w.SweepWatch(tmp_path, FaultToleranceConfig(trial_retries=3, stall_warn_s=60, stall_fail_s=300),
                             lambda t: t.tid, clock=lambda: 0.0, say=said.append)
        for now in (0.0, 60.0, 300.0, 400.0):
            watch.check([t1], now)
        assert killed == failed and len(said) == 2 * len(failed)  # the stall line, then the failure


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Ray Data's, as Ray's own DatasetsCallback is built
def test_trial_trainer_starts_no_placement_group_cleaner(tmp_path) -> None:
    """`sweep.TrialTrainer` leaves out exactly two of Ray Train's default callbacks: Ray Data's
    (no datasets) and the PlacementGroupCleaner's (`watchdog.RAY_PG_CLEANER`: the driver removes a
    dead controller's placement group). Both names are Ray 2.60's own: a Ray that renames them
    shows here, before a sweep starts the actors again."""
    import ray.train
    from ray.train.torch import TorchTrainer

    from distillab.driver.sweep import TrialTrainer, train_fn
    from distillab.driver.watchdog import RAY_PG_CLEANER

    trainer = TrialTrainer(train_fn, scaling_config=ray.train.ScalingConfig(num_workers=1),
                           run_config=ray.train.RunConfig(name="t", storage_path=str(tmp_path)))
    ours = {type(c).__name__ for c in trainer._create_default_callbacks()}
    rays = {type(c).__name__ for c in TorchTrainer._create_default_callbacks(trainer)}
    assert rays - ours == {RAY_PG_CLEANER, "DatasetsCallback"}


def test_sweep_watch_fails_a_trial_whose_started_workers_stay_silent(tmp_path, monkeypatch) -> None:
    """`SweepWatch.fail_silent` with ``silent_fail_s`` 600: t1's and t2's worker groups are placed
    at 0; t1 reports a step at 100, then nothing; t2 reports at 650 and completes. At 700 (t1 silent
    600 s) the sweep is not stalled and t1 runs on; at 1249 nothing yet; at 1250 (no step from any
    trial for 600 s, t1 silent 1150 s) t1 is failed with the line that names it and its placement
    group, once. With ``silent_fail_s`` null nothing is failed in 5000 s."""
    import ray

    import distillab.driver.watchdog as w
    from distillab.config import FaultToleranceConfig
    from distillab.driver.watchdog import record_path
    from distillab.tables import atomic_write_bytes

    monkeypatch.setattr(w, "placement_groups", list)
    monkeypatch.setattr(w, "actors", list)
    monkeypatch.setattr(ray, "kill", lambda actor: actor.kill())
    for limit, failed_at in ((600.0, 1250.0), (None, None)):
        t1, killed = _trial(tmp_path, "t1", "running", controller="c1")
        t2, _ = _trial(tmp_path, "t2", "running", controller="c2")
        atomic_write_bytes(record_path(tmp_path, "t1"), json.dumps(
            {"state": "running", "controller": "c1", "at": 0.0, "placement_group": "ab12"}).encode())
        clock, said = [0.0], []
        watch = w.SweepWatch(tmp_path, FaultToleranceConfig(stall_warn_s=60, stall_fail_s=300, silent_fail_s=limit),
                             lambda t: t.tid, clock=lambda: clock[0], say=said.append)
        for now in (0.0, 100.0, 650.0, 700.0, 1249.0, 1250.0, 1300.0, 5000.0):
            clock[0] = now
            if now == 100.0:
                watch.on_trial_result(0, [t1, t2], t1, {})
            if now == 650.0:
                watch.on_trial_result(0, [t1, t2], t2, {})
                t2.status = "TERMINATED"
                watch.on_trial_complete(0, [t1, t2], t2)
            watch.check([t1, t2], now)
            if failed_at is None or now < failed_at:
                assert killed == [] and said == [], now
        if failed_at is None:
            continue
        line = ("[watchdog] trial t1 reported no step for 1150 s with its workers started (placement group ab12) "
                "and no trial progressed for 600 s: its workers hold their resources and are stuck")
        assert killed == ["t1"]
        assert said == [f"[watchdog] failed trial t1 (distillab sweep --resume {tmp_path} runs it again): {line}"]
        row = pl.read_parquet(tmp_path / "trials" / "t1.parquet").row(0, named=True)
        assert (row["status"], row["error"]) == ("failed", line)
