"""The RLVR stage inside a trial (distill → GRPO/DAPO → evals at pre, distill, rlvr):
config errors before compute, and a real smoke trial through Ray Tune (slow)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import polars as pl
import _tolerance as tol
import pytest
from pydantic import ValidationError

from distillab.config import TrialConfig, load_sweep

#: float64 roundings (tests/_tolerance.py, approx64): a mean of 10 rewards computed twice (11 each), or a cosine
#: learning rate
ROUNDINGS = 32

REPO = Path(__file__).resolve().parents[1]
RLVR = {"task": "countdown4", "steps": 12, "prompts_per_step": 4, "samples_per_prompt": 4, "lr": 1e-3,
        "max_tokens": 12, "format_reward": 0.5, "train_prompts": 200, "warmup_ratio": 0.25}


def test_rlvr_config_errors_name_the_field() -> None:
    with pytest.raises(ValidationError, match="samples_per_prompt"):
        TrialConfig.model_validate({"rlvr": {"samples_per_prompt": 1},
                                    "evaluation": {"countdown_tasks": ["countdown3", "countdown4"]}})
    with pytest.raises(ValidationError, match=r"rlvr.task 'countdown4' must be in evaluation.countdown_tasks"):
        TrialConfig.model_validate({"rlvr": {}})
    with pytest.raises(ValidationError, match="format_reward"):
        TrialConfig.model_validate({"rlvr": {"format_reward": 0.6},
                                    "evaluation": {"countdown_tasks": ["countdown3", "countdown4"]}})
    with pytest.raises(ValidationError, match=r"rlvr.engine\n  Input should be 'auto', 'vllm' or 'transformers'"):
        TrialConfig.model_validate({"rlvr": {"engine": "sglang"},
                                    "evaluation": {"countdown_tasks": ["countdown3", "countdown4"]}})
    from distillab.config import ModelsConfig

    with pytest.raises(ValidationError, match=r"models.teacher_refine.engine: .*allowed: auto, transformers"):
        ModelsConfig.model_validate({"teacher_refine": {"task": "countdown3", "engine": "vllm"}})
    ok = TrialConfig.model_validate({"rlvr": {}, "evaluation": {"countdown_tasks": ["countdown3", "countdown4e",
                                                                                    "countdown4"]}})
    assert ok.rlvr.samples_per_prompt == 8 and ok.rlvr.beta == 0.0 and ok.rlvr.top_p == 0.95  # PROTOCOL.md §6


QLORA = {"r": 8, "alpha": 16, "load_in_4bit": True}


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2], ids=["full-and-qlora", "two-workers"])
def test_smoke_trial_with_rlvr_stage(run_locally, tmp_path, workers) -> None:
    """Smoke trials distil, then run 12 GRPO steps, with every stage evaluated: on one Train
    worker, one sweep of two trials side by side (full fine-tuning through DeepSpeed, and
    LoRA on a 4-bit copy); data-parallel over two Train workers, full fine-tuning."""
    from distillab.analysis.results import load, rlvr_reward_summary

    qlora = workers == 1 and importlib.util.find_spec("bitsandbytes") is not None
    grid = {"rollout.policy": ["offpd"]}
    sweep = load_sweep(REPO / "search_spaces" / "smoke.yaml", {
        "storage_path": str(tmp_path), "models.cache_dir": str(REPO / ".cache" / "models"),
        "search.grid": None, "search.grids": [{"grid": grid}, *([{"set": {"rlvr.lora": QLORA}, "grid": grid}] * qlora)],
        "trial.rlvr": RLVR, "resources.num_workers": workers, "resources.max_concurrent_trials": 3 - workers,
        "resources.local_mode": workers == 1,  # one process per trial where one worker: lean for CI
        "trial.evaluation.countdown_tasks": ["countdown3", "countdown4e", "countdown4"],
    })
    res = load(run_locally(sweep))
    trials = res.trials.collect()
    assert trials["status"].to_list() == ["completed"] * (1 + qlora), trials["error"].to_list()
    assert sorted(t.rlvr.lora is not None for t in sweep.trials) == [False] + [True] * qlora
    for tid in trials["trial_id"]:
        _check_rlvr_trial(res, tid)
    summary = rlvr_reward_summary(res)
    assert summary["steps"].to_list() == [12] * (1 + qlora)


def _check_rlvr_trial(res, tid: str) -> None:
    """Every stage evaluated on every Countdown task; each of the 12 RLVR steps logged once,
    rewards in range, the LR warmed up over 3 steps then decayed (cosine); the reward
    summary's first and last windows are the means of the logged rewards."""
    from distillab.analysis.results import rlvr_reward_summary

    ev = res.evals.filter(pl.col("trial_id") == tid).collect()
    got = {(r["stage"], r["task"]) for r in ev.filter(pl.col("metric") == "accuracy").iter_rows(named=True)}
    for stage in ("pre", "distill", "rlvr"):
        for task in ("countdown3", "countdown4e", "countdown4"):
            assert (stage, task) in got
    m = res.metrics.collect().filter((pl.col("stage") == "rlvr") & (pl.col("trial_id") == tid))
    reward = m.filter(pl.col("name") == "rlvr/reward_mean").sort("step")
    assert reward["step"].to_list() == list(range(1, 13))  # every RLVR step exactly once
    assert reward["value"].is_between(0.0, 2.5).all()  # 2 (correct) + at most 0.5 (format)
    lr = m.filter(pl.col("name") == "rlvr/lr").sort("step")["value"].to_list()
    assert lr[0] < lr[1] < lr[2] == tol.approx64(1e-3, ROUNDINGS) and lr[-1] < lr[4] < lr[2]  # 3 warm-up steps, then cosine
    summary = rlvr_reward_summary(res).filter(pl.col("trial_id") == tid)
    assert summary["first"][0] == tol.approx64(reward["value"].head(10).mean(), ROUNDINGS)
    assert summary["last"][0] == tol.approx64(reward["value"].tail(10).mean(), ROUNDINGS)


def test_rlvr_worker_count_errors_before_compute() -> None:
    from distillab.config import ConfigError

    tasks = {"trial.evaluation.countdown_tasks": ["countdown3", "countdown4e", "countdown4"]}
    with pytest.raises(ConfigError, match=r"trial.rlvr.prompts_per_step \(4\) must be a multiple of "
                                          r"resources.num_workers \(3\)"):
        load_sweep(REPO / "search_spaces" / "smoke.yaml", {"trial.rlvr": RLVR, "resources.num_workers": 3, **tasks})
    pytest.importorskip("bitsandbytes")
    with pytest.raises(ConfigError, match=r"trial.rlvr.lora.load_in_4bit runs on one worker .* \(got 2\)"):
        load_sweep(REPO / "search_spaces" / "smoke.yaml", {
            "trial.rlvr": {**RLVR, "lora": {"load_in_4bit": True}}, "resources.num_workers": 2, **tasks})
    ok = load_sweep(REPO / "search_spaces" / "smoke.yaml", {"trial.rlvr": RLVR, "resources.num_workers": 2, **tasks})
    assert ok.resources.num_workers == 2
