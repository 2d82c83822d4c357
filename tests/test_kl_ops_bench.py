"""benchmarks/kl_ops.py times implementations of one loss: each CPU implementation's
forward+backward (`make_step`) gives the loss and the gradients w.r.t. the student's hidden
states and lm_head of a float64 computation on the same inputs (odd shapes), and its
estimators equal their chunked forms."""

from __future__ import annotations

from types import SimpleNamespace

import _tolerance as tol
import pytest
import torch
import torch.nn.functional as F
from _helpers import load_script


def _bench():
    return load_script("benchmarks/kl_ops.py")


def _args(kind: str, tau_s: float = 1.0, tau_t: float = 0.5) -> SimpleNamespace:
    return SimpleNamespace(device="cpu", dtype="float32", tokens=37, hidden=24, vocab=101, kind=kind, tau_s=tau_s,
                           tau_t=tau_t, chunk_size=16, top_k=8, topk_source="union")


def _float64(x: SimpleNamespace, kind: str, tau_s: float, tau_t: float):
    """KL(π_T‖π_S) (forward) or KL(π_S‖π_T) (reverse), token mean, and its gradients, in float64."""
    h_s, w_s = x.h_s.detach().double().requires_grad_(), x.w_s.detach().double().requires_grad_()
    ls = F.log_softmax(h_s @ w_s.T / tau_s, dim=-1)
    lt = F.log_softmax(x.h_t.double() @ x.w_t.double().T / tau_t, dim=-1)
    p, q = (lt, ls) if kind == "forward" else (ls, lt)
    loss = (p.exp() * (p - q)).sum(-1).mean()
    loss.backward()
    return float(loss.detach()), h_s.grad, w_s.grad


@pytest.mark.parametrize("kind", ["forward", "reverse"])
@pytest.mark.parametrize("impl", ["naive", "reference", "chunked", "trl"])
def test_each_implementation_is_the_float64_loss_and_gradients(impl: str, kind: str) -> None:
    tau_s, tau_t = (1.0, 1.0) if impl == "trl" else (1.0, 0.5)  # TRL's loss has one temperature
    step = _bench().make_step(impl, _args(kind, tau_s, tau_t))
    loss = step()
    x = step.inputs
    want, g_h, g_w = _float64(x, kind, tau_s, tau_t)
    # float32 from hidden states and lm_heads against float64 (tests/_tolerance.py, linear_loss_bounds)
    n = x.h_s.shape[0]
    value, (rel_h, rel_w, _) = tol.linear_loss_bounds(x.h_s, x.w_s, None, x.h_t, x.w_t, None, torch.full((n,), 1 / n),
                                                      kind=kind, tau_s=tau_s, tau_t=tau_t)
    assert abs(loss - want) <= value
    assert tol.norm_ratio(x.h_s.grad.double() - g_h, g_h) <= rel_h
    assert tol.norm_ratio(x.w_s.grad.double() - g_w, g_w) <= rel_w
    assert step() == loss  # a second call (the timed ones) computes the same, gradients reset


@pytest.mark.parametrize(("full", "chunked"), [("topk", "topk_chunked"), ("k3", "k3_chunked")])
def test_the_estimators_equal_their_chunked_forms(full: str, chunked: str) -> None:
    bench = _bench()
    a, b = bench.make_step(full, _args("forward")), bench.make_step(chunked, _args("forward"))
    la, lb = a(), b()
    # two float32 computations of one estimator (full logits, chunked rows): twice its bound (tests/_tolerance.py,
    # estimator_magnitudes), the lm_head gradient's through linear_grad_bounds
    x, n = a.inputs, a.inputs.h_s.shape[0]
    zs, zt, dz = tol.linear_logits(x.h_s, x.w_s, None, x.h_t, x.w_t, None, tau_s=1.0, tau_t=0.5, ref=False)
    est = dict(estimator=full, kind="reverse" if full == "k3" else "forward", tau_s=1.0, tau_t=0.5, top_k=8,
               topk_source="union", targets=x.targets[0])
    E, M = tol.estimator_magnitudes(zs, zt, **est)
    rho = (tol.row(zs.shape[-1], torch.float32, tol.logit_range((zs, 1.0), (zt, 0.5), rows=True), dz)
           + tol.gamma(n + 2, torch.float32)) / n
    G = rho.unsqueeze(-1) * M  # (N, V): each path's error of ∂L/∂z (its 1/n inside ρ), M/n bounding ∂L/∂z itself
    h = x.h_s.detach().double().abs()
    err_w = (G.T @ h).norm() + tol.gamma(n + 1, torch.float32) * ((M / n).T @ h).norm()  # Gᵀh, a product over N rows
    assert abs(la - lb) <= 2 * float((rho * E).sum())
    assert (a.inputs.w_s.grad.double() - b.inputs.w_s.grad.double()).norm() <= 2 * err_w


def test_floor_and_an_unknown_implementation() -> None:
    bench = _bench()
    assert bench.make_step("floor", _args("forward"))() == 0.0
    with pytest.raises(ValueError, match="unknown impl 'bogus'; choose from naive, trl"):
        bench.make_step("bogus", _args("forward"))
