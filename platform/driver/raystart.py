"""Ray for a sweep: connect to a running cluster, or start a local one whose dashboard
binds to 127.0.0.1, with the workers' environment of the console level (`init_ray`).

A module of its own, importing Ray and the standard library only, so that the CLI can
start Ray in its main thread (where Ray installs its SIGTERM handler) while another
thread imports the sweep's heavy modules and checks the checkpoints (`cli.main`)."""

from __future__ import annotations

import contextlib
import logging
import os
import socket

import psutil
import ray

from distillab.tasks.taskio import LAUNCH_DIR_ENV

log = logging.getLogger(__name__)


#: Environment of every Ray worker process at the default console level (`init_ray`): no Hugging
#: Face progress bars (a micro model loads and saves in milliseconds; the bars were two lines per
#: load), and no setuptools warnings when DeepSpeed's JIT extension loader imports setuptools after
#: distutils (harmless: "Distutils was imported before Setuptools", "Setuptools is replacing distutils").
QUIET_WORKER_ENV = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "PYTHONWARNINGS": "ignore:Distutils was imported before Setuptools,ignore:Setuptools is replacing distutils",
}


def init_ray(address: str | None, dashboard: bool, num_cpus: int | None = None, *, verbose: int = 1,
             cpu_only: bool = False) -> None:
    """Connect to ``address`` (or ``RAY_ADDRESS``, set by ``ray job submit``; a GCS address
    ``host:port`` is handed on to the workers as ``RAY_ADDRESS``, see `_start_local_ray`), else
    start a local Ray whose dashboard binds to 127.0.0.1. Below ``verbose`` 2 the workers
    run with `QUIET_WORKER_ENV` and the driver logs Ray's warnings only; ``cpu_only`` (no
    trial asks for a GPU) tells DeepSpeed its accelerator (``DS_ACCELERATOR=cpu``) instead
    of its "Setting accelerator to CPU" fallback warning in every worker. A local start that
    fails as in `RAY_START_RETRIES` is ended and made again, up to `RAY_START_ATTEMPTS` times;
    its last failure, and any other, is raised."""
    # offline unless the caller says otherwise (HF_HUB_OFFLINE=0 lets lm-eval fetch its hub datasets)
    env_vars = {"HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"), "TOKENIZERS_PARALLELISM": "false",
                # relative task file paths are read from the directory the sweep started in (`tasks.taskio.launch_path`):
                # a trial's own working directory is Ray's
                LAUNCH_DIR_ENV: os.environ.get(LAUNCH_DIR_ENV) or os.getcwd()}
    if verbose < 2:
        env_vars.update({k: os.environ.get(k, v) for k, v in QUIET_WORKER_ENV.items()})
    # a rollout actor's vLLM: quiet at the default console (`rollout.actor.quiet_vllm`), all of it with --verbose
    env_vars["VLLM_LOGGING_LEVEL"] = os.environ.get("VLLM_LOGGING_LEVEL", "ERROR" if verbose < 2 else "INFO")
    if cpu_only:
        env_vars["DS_ACCELERATOR"] = os.environ.get("DS_ACCELERATOR", "cpu")
    kw = {"runtime_env": {"env_vars": env_vars}, "logging_level": logging.INFO if verbose >= 2 else logging.WARNING}
    if address or os.environ.get("RAY_ADDRESS"):
        target = address or os.environ["RAY_ADDRESS"]
        if target != "auto" and "://" not in target:  # a GCS address: told to the workers, as a local start does
            env_vars.setdefault("RAY_ADDRESS", target)  # (`_start_local_ray`: Train's PlacementGroupCleaner)
        ray.init(address=address, **kw)
        return
    for attempt in range(1, RAY_START_ATTEMPTS + 1):
        before = {c.pid for c in psutil.Process().children(recursive=True)}
        try:
            _start_local_ray(num_cpus, dashboard, kw)
            return
        except Exception as e:  # noqa: BLE001 - Ray raises a bare Exception for this
            why = next((w for m, w in RAY_START_RETRIES.items() if m in str(e)), None)
            if why is None or attempt == RAY_START_ATTEMPTS:
                raise
            ray.shutdown()  # whatever state the failed attempt left in this process
            killed = _end_new_children(before)
            log.warning("%s; ended the %d process(es) it had started and starting it again (attempt %d of %d)",
                        why, killed, attempt + 1, RAY_START_ATTEMPTS)


#: Ray's message when the local node does not register with its GCS within a fixed 30 s
#: (ray/_private/node.py; seen on a 2-core machine shared with other runs)
RAY_START_TIMEOUT = "timed out during startup"
#: Ray's message when the GCS it started exits before this process connects (ray/_private/node.py):
#: seen when another Ray, starting at the same moment, took the port `_free_port` had just found
#: (the connection then reached that Ray's GCS: "InvalidAuthToken"); the next attempt picks a new port
#: (unless ``RAY_GCS_SERVER_PORT`` names one)
RAY_GCS_START_FAILED = "Failed to start GCS"
#: the failures of a local Ray's start that `init_ray` retries, with the warning's reason
RAY_START_RETRIES = {
    RAY_START_TIMEOUT: "Ray's node did not register within Ray's fixed 30 s (a loaded machine)",
    RAY_GCS_START_FAILED: "Ray's GCS did not start (its port taken by another process in the meantime?)",
}
#: how often `init_ray` starts a local Ray before it gives up
RAY_START_ATTEMPTS = 3


#: Ray's settings of a local cluster that `init_ray` starts: no Python workers started ahead when the
#: driver connects (Ray's default starts one per CPU). Every Tune trial actor carries its own runtime
#: environment (``ray/tune/execution/class_cache.py``), so none can take such a worker; they only took
#: CPU from the CLI's imports while Ray started (0.4 s each here): a one-trial run 25.0 s against 25.7 s
#: (3 interleaved runs each, 2026-12-04, `benchmarks/sweep_overhead.py`'s single-trial command).
LOCAL_SYSTEM_CONFIG = {"prestart_worker_first_driver": False}


def _start_local_ray(num_cpus: int | None, dashboard: bool, kw: dict) -> None:
    """``ray.init`` of a local Ray (`LOCAL_SYSTEM_CONFIG`) on a known GCS port, told to its workers: Ray Train's
    PlacementGroupCleaner finds its cluster through RAY_ADDRESS, and without it, beside another
    Ray on the same host, it dies at its first check ("Found multiple active Ray instances") and
    frees no placement group."""
    port = os.environ.get("RAY_GCS_SERVER_PORT") or str(_free_port())
    env_vars = dict(kw["runtime_env"]["env_vars"])
    env_vars.setdefault("RAY_ADDRESS", f"{ray.util.get_node_ip_address()}:{port}")
    saved, os.environ["RAY_GCS_SERVER_PORT"] = os.environ.get("RAY_GCS_SERVER_PORT"), port
    try:
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=dashboard, dashboard_host="127.0.0.1",
                 _system_config=LOCAL_SYSTEM_CONFIG, **{**kw, "runtime_env": {**kw["runtime_env"], "env_vars": env_vars}})
    finally:
        if saved is None:
            del os.environ["RAY_GCS_SERVER_PORT"]


def _end_new_children(before: set[int], grace_s: float = 5.0) -> int:
    """End this process's descendants whose PIDs are not in ``before`` (the GCS, raylet and
    agents a failed ``ray.init`` left running): SIGTERM, then SIGKILL after ``grace_s``.
    Returns how many there were."""
    new = [c for c in psutil.Process().children(recursive=True) if c.pid not in before]
    for c in new:
        with contextlib.suppress(psutil.NoSuchProcess):
            c.terminate()
    _, alive = psutil.wait_procs(new, timeout=grace_s)
    for c in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            c.kill()
    return len(new)


def node_resources() -> list[tuple[float, float]]:
    """(CPUs, GPUs) of each live node of the connected Ray cluster: its totals (``ray.nodes()``),
    not what is free now."""
    return [(float(n["Resources"].get("CPU", 0.0)), float(n["Resources"].get("GPU", 0.0)))
            for n in ray.nodes() if n.get("Alive")]


def _free_port() -> int:
    """A TCP port nothing listens on now (the OS's pick)."""
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]
