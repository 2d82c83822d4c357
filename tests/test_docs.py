"""The docs site (docs/): every config field described, the generated reference pages fresh,
and the site built strictly (warnings as errors, nitpicky references, internal links checked).

Regenerate the reference pages with ``python docs/generate.py``; build the site with
``sphinx-build -W --keep-going -n -b html docs docs/_build/html``.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _generator():
    spec = importlib.util.spec_from_file_location("distillab_docs_generate", DOCS / "generate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_config_field_has_a_description():
    missing = _generator().missing_descriptions()
    assert not missing, (
        "config fields without a description (a Field(description=...) or a `#:` comment line directly "
        "above the field in platform/config.py): " + ", ".join(missing))


def test_every_model_reachable_from_the_sweep_is_documented():
    gen = _generator()
    from distillab.config import RLVRConfig, RolloutConfig, SweepConfig

    models = gen.config_models()
    assert {SweepConfig, RolloutConfig, RLVRConfig} <= set(models)
    assert "models.teacher_refine" in models[RLVRConfig] and "trial.rlvr" in models[RLVRConfig]
    page = gen.config_page()
    for m in models:
        for name, f in m.model_fields.items():
            assert f"| `{f.alias or name}` |" in page, (m.__name__, name)


def test_generated_pages_are_fresh():
    stale = _generator().stale()
    assert not stale, f"stale generated docs pages {stale}: run python docs/generate.py and commit them"


def test_reference_pages_cover_the_parser_and_the_registry():
    gen = _generator()
    from distillab.registry import METRICS

    cli, metrics = gen.cli_page(), gen.metrics_page()
    for cmd in ("prepare", "sweep", "report", "findings"):
        assert f"## `distillab {cmd}`" in cli
    for opt in ("--dry-run", "--resume", "--set KEY=VALUE", "--plots DIR", "--by COLUMN"):
        assert f"`{opt}" in cli, opt
    for key in METRICS:
        assert f"| `{key}` |" in metrics, key


def test_readme_is_short_and_runs_what_ci_runs():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250
    assert "bash scripts/test.sh" in readme and "bash scripts/micro_study.sh" in readme
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()


def test_site_builds_strictly(tmp_path):
    if importlib.util.find_spec("sphinx") is None or importlib.util.find_spec("myst_parser") is None:
        pytest.skip("the docs extra is not installed (pip install -e '.[docs]')")
    build = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-q", "-b", "html",
             "-d", str(tmp_path / "doctrees"), str(DOCS), str(tmp_path / "html")]
    r = subprocess.run(build, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"sphinx-build failed:\n{r.stdout[-4000:]}\n{r.stderr[-8000:]}"
    assert (tmp_path / "html" / "reference" / "config.html").exists()
    shutil.rmtree(tmp_path / "html", ignore_errors=True)


def test_readme_example_is_a_valid_four_trial_sweep(tmp_path):
    from distillab.config import load_sweep

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    example = readme.split("```yaml\n", 1)[1].split("```", 1)[0]
    assert "extends: search_spaces/micro.yaml" in example
    (tmp_path / "my_study.yaml").write_text(example.replace("search_spaces/micro.yaml",
                                                            str(ROOT / "search_spaces" / "micro.yaml")))
    sweep = load_sweep(tmp_path / "my_study.yaml")
    assert sweep.name == "my_study" and len(sweep.trials) == 4
    assert {t.loss.kind for t in sweep.trials} == {"forward", "jsd"}


def test_the_rules_page_renders_the_strings_findings_prints(monkeypatch):
    """reference/rules.md is rendered from `distillab.analysis.rules`, the strings `distillab findings`
    prints: each finding's claim and every clause of its rule; a rule changed there changes the page."""
    from distillab.analysis import rules

    gen = _generator()
    page = gen.rules_page()
    for f, r in rules.RULES.items():
        assert f"## {f}\n\n{r.claim}\n" in page
        assert all(f"- {k + ' ' if k else ''}{v}\n" in page for k, v in r.clauses.items()), f
    assert rules.confidence_note() in page and "How §9 is read" in page
    monkeypatch.setitem(rules.RULES, "F4", rules.Rule("A CLAIM", {"": "A RULE"}))
    assert "## F4\n\nA CLAIM\n\n- A RULE\n" in gen.rules_page()


def test_the_config_reference_lists_the_study_axes_and_the_cross_field_rules():
    from distillab.config.rules import RULES
    from distillab.registry import AXES

    page = _generator().config_page()
    assert all(f"| `{key}` | " in page for key in AXES)
    assert "| `rollout.max_staleness` | staleness | yes | when not the default |" in page
    assert "| `seed` | seed | no (averaged over) | always |" in page
    assert all(r.doc.replace("|", "\\|") in page for r in RULES)
    assert "`rollout.max_staleness` > 0 needs `optimizer.zero_stage` 0, 1 or 2" in page
