r"""Triton kernels for the token-level divergences of ``ops.divergence``: one program per row,
online softmax over the vocabulary, temperatures, the log-probability floor and row
masking fused, the gradient w.r.t. the student logits written in the same launch.

Math: exactly ``ops.divergence.token_divergence_and_grad`` (module docstring of
``ops.divergence``, "Gradient with the log-probability floor"); tests compare both, and both against the
float64 reference. Per row, with a = z/τ and F = LOGPROB_FLOOR:

    pass 1  online log-sum-exp of a_S and a_T over blocks of the vocabulary
            (running max m, running sum d ← d·e^(m−m') + Σ e^(a−m'))
    pass 2  ℓ = max(a − lse, F), p = e^(a − lse); accumulate
            D_F = Σ p_T (ℓ_T − ℓ_S), D_R = Σ p_S (ℓ_S − ℓ_T), H(π_T), H(π_T, π_S),
            Σ_{ℓ_S > F} p_T (forward gradient), and for JSD log M = logaddexp(ℓ_T + log β,
            ℓ_S + log(1 − β)) with Σ p_T (ℓ_T − log M), Σ p_S (ℓ_S − log M) and, for the
            gradient, Σ p_S h with h = −softplus(ℓ_T − ℓ_S + log(β/(1 − β)))
    pass 3  (if a gradient is needed) c_row · ∂D/∂z_S, stored in the gradient buffer
            (JSD: (1 − β) p_S (h − Σ p_S h), the cancellation-free form of ``ops.divergence``)

Divergences are accumulated as sums of products of differences (never as a
difference of two large sums), so small KLs keep their relative precision.
Computation is float32 whatever the logits' dtype (bf16/fp16/fp32 loads).

Two faces:
* ``triton_token_divergence_and_grad`` — same signature and results as
  ``ops.divergence.token_divergence_and_grad`` for (N, V) logits; the row backend of
  ``ops.chunked.chunked_distill_loss`` (selected automatically on CUDA).
* ``triton_distill_loss`` — ``ops.kl.distill_loss`` on (B, T, V) logits as an
  ``autograd.Function``; only rows with ``mask`` True are read (row indices are
  passed to the kernel, no gather copy), the others get a zero gradient.

CPU: set ``TRITON_INTERPRET=1`` *before* this module is imported (Triton decides at
decoration time) and pass CPU tensors; the interpreter runs the same kernels in
NumPy (slow: tests use small shapes). On CUDA the kernels are compiled.
"""

from __future__ import annotations

import math
import os

import torch
from torch import Tensor

from distillab.ops._checks import _check_batch, _check_divergence, _check_logits_pair
from distillab.ops.divergence import LOGPROB_FLOOR
from distillab.ops.reduction import row_coefficients
from distillab.registry import REDUCTIONS, check_choice

__all__ = [
    "TRITON_KINDS",
    "triton_available",
    "check_triton_usable",
    "triton_token_divergence_and_grad",
    "triton_distill_loss",
]

try:  # triton is optional: CUDA installs bring it with torch, CPU dev installs from the dev extra
    import triton
    import triton.language as tl

    _TRITON_ERROR: str | None = None
except Exception as e:  # pragma: no cover - exercised where triton is missing
    triton = tl = None
    _TRITON_ERROR = f"{type(e).__name__}: {e}"

_INTERPRETED = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")
_KIND_ID = {"forward": 0, "reverse": 1, "jsd": 2}
#: the divergences (`registry.KINDS`) the kernels compute; any other kind runs the torch rows of ``ops.chunked``
TRITON_KINDS = tuple(_KIND_ID)


def triton_available() -> bool:
    """True when ``triton`` imported (says nothing about a device to run on)."""
    return _TRITON_ERROR is None


def check_triton_usable(device: torch.device | str) -> None:
    """Raise RuntimeError, saying why, unless the kernels can run on ``device``."""
    device = torch.device(device)
    if _TRITON_ERROR is not None:
        raise RuntimeError(f"triton is not importable ({_TRITON_ERROR}); use impl 'chunked' or 'reference'")
    if device.type == "cuda":
        if _INTERPRETED:
            raise RuntimeError("distillab.ops.triton_kl was imported with TRITON_INTERPRET=1; CUDA tensors need compiled kernels")
        return
    if device.type == "cpu":
        if not _INTERPRETED:
            raise RuntimeError(
                "Triton kernels on CPU tensors need the interpreter: set TRITON_INTERPRET=1 before "
                "distillab.ops.triton_kl is imported (or use impl 'chunked', which runs torch math on CPU)"
            )
        return
    raise RuntimeError(f"Triton kernels run on CUDA (or CPU under TRITON_INTERPRET=1), not on {device.type}")


if triton is not None:

    @triton.jit
    def _jsd_h(x):
        """h = −softplus(x) = −log(1 + e^x), accurate for tiny e^x: log1p(e) by Goldberg's
        u = 1 + e, log(u)·e/(u − 1) (no libdevice call, so it runs under the interpreter)."""
        e = tl.exp(-tl.abs(x))
        u = 1.0 + e
        one = u == 1.0
        l1p = tl.where(one, e, tl.log(u) * (e / tl.where(one, 1.0, u - 1.0)))
        return -(tl.maximum(x, 0.0) + l1p)

    @triton.jit
    def _divergence_rows_kernel(
        zs_ptr, zs_stride, zt_ptr, zt_stride, rows_ptr, coef_ptr,
        div_ptr, stats_ptr, grad_ptr, grad_stride,
        V, tau_s, tau_t, beta, log_beta, log_1mbeta,
        KIND: tl.constexpr, HAS_ROWS: tl.constexpr, HAS_COEF: tl.constexpr,
        NEED_GRAD: tl.constexpr, WITH_STATS: tl.constexpr, FLOOR: tl.constexpr, BLOCK: tl.constexpr,
    ):
        pid = tl.program_id(0).to(tl.int64)
        if HAS_ROWS:
            row = tl.load(rows_ptr + pid).to(tl.int64)
        else:
            row = pid
        zs_row = zs_ptr + row * zs_stride
        zt_row = zt_ptr + row * zt_stride
        lse_s, lse_t = _row_lse(zs_row, zt_row, V, tau_s, tau_t, BLOCK)  # pass 1

        # pass 2: the divergences and the sums the gradient needs
        fw = 0.0
        rv = 0.0
        ent = 0.0
        ce = 0.0
        keep_t = 0.0
        g_t = 0.0
        g_s = 0.0
        h_s = 0.0
        log_c = log_beta - log_1mbeta
        for start in range(0, V, BLOCK):
            offs, valid, ls, lt = _block_log_probs(zs_row, zt_row, start, V, tau_s, tau_t, lse_s, lse_t, BLOCK)
            ps = tl.exp(ls)
            pt = tl.exp(lt)
            lsc = tl.maximum(ls, FLOOR)
            ltc = tl.maximum(lt, FLOOR)
            diff = ltc - lsc
            fw += tl.sum(pt * diff, 0)
            rv -= tl.sum(ps * diff, 0)
            if WITH_STATS:
                ent -= tl.sum(pt * ltc, 0)
                ce -= tl.sum(pt * lsc, 0)
            if KIND == 0:
                keep_t += tl.sum(tl.where(ls > FLOOR, pt, 0.0), 0)
            if KIND == 2:
                x = ltc + log_beta
                y = lsc + log_1mbeta
                mx = tl.maximum(x, y)
                log_m = mx + tl.log(tl.exp(x - mx) + tl.exp(y - mx))
                g_t += tl.sum(pt * (ltc - log_m), 0)
                g_s += tl.sum(ps * (lsc - log_m), 0)
                if NEED_GRAD:
                    h_s += tl.sum(ps * _jsd_h(ltc - lsc + log_c), 0)
        if KIND == 0:
            div = fw
        elif KIND == 1:
            div = rv
        else:
            div = beta * g_t + (1.0 - beta) * g_s
        tl.store(div_ptr + pid, div)
        if WITH_STATS:
            tl.store(stats_ptr + pid * 4 + 0, fw)
            tl.store(stats_ptr + pid * 4 + 1, rv)
            tl.store(stats_ptr + pid * 4 + 2, ent)
            tl.store(stats_ptr + pid * 4 + 3, ce)

        if NEED_GRAD:  # pass 3: c_row · ∂D/∂z_S
            if HAS_COEF:
                scale = tl.load(coef_ptr + pid).to(tl.float32) / tau_s
            else:
                scale = 1.0 / tau_s
            _store_grad_row(zs_row, zt_row, grad_ptr + row * grad_stride, V, tau_s, tau_t, lse_s, lse_t, scale,
                            keep_t, div, beta, h_s, log_c, KIND, FLOOR, BLOCK)

    @triton.jit
    def _row_lse(zs_row, zt_row, V, tau_s, tau_t, BLOCK: tl.constexpr):
        """Pass 1 of `_divergence_rows_kernel`: the online log-sum-exp of a_S = z_S/τ_S and
        a_T = z_T/τ_T over one row of V logits (float32 scalars ``(lse_S, lse_T)``)."""
        m_s = -float("inf")
        d_s = 0.0
        m_t = -float("inf")
        d_t = 0.0
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            valid = offs < V
            a_s = tl.load(zs_row + offs, mask=valid, other=-float("inf")).to(tl.float32) / tau_s
            a_t = tl.load(zt_row + offs, mask=valid, other=-float("inf")).to(tl.float32) / tau_t
            ms_new = tl.maximum(m_s, tl.max(a_s, 0))
            mt_new = tl.maximum(m_t, tl.max(a_t, 0))
            ref_s = tl.where(ms_new == -float("inf"), 0.0, ms_new)  # all -inf so far: no NaN from -inf - -inf
            ref_t = tl.where(mt_new == -float("inf"), 0.0, mt_new)
            d_s = d_s * tl.exp(m_s - ref_s) + tl.sum(tl.exp(a_s - ref_s), 0)
            d_t = d_t * tl.exp(m_t - ref_t) + tl.sum(tl.exp(a_t - ref_t), 0)
            m_s = ms_new
            m_t = mt_new
        return m_s + tl.log(d_s), m_t + tl.log(d_t)

    @triton.jit
    def _block_log_probs(zs_row, zt_row, start, V, tau_s, tau_t, lse_s, lse_t, BLOCK: tl.constexpr):
        """One block of a row for passes 2 and 3: its offsets ``start + [0, BLOCK)``, their mask
        (< V), and the log-probabilities log π_S = z_S/τ_S − lse_S and log π_T = z_T/τ_T − lse_T
        (float32; −inf past V)."""
        offs = start + tl.arange(0, BLOCK)
        valid = offs < V
        ls = tl.load(zs_row + offs, mask=valid, other=-float("inf")).to(tl.float32) / tau_s - lse_s
        lt = tl.load(zt_row + offs, mask=valid, other=-float("inf")).to(tl.float32) / tau_t - lse_t
        return offs, valid, ls, lt

    @triton.jit
    def _store_grad_row(zs_row, zt_row, grad_row, V, tau_s, tau_t, lse_s, lse_t, scale, keep_t, div, beta, h_s,
                        log_c, KIND: tl.constexpr, FLOOR: tl.constexpr, BLOCK: tl.constexpr):
        """Pass 3 of `_divergence_rows_kernel`: ``scale`` · ∂D/∂z_S of one row, stored in
        ``grad_row``'s dtype, from pass 1's log-sum-exps and pass 2's sums (``keep_t``
        forward, ``div`` reverse, ``h_s`` JSD)."""
        for start in range(0, V, BLOCK):
            offs, valid, ls, lt = _block_log_probs(zs_row, zt_row, start, V, tau_s, tau_t, lse_s, lse_t, BLOCK)
            ps = tl.exp(ls)
            lsc = tl.maximum(ls, FLOOR)
            ltc = tl.maximum(lt, FLOOR)
            if KIND == 0:
                g = ps * keep_t - tl.where(ls > FLOOR, tl.exp(lt), 0.0)
            elif KIND == 1:
                g = ps * ((lsc - ltc) - div)
            else:  # (1 − β) π_S (h − Σ π_S h): ops.divergence, "Precision of the JSD gradient"
                g = (1.0 - beta) * ps * (_jsd_h(ltc - lsc + log_c) - h_s)
            tl.store(grad_row + offs, (g * scale).to(grad_row.dtype.element_ty), mask=valid)


def _launch_config(V: int, device: torch.device, block_size: int | None) -> tuple[int, int]:
    if block_size is None:
        block_size = 4096 if device.type == "cuda" else 1024
    block = min(triton.next_power_of_2(int(block_size)), triton.next_power_of_2(V))
    num_warps = 4 if block <= 1024 else (8 if block <= 4096 else 16)
    return block, num_warps


def _run_kernel(zs, zt, *, rows, coef, grad, n_prog, kind, tau_s, tau_t, beta, need_grad, with_stats, block_size):
    """Launch one program per row (``rows[i]`` or i); returns (div (n_prog,), stats (n_prog, 4) or None)."""
    V = zs.shape[-1]
    dev = zs.device
    div = torch.empty(n_prog, dtype=torch.float32, device=dev)
    stats = torch.empty(n_prog if with_stats else 1, 4, dtype=torch.float32, device=dev)
    if n_prog == 0:
        return div, (stats if with_stats else None)
    block, num_warps = _launch_config(V, dev, block_size)
    lb = math.log(beta) if 0.0 < beta < 1.0 else 0.0
    l1b = math.log1p(-beta) if 0.0 < beta < 1.0 else 0.0
    dummy = div  # unused pointer arguments (their branches are compiled out)
    _divergence_rows_kernel[(n_prog,)](
        zs, zs.stride(0), zt, zt.stride(0),
        rows if rows is not None else dummy, coef if coef is not None else dummy,
        div, stats, grad if grad is not None else dummy, grad.stride(0) if grad is not None else 0,
        V, float(tau_s), float(tau_t), float(beta), lb, l1b,
        KIND=_KIND_ID[kind], HAS_ROWS=rows is not None, HAS_COEF=coef is not None,
        NEED_GRAD=bool(need_grad), WITH_STATS=bool(with_stats), FLOOR=LOGPROB_FLOOR, BLOCK=block,
        num_warps=num_warps,
    )
    return div, (stats if with_stats else None)


def _rowwise(t: Tensor) -> Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def triton_token_divergence_and_grad(
    student_logits: Tensor,
    teacher_logits: Tensor,
    *,
    kind: str,
    tau_s: float = 1.0,
    tau_t: float = 0.5,
    beta: float = 0.5,
    compute_dtype: torch.dtype = torch.float32,
    need_grad: bool = True,
    with_stats: bool = False,
    block_size: int | None = None,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """``ops.divergence.token_divergence_and_grad`` for (N, V) logits, with the Triton kernel.

    Args and returns as there (float32 results; ``grad`` is a new (N, V) float32
    tensor); ``block_size`` (vocabulary entries per step of the row loop; default
    4096 on CUDA, 1024 under the interpreter) is rounded up to a power of two.

    Raises:
        As ``token_divergence_and_grad``; ValueError for ``compute_dtype`` float64
        (the kernels compute in float32) or logits that are not 2-D; RuntimeError
        where the kernels cannot run (``check_triton_usable``).
    """
    _check_logits_pair(student_logits, teacher_logits)
    if student_logits.dim() != 2:
        raise ValueError(f"logits must be (N, V) rows, got {tuple(student_logits.shape)}")
    kind, tau_s, tau_t, beta = _check_divergence(kind, tau_s, tau_t, beta, compute_dtype)
    if compute_dtype != torch.float32:
        raise ValueError("the Triton kernels compute in float32; use backend 'torch' for compute_dtype float64")
    check_triton_usable(student_logits.device)
    zs, zt = _rowwise(student_logits.detach()), _rowwise(teacher_logits.detach())
    N, V = zs.shape
    grad = torch.empty(N, V, dtype=torch.float32, device=zs.device) if need_grad else None
    div, stats = _run_kernel(
        zs, zt, rows=None, coef=None, grad=grad, n_prog=N, kind=kind, tau_s=tau_s, tau_t=tau_t,
        beta=beta, need_grad=need_grad, with_stats=with_stats, block_size=block_size,
    )
    return div, grad, stats


class _TritonDistill(torch.autograd.Function):
    @staticmethod
    def forward(ctx, zs, zt, rows, coef, opts):
        kind, tau_s, tau_t, beta, need_grad, block_size = opts
        grad = torch.zeros_like(zs) if need_grad else None  # (B·T, V), zero on unselected rows
        div, _ = _run_kernel(
            zs, zt, rows=rows, coef=coef, grad=grad, n_prog=rows.shape[0], kind=kind, tau_s=tau_s,
            tau_t=tau_t, beta=beta, need_grad=need_grad, with_stats=False, block_size=block_size,
        )
        ctx.save_for_backward(grad)
        return (div.double() * coef.double()).sum().float()

    @staticmethod
    def backward(ctx, grad_loss):
        (grad,) = ctx.saved_tensors
        if grad is None:
            return None, None, None, None, None
        return grad * grad_loss.to(grad.dtype), None, None, None, None


def triton_distill_loss(
    student_logits: Tensor,
    teacher_logits: Tensor,
    mask: Tensor,
    *,
    kind: str = "forward",
    tau_s: float = 1.0,
    tau_t: float = 0.5,
    beta: float = 0.5,
    reduction: str = "seq_mean",
    weights: Tensor | None = None,
    block_size: int | None = None,
) -> Tensor:
    """``ops.kl.distill_loss`` (float32 compute) with the Triton kernel.

    Only rows with ``mask`` True are read; the gradient of the others is 0, so
    garbage (NaN, ±inf) there cannot leak. The loss is a float32 0-dim tensor; the
    gradient has the student logits' dtype. Teacher logits are constants.

    Raises:
        As ``distill_loss``; RuntimeError where the kernels cannot run.
    """

    _check_batch(student_logits, teacher_logits, mask)
    kind, tau_s, tau_t, beta = _check_divergence(kind, tau_s, tau_t, beta)
    check_choice("reduction", reduction, REDUCTIONS)
    check_triton_usable(student_logits.device)
    B, T, V = student_logits.shape
    rows = mask.reshape(-1).nonzero().squeeze(1)  # (N,) flat row indices into (B·T, V)
    coef = row_coefficients(rows // T, B, reduction=reduction, weights=weights, dtype=torch.float32)
    zs = _rowwise(student_logits.reshape(B * T, V))
    zt = _rowwise(teacher_logits.detach().reshape(B * T, V))
    need_grad = torch.is_grad_enabled() and student_logits.requires_grad
    opts = (kind, tau_s, tau_t, beta, need_grad, block_size)
    loss = _TritonDistill.apply(zs, zt, rows, coef, opts)
    return loss
