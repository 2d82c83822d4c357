"""The shape of the code (DESIGN.md "The data path of one trial"), read from the source with ``ast``.

The layers are the folders: each package (``tasks``, ``rollout``, ``analysis``, ``ops``,
``evals``) is one node, each flat module of ``platform/`` another, and an edge is an import.
There is no hand-kept list of stages and no exemption:

- no module imports itself back through others (the module graph has no cycle) and no folder
  does either (the folder graph has no cycle), so the layers are the folder graph's
  topological order, printed by `test_layers_are_read_from_the_folders`;
- the lower folders (config, models, tasks, ops, rollout, evals) never reach the recipe
  (``recipe/``: loss, distill, rlvr, prepare, ...) or the driver (``driver/``: sweep, plan, cli, ...), and ``analysis`` reads only the registry and the
  results tables (it never imports torch, the evaluations or the recipe);
- ``from distillab…`` imports sit at module top, except in the modules whose docstring says
  why under "Lazy imports:" with a measurement (cli's start-up, the Tune trial actor's);
- no function in ``platform/``, ``ops/`` or ``evals/`` is over 80 lines, its docstring not
  counted (the count of the repository's before-stop hook).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FOLDERS = {"platform": "distillab", "ops": "distillab.ops", "evals": "distillab.evals"}
#: What each layer of DESIGN.md must never import (the data path flows one way).
RECIPE_AND_DRIVER = {"recipe", "driver"}
LOWER = ("config", "models", "tasks", "ops", "rollout", "evals")
LAZY_MODULES = ("driver.cli", "driver.sweep", "driver.api")
#: The modules that sit flat in ``platform/``: the lowest layer, names (`registry`) and the results schema
#: (`tables`) that every layer writes through; everything else is in the folder of its layer.
FLAT = {"registry", "tables"}
#: The Python API (`distillab.api`): flat in ``platform/`` too, but the top, above every layer: it re-exports
#: the driver's functions (``distillab`` itself is a namespace package and cannot hold them) and no module imports it.
FACADE = "api"


def _modules() -> dict[str, Path]:
    """``{"tasks.countdown": path, "config": path, "ops.kl": path, ...}`` for every source module."""
    out = {}
    for folder, package in FOLDERS.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            parts = list(path.relative_to(REPO / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([package, *parts]).removeprefix("distillab").lstrip(".")] = path
    return out


MODULES = _modules()
PACKAGES = sorted({name.split(".")[0] for name in MODULES if "." in name} | {"ops", "evals"})


def unit(module: str) -> str:
    """The folder node of ``module``: its package (``rollout.types`` → ``rollout``), or itself if flat."""
    return module.split(".")[0]


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
            out.append((name.removeprefix("distillab").lstrip("."), id(node) in inner, node.lineno))
    return out


def _graph(of=lambda m: m) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        graph.setdefault(of(name), set())
        for target, _, _ in _imports(path):
            if of(target) != of(name):
                graph[of(name)].add(of(target))
    return graph


def test_every_import_names_a_module() -> None:
    bad = [f"{path.relative_to(REPO)}:{line} imports unknown module distillab.{t}"
           for name, path in MODULES.items() for t, _, line in _imports(path) if t not in MODULES]
    assert not bad, "\n".join(bad)


def test_no_module_imports_itself_back() -> None:
    try:
        tuple(TopologicalSorter(_graph()).static_order())
    except CycleError as e:
        pytest.fail(f"import cycle between modules: {' -> '.join(e.args[1])}")


def test_layers_are_read_from_the_folders() -> None:
    """The folder graph has no cycle; its topological generations are the layers."""
    sorter = TopologicalSorter(_graph(unit))
    try:
        sorter.prepare()
    except CycleError as e:
        pytest.fail(f"import cycle between folders: {' -> '.join(e.args[1])}")
    layers = []
    while sorter.is_active():
        ready = sorted(sorter.get_ready())
        layers.append(ready)
        sorter.done(*ready)
    print("layers, lowest first:", layers)
    assert {"registry", "config"} <= set(layers[0]) | set(layers[1])
    assert set(PACKAGES) >= {"tasks", "rollout", "analysis", "ops", "evals"}


def test_only_the_lowest_layer_is_flat() -> None:
    """Every module of ``platform/`` is in the folder of its layer, but for `FLAT`."""
    flat = {name for name in MODULES if "." not in name and name not in PACKAGES}
    assert flat == FLAT | {FACADE}, sorted(flat ^ (FLAT | {FACADE}))


def test_the_api_is_the_top() -> None:
    """`distillab.api` imports only the driver's API module and nothing imports it (the CLI calls the same
    functions through `distillab.driver.api`), so the flat façade sits above every layer."""
    assert {t for t, _, _ in _imports(MODULES[FACADE])} == {"driver.api"}
    bad = [f"{path.relative_to(REPO)}:{line} ({name}) imports distillab.api"
           for name, path in MODULES.items() for t, _, line in _imports(path) if t == FACADE]
    assert not bad, "\n".join(bad)


def test_lower_folders_never_reach_the_recipe() -> None:
    bad = [f"{path.relative_to(REPO)}:{line} ({name}) imports distillab.{t}"
           for name, path in MODULES.items() if unit(name) in LOWER
           for t, _, line in _imports(path) if unit(t) in RECIPE_AND_DRIVER | {"analysis"}]
    assert not bad, "\n".join(bad)


def test_analysis_reads_only_the_registry_and_the_tables() -> None:
    bad = [f"{path.relative_to(REPO)}:{line} ({name}) imports distillab.{t}"
           for name, path in MODULES.items() if unit(name) == "analysis"
           for t, _, line in _imports(path) if unit(t) not in ("analysis", "registry", "tables")]
    assert not bad, "\n".join(bad)


def test_analysis_and_report_load_no_torch() -> None:
    """``import distillab.analysis`` (every module of it) and ``distillab report --help`` load no torch."""
    code = ("import sys; import distillab.analysis.results, distillab.analysis.plots, distillab.analysis.findings; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'deepspeed')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout
    code = ("import sys, contextlib, io\nfrom distillab.driver.cli import main\n"
            "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
            "    main(['report', '--help'])\nprint('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False", out.stdout + out.stderr


def test_imports_of_distillab_sit_at_module_top() -> None:
    bad = []
    for name, path in MODULES.items():
        for target, inside, line in _imports(path):
            if inside and name not in LAZY_MODULES:
                bad.append(f"{path.relative_to(REPO)}:{line} imports distillab.{target} inside a function")
    assert not bad, "\n".join(bad)
    for name in LAZY_MODULES:  # allowed only where the module documents why, with a measurement
        doc = ast.get_docstring(ast.parse(MODULES[name].read_text())) or ""
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


@pytest.mark.parametrize("path", sorted(MODULES.values()), ids=lambda p: str(p.relative_to(REPO)))
def test_no_function_over_80_lines(path: Path) -> None:
    long = [f"{name} (line {line}): {n} lines" for name, line, n in _function_lengths(path) if n > 80]
    assert not long, long


def test_distill_is_a_short_recipe() -> None:
    assert len((REPO / "platform" / "recipe" / "distill.py").read_text().splitlines()) <= 350
