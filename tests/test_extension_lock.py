"""`optim.load_shm_comm_op`: a worker killed while torch held its extension lock file no longer
stops every later worker (issue 48; seen once in five whole-suite runs: a trial's workers waited
in ``FileBaton.wait`` for ever, holding the trial's resources)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from distillab.recipe.optim import SHM_COMM_OP, load_shm_comm_op

# a process that takes the OS lock as `load_shm_comm_op` does, creates torch's lock file as torch's
# load does, says so, and then is killed before it removes either
HOLDER = textwrap.dedent("""
    import fcntl, os, sys, time
    build = sys.argv[1]
    f = open(build + ".flock", "a")
    fcntl.flock(f, fcntl.LOCK_EX)
    os.close(os.open(os.path.join(build, "lock"), os.O_CREAT | os.O_EXCL))
    print("holding", flush=True)
    time.sleep(600)
""")


@pytest.fixture
def extensions_dir(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    (tmp_path / SHM_COMM_OP).mkdir()
    return tmp_path


def test_a_lock_file_left_by_a_dead_loader_is_removed_before_the_load(extensions_dir):
    lock = extensions_dir / SHM_COMM_OP / "lock"
    lock.touch()
    seen = []
    assert load_shm_comm_op(load=lambda: seen.append(lock.exists()) or "op") == "op"
    assert seen == [False] and not lock.exists()


def test_a_load_waits_for_a_live_loader_and_goes_on_once_it_is_killed(extensions_dir):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(extensions_dir / SHM_COMM_OP)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        result = []
        waiter = threading.Thread(target=lambda: result.append(load_shm_comm_op(load=lambda: "op")), daemon=True)
        waiter.start()
        waiter.join(1.0)
        assert waiter.is_alive() and result == []  # the live holder's lock file is left alone
        assert (extensions_dir / SHM_COMM_OP / "lock").exists()
        os.kill(holder.pid, signal.SIGKILL)
        waiter.join(60.0)
        assert result == ["op"] and not (extensions_dir / SHM_COMM_OP / "lock").exists()
    finally:
        holder.kill()
        holder.wait()


# torch's own load of the built op, in a fresh process, with or without `load_shm_comm_op`
LOAD = textwrap.dedent("""
    import sys
    from deepspeed.comm.torch import build_shm_op
    from distillab.recipe.optim import load_shm_comm_op
    print("loading", flush=True)
    op = load_shm_comm_op() if sys.argv[1] == "distillab" else build_shm_op()
    print("loaded", op is not None, flush=True)
""")


@pytest.mark.slow
def test_the_built_op_loads_past_a_stale_lock_file(tmp_path):
    """The real op, built once by the suite's trials (or here), copied with its build files into
    a fresh ``TORCH_EXTENSIONS_DIR`` with a stale lock file: torch's load alone still waits 5 s
    after it began (then it is stopped), `load_shm_comm_op` removes the file and loads it."""
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    built = Path(os.environ.get("TORCH_EXTENSIONS_DIR", ".cache/torch_extensions")) / SHM_COMM_OP
    if not (built / f"{SHM_COMM_OP}.so").exists():  # build it where the suite keeps it
        subprocess.run([sys.executable, "-c", LOAD, "distillab"], env=env, check=True, timeout=600)
    shutil.copytree(built, tmp_path / SHM_COMM_OP, ignore=shutil.ignore_patterns("lock"))
    (tmp_path / SHM_COMM_OP / "lock").touch()
    env["TORCH_EXTENSIONS_DIR"] = str(tmp_path)
    alone = subprocess.Popen([sys.executable, "-c", LOAD, "torch"], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert alone.stdout.readline().strip() == "loading"
        with pytest.raises(subprocess.TimeoutExpired):
            alone.wait(timeout=5)
    finally:
        alone.kill()
        alone.wait()
    out = subprocess.run([sys.executable, "-c", LOAD, "distillab"], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "loaded True" in out.stdout and "left by a process that died" in out.stderr
    assert not (tmp_path / SHM_COMM_OP / "lock").exists()
