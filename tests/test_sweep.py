"""Real micro trials through Ray Tune → Ray Train (DeepSpeed) → Parquet results.

Uses the session's ``smoke_sweep`` (tests/conftest.py): search_spaces/smoke.yaml,
2 trials (OffPD forward KL, OnPD forward KL) on a local Ray."""

import re
import time
from pathlib import Path

import polars as pl
import pytest

from distillab.config import load_sweep

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_micro_trials_through_tune(smoke_sweep):
    from distillab.analysis.results import load

    sweep = load_sweep(REPO / "search_spaces" / "smoke.yaml")
    steps = sweep.trial.optimizer.steps
    res = load(smoke_sweep)
    trials = res.trials.collect().sort("rollout.policy")
    assert trials.height == 2  # one row per configuration
    assert trials["rollout.policy"].to_list() == ["offpd", "onpd"]
    for row in trials.iter_rows(named=True):
        assert row["status"] == "completed", row["error"]
        assert (Path(row["checkpoint"]) / "model.safetensors").exists()
        assert row["end_time"] > row["start_time"]

    metrics = res.metrics.collect()
    for tid in trials["trial_id"]:
        loss = metrics.filter((pl.col("trial_id") == tid) & (pl.col("name") == "loss")).sort("step")
        assert loss["step"].to_list() == list(range(1, steps + 1))  # each step exactly once
        assert loss["value"].is_finite().all() and (loss["value"] >= 0).all()
        gn = metrics.filter((pl.col("trial_id") == tid) & (pl.col("name") == "grad_norm"))["value"]
        assert gn.len() == steps and (gn > 0).all() and gn.is_finite().all()
        fkl = metrics.filter((pl.col("trial_id") == tid) & (pl.col("name") == "kl/forward"))["value"]
        # forward KL is the optimised loss here (seq_mean vs token mean differ only by weighting)
        assert (fkl >= 0).all()

    evals = res.evals.collect()
    for tid in trials["trial_id"]:
        for stage, step in (("pre", 0), ("distill", steps)):
            got = evals.filter((pl.col("trial_id") == tid) & (pl.col("stage") == stage) & (pl.col("step") == step))
            keys = set(zip(got["task"], got["metric"]))
            for task in ("countdown3", "countdown4e"):
                assert {(task, "accuracy"), (task, "pass@1"), (task, "pass@2")} <= keys
            assert {("ood", "ood_mean"), ("params", "sparsity@1e-06"), ("params", "sparsity@1e-08")} <= keys
            assert got["value"].is_between(0, 1).all()
            sp = dict(zip(got["metric"], got["value"]))
            if stage == "pre":
                assert sp["sparsity@1e-06"] == 1.0  # nothing has moved yet
            else:  # 4 AdamW steps at lr 1e-3 move most weights by more than 1e-6
                assert sp["sparsity@1e-08"] <= sp["sparsity@1e-06"] < 0.5


@pytest.mark.slow
def test_local_mode_trials_equal_the_worker_groups(smoke_sweep, tmp_path):
    """``distillab sweep search_spaces/smoke.yaml --set resources.local_mode=true``: the
    same two smoke trials run in their Tune trial actors (no Train worker group) give
    the session's smoke sweep's numbers exactly (every per-step metric but the
    wall-clock ones, every evaluation row), a final checkpoint (Tune's) holding the
    student's weights, and the same calm console: one line per finished stage of each
    trial, no Tune checkpoint notes."""
    import subprocess
    import sys

    from distillab.analysis.results import load
    from distillab.tables import run_records

    cmd = [sys.executable, "-m", "distillab.driver.cli", "sweep", str(REPO / "search_spaces" / "smoke.yaml"), "--no-dashboard"]
    sets = (f"storage_path={tmp_path}", f"models.cache_dir={REPO / '.cache' / 'models'}", "resources.local_mode=true")
    for kv in sets:
        cmd += ["--set", kv]
    t_run = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800)
    t_run = time.perf_counter() - t_run
    assert proc.returncode == 0, proc.stdout[-4000:]
    local, group = load(tmp_path / "smoke"), load(smoke_sweep)
    trials = local.trials.collect()
    assert trials["status"].to_list() == ["completed"] * 2, trials["error"].to_list()
    for path in trials["checkpoint"]:
        assert Path(path).parent.parent == tmp_path / "smoke" / "tune" and (Path(path) / "model.safetensors").exists()
    assert sorted(trials["trial_id"]) == sorted(group.trials.collect()["trial_id"])
    timed = pl.col("name").str.starts_with("time/") | pl.col("name").str.contains("tokens_per_s|_s$")
    keys = ["trial_id", "stage", "step", "name"]
    m_local, m_group = (r.metrics.filter(~timed).collect().sort(keys) for r in (local, group))
    assert m_local.height > 50 and m_local.select(*keys, "value").equals(m_group.select(*keys, "value"))
    keys = ["trial_id", "stage", "step", "task", "metric"]
    e_local, e_group = (r.evals.collect().sort(keys) for r in (local, group))
    assert e_local.height > 50 and e_local.select(*keys, "value").equals(e_group.select(*keys, "value"))
    lines = proc.stdout.splitlines()
    assert len(lines) <= 60 and "Checkpoint successfully created" not in proc.stdout, proc.stdout
    for tid in trials["trial_id"]:
        for stage in ("pre step 0:", "distill step 4:"):
            assert len([x for x in lines if f"[trial] {tid} {stage}" in x]) == 1, proc.stdout
    # [time] total counts from the process's start: at least start-up + prepare + sweep + ray.shutdown, less
    # ray.init, which the sweep's seconds count and which ran inside the start-up (beside its imports and
    # checks); and it is the total kept in the sweep's run record
    times = {m[1]: float(m[2]) for m in re.finditer(r"^\[time\] ([\w. -]+): ([\d.]+) s", proc.stdout, re.M)}
    parts = ("start-up", "prepare", "sweep", "ray.shutdown")
    assert set(parts) | {"total", "ray.init"} <= set(times), times
    assert times["ray.init"] <= times["start-up"] + 0.1, times
    assert times["total"] >= sum(times[k] for k in parts) - times["ray.init"] - 0.25, times
    assert times["total"] <= t_run, (times, t_run)  # and no more than the process ran
    # the [time] line prints one decimal (telemetry.print_time): the record's seconds within half a unit of it
    assert run_records(tmp_path / "smoke")[-1]["seconds"]["total"] == pytest.approx(times["total"], abs=0.05)


@pytest.fixture(scope="module")
def divergence_and_estimator_sweep(run_locally, tmp_path_factory):
    """One smoke sweep, a union of two grids (lean for CI: one local Ray, 6 trials):
    OffPD ``loss.kind: [forward, reverse, jsd]`` with ``loss.beta`` 0.5, 3 steps; and OnPD
    reverse KL ``loss.estimator: [full, topk, k3]`` (the cell every estimator applies to)
    with the oracle at both of 2 steps. Returns ``(sweep, results)``."""
    from distillab.analysis.results import load

    tmp_path = tmp_path_factory.mktemp("divergences")
    sweep = load_sweep(REPO / "search_spaces" / "smoke.yaml", {
        "storage_path": str(tmp_path), "models.cache_dir": str(REPO / ".cache" / "models"),
        "search.grid": None, "search.grids": [
            {"set": {"rollout.policy": "offpd", "loss.beta": 0.5, "optimizer.steps": 3},
             "grid": {"loss.kind": ["forward", "reverse", "jsd"]}},
            {"set": {"rollout.policy": "onpd", "loss.kind": "reverse", "loss.top_k": 4, "loss.oracle_every": 1,
                     "optimizer.steps": 2, "optimizer.warmup_steps": 1},
             "grid": {"loss.estimator": ["full", "topk", "k3"]}}],
        "trial.evaluation.countdown_tasks": ["countdown3"], "trial.evaluation.id_items": 2,
        "trial.evaluation.pass_items": 1, "trial.evaluation.ood_items": 1, "trial.evaluation.sparsity_touched": False,
        "resources.local_mode": True})
    return sweep, load(run_locally(sweep))


@pytest.mark.slow
def test_smoke_grid_over_the_divergence(divergence_and_estimator_sweep):
    """``loss.kind: [forward, reverse, jsd]`` with one ``loss.beta``: three trials complete,
    the JSD trial is named by its β, and each trains on its own divergence (β is read by
    jsd only, so forward and reverse runs differ from it)."""
    sweep, res = divergence_and_estimator_sweep
    assert [t.trial_id.split("-")[1] for t in sweep.trials[:3]] == ["forward", "reverse", "jsd0.5"]
    trials = res.trials.collect().filter(pl.col("rollout.policy") == "offpd").sort("loss.kind")
    assert trials["loss.kind"].to_list() == ["forward", "jsd", "reverse"]
    assert (trials["status"] == "completed").all(), trials["error"].to_list()
    assert trials["loss.beta"].to_list() == [0.5] * 3
    by_kind = dict(zip(trials["trial_id"], trials["loss.kind"]))
    loss = res.metrics.filter((pl.col("name") == "loss") & (pl.col("step") == 1)
                              & pl.col("trial_id").is_in(list(by_kind))).collect()
    first = {by_kind[t]: v for t, v in zip(loss["trial_id"], loss["value"])}
    assert len(first) == 3 and all(v >= 0 for v in first.values())
    # the same OffPD rollouts at step 1 (same seed, same teacher): JSD(0.5) is bounded by log 2 per token
    assert first["jsd"] <= 0.6932 and first["jsd"] != first["forward"] and first["jsd"] != first["reverse"]


@pytest.mark.slow
def test_smoke_grid_over_the_estimators(divergence_and_estimator_sweep):
    """``loss.estimator: [full, topk, k3]`` (OnPD reverse KL) with the oracle at both of 2 steps:
    three trials complete, named by their estimator; at steps 1 and 2 each logs estimator/bias
    and estimator/grad_cos: 0 and 1 for full, a real gap for the others; figure (h) draws them."""
    from distillab.analysis.plots import fig_estimator, figure_notes

    sweep, res = divergence_and_estimator_sweep
    assert [t.trial_id.split("-lr")[0] for t in sweep.trials[3:]] == [
        "onpd-reverse", "onpd-reverse-topk4-teacher", "onpd-reverse-k3"]
    trials = res.trials.collect().filter(pl.col("rollout.policy") == "onpd")
    assert trials.height == 3 and (trials["status"] == "completed").all(), trials["error"].to_list()
    by_id = dict(zip(trials["trial_id"], trials["loss.estimator"]))
    m = res.metrics.filter(pl.col("name").str.starts_with("estimator/")).collect()
    for name in ("estimator/bias", "estimator/grad_cos"):
        rows = m.filter(pl.col("name") == name)
        assert sorted(set(rows["step"].to_list())) == [1, 2] and rows.height == 6  # the OnPD trials only
        vals = {(by_id[t], s): v for t, s, v in zip(rows["trial_id"], rows["step"], rows["value"])}
        for step in (1, 2):
            if name == "estimator/bias":
                assert abs(vals[("full", step)]) < 1e-5 and abs(vals[("topk", step)]) > 1e-5
            else:
                assert vals[("full", step)] == pytest.approx(1.0, abs=1e-5)
                assert -1.0 <= vals[("k3", step)] < 0.999 and vals[("topk", step)] < 0.999999
    assert figure_notes(fig_estimator(res)) == []
