"""The Python API, `distillab.api`: the functions the ``distillab`` command calls, on the committed results of
the findings study (docs/data/micro_findings: 66 trials) and on the own-data example's sweep YAML.

- `findings` gives the verdicts, §9.1 confidences and replications that ``distillab findings
  docs/data/micro_findings`` printed into the committed docs/findings.md, and its text is what the CLI prints;
- `load_results` reads what `analysis.results.load` reads (the frames ``distillab report`` tabulates);
- `run_sweep`'s ``overrides`` give the config ``--set`` gives (the dumps compared), for a YAML path and for a
  built `SweepConfig`; ``dry_run=True`` returns the plan ``distillab sweep --dry-run`` prints;
- bad input raises the CLI's error, before anything starts or is written.

No Ray trial here: the CLI's sweep tests run `run_sweep` (``distillab sweep`` calls it).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import polars as pl
import pytest

from distillab import api
from distillab.analysis.findings import FINDINGS, format_verdicts, reason
from distillab.analysis.results import load
from distillab.config import ConfigError, load_sweep
from distillab.driver import api as driver_api
from distillab.driver import cli
from distillab.tasks import registry  # noqa: F401  (the file task registers its config section)

REPO = Path(__file__).resolve().parents[1]
STUDY = REPO / "docs" / "data" / "micro_findings"
OWN_DATA = REPO / "search_spaces" / "micro_own_data.yaml"


@pytest.fixture(scope="module")
def decided() -> driver_api.Findings:
    return api.findings(STUDY)  # the 2,000 redraws of §9.1 per finding: about 9 s, once


def test_the_api_exports_the_functions_the_cli_calls() -> None:
    assert api.__all__ == ["findings", "load_results", "run_sweep"]
    for name in api.__all__:
        assert getattr(api, name) is getattr(driver_api, name) is getattr(cli, name), name


def _committed_verdicts() -> dict[str, dict[str, str]]:
    """The verdict table of docs/findings.md (``distillab findings docs/data/micro_findings --out docs``),
    one dict per finding keyed by the table's column names."""
    lines = (REPO / "docs" / "findings.md").read_text(encoding="utf-8").splitlines()
    start = next(i for i, x in enumerate(lines) if re.match(r"^\| finding +\| verdict ", x))
    head = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        row = dict(zip(head, (c.strip() for c in line.strip("|").split("|"))))
        rows[row["finding"]] = row
    return rows


def test_findings_give_the_verdicts_the_cli_committed(decided) -> None:
    table = decided.table
    assert table.columns == ["group", "finding", "verdict", "confidence", "firm", "replication", "reason", "claim"]
    assert table.schema["confidence"] == pl.Float64 and table["finding"].to_list() == list(FINDINGS)
    committed = _committed_verdicts()
    assert set(committed) == set(FINDINGS)
    for row in table.iter_rows(named=True):
        cli_row = committed[row["finding"]]
        assert row["group"] == "all" and row["verdict"] == cli_row["verdict"], row
        assert f"{row['confidence']:.3f}" == cli_row["confidence"].split()[0], row
        assert f"{row['replication']:.2f}" == cli_row["replication"], row
        assert row["firm"] is (row["confidence"] >= 0.9)
    # the study's values (docs/findings.md): F2, F4 reproduced; F1, F3, F5 not, all firm
    assert table["verdict"].to_list() == ["not reproduced", "reproduced", "not reproduced", "reproduced",
                                          "not reproduced"]
    assert table.filter(pl.col("finding") == "F4")["reason"].item() == "the rule holds"
    assert table.filter(pl.col("finding") == "F2")["reason"].item() == (
        "every clause holds; least confident: (a) onpd, forward (0.974 firm)")
    assert table["reason"].to_list() == [reason(v) for v in decided.verdicts["all"]]


def test_findings_text_is_what_the_cli_prints(decided) -> None:
    text = decided.text()
    assert text == str(decided) == format_verdicts(decided.verdicts)
    assert text.splitlines()[0] == "== findings (all) =="
    heads = [x for x in text.splitlines() if re.match(r"^F\d  ", x)]
    assert heads[3].startswith("F4  REPRODUCED  (confidence 1.000 firm; replication 1.00)")
    assert decided.sources == (str(STUDY),) and decided.by is None and decided.task == "countdown3"


def test_load_results_reads_what_report_reads() -> None:
    res, ref = api.load_results(STUDY), load(STUDY)
    for table in ("trials", "metrics", "evals", "samples"):
        got, want = getattr(res, table).collect(), getattr(ref, table).collect()
        assert got.equals(want), table
    assert res.trials.collect().height == 66  # "from 66 trials" (docs/findings.md)
    both = api.load_results([STUDY])
    assert both.trials.collect()["sweep"].unique().to_list() == ["micro_findings"]


def test_bad_results_paths_raise_the_cli_errors(tmp_path, capsys) -> None:
    with pytest.raises(FileNotFoundError, match="load_results: no such sweep directory: "):
        api.load_results(tmp_path / "absent")
    with pytest.raises(NotADirectoryError, match="a file, not a sweep directory"):
        api.load_results(OWN_DATA)
    (tmp_path / "notes").mkdir()
    with pytest.raises(FileNotFoundError, match=r"findings: not a sweep directory \(no sweep.json, no trials table\)"):
        api.findings(tmp_path / "notes")
    assert cli.main(["findings", str(tmp_path / "notes")]) == 2
    assert "distillab: findings: not a sweep directory (no sweep.json, no trials table)" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"unknown finding\(s\) \['F9'\]; allowed: \['F1', 'F2', 'F3', 'F4', 'F5'\]"):
        api.findings(STUDY, only=["F9"])


OVERRIDES = {"name": "mine", "trial.optimizer.steps": 200, "trial.evaluation.task_items.files": 50}
SET = ["name=mine", "trial.optimizer.steps=200", "trial.evaluation.task_items.files=50"]


def test_overrides_are_the_cli_set() -> None:
    from_set = load_sweep(OWN_DATA, cli.parse_overrides(SET))
    from_path = driver_api.sweep_config(OWN_DATA, OVERRIDES)
    from_config = driver_api.sweep_config(load_sweep(OWN_DATA), OVERRIDES)
    for sweep in (from_path, from_config):
        assert sweep.model_dump(mode="json") == from_set.model_dump(mode="json")
        assert [t.trial_id for t in sweep.trials] == [t.trial_id for t in from_set.trials]
    assert len(from_set.trials) == 4 and {t.optimizer.steps for t in from_set.trials} == {200}
    assert from_set.name == "mine" and from_set.trials[0].evaluation.task_items["files"] == 50
    assert load_sweep(OWN_DATA).trials[0].optimizer.steps == 400  # the YAML's, overridden


def test_dry_run_returns_the_cli_plan(tmp_path, capsys) -> None:
    run = api.run_sweep(OWN_DATA, {**OVERRIDES, "storage_path": str(tmp_path / "runs")}, dry_run=True)
    printed = capsys.readouterr().out
    assert run.plan is not None and run.plan in printed and run.path is None and not run.complete
    assert run.placeable and run.trials_expected == 4 and run.trials_completed == 0
    assert "trials: 4 (grid over" in run.plan and f"{tmp_path / 'runs' / 'mine'}" in run.plan
    assert cli.main(["sweep", str(OWN_DATA), "--dry-run", *(x for s in SET for x in ("--set", s)),
                     "--set", f"storage_path={tmp_path / 'runs'}"]) == 0
    assert run.plan in capsys.readouterr().out
    assert not (tmp_path / "runs").exists()  # a dry run writes nothing


@pytest.mark.parametrize("overrides, kwargs, error, message", [
    ({"trial.loss.kind": "bogus"}, {}, ConfigError,
     "(with --set trial.loss.kind): trial.loss.kind: Input should be 'forward', 'reverse' or 'jsd' (got 'bogus')"),
    ({"trial.nope": 1}, {}, ConfigError, "(with --set trial.nope): trial.nope: unknown field; allowed: ["),
    ({}, {"threads": 0}, ConfigError, "--threads 0: must be >= 1"),
    ({"storage_path": "/proc/distillab"}, {}, ConfigError, "storage_path"),
], ids=["bad-value", "unknown-key", "bad-number", "unwritable-storage"])
def test_bad_input_raises_the_cli_error_before_anything_starts(overrides, kwargs, error, message, capsys) -> None:
    with pytest.raises(error) as raised:
        api.run_sweep(OWN_DATA, overrides, **kwargs)
    assert message in str(raised.value)
    argv = ["sweep", str(OWN_DATA), *(x for k, v in overrides.items() for x in ("--set", f"{k}={v}"))]
    argv += [x for k, v in kwargs.items() for x in (f"--{k}", str(v))]
    assert cli.main(argv) == 2
    assert f"distillab: {raised.value}" in capsys.readouterr().err
    assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()  # no Ray started


def test_a_missing_yaml_and_a_resume_with_overrides_are_refused(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="nowhere.yaml does not exist"):
        api.run_sweep(tmp_path / "nowhere.yaml")
    with pytest.raises(ConfigError, match=re.escape(driver_api.RESUME_ONLY)):
        api.run_sweep(STUDY, {"name": "x"}, resume=True)
    with pytest.raises(ConfigError, match="a sweep is a YAML path or a SweepConfig, got dict"):
        api.run_sweep({"name": "x"})
