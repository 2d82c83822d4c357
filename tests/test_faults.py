"""Sweeps that survive faults and run as Ray jobs (slow; real Ray, Tune, Train, DeepSpeed):

- a Train worker killed with SIGKILL mid-trial: the trial resumes from its last
  checkpoint and every (trial, step, name) metric lands exactly once;
- the sweep driver killed after the first trial completes, then ``--resume``;
- a 2-node local cluster losing a node mid-sweep;
- ``ray job submit`` against a head started here (a subprocess ended by its PID,
  never ``ray stop``), with the custom Ray metrics on the head's metrics endpoint.

All on the smoke models (search_spaces/smoke.yaml), cached under ``.cache/models``.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import polars as pl
import pytest
from _helpers import init_local_ray

from distillab.config import load_sweep
from distillab.driver.raystart import LOCAL_SYSTEM_CONFIG

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache"
SMOKE = REPO / "search_spaces" / "smoke.yaml"

pytestmark = pytest.mark.slow


def _sweep(tmp_path: Path, **overrides):
    base = {"storage_path": str(tmp_path), "models.cache_dir": str(CACHE / "models")}
    return load_sweep(SMOKE, {**base, **overrides})


def _metric_steps(root: Path) -> list[int]:
    d = root / "metrics"
    return [int(f.stem.rsplit("__", 1)[1]) for f in d.glob("*.parquet")] if d.exists() else []


def _assert_metrics_once(res) -> pl.DataFrame:
    m = res.metrics.collect()
    dup = m.group_by("trial_id", "stage", "step", "name").len().filter(pl.col("len") > 1)
    assert dup.is_empty(), dup
    return m


def _kill_session(sid: int) -> None:
    """SIGKILL every process of session ``sid`` (a process started with
    ``start_new_session=True``): that driver or head and the Ray processes it started."""
    out = subprocess.run(["ps", "-eo", "pid=,sid="], capture_output=True, text=True).stdout
    for line in out.splitlines():
        pid, s = map(int, line.split())
        if s == sid and pid != os.getpid():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _train_worker_pids(title: str = "ray::RayTrainWorker") -> list[int]:
    """PIDs of live Ray Train workers (process title ``ray::RayTrainWorker...``; or of
    another ``title`` prefix: ``ray::ImplicitFunc``, the Tune trial actors of a function trainable) that descend
    from this process, i.e. belong to the Ray this test started."""
    me, out = os.getpid(), []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            if not cmd.startswith(title):
                continue
            pid = int(d.name)
            while pid > 1 and pid != me:
                pid = int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if pid == me:
                out.append(int(d.name))
        except (OSError, ValueError, IndexError):
            continue
    return out


def _registered_checkpoints(root: Path, local_mode: bool = False) -> int:
    """How many checkpoints Ray Train's controller has registered for the sweep's runs
    (its ``checkpoint_manager_snapshot.json`` under ``train/<trial_id>/``); with
    ``local_mode``, how many Tune has persisted (``tune/<trial>/checkpoint_*``)."""
    import json

    if local_mode:
        return len(list((root / "tune").glob("*/checkpoint_*")))
    n = 0
    for f in (root / "train").glob("*/checkpoint_manager_snapshot.json"):
        try:
            n += len(json.loads(f.read_text()).get("checkpoint_results", []))
        except (OSError, ValueError):
            pass
    return n


def _sweep_beside(killer, sweep, teacher: Path, student: Path, num_cpus: int = 2, address: str | None = None,
                  then=None) -> None:
    """``run_sweep`` on a local Ray of ``num_cpus`` CPUs without the dashboard (or on the cluster at
    ``address``), ``killer`` in a thread beside it, then ``then()`` in the same Ray;
    ``ray.shutdown()`` after."""
    import ray

    from distillab.driver.sweep import run_sweep

    if address:
        ray.init(address=address)
    else:
        init_local_ray(num_cpus)
    try:
        t = threading.Thread(target=killer, daemon=True)
        t.start()
        run_sweep(sweep, teacher, student, verbose=0)
        t.join(timeout=5)
        if then is not None:
            then()
    finally:
        ray.shutdown()


def _assert_one_trial_completed(res) -> pl.DataFrame:
    """The sweep's one trial completed, each metric row once; returns the metrics."""
    trial = res.trials.collect()
    assert trial.height == 1 and trial["status"].item() == "completed", trial["error"].item()
    return _assert_metrics_once(res)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------------------
# a Train worker killed mid-trial
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("local_mode", [False, True], ids=["worker_group", "local_mode"])
def test_killed_worker_resumes_from_checkpoint(tmp_path: Path, local_mode: bool) -> None:
    """The process running the trial, SIGKILLed past a checkpoint: a Train worker (Ray
    Train restarts its worker group) or, with ``resources.local_mode``, the Tune trial
    actor (Tune retries the trial). Either way the trial resumes from that checkpoint."""
    from distillab.analysis.results import load
    from distillab.recipe.prepare import prepare

    steps, every = 200, 50
    sweep = _sweep(tmp_path, **{"search.grid": {"rollout.policy": ["onpd"]}, "trial.optimizer.steps": steps,
                                "trial.optimizer.checkpoint_every": every, "fault_tolerance.worker_restarts": 2,
                                "resources.local_mode": local_mode})
    root = sweep.sweep_dir()
    teacher, student = prepare(sweep, threads=1)
    killed: dict[str, int] = {}

    def killer() -> None:
        pid, deadline = None, time.time() + 600
        while time.time() < deadline and not killed:
            if pid is None:
                alive = _train_worker_pids("ray::ImplicitFunc" if local_mode else "ray::RayTrainWorker")
                pid = alive[0] if alive else None
            elif _registered_checkpoints(root, local_mode) and max(_metric_steps(root), default=0) > every:
                killed["at_step"] = max(_metric_steps(root))  # past a checkpoint that Train has registered
                os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)

    _sweep_beside(killer, sweep, teacher, student, num_cpus=2)
    assert killed and killed["at_step"] < steps, killed  # the kill happened mid-trial
    res = load(root)
    m = _assert_one_trial_completed(res)
    loss = m.filter(pl.col("name") == "loss").sort("step")
    assert loss["step"].to_list() == list(range(1, steps + 1))  # every step exactly once
    resumed = m.filter(pl.col("name") == "resume/start_step")["value"].to_list()
    # the restart continued from a checkpoint (a multiple of `every`, > 0), not from step 0
    assert len(resumed) == 1 and resumed[0] > 0 and resumed[0] % every == 0 and resumed[0] <= killed["at_step"]
    ev = res.evals.collect()
    assert ev.filter(pl.col("stage") == "pre")["step"].unique().to_list() == [0]
    assert ev.filter(pl.col("stage") == "distill")["step"].unique().to_list() == [steps]


# --------------------------------------------------------------------------------------
# a Tune trial actor killed on a one-CPU Ray: the wedge of issue 48, the watchdog, the fix
# --------------------------------------------------------------------------------------


def test_killed_trial_actor_wedge_is_said_failed_and_freed(tmp_path: Path, capsys, monkeypatch) -> None:
    """The wedge of issue 48 at its smallest, then its fix. A Tune trial actor is SIGKILLed while
    its worker group runs, past its step-10 checkpoint, on a one-CPU Ray without a dashboard: its
    Train controller and worker die with it, but Ray keeps their placement group (0.99 CPU) while
    the job lives. With the driver's removal of such groups switched off (as before the fix; Ray
    Train's own cleaner cannot tell without the dashboard), the retried trial waits for its worker
    group for ever (0.98 CPU free): the watchdog says so in one line, naming the dead actor's group
    as the holder, after ``stall_warn_s``, fails the trial after ``stall_fail_s`` (once: not
    retried, although ``trial_retries`` allows 3) and the sweep ends. ``resume_sweep`` in the same
    Ray, the removal on, frees the group: the trial resumes from its checkpoint and completes,
    and the ``waiting`` record that the failed trial's controller (dead now) left is not taken for
    the resumed trial's (before `watchdog.gone_actors` it was, under load, and the resumed trial
    was failed too)."""
    from distillab.analysis.results import load
    from distillab.driver import watchdog
    from distillab.driver.sweep import resume_sweep
    from distillab.recipe.prepare import prepare

    steps, every = 20, 10
    sweep = _sweep(tmp_path, **{"search.grid": {"rollout.policy": ["offpd"]}, "trial.optimizer.steps": steps,
                                "trial.optimizer.checkpoint_every": every, "fault_tolerance.trial_retries": 3,
                                "fault_tolerance.stall_warn_s": 5, "fault_tolerance.stall_fail_s": 20})
    (tid,) = [t.trial_id for t in sweep.trials]
    root = sweep.sweep_dir()
    teacher, student = prepare(sweep, threads=1)
    killed: dict[str, int] = {}

    def killer() -> None:
        deadline = time.time() + 900
        while time.time() < deadline and not killed:
            actors = _train_worker_pids("ray::ImplicitFunc")
            if actors and _train_worker_pids() and _registered_checkpoints(root):
                os.kill(actors[0], signal.SIGKILL)  # its worker group runs: its placement group is placed
                killed["pid"] = actors[0]
            time.sleep(0.2)

    def resume() -> None:
        monkeypatch.undo()
        resume_sweep(root, teacher, student, verbose=0)

    monkeypatch.setattr(watchdog, "remove_orphaned_placement_groups", list)  # as before the fix
    _sweep_beside(killer, sweep, teacher, student, num_cpus=1, then=resume)
    assert killed, "the trial actor was never killed"
    out = capsys.readouterr().out
    said = [line for line in out.splitlines() if line.startswith("[watchdog] no trial reported a step for ")]
    failed = [line.split("): ", 1)[1] for line in out.splitlines() if line.startswith(f"[watchdog] failed trial {tid} (")]
    assert len(said) == 1 and len(failed) == 1, out  # said once; failed once: Tune did not retry it
    for line in (said[0], failed[0]):
        assert f"; waiting for resources: {tid} (a worker group of 1 × {{CPU: 0.99}}, " in line, line
        assert re.search(r"; held: CPU 1 of 1 in use: .*0\.99 by placement group \w{8} of actor \w{8} \(dead\)", line)
    assert "[sweep] 0 of 1 trials completed, 1 failed" in out, out  # the first sweep ended
    assert "[sweep] 1 of 1 trials completed, 0 failed" in out, out  # the resumed one completed it
    m = _assert_one_trial_completed(load(root))
    assert m.filter(pl.col("name") == "loss").sort("step")["step"].to_list() == list(range(1, steps + 1))
    assert m.filter(pl.col("name") == "resume/start_step")["value"].to_list() == [every]  # from its checkpoint


def test_a_gone_actor_is_ended_by_its_id() -> None:
    """`watchdog._kill_actor` ends a live actor from its id alone (the watchdog has no handle to a
    gone Train controller): before, `gone_actors` does not list it; after, it does and a call to it
    raises ``ActorDiedError``."""
    import ray

    from distillab.driver import watchdog

    @ray.remote(num_cpus=0)
    class Echo:
        def ping(self) -> int:
            return 1

    init_local_ray(1)
    try:
        actor = Echo.remote()
        assert ray.get(actor.ping.remote()) == 1
        actor_id = actor._actor_id.hex()
        assert actor_id not in watchdog.gone_actors(watchdog.actors())
        watchdog._kill_actor(actor_id)
        with pytest.raises(ray.exceptions.ActorDiedError):
            ray.get(actor.ping.remote(), timeout=60)
        assert actor_id in watchdog.gone_actors(watchdog.actors())
    finally:
        ray.shutdown()


# --------------------------------------------------------------------------------------
# the driver killed, then --resume
# --------------------------------------------------------------------------------------


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "distillab.driver.cli", *args]


def test_killed_driver_then_resume(tmp_path: Path) -> None:
    from distillab.analysis.results import load

    sets = ["--set", f"storage_path={tmp_path}", "--set", f"models.cache_dir={CACHE / 'models'}",
            "--set", "resources.max_concurrent_trials=1", "--set", "trial.optimizer.steps=40",
            "--set", "trial.optimizer.checkpoint_every=20"]
    root = tmp_path / "smoke"
    log = (tmp_path / "driver.log").open("w")
    driver = subprocess.Popen(_cli("sweep", str(SMOKE), *sets, "--no-dashboard"), stdout=log,
                              stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO)
    first = None
    try:
        deadline = time.time() + 600
        while time.time() < deadline and driver.poll() is None:
            if (root / "trials").exists():
                rows = load(root).trials.collect()
                done = rows.filter(pl.col("status") == "completed")
                if done.height:
                    first = done.row(0, named=True)
                    break
            time.sleep(0.5)
        assert first is not None, (tmp_path / "driver.log").read_text()[-3000:]
        time.sleep(3)  # let Tune record the finished trial in its experiment state
    finally:
        _kill_session(driver.pid)  # SIGKILL the driver and the local Ray it started
        driver.wait(timeout=60)
    assert driver.returncode == -signal.SIGKILL
    rows = load(root).trials.collect()
    assert rows.filter(pl.col("status") == "completed").height == 1  # the second trial did not finish

    resumed = subprocess.run(_cli("sweep", "--resume", str(root), "--no-dashboard"), capture_output=True,
                             text=True, timeout=900, cwd=REPO, start_new_session=True)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    res = load(root)
    rows = res.trials.collect()
    assert rows.height == 2 and rows["trial_id"].n_unique() == 2  # each trials row exactly once
    assert (rows["status"] == "completed").all(), rows["error"].to_list()
    again = rows.filter(pl.col("trial_id") == first["trial_id"]).row(0, named=True)
    assert again["start_time"] == first["start_time"] and again["end_time"] == first["end_time"]  # not rerun
    m = _assert_metrics_once(res)
    for tid in rows["trial_id"]:
        assert m.filter((pl.col("trial_id") == tid) & (pl.col("name") == "loss"))["step"].sort().to_list() == list(range(1, 41))


# --------------------------------------------------------------------------------------
# a 2-node cluster losing a node
# --------------------------------------------------------------------------------------


def test_two_node_cluster_loses_a_node(tmp_path: Path) -> None:
    from ray.cluster_utils import Cluster

    from distillab.analysis.results import load
    from distillab.recipe.prepare import prepare

    steps, every = 200, 40
    sweep = _sweep(tmp_path, **{"trial.optimizer.steps": steps, "trial.optimizer.checkpoint_every": every,
                                "resources.cpus_per_worker": 0.9})
    root = sweep.sweep_dir()
    teacher, student = prepare(sweep, threads=1)
    # no dashboard: the sweep's driver frees a lost trial's placement group (`watchdog.SweepWatch`; Ray Train's
    # PlacementGroupCleaner needed the dashboard's state API, and without it the retried trials waited for ever)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                                "_system_config": LOCAL_SYSTEM_CONFIG})
    node = cluster.add_node(num_cpus=1)  # each node fits one 0.9-CPU worker: one trial per node
    removed: dict[str, float] = {}

    def remover() -> None:
        deadline = time.time() + 600
        while time.time() < deadline:
            if _registered_checkpoints(root) >= 2:  # both trials have a checkpoint
                cluster.remove_node(node, allow_graceful=False)
                removed["t"] = time.time()
                return
            time.sleep(0.2)

    try:
        _sweep_beside(remover, sweep, teacher, student, address=cluster.address)
    finally:
        cluster.shutdown()
    assert removed, "the node was never removed"
    res = load(root)
    rows = res.trials.collect()
    assert rows.height == 2 and (rows["status"] == "completed").all(), rows["error"].to_list()
    m = _assert_metrics_once(res)
    for tid in rows["trial_id"]:
        steps_seen = m.filter((pl.col("trial_id") == tid) & (pl.col("name") == "loss"))["step"].sort().to_list()
        assert steps_seen == list(range(1, steps + 1))


# --------------------------------------------------------------------------------------
# ray job submit against a local head
# --------------------------------------------------------------------------------------


def test_ray_job_submit(tmp_path: Path) -> None:
    from distillab.analysis.results import load

    ray_bin = str(Path(sys.executable).with_name("ray"))
    # every port its own: Ray's default dashboard-agent port (52365) is taken by any other Ray on this
    # machine (the other pytest-xdist worker's), and the head's job agent then never starts
    gcs, dash, mport, agent = _free_port(), _free_port(), _free_port(), _free_port()
    # the head ends at once on SIGTERM below (Ray's default drains the node for 30 s first)
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}
    temp_dir = CACHE / f"ray-job-{os.getpid()}"
    head = subprocess.Popen(
        [ray_bin, "start", "--head", "--block", f"--port={gcs}", "--num-cpus=2", "--include-dashboard=true",
         "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}", f"--metrics-export-port={mport}",
         f"--dashboard-agent-listen-port={agent}", f"--temp-dir={temp_dir}"],
        env=env, stdout=(tmp_path / "head.log").open("w"), stderr=subprocess.STDOUT, start_new_session=True,
    )
    address = f"http://127.0.0.1:{dash}"
    try:
        deadline = time.time() + 180
        while time.time() < deadline:
            try:
                urllib.request.urlopen(f"{address}/api/version", timeout=2)
                break
            except urllib.error.HTTPError:  # it answered (401 without the auth token): it is up
                break
            except OSError:
                assert head.poll() is None, (tmp_path / "head.log").read_text()[-3000:]
                time.sleep(1)
        entry = [sys.executable, "-m", "distillab.driver.cli", "sweep", "search_spaces/smoke.yaml",
                 "--set", f"storage_path={tmp_path}", "--set", f"models.cache_dir={CACHE / 'models'}",
                 "--set", "search.grid={rollout.policy: [onpd]}",  # one trial: it samples, so every gauge is set
                 "--set", "resources.local_mode=true"]  # in its Tune trial actor: lean for CI
        deadline = time.time() + 180
        while True:  # the dashboard answers before its job agent is up (measured on a loaded 2-core machine):
            sub = subprocess.run(  # Ray's own message asks to try again later
                [ray_bin, "job", "submit", "--address", address, "--working-dir", str(REPO),
                 "--submission-id", "distillab-smoke", "--", *entry],
                env=env, capture_output=True, text=True, timeout=900, cwd=REPO,
            )
            if "No available agent to submit job" not in sub.stderr + sub.stdout or time.time() > deadline:
                break
            time.sleep(3)
        assert sub.returncode == 0, sub.stdout[-3000:] + sub.stderr[-3000:]
        status = subprocess.run([ray_bin, "job", "status", "--address", address, "distillab-smoke"],
                                env=env, capture_output=True, text=True, timeout=60)
        assert "Job 'distillab-smoke' succeeded" in status.stdout, status.stdout + status.stderr
        # the custom gauges reach the head's Prometheus endpoint (exported every few seconds)
        text, deadline = "", time.time() + 60
        while "distillab_rollout_tokens_per_s" not in text and time.time() < deadline:
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=5).read().decode()
            except OSError:
                pass
            time.sleep(2)
        assert "ray_distillab_rollout_tokens_per_s" in text and "ray_distillab_kl_forward" in text
    finally:
        head.send_signal(signal.SIGTERM)  # --block: the head ends with its process, never `ray stop`
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
        _kill_session(head.pid)
    res = load(tmp_path / "smoke")
    rows = res.trials.collect()
    assert rows.height == 1 and (rows["status"] == "completed").all()
    assert res.evals.filter(pl.col("stage") == "distill").collect().height > 0
