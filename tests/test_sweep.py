"""One real micro trial through Ray Tune → Ray Train (DeepSpeed) → Parquet results."""

from pathlib import Path

import polars as pl
import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_one_micro_trial_through_tune(tmp_path):
    import ray

    from distillab.config import load_sweep
    from distillab.prepare import prepare
    from distillab.results import load
    from distillab.sweep import run_sweep

    sweep = load_sweep(
        REPO / "search_spaces" / "smoke.yaml",
        {
            "storage_path": str(tmp_path),
            "search.grid": {"rollout.policy": ["onpd"], "loss.kind": ["reverse"]},
            "models.cache_dir": str(REPO / ".cache" / "models"),
        },
    )
    teacher, student = prepare(sweep, threads=1)
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    try:
        root = run_sweep(sweep, teacher, student, verbose=0)
    finally:
        ray.shutdown()

    res = load(root)
    trials = res.trials.collect()
    assert trials.height == 1
    row = trials.row(0, named=True)
    assert row["status"] == "completed", row["error"]
    assert row["rollout.policy"] == "onpd" and row["loss.kind"] == "reverse"
    assert (Path(row["checkpoint"]) / "model.safetensors").exists()

    steps = sweep.trial.optimizer.steps
    metrics = res.metrics.collect()
    loss = metrics.filter(pl.col("name") == "loss").sort("step")
    assert loss["step"].to_list() == list(range(1, steps + 1))  # each step exactly once
    assert loss["value"].is_finite().all()
    gn = metrics.filter(pl.col("name") == "grad_norm")["value"]
    assert (gn > 0).all() and gn.is_finite().all()

    evals = res.evals.collect()
    for stage, step in (("pre", 0), ("distill", steps)):
        got = evals.filter((pl.col("stage") == stage) & (pl.col("step") == step))
        keys = set(zip(got["task"], got["metric"]))
        for task in ("countdown3", "countdown4e"):
            assert {(task, "accuracy"), (task, "pass@1"), (task, "pass@2")} <= keys
        assert ("ood", "ood_mean") in keys
        assert got["value"].is_between(0, 1).all()
    post = evals.filter(pl.col("stage") == "distill")
    sp = dict(zip(post["metric"], post["value"]))
    # reverse KL on-policy at lr 1e-3 moves every weight by more than 1e-8 but not all by 1e-6
    assert 0 <= sp["sparsity@1e-06"] < 1 and 0 <= sp["sparsity@1e-08"] <= sp["sparsity@1e-06"]
