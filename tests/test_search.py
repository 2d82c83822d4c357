"""Search-space config (grid / Optuna / ASHA / fault tolerance), the Pareto front and
the report metrics rebuilt from Parquet (platform/config.py, results.py, sweep.py)."""

from __future__ import annotations

import math
from pathlib import Path

import polars as pl
import pytest

from distillab.analysis.results import load, pareto_front, trial_metrics
from distillab.config import ConfigError, load_sweep
from distillab.tables import report_metrics, write_rows

REPO = Path(__file__).resolve().parents[1]
OPTUNA = REPO / "search_spaces" / "smoke_optuna.yaml"


# --------------------------------------------------------------------------------------
# config
# --------------------------------------------------------------------------------------


def test_optuna_config_loads() -> None:
    s = load_sweep(OPTUNA)
    assert s.search.kind == "optuna" and s.search.grid == {}
    assert s.search.space["optimizer.lr"].loguniform == (1e-4, 1e-2)
    assert s.search.space["rollout.lambda"].uniform == (-2.0, 2.0)
    assert s.search.objectives == [("eval/distill/countdown3/accuracy", "max"), ("eval/forgetting", "max")]
    assert s.fault_tolerance.worker_restarts == 2 and s.fault_tolerance.trial_retries == 1


@pytest.mark.parametrize(
    "override, fragment",
    [
        ({"search.space": {"rollout.lambda": {"uniform": [-3, 2]}}}, "rollout.lambda"),
        ({"search.space": {"optimizer.lr": {"loguniform": [0, 1]}}}, "loguniform bounds must be > 0"),
        ({"search.space": {"optimizer.lr": {"uniform": [2, 1]}}}, "low < high"),
        ({"search.space": {"optimizer.lr": {"uniform": [1e-3, 1e-2], "choice": [1]}}}, "exactly one of"),
        ({"search.space": {"model.depth": {"choice": [1]}}}, "not searchable"),
        ({"search.space": {"optimizer.lr": {"uniform": [-1e-3, 1e-2]}}}, "optimizer.lr"),  # lr must be > 0
        ({"search.space": {}}, "at least one dimension"),
        ({"search.grid": {"seed": [1, 2]}}, "search.grid is not used"),
        ({"search.mode": ["max"]}, "same length"),
        ({"search.sampler": "cmaes"}, "search.sampler"),
        ({"search.scheduler": {"kind": "pbt"}}, "search.scheduler.kind"),
        ({"fault_tolerance.worker_restarts": -1}, "fault_tolerance.worker_restarts"),
        ({"trial.rollout.lambda": None}, "rollout.lambda is required"),
    ],
)
def test_search_config_errors_name_the_field(override: dict, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment.replace(".", r"\.")):
        load_sweep(OPTUNA, override)


def test_space_only_with_optuna() -> None:
    with pytest.raises(ConfigError, match="search.space is only used"):
        load_sweep(REPO / "search_spaces" / "smoke.yaml", {"search.space": {"optimizer.lr": {"uniform": [1e-4, 1e-3]}}})


def test_build_search_maps_domains_onto_tune() -> None:
    from ray.tune.search.sample import Categorical, Float, Integer

    from distillab.driver.sweep import build_search

    s = load_sweep(OPTUNA, {"search.space": {
        "optimizer.lr": {"loguniform": [1e-4, 1e-2]}, "rollout.lambda": {"uniform": [-2, 2]},
        "loss.kind": {"choice": ["forward", "reverse"]}, "optimizer.steps": {"int": [2, 4]}},
        "search.scheduler": {"metric": "loss", "mode": "min", "grace_period": 2}})
    space, searcher, scheduler, n = build_search(s)
    assert n == 6
    lr, lam, kind, steps = (space[k] for k in ("optimizer.lr", "rollout.lambda", "loss.kind", "optimizer.steps"))
    assert isinstance(lr, Float) and (lr.lower, lr.upper) == (1e-4, 1e-2) and "LogUniform" in type(lr.sampler).__name__
    assert isinstance(lam, Float) and (lam.lower, lam.upper) == (-2.0, 2.0)
    assert isinstance(kind, Categorical) and kind.categories == ["forward", "reverse"]
    assert isinstance(steps, Integer) and (steps.lower, steps.upper) == (2, 5)  # Tune's upper bound is exclusive
    assert type(searcher).__name__ == "ConcurrencyLimiter" and searcher.max_concurrent == 2
    assert type(scheduler).__name__ == "AsyncHyperBandScheduler"
    smoke = load_sweep(REPO / "search_spaces" / "smoke.yaml")
    grid_space, none, _, one = build_search(smoke)
    # one grid expansion (issue 13): Tune iterates the sweep's validated trials, one point each
    assert none is None and one == 1 and grid_space["point"] == {"grid_search": [
        {"trial_id": t.trial_id, "rollout.policy": p} for t, p in zip(smoke.trials, ["offpd", "onpd"])]}



def test_build_search_over_a_union_of_grids() -> None:
    """search.grids (micro_findings.yaml): Tune's points are the validated trials of both grids,
    each with the values that tell them apart, and each point gives back its trial."""
    from distillab.driver.sweep import POINT, build_search, search_trials, trial_of

    s = load_sweep(REPO / "search_spaces" / "micro_findings.yaml")
    space, none, _, one = build_search(s)
    points = space[POINT]["grid_search"]
    assert none is None and one == 1 and [p["trial_id"] for p in points] == [t.trial_id for t in s.trials]
    assert points[0] == {"trial_id": s.trials[0].trial_id, "rollout.policy": "offpd", "loss.kind": "forward",
                         "optimizer.lr": s.trials[0].optimizer.lr, "seed": 42, "rollout.lambda": None}
    assert {p["rollout.lambda"] for p in points if p["rollout.policy"] == "spectrum"} == {-2.0, -1.0, 0.0, 1.0, 2.0}
    trials, base = search_trials(s)
    for p, t in zip(points, s.trials):
        assert trial_of({POINT: p}, trials, base) == t



def test_completed_trials_counts_rows_of_different_configs(tmp_path) -> None:
    """Trials rows of a union of grids carry different config columns (an RLVR stage's ``rlvr.*``
    in one grid, ``rlvr`` null in the other): every row is counted, by status."""
    from distillab.driver.sweep import completed_trials
    from distillab.tables import write_rows

    rows = {"a": {"status": "completed", "rlvr": None}, "b": {"status": "completed", "rlvr.task": "countdown4"},
            "c": {"status": "failed", "rlvr.task": "countdown4", "rlvr.steps": 4}}
    for tid, row in rows.items():
        write_rows(tmp_path, "trials", [{"trial_id": tid, "start_time": 0.0, "end_time": 1.0, **row}], key=tid)
    assert completed_trials(tmp_path) == 2
    assert completed_trials(tmp_path, "b") == 1 and completed_trials(tmp_path, "c") == 0


# --------------------------------------------------------------------------------------
# Pareto front by hand
# --------------------------------------------------------------------------------------


def test_pareto_front_by_hand() -> None:
    df = pl.DataFrame({
        "trial_id": ["a", "b", "c", "d", "e", "f"],
        "acc": [0.5, 0.4, 0.3, 0.5, 0.2, None],
        "forget": [-0.3, -0.1, -0.1, -0.4, 0.0, 0.5],
    })
    # max acc, max forget (= lose the least): a (best acc) beats d; b beats c; e best forget
    got = pareto_front(df, [("acc", "max"), ("forget", "max")])
    assert dict(zip(got["trial_id"], got["pareto"])) == {"a": True, "b": True, "c": False, "d": False, "e": True, "f": False}
    # minimising forget instead: d dominates a (same acc, lower), c dominates b? no (acc lower): c,b tie on forget
    got = pareto_front(df, [("acc", "max"), ("forget", "min")])
    assert got.filter(pl.col("pareto"))["trial_id"].to_list() == ["d"]
    # one objective: the front is the argmax (ties all kept)
    assert pareto_front(df, [("acc", "max")]).filter(pl.col("pareto"))["trial_id"].to_list() == ["a", "d"]
    with pytest.raises(ValueError, match="no column 'x'"):
        pareto_front(df, [("x", "max")])
    with pytest.raises(ValueError, match="'max' or 'min'"):
        pareto_front(df, [("acc", "up")])


# --------------------------------------------------------------------------------------
# report metrics rebuilt from Parquet
# --------------------------------------------------------------------------------------


def _evals(root: Path, tid: str, stage: str, step: int, ood: float, acc: float) -> None:
    rows = [dict(trial_id=tid, stage=stage, step=step, task="ood", metric="ood_mean", value=ood, n=8),
            dict(trial_id=tid, stage=stage, step=step, task="countdown3", metric="accuracy", value=acc, n=8)]
    write_rows(root, "evals", rows, key=f"{tid}__{stage}__{step}")


def test_report_metrics_and_trial_metrics(tmp_path: Path) -> None:
    assert report_metrics(tmp_path, "t0") == {}
    _evals(tmp_path, "t0", "pre", 0, ood=0.75, acc=0.0)
    _evals(tmp_path, "t0", "distill", 10, ood=0.5, acc=0.125)
    _evals(tmp_path, "t0", "distill", 20, ood=0.25, acc=0.375)  # the last step of the stage counts
    _evals(tmp_path, "t1", "pre", 0, ood=0.5, acc=0.0)
    got = report_metrics(tmp_path, "t0")
    assert got == {
        "eval/pre/ood/ood_mean": 0.75, "eval/pre/countdown3/accuracy": 0.0,
        "eval/distill/ood/ood_mean": 0.25, "eval/distill/countdown3/accuracy": 0.375,
        "eval/forgetting": -0.5,  # after − before (PROTOCOL.md §4)
    }
    assert "eval/forgetting" not in report_metrics(tmp_path, "t1")  # no distill stage yet
    for tid, status in (("t0", "completed"), ("t1", "failed")):
        write_rows(tmp_path, "trials", [dict(trial_id=tid, status=status, start_time=0.0, end_time=1.0,
                                             **{"optimizer.lr": 1e-3})], key=tid)
    wide = trial_metrics(load(tmp_path))
    assert wide["trial_id"].to_list() == ["t0"]  # completed trials only
    assert wide["eval/forgetting"].item() == -0.5 and wide["eval/distill/countdown3/accuracy"].item() == 0.375
    assert wide["optimizer.lr"].item() == 1e-3  # a float64 through Parquet and back: exact


def test_running_row_has_nan_end_time(tmp_path: Path) -> None:
    write_rows(tmp_path, "trials", [dict(trial_id="t", status="running", start_time=1.0, end_time=math.nan)], key="t")
    row = load(tmp_path).trials.collect()
    assert row["status"].item() == "running" and math.isnan(row["end_time"].item())


# --------------------------------------------------------------------------------------
# the CLI's --resume guard rails
# --------------------------------------------------------------------------------------


def test_resume_needs_a_sweep_directory(tmp_path: Path, capsys) -> None:
    from distillab.driver.cli import main

    assert main(["sweep", "--resume", str(tmp_path)]) == 2
    assert "no sweep.json there" in capsys.readouterr().err
    assert main(["sweep", str(OPTUNA), "--resume", str(tmp_path)]) == 2
    assert "--resume takes the sweep directory only" in capsys.readouterr().err
    (tmp_path / "sweep.json").write_text('{"name": "x", "bogus": 1}')
    assert main(["sweep", "--resume", str(tmp_path)]) == 2
    assert "bogus" in capsys.readouterr().err
    assert main(["sweep"]) == 2
    assert "needs a config YAML" in capsys.readouterr().err


@pytest.mark.parametrize(
    "override, fragment",
    [
        ({"search.metric": ["eval/distill/countdown3/acc", "eval/forgetting"]}, "search.metric 'eval/distill/countdown3/acc' is not a reported metric"),
        ({"search.metric": "accuracy", "search.mode": "max"}, "search.metric 'accuracy' is not a reported metric"),
        ({"search.scheduler": {"metric": "eval/forgetting"}}, "search.scheduler.metric 'eval/forgetting' is not a reported metric"),
    ],
)
def test_metric_names_are_checked_before_compute(override: dict, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment.replace(".", r"\.").replace("/", "/")):
        load_sweep(OPTUNA, override)
    ok = load_sweep(OPTUNA, {"search.metric": ["eval/distill/countdown4e/pass@10", "eval/distill/ood/add/accuracy"],
                             "search.mode": ["max", "max"], "search.scheduler": {"metric": "kl/forward"}})
    assert ok.search.scheduler.metric == "kl/forward"
