"""``resources.compile`` (`models.configure_passes`): the compiled training passes compute
what the eager ones compute, on odd shapes, next to a float64 reference; the compiled code
is reused for the next models of the same class (what a reused trial actor runs), and
parameter names (hence checkpoints) are unchanged."""

from __future__ import annotations

import copy
import logging

import _tolerance as tol
import pytest
import torch
from _helpers import EngineStandIn
from fixtures.record_golden import golden_models, golden_trial
from torch._dynamo.utils import counters

from distillab.config import SweepConfig, TrialConfig
from distillab.ops.kl import row_coefficients
from distillab.recipe.loss import loss_step, pack_batch
from distillab.models import bf16_matmuls, configure_passes, load_model
from distillab.rollout.types import Rollouts
from distillab.recipe.teacher import LocalTeacher


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return golden_models(tmp_path_factory.mktemp("compile_models"))


def _rollouts(seed: int, batch: int, vocab: int) -> Rollouts:
    """``batch`` random rollouts of uneven prompt (3-9) and completion (1-8) lengths."""
    g = torch.Generator().manual_seed(seed)

    def ids(lo: int, hi: int) -> list[int]:
        n = int(torch.randint(lo, hi + 1, (1,), generator=g))
        return torch.randint(7, vocab, (n,), generator=g).tolist()

    prompts, completions = [ids(3, 9) for _ in range(batch)], [ids(1, 8) for _ in range(batch)]
    return Rollouts(prompts, completions, [[0.0] * len(c) for c in completions], ["stop"] * batch)


def _loss_and_grads(trial: TrialConfig, student, teacher, rollouts: Rollouts) -> tuple[float, dict[str, torch.Tensor]]:
    """The trial's loss (`loss.loss_step`, chunked forward KL) on ``rollouts`` and the student's gradients."""
    loss, _ = loss_step(trial, EngineStandIn(student), LocalTeacher(teacher), rollouts, 0, torch.Generator().manual_seed(0))
    loss.backward()
    grads = {n: p.grad.detach().double().clone() for n, p in student.named_parameters()}
    student.zero_grad(set_to_none=True)
    return float(loss.detach()), grads


def _loss_bound(trial: TrialConfig, student, teacher, rollouts: Rollouts) -> float:
    """The float32 loss's bound against its float64 reference (tests/_tolerance.py): the rows' bound with the
    logits' own float32 error (``forward_err`` E, against the models in float64) carried in."""
    L, batch = trial.loss, pack_batch(rollouts, 0)
    with torch.no_grad():
        zs = student.double()(**batch.inputs).logits[batch.cmask]
        zt = teacher.double()(**batch.teacher_inputs).logits[batch.cmask]
    student.float(), teacher.float()
    E_s = tol.forward_err(lambda m: m(**batch.inputs).logits, student)
    E_t = tol.forward_err(lambda m: m(**batch.teacher_inputs).logits, teacher)
    rows = batch.cmask.nonzero(as_tuple=True)
    value, _ = tol.loss_bounds(zs, zt, row_coefficients(rows[0], batch.cmask.shape[0]), kind=L.kind, tau_s=L.tau_s,
                               tau_t=L.tau_t, beta=L.beta, dtype=torch.float32, dz=E_s / L.tau_s + E_t / L.tau_t)
    return value


def _pair(paths, dtype=torch.float32):
    teacher_path, student_path = paths
    teacher = load_model(teacher_path, dtype).eval().requires_grad_(False)
    return load_model(student_path, dtype), teacher


def test_compiled_passes_equal_the_eager_ones_and_float64(models, caplog) -> None:
    """Loss and every gradient of the compiled float32 passes against the eager float32 ones and
    against float64 eager passes, on two batches of different shapes (5 and 7 rollouts of uneven
    lengths: the dynamic shapes the packed batches of a trial have), within float32's rounding
    (tests/_tolerance.py): the loss within its bound against float64 (twice against the eager
    float32 loss), each gradient within 2E against float64 and 4E against the eager one, E the eager
    gradient's own largest error against float64."""
    trial = TrialConfig.model_validate(golden_trial("offpd", "forward"))
    student, teacher = _pair(models)
    s64, t64 = copy.deepcopy(student).double(), copy.deepcopy(teacher).double()
    eager = [_loss_and_grads(trial, student, teacher, _rollouts(s, b, student.config.vocab_size))
             for s, b in ((0, 5), (1, 7))]
    ref = [_loss_and_grads(trial, s64, t64, _rollouts(s, b, student.config.vocab_size)) for s, b in ((0, 5), (1, 7))]
    bounds = [_loss_bound(trial, student, teacher, _rollouts(s, b, student.config.vocab_size))
              for s, b in ((0, 5), (1, 7))]
    names = [n for n, _ in student.named_parameters()]
    with caplog.at_level(logging.INFO, logger="distillab.models"):
        configure_passes(student, teacher, gradient_checkpointing=False, compile=True)
    assert [r.getMessage() for r in caplog.records] == [  # the console says why the first steps are slow
        "[trial] training passes compiled (resources.compile): the first steps of a process compile them"]
    assert [n for n, _ in student.named_parameters()] == names  # checkpoints keep their keys
    graphs = counters["stats"]["unique_graphs"]
    got = [_loss_and_grads(trial, student, teacher, _rollouts(s, b, student.config.vocab_size))
           for s, b in ((0, 5), (1, 7))]
    assert counters["stats"]["unique_graphs"] > graphs  # it did compile
    for (loss, grads), (e_loss, e_grads), (r_loss, r_grads), bound in zip(got, eager, ref, bounds):
        assert abs(loss - e_loss) <= 2 * bound and abs(loss - r_loss) <= bound
        for n in names:
            E = (e_grads[n] - r_grads[n]).abs().max()
            assert (grads[n] - e_grads[n]).abs().max() <= 4 * E, n
            assert (grads[n] - r_grads[n]).abs().max() <= 2 * E, n
    assert got[0][0] != pytest.approx(got[1][0], rel=1e-3)  # two different batches


def test_the_next_models_reuse_the_compiled_passes(models) -> None:
    """After a first trial's steps, a second pair of models of the same classes (the next
    trial in a reused trial actor: fresh models, `configure_passes`, its first step) runs
    the compiled code without capturing a new graph, and equals the eager passes of a third
    pair. (Measured: 3 graphs over the first pair's first two steps, none for each of the
    next five pairs; so dynamo's per-frame cache limit is not reached in a long sweep.)"""
    trial = TrialConfig.model_validate(golden_trial("offpd", "forward"))
    rollouts = _rollouts(2, 6, 99)
    first = _pair(models)
    configure_passes(*first, gradient_checkpointing=False, compile=True)
    for step in range(2):  # a trial's steps: the second runs the graphs its first call installed hooks for
        _loss_and_grads(trial, *first, _rollouts(3 + step, 6, 99))
    student, teacher = _pair(models)
    configure_passes(student, teacher, gradient_checkpointing=False, compile=True)
    graphs = counters["stats"]["unique_graphs"]
    loss, grads = _loss_and_grads(trial, student, teacher, rollouts)
    assert counters["stats"]["unique_graphs"] == graphs
    third = _pair(models)
    bound = _loss_bound(trial, *third, rollouts)
    ref_grads = _loss_and_grads(trial, *(copy.deepcopy(m).double() for m in third), rollouts)[1]
    eager_loss, eager_grads = _loss_and_grads(trial, *third, rollouts)
    assert abs(loss - eager_loss) <= 2 * bound  # two float32 computations (tests/_tolerance.py)
    for n, g in grads.items():  # within 4E, E the eager gradient's largest error against float64
        assert (g - eager_grads[n]).abs().max() <= 4 * (eager_grads[n] - ref_grads[n]).abs().max(), n


def test_bf16_compiled_passes_equal_the_eager_bf16_ones(models) -> None:
    """A bf16 trial's passes (models and activations in bf16, the loss math in float32)
    compiled: the loss within one bf16 rounding step (2^-8 relative) of the eager bf16 loss,
    in the context a bf16 trial computes in (`models.bf16_matmuls`), on two batches."""
    trial = TrialConfig.model_validate({**golden_trial("offpd", "forward"), "precision": "bf16"})
    batches = [_rollouts(s, b, 99) for s, b in ((4, 5), (5, 7))]
    with bf16_matmuls("bf16", "cpu"):
        student, teacher = _pair(models, torch.bfloat16)
        eager = [_loss_and_grads(trial, student, teacher, r)[0] for r in batches]
        configure_passes(student, teacher, gradient_checkpointing=False, compile=True)
        got = [_loss_and_grads(trial, student, teacher, r)[0] for r in batches]
    assert got == pytest.approx(eager, rel=tol.u(torch.bfloat16))  # one bf16 rounding: u = 2^-8


def test_compile_with_zero3_is_refused_before_anything_runs() -> None:
    """ZeRO 3's parameter hooks are not compiled here: the sweep config names both fields."""
    with pytest.raises(ValueError, match=r"resources.compile .* trial.optimizer.zero_stage 3"):
        SweepConfig.model_validate({"name": "c", "trial": {"optimizer": {"zero_stage": 3}},
                                    "resources": {"compile": True}})
    assert SweepConfig.model_validate({"name": "c", "resources": {"compile": True}}).resources.compile
