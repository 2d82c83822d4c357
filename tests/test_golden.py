"""Golden trial: 20 steps of the real per-worker distillation loop (OffPD and OnPD ×
forward and reverse KL; the reference implementation and the sampled estimator once
each) on random micro models give the per-step loss and grad-norm
sequences recorded on bd23b57, before the recipe refactor of issue 13
(tests/fixtures/golden_*.json, written by tests/fixtures/record_golden.py), to 1e-6."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import ray.train

import distillab.distill as distill
from fixtures.record_golden import CASES, case_name, golden_models, golden_trial, init_one_rank, per_step

FIXTURES = Path(__file__).resolve().parent / "fixtures"


class _OneRank:
    def get_world_rank(self):
        return 0

    def get_world_size(self):
        return 1


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    import torch.distributed as dist

    init_one_rank()
    yield golden_models(tmp_path_factory.mktemp("golden_models"))
    dist.destroy_process_group()


@pytest.mark.parametrize("policy, kind, variant", CASES)
def test_golden_loss_and_grad_norm(models, tmp_path, monkeypatch, policy, kind, variant) -> None:
    monkeypatch.setattr(ray.train, "get_context", lambda: _OneRank())
    monkeypatch.setattr(ray.train, "get_checkpoint", lambda: None)
    monkeypatch.setattr(ray.train, "report", lambda metrics, checkpoint=None: None)
    monkeypatch.setattr(distill, "RayGauges", lambda trial_id: None)
    teacher, student = models
    trial_id = case_name(policy, kind, variant)
    distill.train_loop_per_worker({
        "trial": golden_trial(policy, kind, variant), "trial_id": trial_id, "teacher_path": str(teacher),
        "student_path": str(student), "results_root": str(tmp_path), "torch_threads": 1,
    })
    got = per_step(tmp_path, trial_id)
    want = json.loads((FIXTURES / f"{trial_id}.json").read_text())
    for name in ("loss", "grad_norm"):
        assert got[name] == pytest.approx(want[name], rel=1e-6, abs=1e-6), name
