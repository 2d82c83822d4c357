"""Study axes registered once (`distillab.registry.AXES`): the keys a sweep may vary, how each
prints, whether it splits a report row and its part of the trial name. The config, the trial id,
``distillab report`` (headline and ``--full``), the plots, ``findings --by`` and the dry-run read it:
an axis registered here, in the test alone, is searchable, named and reported apart; registered as
not grouping (like the seed), its values are averaged together."""

from __future__ import annotations

from pathlib import Path

import pytest

from distillab import registry
from distillab.analysis import plots
from distillab.analysis.results import final_table, group_columns, load
from distillab.config import ConfigError, TrialConfig, load_sweep
from distillab.driver.cli import main
from distillab.tables import write_rows

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "search_spaces" / "smoke.yaml"
STALENESS = REPO / "docs" / "data" / "micro_staleness"
#: the test's axis: AdamW's ε, a field of the trial no registered axis covers
EPS = "optimizer.eps"
GRID = {"search.grid": {EPS: [1e-8, 1e-6], "seed": [42, 43, 44]}}


def _eps_axis(**kw) -> registry.Axis:
    return registry.Axis(EPS, "ε", name=lambda v: f"eps{v[EPS]:g}", name_at=70, name_if_default=False, **kw)


def _rows(cells: list[str]) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in cells[2:]]


def _write_study(root: Path) -> list[TrialConfig]:
    """The smoke sweep over ε ∈ {1e-8, 1e-6} × seeds 42-44, its trials written as ``distillab sweep``
    writes them (the id, ``TrialConfig.flat``), with Countdown-3 accuracy 0.30 (ε 1e-8) or 0.50 (ε
    1e-6) after distillation, ± 0.01 by seed (SEM 0.01/√3 = 0.0058 over 3 seeds)."""
    trials = load_sweep(SMOKE, GRID).trials
    for t in trials:
        acc = (0.30 if t.optimizer.eps == 1e-8 else 0.50) + 0.01 * (t.seed - 43)
        write_rows(root, "trials", [{"trial_id": t.trial_id, "status": "completed", "start_time": 0.0,
                                     "end_time": 1.0, "checkpoint": None, "error": None, **t.flat()}], key=t.trial_id)
        write_rows(root, "evals", [dict(trial_id=t.trial_id, stage=stage, step=step, task="countdown3",
                                        metric="accuracy", value=v, n=8)
                                   for stage, step, v in (("pre", 0, 0.1), ("distill", 4, acc))], key=t.trial_id)
    return trials


def test_an_axis_registered_in_a_test_is_searchable_named_reported_and_plotted(tmp_path, monkeypatch, capsys):
    with pytest.raises(ConfigError, match=r"search.grid key 'optimizer.eps' is not searchable; allowed:"):
        load_sweep(SMOKE, GRID)
    monkeypatch.setitem(registry.AXES, EPS, _eps_axis())
    trials = _write_study(tmp_path / "eps")
    # the trial name: the axis's part away from its default only, so every other trial keeps its id
    names = sorted({t.trial_id.rsplit("-", 1)[0] for t in trials})
    assert names == sorted(f"offpd-forward-{e}lr0.001-s{s}" for e in ("", "eps1e-06-") for s in (42, 43, 44))
    assert TrialConfig().trial_id == "offpd-forward-lr1e-05-s42-06fc67f7"
    # the report: one row per ε (the seed averaged over), headline and --full
    res = load(tmp_path / "eps")
    assert group_columns(res) == [EPS]
    assert main(["report", str(tmp_path / "eps")]) == 0
    head = capsys.readouterr().out.splitlines()
    assert head[0].startswith(f"| {EPS} | countdown3 acc |")
    assert [(float(r[0]), r[1], r[-2]) for r in _rows(head)] == [(1e-8, "0.3 ± 0.0058", "3"), (1e-6, "0.5 ± 0.0058", "3")]
    assert main(["report", str(tmp_path / "eps"), "--full"]) == 0
    full = _rows(capsys.readouterr().out.splitlines())
    assert [(float(r[0]), r[4], r[5]) for r in full if r[1] == "distill"] == [
        (1e-8, "0.3 ± 0.0058", "3"), (1e-6, "0.5 ± 0.0058", "3")]
    # the plots: the axis is a series of its own, labelled with its short name
    assert plots.swept_columns(res) == [EPS]
    fig = plots.fig_policy_kl(res)
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["offpd, forward, ε=1e-08", "offpd, forward, ε=1e-06"]


def test_an_axis_that_does_not_group_is_averaged_over_like_the_seed(tmp_path, monkeypatch, capsys):
    """The same study with ε registered as not grouping a report row: one row, n = 6 over both values;
    the plots draw one series; ``findings --by optimizer.eps`` still splits by it on request."""
    monkeypatch.setitem(registry.AXES, EPS, _eps_axis(groups=False))
    _write_study(tmp_path / "eps")
    res = load(tmp_path / "eps")
    assert group_columns(res) == [] and plots.swept_columns(res) == []
    assert main(["report", str(tmp_path / "eps")]) == 0
    (row,) = _rows(capsys.readouterr().out.splitlines())
    assert row[0] == "0.4 ± 0.045" and row[-2:] == ["6", "0"]  # 0.29..0.51: sd √(0.0604 / 5) = 0.110, /√6
    assert final_table(res, group_columns(res)).filter(stage="distill")["n"].to_list() == [6]


def test_report_full_of_the_staleness_study_has_a_row_per_staleness_with_three_seeds(capsys):
    """docs/data/micro_staleness (``rollout.max_staleness`` 0, 1, 4 × forward, reverse × seeds 42-44):
    ``--full`` groups by the staleness as the headline does (it pooled the three values, n = 9, when
    it grouped by a hand-kept list of six columns)."""
    assert main(["report", str(STALENESS), "--full"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| rollout.max_staleness | loss.kind | stage ")
    rows = _rows(out)
    assert {(r[0], r[1]) for r in rows} == {(k, d) for k in ("0", "1", "4") for d in ("forward", "reverse")}
    assert {r[-2] for r in rows} == {"3"} and {r[-1] for r in rows} == {"0"}
    assert main(["report", str(STALENESS)]) == 0
    head = _rows(capsys.readouterr().out.splitlines())
    assert [(r[0], r[1], r[-2]) for r in head] == [(k, d, "3") for k in ("0", "1", "4") for d in ("forward", "reverse")]


def test_staleness_is_named_away_from_its_default_only() -> None:
    """The trial name shows ``rollout.max_staleness`` (``stale<k>``) and ``staleness_correction`` when
    they are not the default trial's (0, none): every trial at the defaults keeps the id it had."""
    def tid(**rollout) -> str:
        return TrialConfig.model_validate({"rollout": {"policy": "onpd", **rollout}}).trial_id.rsplit("-", 1)[0]

    assert tid() == "onpd-forward-lr1e-05-s42"
    assert tid(max_staleness=4) == "onpd-forward-stale4-lr1e-05-s42"
    assert tid(max_staleness=1, staleness_correction="tis") == "onpd-forward-stale1-tis-lr1e-05-s42"
    assert all(a.key in registry.SEARCHABLE for a in registry.AXES.values())
    assert registry.AXES["rollout.lambda"].in_name and not registry.AXES["optimizer.steps"].in_name


def test_the_dry_run_lists_the_swept_axes_the_trial_name_does_not_show() -> None:
    """``sweep --dry-run``'s trial lines (`driver.plan`): each ends with the value of every swept axis
    that its id does not name (`registry.Axis.text`: the short name and value); named axes (the LR
    here) stay in the id only."""
    from distillab.driver.plan import _trial_lines

    sweep = load_sweep(SMOKE, {"search.grid": {"rollout.tau_t": [0.5, 1.0], "optimizer.lr": [0.001]}})
    head, *lines = _trial_lines(sweep)
    assert head == "trials: 2 (grid over rollout.tau_t, optimizer.lr)"
    assert [x.split(": ", 1)[0].rsplit("-", 1)[0] for x in lines] == ["  offpd-forward-lr0.001-s42"] * 2
    assert [x.rsplit(", ", 1)[1] for x in lines] == ["sample τ_T=0.5", "sample τ_T=1"]
