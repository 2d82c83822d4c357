"""The shape of the code (DESIGN.md, issue 13), read from the source with ``ast``:

- imports follow the data path: no module imports one of a later stage (a lower stage
  such as tasks, models, ops, evals.metrics or rollout never imports distill, rlvr,
  sweep or cli);
- ``from distillab…`` imports sit at module top, except the documented ``ops.chunked`` ↔
  ``ops.triton_kl`` cycle and the lazy imports of ``cli`` and ``sweep`` (documented, with
  the measured import time, in each module docstring);
- no function in ``platform/``, ``ops/`` or ``evals/`` is over 80 lines, its docstring not
  counted (the count of the repository's before-stop hook).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FOLDERS = {"platform": "distillab", "ops": "distillab.ops", "evals": "distillab.evals"}

#: Stages in data-path order; a module may import its own stage and earlier ones only.
STAGES: list[tuple[str, ...]] = [
    ("registry", "countdown", "taskio", "imports", "raystart"),  # names and primitives, no distillab imports but these
    ("mcq", "math_task"),
    ("config",),
    ("ops", "ops.kl", "ops.chunked", "ops.triton_kl", "ops.oracle", "evals", "evals.metrics"),
    ("results", "models"),
    ("tasks",),
    ("decode",),
    ("rollout",),
    ("evals.sampling", "evals.style", "evals.ood", "evals.suite", "loss", "optim", "telemetry", "sft"),
    ("rlvr",),
    ("distill", "prepare"),
    ("sweep", "plots", "plan"),
    ("findings",),
    ("cli",),
]
RANK = {name: i for i, stage in enumerate(STAGES) for name in stage}
#: Function-level imports allowed: the documented cycle (ops/__init__.py, ops/triton_kl.py) and the lazy imports of
#: cli and sweep (each documented, with its measured import time, in its module docstring).
CYCLE = {("ops.chunked", "ops.triton_kl"), ("ops.triton_kl", "ops.chunked")}
LAZY_MODULES = ("cli", "sweep")


def _modules() -> dict[str, Path]:
    out = {}
    for folder, package in FOLDERS.items():
        for path in sorted((REPO / folder).glob("*.py")):
            name = f"{package}.{path.stem}" if path.stem != "__init__" else package
            out[name.removeprefix("distillab.")] = path
    return out


def _imports(path: Path) -> list[tuple[str, bool, int]]:
    """(imported distillab module, inside a function?, line) for each ``from distillab…`` / ``import distillab…``."""
    tree = ast.parse(path.read_text())
    inner = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
             for n in ast.walk(f)}
    out = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("distillab"):
            names = [node.module] if node.module != "distillab" else [f"distillab.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.startswith("distillab")]
        for name in names:
            out.append((name.removeprefix("distillab.").removeprefix("distillab"), id(node) in inner, node.lineno))
    return out


def test_every_module_has_a_stage() -> None:
    missing = sorted(set(_modules()) - set(RANK))
    assert not missing, f"modules without a stage in tests/test_imports.py STAGES: {missing}"


def test_no_module_imports_a_later_stage() -> None:
    bad = []
    for name, path in _modules().items():
        for target, inside, line in _imports(path):
            if target not in RANK:
                bad.append(f"{path.relative_to(REPO)}:{line} imports unknown module distillab.{target}")
            elif RANK[target] > RANK[name] and (name, target) not in CYCLE:
                bad.append(f"{path.relative_to(REPO)}:{line} ({name}) imports the later stage {target}")
    assert not bad, "\n".join(bad)


def test_lower_stages_never_reach_the_recipe() -> None:
    """The issue's rule, spelled out (implied by the stage order)."""
    lower, higher = ("tasks", "models", "ops.kl", "ops.chunked", "evals.metrics", "rollout"), {"distill", "rlvr",
                                                                                               "sweep", "cli"}
    mods = _modules()
    for name in lower:
        assert not {t for t, _, _ in _imports(mods[name])} & higher, name


def test_imports_of_distillab_sit_at_module_top() -> None:
    bad = []
    for name, path in _modules().items():
        for target, inside, line in _imports(path):
            if inside and (name, target) not in CYCLE and name not in LAZY_MODULES:
                bad.append(f"{path.relative_to(REPO)}:{line} imports distillab.{target} inside a function")
    assert not bad, "\n".join(bad)
    for name in LAZY_MODULES:  # allowed only where the module documents why, with a measurement
        doc = ast.get_docstring(ast.parse(_modules()[name].read_text())) or ""
        assert "Lazy imports:" in doc and " s" in doc, name


def _function_lengths(path: Path):
    """(name, line, length without docstring): the before-stop hook's count."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(getattr(first, "value", None), ast.Constant) \
                    and isinstance(first.value.value, str):
                n -= first.end_lineno - first.lineno + 1
            yield node.name, node.lineno, n


@pytest.mark.parametrize("path", sorted(p for d in ("platform", "ops", "evals") for p in (REPO / d).glob("*.py")),
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_function_over_80_lines(path: Path) -> None:
    long = [f"{name} (line {line}): {n} lines" for name, line, n in _function_lengths(path) if n > 80]
    assert not long, long


def test_distill_is_a_short_recipe() -> None:
    assert len((REPO / "platform" / "distill.py").read_text().splitlines()) <= 350
