"""`imports.without_unused_integrations`: the packages it hides read as not installed inside
the block (``import`` fails, ``find_spec`` answers None), are importable again after it, and a
package already imported is left alone; in a fresh interpreter, the recipe's modules imported
inside it load neither scikit-learn, SciPy nor MLflow, which they load without it."""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys

import pytest

from distillab.driver.imports import UNUSED_INTEGRATIONS, without_unused_integrations


def test_hidden_inside_the_block_and_importable_after_it() -> None:
    name = "tabnanny"  # a standard-library module nothing here imports
    sys.modules.pop(name, None)
    with without_unused_integrations((name, "json")):
        with pytest.raises(ImportError):
            importlib.import_module(name)
        assert importlib.util.find_spec(name) is None
        assert importlib.import_module("json").dumps([1]) == "[1]"  # imported before: untouched
    assert name not in sys.modules
    assert importlib.import_module(name).__name__ == name
    assert sys.modules["json"] is not None


def test_an_exception_in_the_block_still_unhides() -> None:
    sys.modules.pop("tabnanny", None)
    with pytest.raises(RuntimeError), without_unused_integrations(("tabnanny",)):
        raise RuntimeError("boom")
    assert "tabnanny" not in sys.modules and importlib.util.find_spec("tabnanny") is not None


_PROBE = """
import sys
from distillab.driver.imports import UNUSED_INTEGRATIONS, without_unused_integrations
HIDE = {hide}
if HIDE:
    with without_unused_integrations():
        import distillab.recipe.distill
else:
    import distillab.recipe.distill
from transformers.utils import is_sklearn_available
print(sorted(n for n in UNUSED_INTEGRATIONS if n in sys.modules), is_sklearn_available())
"""


@pytest.mark.slow
def test_the_recipe_imports_without_them() -> None:
    """The point of it: the recipe (transformers' model classes, DeepSpeed) loads none of
    `UNUSED_INTEGRATIONS` inside the block, and all of them without it (so this test can fail:
    they are installed here)."""
    missing = [n for n in UNUSED_INTEGRATIONS if importlib.util.find_spec(n) is None]
    if missing:
        pytest.skip(f"not installed here: {missing}")
    out = {}
    for hide in (True, False):
        run = subprocess.run([sys.executable, "-c", _PROBE.format(hide=hide)], capture_output=True, text=True,
                             timeout=300)
        assert run.returncode == 0, run.stderr[-2000:]
        out[hide] = run.stdout.strip().splitlines()[-1]
    assert out[True] == "[] False"
    assert out[False] == f"{sorted(UNUSED_INTEGRATIONS)} True"


def test_a_module_that_saw_a_hidden_package_is_forgotten(tmp_path, monkeypatch) -> None:
    """``forget``: a listed module first imported inside the block keeps what it found (None
    for a hidden package) and is dropped after it, so the next import runs it anew and finds
    the package; one imported before the block is kept."""
    (tmp_path / "probe_saw.py").write_text("try:\n    import tabnanny as found\nexcept ImportError:\n    found = None\n")
    (tmp_path / "probe_before.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for m in ("tabnanny", "probe_saw", "probe_before"):
        sys.modules.pop(m, None)
    before = importlib.import_module("probe_before")
    with without_unused_integrations(("tabnanny",), forget=("probe_saw", "probe_before")):
        assert importlib.import_module("probe_saw").found is None
    assert "probe_saw" not in sys.modules and sys.modules["probe_before"] is before
    assert importlib.import_module("probe_saw").found.__name__ == "tabnanny"


_TUNE_PROBE = """
import sys
from ray.air._internal.usage import _count_callbacks
from ray.tune.logger import CSVLoggerCallback
from distillab.driver.imports import without_unused_integrations
from distillab.driver.sweep import TRACKER_PACKAGES, TUNE_TRACKER_MODULES
with without_unused_integrations(TRACKER_PACKAGES, forget=TUNE_TRACKER_MODULES):
    counts = _count_callbacks([CSVLoggerCallback()])
print(dict(counts), sorted(p for p in ("wandb", "mlflow") if p in sys.modules))
from ray.air.integrations.wandb import wandb
from ray.air.integrations.mlflow import mlflow
print(wandb is not None, mlflow is not None)
"""


@pytest.mark.slow
def test_tune_counts_a_sweeps_callbacks_without_the_trackers() -> None:
    """What `sweep._fit` relies on for a sweep without ``tracking``: Ray Tune counts its
    callbacks (usage statistics) without importing W&B or MLflow, and its tracker modules
    find both afterwards (a later sweep with ``tracking`` in the same process)."""
    missing = [n for n in ("wandb", "mlflow") if importlib.util.find_spec(n) is None]
    if missing:
        pytest.skip(f"not installed here: {missing}")
    run = subprocess.run([sys.executable, "-c", _TUNE_PROBE], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-2:] == ["{'CSVLoggerCallback': 1} []", "True True"]
