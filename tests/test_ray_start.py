"""`raystart.init_ray` on a loaded machine: when Ray's local node does not register within Ray's
fixed 30 s (``ray/_private/node.py``: "The current node timed out during startup"), the
processes that attempt started are ended and Ray is started again, up to
`raystart.RAY_START_ATTEMPTS` times; likewise when its GCS fails to start (another Ray took the
port); any other failure is raised at once. No Ray is started here:
`raystart._start_local_ray` is replaced by a stand-in that starts a real child process (as
``ray.init`` starts the GCS and raylet) and then fails."""

from __future__ import annotations

import os
import subprocess

import psutil
import pytest

from distillab.driver import raystart

TIMEOUT = Exception("The current node timed out during startup. This could happen because some of the raylet "
                    "failed to startup or the GCS has become overloaded.")


class FlakyStart:
    """Fails its first ``fails`` calls with ``error`` after starting a child process; then succeeds."""

    def __init__(self, fails: int, error: Exception):
        self.fails, self.error, self.calls, self.children = fails, error, 0, []

    def __call__(self, num_cpus, dashboard, kw) -> None:
        self.calls += 1
        if self.calls <= self.fails:
            self.children.append(subprocess.Popen(["sleep", "120"]))
            raise self.error


def test_a_start_up_timeout_ends_the_attempts_processes_and_starts_again(monkeypatch, caplog) -> None:
    start = FlakyStart(fails=2, error=TIMEOUT)
    monkeypatch.setattr(raystart, "_start_local_ray", start)
    bystander = subprocess.Popen(["sleep", "120"])  # started before init_ray: not its to end
    try:
        with caplog.at_level("WARNING", logger="distillab.driver.raystart"):
            raystart.init_ray(None, dashboard=False, num_cpus=1)
        assert start.calls == 3
        # ended (and reaped) by init_ray: a `sleep 120` left alone would still be running
        assert all(c.poll() is not None and not psutil.pid_exists(c.pid) for c in start.children)
        assert bystander.poll() is None and psutil.pid_exists(bystander.pid)
        assert "ended the 1 process(es) it had started and starting it again (attempt 2 of 3)" in caplog.text
        assert "(attempt 3 of 3)" in caplog.text
    finally:
        bystander.kill()
        bystander.wait()


def test_a_gcs_that_failed_to_start_is_started_again_on_a_new_port(monkeypatch, caplog) -> None:
    """Ray's error when its GCS exits at start, as seen when another Ray took the port first,
    is retried; and each start asks the OS for its own port (`raystart._free_port`), so the retry
    does not meet the taken one again."""
    gcs = RuntimeError("Failed to start GCS.  Last 0 lines of error files:\n\n.Please check .../gcs_server.out for "
                       "details. Last connection error: ... RPC error: InvalidAuthToken: Authentication token is "
                       "missing or incorrect.")
    start = FlakyStart(fails=1, error=gcs)
    monkeypatch.setattr(raystart, "_start_local_ray", start)
    with caplog.at_level("WARNING", logger="distillab.driver.raystart"):
        raystart.init_ray(None, dashboard=False, num_cpus=1)
    assert start.calls == 2 and start.children[0].poll() is not None
    assert "Ray's GCS did not start" in caplog.text and "(attempt 2 of 3)" in caplog.text
    monkeypatch.undo()

    seen = []
    monkeypatch.delenv("RAY_GCS_SERVER_PORT", raising=False)
    monkeypatch.setattr(raystart, "_free_port", iter([41001, 41002]).__next__)
    monkeypatch.setattr(raystart.ray, "init", lambda **kw: seen.append((os.environ["RAY_GCS_SERVER_PORT"],
                                                                     kw["runtime_env"]["env_vars"]["RAY_ADDRESS"])))
    kw = {"runtime_env": {"env_vars": {}}}
    raystart._start_local_ray(1, False, kw)
    raystart._start_local_ray(1, False, kw)
    assert [p for p, _ in seen] == ["41001", "41002"] and all(a.endswith(f":{p}") for p, a in seen)
    assert "RAY_GCS_SERVER_PORT" not in os.environ


def test_the_last_timeout_and_any_other_failure_are_raised(monkeypatch) -> None:
    start = FlakyStart(fails=raystart.RAY_START_ATTEMPTS, error=TIMEOUT)
    monkeypatch.setattr(raystart, "_start_local_ray", start)
    with pytest.raises(Exception, match="timed out during startup"):
        raystart.init_ray(None, dashboard=False, num_cpus=1)
    assert start.calls == raystart.RAY_START_ATTEMPTS
    # the last attempt's processes are Ray's to report on, not ended by init_ray
    assert start.children[-1].poll() is None
    for c in start.children:
        c.kill()
        c.wait()

    other = FlakyStart(fails=1, error=ValueError("Invalid value for num_cpus"))
    monkeypatch.setattr(raystart, "_start_local_ray", other)
    with pytest.raises(ValueError, match="num_cpus"):
        raystart.init_ray(None, dashboard=False, num_cpus=1)
    assert other.calls == 1
    other.children[0].kill()
    other.children[0].wait()


def test_a_local_ray_starts_no_idle_workers_ahead() -> None:
    """`raystart.LOCAL_SYSTEM_CONFIG`: the local Ray that `init_ray` starts runs no Python
    worker before a task or actor asks for one (Ray's default starts one per CPU when the
    driver connects: two ``ray::IDLE`` processes here)."""
    import time

    import ray

    raystart.init_ray(None, dashboard=False, num_cpus=2)
    try:
        time.sleep(2.0)  # Ray's own start-ahead comes within a second of the driver's connection
        names = [" ".join(c.cmdline()) for c in psutil.Process().children(recursive=True) if c.is_running()]
        assert any("raylet" in n for n in names), names  # a running Ray, whose processes are listed
        assert not [n for n in names if n.startswith("ray::IDLE")], names

        @ray.remote
        def pid() -> int:
            return os.getpid()

        assert ray.get(pid.remote(), timeout=120) != os.getpid()  # a worker still starts when asked for
    finally:
        ray.shutdown()


@pytest.mark.parametrize("address, env, told", [("10.0.0.1:6379", None, "10.0.0.1:6379"),
                                                (None, "10.0.0.2:6380", "10.0.0.2:6380"),
                                                ("auto", None, None), ("ray://10.0.0.1:10001", None, None)])
def test_a_cluster_address_is_told_to_the_workers(monkeypatch, address, env, told) -> None:
    """Connecting to a cluster: its GCS address reaches the workers as ``RAY_ADDRESS`` (Ray Train's
    PlacementGroupCleaner, beside another Ray on the same host, otherwise connects to "the latest
    cluster", which may be another one); ``auto`` and client addresses are left to Ray."""
    calls = []
    monkeypatch.setattr(raystart.ray, "init", lambda **kw: calls.append(kw))
    if env is None:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
    else:
        monkeypatch.setenv("RAY_ADDRESS", env)
    raystart.init_ray(address, dashboard=False)
    (kw,) = calls
    assert kw["address"] == address and kw["runtime_env"]["env_vars"].get("RAY_ADDRESS") == told
