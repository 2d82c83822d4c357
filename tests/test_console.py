"""What a sweep prints and what its trackers log (issue 14), on real smoke sweeps
through the command line:

- the session's ``smoke_sweep`` (tests/conftest.py: ``distillab sweep
  search_spaces/smoke.yaml --no-dashboard``, 2 trials) prints at most 60 lines: the
  Tune progress table, one line per finished stage of each trial, the closing
  tables, and none of Ray's known-harmless lines;
- a trial that fails still prints its traceback, and the sweep exits 1;
- with the ``tracking`` extra installed, a smoke sweep's W&B (offline) and MLflow
  (SQLite under the run folder) runs, read back, hold every trial's config and its
  final Countdown-3 accuracy, equal to the ``evals`` table's.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import yaml

from distillab.cli import HARMLESS_RAY_LINES

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "search_spaces" / "smoke.yaml"
ACC = "eval/distill/countdown3/accuracy"


def _final_accuracy(root: Path) -> dict[str, float]:
    """trial id → its Countdown-3 accuracy after distillation, from the ``evals`` table."""
    from distillab.results import load

    ev = load(root).evals.filter((pl.col("stage") == "distill") & (pl.col("task") == "countdown3")
                                 & (pl.col("metric") == "accuracy")).collect()
    return dict(zip(ev["trial_id"], ev["value"]))


@pytest.mark.slow
def test_a_smoke_sweep_prints_a_calm_console(smoke_sweep: Path) -> None:
    lines = (smoke_sweep.parent / "console.txt").read_text().splitlines()
    text = "\n".join(lines)
    assert len(lines) <= 60, text
    trials = sorted(_final_accuracy(smoke_sweep))
    assert len(trials) == 2
    for tid in trials:  # one line per finished stage of each trial, and the progress table names the trials
        assert len([x for x in lines if f"[trial] {tid} pre step 0:" in x]) == 1, text
        assert len([x for x in lines if f"[trial] {tid} distill step 4:" in x]) == 1, text
        assert any(x.startswith("|") and tid in x for x in lines), text
    assert "== Status ==" in text and "[sweep] 2 of 2 trials completed" in text
    assert any(x.startswith("| rollout.policy") and "countdown3 acc" in x for x in lines)  # the headline table
    for harmless in (*HARMLESS_RAY_LINES, "Summary name", "Loading weights", "Writing model shards",
                     "Setting accelerator to CPU", "Token authentication is enabled", "Distutils was imported"):
        assert not re.search(harmless, text), harmless


@pytest.mark.slow
def test_a_failed_trial_prints_its_traceback(tmp_path: Path) -> None:
    """The student path of a trial is a directory with no model in it: its Train worker
    fails at set-up, and the console shows the traceback and the error."""
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    sets = {"storage_path": tmp_path, "models.cache_dir": REPO / ".cache" / "models", "models.student_path": empty,
            "search.grid": "{rollout.policy: [onpd]}", "fault_tolerance.trial_retries": 0,
            "fault_tolerance.worker_restarts": 0}
    cmd = [sys.executable, "-m", "distillab.cli", "sweep", str(SMOKE), "--no-dashboard"]
    proc = subprocess.run([*cmd, *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")]], cwd=REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    out = proc.stdout
    assert proc.returncode == 1, out[-3000:]
    assert "Traceback (most recent call last)" in out, out[-3000:]
    assert "not-a-model" in out and "setup_models" in out, out[-3000:]  # the error and where it happened
    assert "[sweep] 0 of 1 trials completed" in out and "distillab sweep --resume" in out


@pytest.mark.slow
def test_trackers_hold_every_trials_config_and_accuracy(run_locally, tmp_path: Path) -> None:
    pytest.importorskip("wandb")
    mlflow = pytest.importorskip("mlflow")
    from distillab.config import load_sweep
    from distillab.results import load

    sweep = load_sweep(SMOKE, {"storage_path": str(tmp_path), "models.cache_dir": str(REPO / ".cache" / "models"),
                               "trial.optimizer.steps": 4, "tracking": {"wandb": {"mode": "offline"}, "mlflow": {}}})
    smoke_sweep = run_locally(sweep)
    trials = load(smoke_sweep).trials.collect()
    policy = dict(zip(trials["trial_id"], trials["rollout.policy"]))
    acc = _final_accuracy(smoke_sweep)
    assert len(acc) == 2

    # W&B, offline: one run directory per trial, its config and its summary (the last value of each key)
    runs = sorted((smoke_sweep / "wandb" / "wandb").glob("offline-run-*"))
    assert len(runs) == 2, runs
    seen = {}
    for run in runs:
        config = {k: v["value"] for k, v in yaml.safe_load((run / "files" / "config.yaml").read_text()).items()
                  if isinstance(v, dict) and "value" in v}
        summary = json.loads((run / "files" / "wandb-summary.json").read_text())
        tid = config["trial_id"]
        assert config["rollout.policy"] == policy[tid] and config["optimizer.lr"] == 1e-3
        assert summary[ACC] == pytest.approx(acc[tid]) and summary["step"] == 4
        seen[tid] = run
    assert sorted(seen) == sorted(acc)

    # MLflow, SQLite under the run folder: one run per trial named by its id, config as parameters
    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{smoke_sweep / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("smoke")
    found = client.search_runs([experiment.experiment_id])
    assert sorted(r.info.run_name for r in found) == sorted(acc)
    for r in found:
        tid = r.info.run_name
        assert r.data.params["trial_id"] == tid and r.data.params["rollout.policy"] == policy[tid]
        assert r.data.metrics[ACC] == pytest.approx(acc[tid])
        assert r.data.metrics["eval/distill/countdown3/pass_at_1"] >= 0  # '@' is '_at_' in MLflow's names
        history = client.get_metric_history(r.info.run_id, "loss")
        assert {m.step for m in history} == {4}  # the reports of the last step, at its optimizer step
        assert r.info.status == "FINISHED"
