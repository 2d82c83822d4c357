"""Package layout: ``platform/`` is installed as ``distillab`` and must never shadow
the standard library's ``platform`` module (so it has no ``__init__.py``)."""

from __future__ import annotations

import importlib
import subprocess
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_stdlib_platform_not_shadowed_from_repo_root() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import platform, sys; print(platform.__file__)"],
        cwd=REPO, capture_output=True, text=True, timeout=30, check=True,
    )
    path = Path(out.stdout.strip()).resolve()
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    assert path.name == "platform.py"
    assert path.parent == stdlib
    assert REPO not in path.parents


def test_platform_dir_has_no_init() -> None:
    assert (REPO / "platform").is_dir()
    assert not (REPO / "platform" / "__init__.py").exists()


def test_subpackages_import() -> None:
    for name in ("distillab.ops", "distillab.evals", "distillab.config", "distillab.models", "distillab.tasks",
                 "distillab.rollout", "distillab.recipe", "distillab.driver", "distillab.analysis"):
        mod = importlib.import_module(name)
        assert mod.__name__ == name
        assert Path(mod.__file__).resolve().parent.name == name.split(".")[-1]
    import distillab.tasks.data

    assert Path(distillab.tasks.data.__file__).resolve() == REPO / "platform" / "tasks" / "data.py"
