"""Tests of the Triton kernels (ops.triton_kl) against the float64 reference and the torch
row math. Without CUDA they run under TRITON_INTERPRET=1 (set in conftest.py) on small
shapes; they are skipped when triton is not importable."""

from __future__ import annotations

import _tolerance as tol
import pytest
import torch

pytest.importorskip("triton")

from distillab.ops import triton_kl  # noqa: E402
from distillab.ops.chunked import chunked_distill_loss  # noqa: E402
from distillab.ops.kl import distill_loss, row_coefficients, token_divergence, token_divergence_and_grad  # noqa: E402
from distillab.ops.triton_kl import triton_distill_loss, triton_token_divergence_and_grad  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
F32, F64 = torch.float32, torch.float64
CASES = [("forward", 0.5), ("reverse", 0.5), ("jsd", 0.3)]


def rel(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def test_kernels_can_run_here():
    triton_kl.check_triton_usable(DEV)
    assert triton_kl.triton_available()


@pytest.mark.parametrize("V,block", [(37, 16), (41, 64), (130, 32)])
@pytest.mark.parametrize("kind,beta", CASES + [("jsd", 0.0), ("jsd", 1.0)])
def test_row_kernel_matches_float64_reference(V, block, kind, beta):
    gen = torch.Generator().manual_seed(300 + V + block + len(kind) + int(10 * beta))
    zs = torch.randn(5, V, generator=gen, dtype=F64) * 3
    zt = torch.randn(5, V, generator=gen, dtype=F64) * 3
    zs[1, [0, 3]] = zt[1, [0, 3]] = float("-inf")  # both
    zt[2, [1, V - 1]] = float("-inf")  # teacher only
    zs[3, [2, 5]] = torch.tensor([1e4, -1e4], dtype=F64)  # huge
    zt[3, [2, 6]] = torch.tensor([-1e4, 1e4], dtype=F64)
    zs[4, 7] = -3e4  # student log-prob below the floor
    kw = dict(kind=kind, tau_s=0.8, tau_t=0.5, beta=beta)
    x = zs.clone().requires_grad_()
    want = token_divergence(x, zt, compute_dtype=F64, **kw)
    (want_g,) = torch.autograd.grad(want.sum(), x)
    s32, t32 = zs.float(), zt.float()
    div, grad, stats = triton_token_divergence_and_grad(s32.to(DEV), t32.to(DEV), with_stats=True, block_size=block, **kw)
    assert torch.isfinite(div).all() and torch.isfinite(grad).all()
    # float32 kernel rows against float64 (tests/_tolerance.py), row by row; rounding the logits to
    # float32 (u|z/τ|) is an error they carry in (dz)
    A = tol.logit_range((zs, 0.8), (zt, 0.5), rows=True)
    rho = tol.row(V, F32, A, dz=tol.u(F32) * A) + tol.row(V, F64, A)
    _, S, m = tol.divergence_scale(zs, zt, **kw)
    assert ((div.cpu().double() - want.detach()).abs() <= rho * S).all()
    assert ((grad.cpu().double() - want_g).abs() <= rho.unsqueeze(-1) * m).all()
    _, _, st = token_divergence_and_grad(s32, t32, with_stats=True, **kw)
    scale = tol.stats_scale(zs, zt, tau_s=0.8, tau_t=0.5)  # two float32 computations of the stats
    assert ((stats.cpu().double() - st.double()).abs() <= 2 * tol.row(V, F32, A).unsqueeze(-1) * scale).all()


@pytest.mark.parametrize("kind,beta", CASES)
def test_triton_distill_loss_matches_reference_with_masks_and_garbage(kind, beta):
    gen = torch.Generator().manual_seed(900 + len(kind))
    B, T, V = 3, 5, 29
    s = torch.randn(B, T, V, generator=gen) * 2
    t = torch.randn(B, T, V, generator=gen) * 2
    mask = torch.rand(B, T, generator=gen) < 0.6
    mask[0, 0] = True
    mask[1] = False
    s[~mask] = float("nan")  # masked rows are never read
    t[~mask] = float("inf")
    w = torch.tensor([1.5, float("nan"), 0.5])
    for reduction, weights in (("seq_mean", None), ("token_mean", w), ("sum", w)):
        kw = dict(kind=kind, beta=beta, reduction=reduction, weights=weights)
        x64 = s.double().requires_grad_()
        ref = distill_loss(x64, t.double(), mask, compute_dtype=F64, **kw)
        (ref_g,) = torch.autograd.grad(ref, x64)
        x = s.to(DEV).requires_grad_()
        loss = triton_distill_loss(x, t.to(DEV), mask.to(DEV), block_size=16, **kw)
        (g,) = torch.autograd.grad(loss, x)
        rows = mask.nonzero(as_tuple=True)
        coef = row_coefficients(rows[0], B, reduction=reduction, weights=weights)
        value, grad = tol.loss_bounds(s[rows].double(), t[rows].double(), coef, kind=kind, beta=beta, tau_s=1.0,
                                      tau_t=0.5, dtype=F32)
        assert loss.dtype == torch.float32 and abs(loss.item() - ref.item()) <= value
        assert torch.isfinite(g).all() and (g.cpu()[~mask] == 0).all()
        assert rel(g, ref_g) <= tol.norm_ratio(grad, ref_g[rows])


def test_triton_distill_loss_bf16_and_empty_mask():
    gen = torch.Generator().manual_seed(17)
    s = (torch.randn(2, 3, 40, generator=gen) * 2).bfloat16()
    t = (torch.randn(2, 3, 40, generator=gen) * 2).bfloat16()
    mask = torch.tensor([[True, True, False], [False, True, True]])
    x64 = s.double().requires_grad_()
    ref = distill_loss(x64, t.double(), mask, kind="reverse", compute_dtype=F64)
    (ref_g,) = torch.autograd.grad(ref, x64)
    x = s.to(DEV).requires_grad_()
    loss = triton_distill_loss(x, t.to(DEV), mask.to(DEV), kind="reverse")
    (g,) = torch.autograd.grad(loss, x)
    assert g.dtype == torch.bfloat16
    # float32 compute from bf16 values (exact in float32); the gradient rounds once more, to bf16
    rows = mask.nonzero(as_tuple=True)
    value, grad = tol.loss_bounds(s[rows].double(), t[rows].double(), row_coefficients(rows[0], 2), kind="reverse",
                                  tau_s=1.0, tau_t=0.5, dtype=F32)
    assert abs(loss.item() - ref.item()) <= value
    assert rel(g, ref_g) <= tol.norm_ratio(grad, ref_g[rows]) + tol.u(torch.bfloat16)
    x = s.to(DEV).requires_grad_()
    empty = triton_distill_loss(x, t.to(DEV), torch.zeros(2, 3, dtype=torch.bool, device=DEV))
    empty.backward()
    assert empty.item() == 0.0 and (x.grad == 0).all()


@pytest.mark.parametrize("kind,beta", CASES)
def test_chunked_with_triton_rows_matches_float64_reference(kind, beta):
    gen = torch.Generator().manual_seed(1200 + len(kind))
    B, T, H, V = 2, 4, 8, 53
    hs, ht = torch.randn(B, T, H, generator=gen), torch.randn(B, T, H + 4, generator=gen)
    ws = torch.randn(V, H, generator=gen) * 0.7
    wt = torch.randn(V, H + 4, generator=gen) * 0.6
    mask = torch.tensor([[True, False, True, True], [False, True, True, False]])
    a, w = hs.double().requires_grad_(), ws.double().requires_grad_()
    ref = distill_loss(a @ w.T, ht.double() @ wt.double().T, mask, kind=kind, beta=beta, compute_dtype=F64)
    ref_g = torch.autograd.grad(ref, (a, w))
    a2, w2 = hs.to(DEV).requires_grad_(), ws.to(DEV).requires_grad_()
    out = chunked_distill_loss(
        a2, w2, ht.to(DEV), wt.to(DEV), mask.to(DEV), kind=kind, beta=beta, chunk_size=3,
        backend="triton", return_stats=True,
    )
    grads = torch.autograd.grad(out.loss, (a2, w2))
    rows = mask.nonzero(as_tuple=True)
    value, rels = tol.linear_loss_bounds(hs[rows], ws, None, ht[rows], wt, None, row_coefficients(rows[0], B),
                                         kind=kind, beta=beta)
    assert abs(out.loss.item() - ref.item()) <= value
    for g, r, bound in zip(grads, ref_g, rels):
        assert rel(g, r) <= bound
    torch_out = chunked_distill_loss(hs, ws, ht, wt, mask, kind=kind, beta=beta, backend="torch", return_stats=True)
    # two float32 computations of the stats, from float32 logits (their matmuls' errors in dz)
    zs, zt = hs[rows].double() @ ws.double().T, ht[rows].double() @ wt.double().T
    dz = (float(tol.matmul_err(hs[rows], ws.T, F32).max()) + float(tol.matmul_err(ht[rows], wt.T, F32).max()) / 0.5)
    rho = tol.row(V, F32, tol.logit_range((zs, 1.0), (zt, 0.5), rows=True), dz)
    err = 2 * rho.unsqueeze(-1) * tol.stats_scale(zs, zt, tau_s=1.0, tau_t=0.5)
    assert ((out.stats.cpu().double() - torch_out.stats.double()).abs() <= err).all()


def test_triton_refuses_float64_compute():
    z = torch.zeros(2, 5, device=DEV)
    with pytest.raises(ValueError, match="float32"):
        triton_token_divergence_and_grad(z, z, kind="forward", compute_dtype=F64)


@pytest.mark.parametrize("std", [8.0, 16.0])
def test_saturated_jsd_gradient_within_1e2_of_float64(std):
    """The kernel's JSD gradient in the cancellation-free h form (ops.divergence, "Precision of the JSD
    gradient"): at V = 32,000 and logit std 8 and 16, within float32's rounding bound
    (tests/_tolerance.py; about 3e-4 relative here) of float64 on the same float32 logits, as rows
    and through the chunked op (the g − Σ π_S g form was 1.8e-2 off at std 8, 1.4e2 at std 16)."""
    N, V = 3, 32_000
    gen = torch.Generator().manual_seed(1)
    z_s = (torch.randn(N, V, generator=gen, dtype=F64) * std).float()
    z_t = (torch.randn(N, V, generator=gen, dtype=F64) * std).float()
    x = z_s.double().requires_grad_()
    ref = token_divergence(x, z_t.double(), kind="jsd", beta=0.5, compute_dtype=F64)
    (ref_g,) = torch.autograd.grad(ref.sum(), x)
    div, grad, _ = triton_token_divergence_and_grad(z_s.to(DEV), z_t.to(DEV), kind="jsd", beta=0.5, block_size=8192)
    _, S, m = tol.divergence_scale(z_s, z_t, kind="jsd", beta=0.5, tau_s=1.0, tau_t=0.5)
    rho = tol.both(tol.row, V, F32, tol.logit_range((z_s, 1.0), (z_t, 0.5), rows=True))
    assert ((div.cpu().double() - ref.detach()).abs() <= rho * S).all()
    assert rel(grad, ref_g) <= tol.norm_ratio(rho.unsqueeze(-1) * m, ref_g)
    eye = torch.eye(N, device=DEV)[None]
    w_s = z_s.T.contiguous().to(DEV).requires_grad_()
    mask = torch.ones(1, N, dtype=torch.bool, device=DEV)
    loss = chunked_distill_loss(eye, w_s, eye, z_t.T.contiguous().to(DEV), mask, kind="jsd", beta=0.5,
                                reduction="sum", backend="triton")
    loss.backward()
    assert rel(w_s.grad.T, ref_g) <= tol.norm_ratio(rho.unsqueeze(-1) * m, ref_g) + tol.gamma(N + 2, F32)
