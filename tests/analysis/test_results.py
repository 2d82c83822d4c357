"""Results tables: atomic idempotent writes, lazy loading, mean ± SEM over seeds,
the final report table (DESIGN.md "Results schema")."""

from __future__ import annotations

import math
from pathlib import Path

import polars as pl
import _tolerance as tol
import pytest

from distillab import tables
from distillab.analysis.results import aggregate, config_columns, final_table, format_table, joined_evals, load
from distillab.tables import write_rows

#: float64 roundings (tests/_tolerance.py, approx64) of a value below: a mean, SEM or difference over at
#: most 4 trials of 3 seeds (sums, squares, a division and a square root) and the literals' own rounding
ROUNDINGS = 64


def _eval(trial_id: str, stage: str, step: int, value: float, metric: str = "accuracy") -> dict:
    return dict(trial_id=trial_id, stage=stage, step=step, task="countdown3", metric=metric,
                value=value, n=200)


def _trial(trial_id: str, lr: float, seed: int, status: str = "completed", **extra) -> dict:
    return {"trial_id": trial_id, "status": status, "error": None if status == "completed" else "boom",
            "start_time": 1.0, "end_time": 2.0, "checkpoint": None,
            "loss.kind": "forward", "optimizer.lr": lr, "seed": seed, **extra}


def _no_temp_files(directory: Path) -> bool:
    return all(p.suffix == ".parquet" and not p.name.startswith(".") for p in directory.iterdir())


def test_roundtrip_all_tables(tmp_path: Path) -> None:
    write_rows(tmp_path, "trials", [_trial("t0", 1e-5, 42, clip=True)], key="t0")
    write_rows(tmp_path, "metrics", [dict(trial_id="t0", stage="distill", step=3, name="loss/kl",
                                          value=1.5)], key="t0__distill__3")
    write_rows(tmp_path, "evals", [_eval("t0", "pre", 0, 0.25)], key="t0__pre__0")
    write_rows(tmp_path, "samples", [dict(trial_id="t0", stage="pre", step=0, task="countdown3",
                                          prompt="p", completion="c", reward=2)], key="t0__pre__0")
    res = load(tmp_path)
    trials = res.trials.collect()
    assert trials.row(0, named=True) == {**_trial("t0", 1e-5, 42, clip=True)}
    assert trials.schema["start_time"] == pl.Float64 and trials.schema["clip"] == pl.Boolean
    assert config_columns(res) == ["loss.kind", "optimizer.lr", "seed", "clip"]
    m = res.metrics.collect()
    assert m.schema == pl.Schema({"trial_id": pl.String, "stage": pl.String, "step": pl.Int64,
                                  "name": pl.String, "value": pl.Float64})
    assert m.rows() == [("t0", "distill", 3, "loss/kl", 1.5)]
    assert res.evals.collect().rows() == [("t0", "pre", 0, "countdown3", "accuracy", 0.25, 200)]
    s = res.samples.collect()
    assert s["reward"].dtype == pl.Float64 and s["reward"].to_list() == [2.0]


def test_missing_tables_are_empty_with_schema(tmp_path: Path) -> None:
    res = load(tmp_path)
    for table in tables.TABLES:
        frame = getattr(res, table).collect()
        assert frame.height == 0
        assert frame.columns == [c.name for c in tables.SCHEMAS[table]]
    assert final_table(res, []).height == 0
    with pytest.raises(FileNotFoundError):
        load(tmp_path / "nope")


def test_rewriting_a_key_replaces_rows(tmp_path: Path) -> None:
    rows = [_eval("t0", "distill", 10, 0.1), _eval("t0", "distill", 10, 0.2, metric="pass@10")]
    write_rows(tmp_path, "evals", rows, key="t0__distill__10")
    rows[0]["value"] = 0.5
    write_rows(tmp_path, "evals", rows, key="t0__distill__10")
    got = load(tmp_path).evals.sort("metric").collect()
    assert got["value"].to_list() == [0.5, 0.2]
    assert len(list((tmp_path / "evals").iterdir())) == 1


def test_failed_write_leaves_old_file_and_no_temp(tmp_path: Path, monkeypatch) -> None:
    path = write_rows(tmp_path, "evals", [_eval("t0", "pre", 0, 0.25)], key="t0__pre__0")
    before = path.read_bytes()
    bad = _eval("t0", "pre", 0, 0.9)
    del bad["value"]
    with pytest.raises(ValueError, match="'value'"):
        write_rows(tmp_path, "evals", [bad], key="t0__pre__0")
    # A crash after the temp file was written (here: in os.replace) cleans it up.
    def boom(*_a, **_k):
        raise OSError("disk gone")
    monkeypatch.setattr(tables.os, "replace", boom)
    with pytest.raises(OSError, match="disk gone"):
        write_rows(tmp_path, "evals", [_eval("t0", "pre", 0, 0.9)], key="t0__pre__0")
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert _no_temp_files(tmp_path / "evals")
    assert load(tmp_path).evals.collect()["value"].to_list() == [0.25]


@pytest.mark.parametrize(
    ("table", "rows", "key", "match"),
    [
        ("evalz", [], "k", r"table must be one of \['trials', 'metrics', 'evals', 'samples'\]"),
        ("evals", [], "../x", "path separators"),
        ("evals", [], "a..b", r"'\.\.'"),
        ("evals", [], ".hidden", "leading|start"),
        ("evals", [], "a b", r"A-Za-z0-9"),
        ("evals", [{**_eval("t", "pre", 0, 1.0), "extra": 1}], "k", "unknown column.*'extra'"),
        ("evals", [{**_eval("t", "pre", 0, 1.0), "step": 1.5}], "k", r"evals\.step.*expected int"),
        ("evals", [{**_eval("t", "pre", 0, 1.0), "value": "x"}], "k", r"evals\.value"),
        ("evals", [{**_eval("t", "pre", 0, 1.0), "n": True}], "k", r"evals\.n"),
        ("evals", [{**_eval("t", "pre", 0, 1.0), "task": None}], "k", r"evals\.task.*None"),
        ("evals", [_eval("t", "train", 0, 1.0)], "k", "stage must be one of"),
        ("metrics", [dict(trial_id="t", stage="pre", step=0, name="x", value=1.0)], "k", "stage"),
        ("trials", [{**_trial("t", 1e-5, 42), "tasks": [1, 2]}], "k", r"trials\.tasks.*flatten"),
        ("trials", [_trial("t", 1e-5, 42), _trial("u", "big", 43)], "k", r"trials\.optimizer\.lr"),
        ("trials", [{k: v for k, v in _trial("t", 1e-5, 42).items() if k != "status"}], "k",
         "'status'"),
    ],
)
def test_write_validation(tmp_path: Path, table, rows, key, match) -> None:
    with pytest.raises(ValueError, match=match):
        write_rows(tmp_path, table, rows, key=key)
    assert not any(tmp_path.iterdir())  # nothing was written


def test_aggregate_mean_sem_by_hand() -> None:
    # 2 configs × 3 seeds, config B is missing seed 44.
    df = pl.DataFrame({
        "lr": [1e-5, 1e-5, 1e-5, 5e-5, 5e-5],
        "seed": [42, 43, 44, 42, 43],
        "value": [0.5, 0.6, 0.7, 0.2, 0.4],
    })
    out = aggregate(df.lazy(), ["lr"])
    assert out.columns == ["lr", "mean", "sem", "n"]
    a, b = out.rows(named=True)
    assert a["lr"] == 1e-5 and a["n"] == 3
    assert a["mean"] == tol.approx64(0.6, ROUNDINGS)
    assert a["sem"] == tol.approx64(0.1 / math.sqrt(3), ROUNDINGS)  # std = 0.1
    assert b["n"] == 2 and b["mean"] == tol.approx64(0.3, ROUNDINGS)
    assert b["sem"] == tol.approx64(0.1, ROUNDINGS)  # std = sqrt(0.02) = 0.1414, / sqrt(2)
    single = aggregate(df.filter(pl.col("seed") == 42), ["lr"])
    assert single["sem"].to_list() == [None, None] and single["n"].to_list() == [1, 1]
    assert aggregate(df, [])["n"].to_list() == [5]
    with pytest.raises(ValueError, match="'nope'"):
        aggregate(df, ["nope"])


def _sweep(root: Path, trial_prefix: str = "") -> None:
    """Config A (lr 1e-5): seeds 42-44 completed. Config B (lr 5e-5): seeds 42, 43
    completed, seed 44 errored (its evals must not count)."""
    values = {("A", 42): 0.5, ("A", 43): 0.6, ("A", 44): 0.7, ("B", 42): 0.2, ("B", 43): 0.4}
    for (cfg, seed), v in values.items():
        tid = f"{trial_prefix}{cfg}{seed}"
        lr = 1e-5 if cfg == "A" else 5e-5
        write_rows(root, "trials", [_trial(tid, lr, seed)], key=tid)
        write_rows(root, "evals", [_eval(tid, "pre", 0, 0.1)], key=f"{tid}__pre__0")
        write_rows(root, "evals", [_eval(tid, "distill", 50, 0.0)], key=f"{tid}__distill__50")
        write_rows(root, "evals", [_eval(tid, "distill", 150, v)], key=f"{tid}__distill__150")
    tid = f"{trial_prefix}B44"
    write_rows(root, "trials", [_trial(tid, 5e-5, 44, status="error")], key=tid)
    write_rows(root, "evals", [_eval(tid, "distill", 50, 0.9)], key=f"{tid}__distill__50")


def test_final_table_excludes_and_counts_failed(tmp_path: Path) -> None:
    _sweep(tmp_path)
    res = load(tmp_path)
    assert joined_evals(res).collect().height == 16
    table = final_table(res, ["loss.kind", "optimizer.lr"])
    assert table.columns == ["loss.kind", "optimizer.lr", "stage", "task", "metric", "mean",
                             "sem", "n", "n_failed"]
    rows = {(r["optimizer.lr"], r["stage"]): r for r in table.iter_rows(named=True)}
    assert [(r["optimizer.lr"], r["stage"]) for r in table.iter_rows(named=True)] == [
        (1e-5, "pre"), (1e-5, "distill"), (5e-5, "pre"), (5e-5, "distill")]
    a, b = rows[(1e-5, "distill")], rows[(5e-5, "distill")]
    assert (a["n"], a["n_failed"]) == (3, 0)
    assert a["mean"] == tol.approx64(0.6, ROUNDINGS) and a["sem"] == tol.approx64(0.1 / math.sqrt(3), ROUNDINGS)
    assert (b["n"], b["n_failed"]) == (2, 1)
    assert b["mean"] == tol.approx64(0.3, ROUNDINGS) and b["sem"] == tol.approx64(0.1, ROUNDINGS)
    assert rows[(5e-5, "pre")]["mean"] == tol.approx64(0.1, ROUNDINGS)
    assert rows[(5e-5, "pre")]["sem"] == tol.approx64(0.0, ROUNDINGS)

    text = format_table(table)
    assert "0.6 ± 0.058" in text and "0.3 ± 0.1" in text and "n_failed" in text


def test_final_table_keeps_all_failed_configuration(tmp_path: Path) -> None:
    _sweep(tmp_path)
    write_rows(tmp_path, "trials", [_trial("C42", 1e-4, 42, status="error")], key="C42")
    table = final_table(load(tmp_path), ["optimizer.lr"])
    c = table.filter(pl.col("optimizer.lr") == 1e-4).row(0, named=True)
    assert (c["stage"], c["mean"], c["n"], c["n_failed"]) == (None, None, 0, 1)
    assert "–" in format_table(table)
    with pytest.raises(ValueError, match="'nope'"):
        final_table(load(tmp_path), ["nope"])


def test_load_list_of_sweeps(tmp_path: Path) -> None:
    one, two = tmp_path / "sweep1", tmp_path / "sweep2"
    _sweep(one)
    _sweep(two)  # same trial ids in both sweeps
    write_rows(two, "trials", [_trial("A42", 1e-5, 42, **{"rollout.lambda": 0.5})], key="A42")
    res = load([one, two])
    trials = res.trials.collect()
    assert trials.columns[0] == "sweep" and trials.height == 12
    assert "rollout.lambda" in trials.columns
    assert trials.filter(pl.col("sweep") == "sweep1")["rollout.lambda"].null_count() == 6
    for table in ("metrics", "evals", "samples"):
        assert getattr(res, table).collect_schema().names()[0] == "sweep"
    assert joined_evals(res).collect().height == 32  # joined on (sweep, trial_id)
    table = final_table(res, ["sweep", "optimizer.lr"])
    distill = table.filter(pl.col("stage") == "distill")
    assert distill["n"].to_list() == [3, 2, 3, 2]
    assert distill["n_failed"].to_list() == [0, 1, 0, 1]
    assert final_table(res, ["optimizer.lr"]).filter(pl.col("stage") == "distill")["n"].to_list() \
        == [6, 4]
    with pytest.raises(ValueError, match="unique"):
        load([one, tmp_path / "x" / "sweep1"])


# --------------------------------------------------------------------------- before/after,
# filters and counts on a hand-made set: 3 seeds (42-44) × 2 configurations, where
# "forward" has seed 44 failed and "reverse" is missing seed 43.

_HAND = {  # (kind, seed): (ood pre, ood distill, 4E pre, 4E distill, 4E rlvr)
    ("forward", 42): (0.80, 0.70, 0.10, 0.30, 0.50),
    ("forward", 43): (0.78, 0.74, 0.12, 0.36, 0.44),
    ("reverse", 42): (0.80, 0.60, 0.10, 0.20, None),
    ("reverse", 44): (0.82, 0.66, 0.08, 0.26, None),
}


def _hand_sweep(root: Path) -> Path:
    def ev(tid, stage, step, task, metric, value):
        return dict(trial_id=tid, stage=stage, step=step, task=task, metric=metric, value=value, n=8)

    for (kind, seed), (op, od, hp, hd, hr) in _HAND.items():
        tid = f"{kind}-s{seed}"
        write_rows(root, "trials", [_trial(tid, 1e-3, seed, **{"loss.kind": kind, "rollout.policy": "onpd"})],
                   key=tid)
        write_rows(root, "evals", [ev(tid, "pre", 0, "ood", "ood_mean", op),
                                   ev(tid, "pre", 0, "countdown4e", "accuracy", hp)], key=f"{tid}__pre__0")
        # an intermediate eval that the final-step selection must skip
        write_rows(root, "evals", [ev(tid, "distill", 50, "ood", "ood_mean", 0.0),
                                   ev(tid, "distill", 50, "countdown4e", "accuracy", 1.0)],
                   key=f"{tid}__distill__50")
        write_rows(root, "evals", [ev(tid, "distill", 100, "ood", "ood_mean", od),
                                   ev(tid, "distill", 100, "countdown4e", "accuracy", hd)],
                   key=f"{tid}__distill__100")
        if hr is not None:
            write_rows(root, "evals", [ev(tid, "rlvr", 20, "countdown4e", "accuracy", hr)],
                       key=f"{tid}__rlvr__20")
        write_rows(root, "metrics", [dict(trial_id=tid, stage="distill", step=1, name="loss", value=1.0)],
                   key=f"{tid}__distill")
    # the failed trial: evaluated before training and at step 50, then crashed
    tid = "forward-s44"
    write_rows(root, "trials", [_trial(tid, 1e-3, 44, status="failed",
                                       **{"loss.kind": "forward", "rollout.policy": "onpd"})], key=tid)
    write_rows(root, "evals", [ev(tid, "pre", 0, "ood", "ood_mean", 0.9),
                               ev(tid, "pre", 0, "countdown4e", "accuracy", 0.0)], key=f"{tid}__pre__0")
    write_rows(root, "evals", [ev(tid, "distill", 50, "ood", "ood_mean", 0.1),
                               ev(tid, "distill", 50, "countdown4e", "accuracy", 0.9)],
               key=f"{tid}__distill__50")
    return root


def _by_kind(df: pl.DataFrame) -> dict[str, dict]:
    return {r["loss.kind"]: r for r in df.iter_rows(named=True)}


def test_forgetting_and_gains_by_hand(tmp_path: Path) -> None:
    from distillab.analysis.results import forgetting, generalisation_gain, rlvr_gain, stage_delta

    res = load(_hand_sweep(tmp_path))
    per_trial = forgetting(res).sort("trial_id").collect()
    assert per_trial["trial_id"].to_list() == ["forward-s42", "forward-s43", "reverse-s42",
                                               "reverse-s44"]  # the failed trial is excluded
    assert per_trial["value"].to_list() == tol.approx64([-0.10, -0.04, -0.20, -0.16], ROUNDINGS)
    assert per_trial["before"].to_list() == tol.approx64([0.80, 0.78, 0.80, 0.82], ROUNDINGS)
    assert {"loss.kind", "seed", "status", "after"} <= set(per_trial.columns)

    f = _by_kind(aggregate(forgetting(res), ["loss.kind"]))
    # forward: -0.10, -0.04 -> mean -0.07, std sqrt(2 * 0.03**2) = 0.0424, sem 0.03
    assert f["forward"]["mean"] == tol.approx64(-0.07, ROUNDINGS) and f["forward"]["sem"] == tol.approx64(0.03, ROUNDINGS)
    # reverse (seed 43 missing): -0.20, -0.16 -> mean -0.18, sem 0.02
    assert f["reverse"]["mean"] == tol.approx64(-0.18, ROUNDINGS) and f["reverse"]["sem"] == tol.approx64(0.02, ROUNDINGS)
    assert f["forward"]["n"] == f["reverse"]["n"] == 2

    g = _by_kind(aggregate(generalisation_gain(res), ["loss.kind"]))
    assert g["forward"]["mean"] == tol.approx64(0.22, ROUNDINGS) and g["forward"]["sem"] == tol.approx64(0.02, ROUNDINGS)
    assert g["reverse"]["mean"] == tol.approx64(0.14, ROUNDINGS) and g["reverse"]["sem"] == tol.approx64(0.04, ROUNDINGS)

    r = _by_kind(aggregate(rlvr_gain(res), ["loss.kind"]))
    assert list(r) == ["forward"]  # no RLVR for the reverse configuration
    assert r["forward"]["mean"] == tol.approx64(0.14, ROUNDINGS) and r["forward"]["sem"] == tol.approx64(0.06, ROUNDINGS)

    assert stage_delta(res, "ood", "nope").collect().height == 0
    with pytest.raises(ValueError, match="stage must be one of"):
        stage_delta(res, "ood", "ood_mean", before="train")


def test_trial_counts_exclude_and_count_failed(tmp_path: Path) -> None:
    from distillab.analysis.results import trial_counts

    res = load(_hand_sweep(tmp_path))
    counts = _by_kind(trial_counts(res, ["loss.kind"]))
    assert {k: (c["n_trials"], c["n_completed"], c["n_failed"]) for k, c in counts.items()} == {
        "forward": (3, 2, 1), "reverse": (2, 2, 0)}
    assert trial_counts(res, []).rows() == [(5, 4, 1)]
    # the final table agrees: forward's distill means use seeds 42 and 43 only
    table = final_table(res, ["loss.kind"]).filter(
        (pl.col("stage") == "distill") & (pl.col("metric") == "ood_mean"))
    t = _by_kind(table)
    assert (t["forward"]["n"], t["forward"]["n_failed"]) == (2, 1)
    assert t["forward"]["mean"] == tol.approx64(0.72, ROUNDINGS) and t["forward"]["sem"] == tol.approx64(0.02, ROUNDINGS)
    assert (t["reverse"]["n"], t["reverse"]["n_failed"]) == (2, 0)
    assert t["reverse"]["mean"] == tol.approx64(0.63, ROUNDINGS) and t["reverse"]["sem"] == tol.approx64(0.03, ROUNDINGS)
    with pytest.raises(ValueError, match="'nope'"):
        trial_counts(res, ["nope"])


def test_filter_trials(tmp_path: Path) -> None:
    from distillab.analysis.results import filter_trials, forgetting

    res = load(_hand_sweep(tmp_path))
    fwd = filter_trials(res, **{"loss.kind": "forward"})
    assert sorted(fwd.trials.collect()["trial_id"]) == ["forward-s42", "forward-s43", "forward-s44"]
    assert set(fwd.evals.collect()["trial_id"]) == {"forward-s42", "forward-s43", "forward-s44"}
    assert set(fwd.metrics.collect()["trial_id"]) == {"forward-s42", "forward-s43"}
    assert forgetting(fwd).collect()["value"].to_list() == tol.approx64([-0.10, -0.04], ROUNDINGS)

    both = filter_trials(res, seed=[42, 44], status="completed")
    assert sorted(both.trials.collect()["trial_id"]) == ["forward-s42", "reverse-s42", "reverse-s44"]
    expr = filter_trials(res, pl.col("seed") > 42, **{"loss.kind": ("reverse",)})
    assert expr.trials.collect()["trial_id"].to_list() == ["reverse-s44"]
    assert filter_trials(res, error=None).trials.collect().height == 4
    assert filter_trials(res) is res
    with pytest.raises(ValueError, match="'loss.kynd' is not a trials column"):
        filter_trials(res, **{"loss.kynd": "forward"})

    # several sweeps: filtered and joined on (sweep, trial_id)
    two = load([_hand_sweep(tmp_path / "a"), _hand_sweep(tmp_path / "b")])
    sel = filter_trials(two, pl.col("sweep") == "b", **{"loss.kind": "reverse"})
    assert sel.evals.collect()["sweep"].unique().to_list() == ["b"]
    assert sel.evals.collect().height == 2 * 6
    f = _by_kind(aggregate(forgetting(two), ["loss.kind"]))
    assert f["forward"]["n"] == 4 and f["forward"]["mean"] == tol.approx64(-0.07, ROUNDINGS)


def test_final_evals_keeps_failed_on_request(tmp_path: Path) -> None:
    from distillab.analysis.results import final_evals

    res = load(_hand_sweep(tmp_path))
    done = final_evals(res).collect()
    assert "forward-s44" not in done["trial_id"].to_list()
    assert set(done.filter(pl.col("stage") == "distill")["step"]) == {100}
    every = final_evals(res, completed_only=False).filter(pl.col("trial_id") == "forward-s44").collect()
    assert sorted(zip(every["stage"], every["step"])) == [("distill", 50)] * 2 + [("pre", 0)] * 2
