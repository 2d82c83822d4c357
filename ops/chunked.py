r"""Chunked fused-linear distillation loss: the divergences of ``ops.divergence`` computed from
hidden states and lm_head weights, never holding more than ``chunk_size × V`` logits.

Why
---
The naive loss materialises float32 (N, V) student and teacher logits, their
log-probabilities and the logits' gradient: at N = 8,192 tokens and Llama-3's
V = 128,256 that is 4 GiB per tensor. Here rows are processed ``chunk_size`` at a
time (Liger-Kernel's fused linear cross-entropy pattern):

    for each chunk of rows i:                         # (c, H) hidden states
        z_S = h_S W_Sᵀ (+ b_S),  z_T = h_T W_Tᵀ (+ b_T)   # (c, V) each, over τ_S and τ_T (the GEMM's α)
        D_i, ∂D_i/∂z_S = ops.divergence.token_divergence_and_grad(z_S, z_T)   # same math as the reference
                                                       # (CPU: a few rows at a time, in cache; written
                                                       #  over z_S, which is not needed again)
        L      += Σ_i c_i D_i                          # c_i: the reduction's row coefficient
        ∂L/∂h_S[i] = (c_i ∂D_i/∂z_S) W_S                  # (c, H)
        ∂L/∂W_S  += (c_i ∂D_i/∂z_S)ᵀ h_S[i]               # (V, H), float32 accumulator
        ∂L/∂b_S  += Σ_i c_i ∂D_i/∂z_S

The gradients are computed in the forward pass and only scaled by the incoming
gradient in backward, so no logits survive the call. The teacher is a constant.
Memory: a few (chunk, V) temporaries, the (V, H) gradient accumulator and the (N, H)
hidden-state gradient; time: the same four matmuls as the naive loss.

Reductions as linear row weights
--------------------------------
Every reduction of ``ops.reduction.reduce_loss`` is L = Σ_i c_i D_i over the selected rows,
row i belonging to sequence b(i) with n_b rows, K sequences with ≥ 1 row, N rows,
and optional per-sequence weights w (detached):

    seq_mean:   c_i = w_b(i) / (n_b(i) · K)       (PROTOCOL.md §2, the default)
    token_mean: c_i = w_b(i) / N
    sum:        c_i = w_b(i)

Row math backends
-----------------
``backend="torch"`` evaluates ``ops.divergence.token_divergence_and_grad`` on each chunk;
``backend="triton"`` runs the row kernels of ``ops.triton_kl`` (online softmax,
temperature and floor fused); ``"auto"`` (default) picks Triton for CUDA tensors
when ``triton`` imports (and ``compute_dtype`` is float32), torch otherwise.

Precision
---------
The logits of a chunk are the exact float32 logits of the inputs' values: for bf16
or fp16 inputs a float32-output matmul on CUDA (``torch.mm(..., out_dtype=)``; where a
torch build lacks it, bf16 logits cast up), and on CPU a float32 copy of the weight
made once per call. (The reference path sees the model's logits rounded to bf16, so
this is the more accurate of the two.) They are cast to ``compute_dtype`` (float32,
or float64) for the divergence; ∂L/∂h_S is computed from the float32 gradient of
the logits rounded to the weight's dtype. ∂L/∂W_S accumulates in float32 (float64 for
float64 inputs) and is cast to W_S's dtype once at the end.

Example
-------
    loss = chunked_distill_loss(h_s, lm_s.weight, h_t, lm_t.weight, mask=mask,
                                kind="forward", tau_s=1.0, tau_t=0.5)   # h: (B, T, H), mask: (B, T)
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import torch
from torch import Tensor

from distillab.ops._checks import _check_beta, _check_compute_dtype, _check_mask, _check_tau
from distillab.ops.divergence import token_divergence_and_grad
from distillab.ops.reduction import row_coefficients
from distillab.ops.rollout_token import rollout_token_estimate_and_grad
from distillab.ops.topk import topk_divergence_and_grad
from distillab.ops.triton_kl import (
    TRITON_KINDS,
    check_triton_usable,
    triton_available,
    triton_token_divergence_and_grad,
)
from distillab.ops.weights import token_logprobs
from distillab.registry import ESTIMATORS, REDUCTIONS, check_choice, check_estimator

__all__ = ["ChunkedOutput", "RowEstimator", "chunked_distill_loss", "estimator_rows", "pad_vocab", "triton_fits",
           "check_vocab_sizes", "token_logprobs_from_hidden"]

BACKENDS = ("auto", "torch", "triton")
#: Fewest rows per chunk by default: ∂L/∂W_S += Gᵀ h_S reads and writes the (V, H) accumulator once per
#: chunk, so short chunks make that GEMM memory-bound (at V = 32,000, H = 512: 1.7x the four-GEMM floor
#: with 32-row chunks, 1.1x with 256; benchmarks/kl_ops.py).
MIN_CHUNK = 256


class ChunkedOutput(NamedTuple):
    """``chunked_distill_loss(..., return_stats=True)``: the loss and per-row diagnostics.

    ``stats`` is (N, 4) float32, detached, columns ``ops.divergence.STAT_NAMES``
    (forward KL, reverse KL, teacher entropy, teacher→student cross-entropy), one row
    per selected position, in the order of ``mask.nonzero()`` (or of the given rows).
    """

    loss: Tensor
    stats: Tensor


# ------------------------------------------------------------------------- vocab checks


def check_vocab_sizes(student_vocab: int, teacher_vocab: int) -> None:
    """Raise a ValueError naming both sizes when the lm_head vocabularies differ."""
    if student_vocab != teacher_vocab:
        raise ValueError(
            f"vocab size mismatch: student lm_head has V={student_vocab} rows, teacher lm_head has "
            f"V={teacher_vocab}. Teacher and student must share a tokenizer; if the difference is only "
            "unused padding rows (e.g. Qwen2.5 151,936 vs 152,064), pad the smaller one with "
            "distillab.ops.chunked.pad_vocab (LossConfig.pad_vocab: true)"
        )


def pad_vocab(weight: Tensor, new_size: int, bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
    r"""Pad an lm_head (V, H) to (new_size, H) with rows whose logit is −inf.

    For teacher/student pairs that share a tokenizer but whose lm_heads differ only
    by unused padding rows (Qwen2.5-1.5B has 151,936 rows, Qwen2.5-7B 152,064; the
    tokenizer has 151,665 tokens). The new rows have zero weight and bias −inf, so
    their probability is exactly 0 under the padded model; the divergence then treats
    them like any −inf logit (ops.divergence: 0·log 0 = 0; teacher mass on a row the student
    cannot produce costs the floored penalty π_T(v)·(log π_T(v) − LOGPROB_FLOOR), which
    is negligible when those rows are truly unused, i.e. have ≈ 0 teacher mass).

    Differentiable: the gradient reaches the original rows of ``weight``/``bias``.
    Costs one copy of the weight (done once per call of the loss).

    Args:
        weight: (V, H) lm_head weight.
        new_size: target number of rows, ≥ V.
        bias: optional (V,) bias (zeros if None).

    Returns:
        ``(weight (new_size, H), bias (new_size,))``, in ``weight``'s dtype.

    Raises:
        ValueError: ``new_size`` < V or ``weight`` not 2-D.
    """
    if weight.dim() != 2:
        raise ValueError(f"weight must be (V, H), got {tuple(weight.shape)}")
    V, H = weight.shape
    if new_size < V:
        raise ValueError(f"pad_vocab: new_size {new_size} < current vocab size {V}; only padding is allowed")
    if bias is None:
        bias = torch.zeros(V, dtype=weight.dtype, device=weight.device)
    extra = new_size - V
    w = torch.cat([weight, weight.new_zeros(extra, H)]) if extra else weight
    b = torch.cat([bias, bias.new_full((extra,), float("-inf"))]) if extra else bias
    return w, b


# ---------------------------------------------------------------------- autograd.Function


_LOW_PRECISION = (torch.bfloat16, torch.float16)
_MM_OUT_DTYPE_OK: dict[str, bool] = {}


def _mm_float32(a: Tensor, b: Tensor) -> Tensor:
    """a @ b for low-precision CUDA tensors with a float32 result (no rounding of the
    output to bf16), via ``torch.mm(..., out_dtype=)`` where this torch has it."""
    key = str(a.device)
    if _MM_OUT_DTYPE_OK.get(key, True):
        try:
            out = torch.mm(a, b, out_dtype=torch.float32)
            _MM_OUT_DTYPE_OK[key] = True
            return out
        except (RuntimeError, TypeError, NotImplementedError):
            _MM_OUT_DTYPE_OK[key] = False
    return (a @ b).float()


def _logits(h: Tensor, w: Tensor, b: Tensor | None, w_up: Tensor | None, scale: float = 1.0) -> Tensor:
    """(c, H) rows x (V, H) weight (+ b), times ``scale`` -> (c, V) logits, float32 or wider.

    Low-precision weights: on CUDA a float32-output matmul; elsewhere ``w_up``, a
    float32 copy of ``w`` made once per call. So bf16 inputs give the exact logits
    of the bf16 values, not logits rounded to bf16. ``scale`` (the 1/τ of the
    divergence) rides on the GEMM's α where the weight is used at full precision
    (no extra pass over the (c, V) logits; exact for τ a power of two)."""
    if w_up is not None or w.dtype not in _LOW_PRECISION:
        ww = w_up if w_up is not None else w
        hh = h.to(ww.dtype)
        if b is None:
            return torch.mm(hh, ww.t()) if scale == 1.0 else torch.addmm(
                hh.new_zeros(()), hh, ww.t(), beta=0.0, alpha=scale)
        return torch.addmm(b.to(ww.dtype), hh, ww.t(), beta=scale, alpha=scale)
    z = _mm_float32(h.to(w.dtype), w.t())
    if b is not None:
        z.add_(b.to(z.dtype))
    return z if scale == 1.0 else z.mul_(scale)


def _upcast(w: Tensor) -> Tensor | None:
    return w.float() if (w.dtype in _LOW_PRECISION and not w.is_cuda) else None


@torch.no_grad()
def token_logprobs_from_hidden(hidden: Tensor, weight: Tensor, targets: Tensor, tau: float,
                               bias: Tensor | None = None, chunk_size: int = 1024) -> Tensor:
    """``ops.weights.token_logprobs`` of the lm_head logits z = h Wᵀ (+ b) of ``(N, H)`` rows,
    ``chunk_size`` rows at a time (never N × V logits at once; logits as in the loss).

    Args:
        hidden: (N, H) final hidden states. weight: (V, H) lm_head. bias: (V,) or None.
        targets: (N,) int64 token ids. tau: temperature (> 0).

    Returns:
        (N,) float32 (float64 for float64 weights), nats, no grad.
    """
    _check_2d("hidden", hidden)
    w_up = _upcast(weight)
    out = [token_logprobs(_logits(hidden[lo : lo + chunk_size], weight, bias, w_up), targets[lo : lo + chunk_size], tau)
           for lo in range(0, hidden.shape[0], chunk_size)]
    dtype = torch.promote_types(weight.dtype, torch.float32)
    return torch.cat(out) if out else hidden.new_zeros(0, dtype=dtype)


#: Bytes of one block of logits rows for the CPU row math (a few (rows, V) temporaries fit in L2/L3).
ROW_BLOCK_BYTES = 1 << 19


def _row_block(V: int, chunk: int) -> int:
    """Rows per block of the row math on CPU: a power of two with about `ROW_BLOCK_BYTES`
    of float32 logits per row block, between 1 and ``chunk``."""
    return max(1, min(chunk, 1 << max(0, int(math.log2(max(1, ROW_BLOCK_BYTES // (4 * max(V, 1))))))))


def _row_fn(backend: str):
    return token_divergence_and_grad if backend == "torch" else triton_token_divergence_and_grad


class RowEstimator(NamedTuple):
    """The row math of an estimator other than ``full`` (`estimator_rows`): ``fn`` has the
    interface of ``ops.divergence.token_divergence_and_grad`` plus ``kwargs``; ``targets`` (N,)
    are the rollout tokens of the rows (k1, k2, k3), sliced per chunk."""

    fn: Callable
    kwargs: dict
    targets: Tensor | None = None

    def __call__(self, zs: Tensor, zt: Tensor, start: int, end: int, **kw):
        """``fn`` on the chunk of rows ``start:end`` (``zs``, ``zt``: their (c, V) logits)."""
        extra = {} if self.targets is None else {"targets": self.targets[start:end]}
        return self.fn(zs, zt, **self.kwargs, **extra, **kw)


def estimator_rows(estimator: str = "full", *, top_k: int = 64, topk_source: str = "teacher", topk_tail: bool = False,
                   k_gradient: str = "auto", targets: Tensor | None = None) -> RowEstimator | None:
    """The `RowEstimator` of ``estimator`` (None for ``full``: the backend's divergence rows).

    Args:
        estimator: ``full`` | ``topk`` | ``k1`` | ``k2`` | ``k3`` (``sampled`` draws from the
            whole distributions and has no chunked path: ``ops.kl.estimator_loss``).
        top_k, topk_source, topk_tail: ``ops.topk.topk_divergence_and_grad``.
        k_gradient, targets: ``ops.rollout_token.rollout_token_estimate_and_grad``; ``targets`` (N,)
            int64, one rollout token per selected row.

    Raises:
        ValueError: an unknown estimator, ``sampled``, k1/k2/k3 without targets.
    """
    check_choice("estimator", estimator, ESTIMATORS)
    if estimator == "full":
        return None
    if estimator == "sampled":
        raise ValueError("estimator 'sampled' draws tokens from the full distributions and has no chunked path; "
                         "use ops.kl.estimator_loss on the logits (loss.impl does not apply to it)")
    if estimator == "topk":
        return RowEstimator(topk_divergence_and_grad, dict(top_k=top_k, topk_source=topk_source, topk_tail=topk_tail))
    if targets is None or targets.dim() != 1:
        raise ValueError(f"estimator {estimator!r} needs targets: the rollout token of each row, (N,) int64")
    return RowEstimator(rollout_token_estimate_and_grad, dict(estimator=estimator, k_gradient=k_gradient), targets)


def _rows(backend: str, est: RowEstimator | None) -> Callable:
    """``rows(zs, zt, start, end, **kw)``: the row math of chunk ``start:end``."""
    if est is not None:
        return est
    fn = _row_fn(backend)
    return lambda zs, zt, start, end, **kw: fn(zs, zt, **kw)


class _ChunkedDivergence(torch.autograd.Function):
    """Σ_i c_i D(h_S[i] W_Sᵀ + b_S, h_T[i] W_Tᵀ + b_T) over rows i; gradients computed
    chunk by chunk in forward. Returns ``(loss, stats)``; ``stats`` is not differentiable."""

    @staticmethod
    def forward(ctx, h_s, w_s, b_s, h_t, w_t, b_t, coef, opts):
        kind, tau_s, tau_t, beta, chunk, cdt, backend, want_stats, need, est = opts
        row_fn = _rows(backend, est)
        N, V = h_s.shape[0], w_s.shape[0]
        acc = torch.float64 if torch.float64 in (cdt, w_s.dtype) else torch.float32
        need_h, need_w, need_b = need
        any_grad = need_h or need_w or need_b
        grad_h = torch.empty_like(h_s) if need_h else None
        grad_w = torch.zeros(w_s.shape, dtype=acc, device=w_s.device) if need_w else None
        grad_b = torch.zeros(V, dtype=acc, device=w_s.device) if need_b else None
        stats = torch.empty(N if want_stats else 0, 4, dtype=cdt, device=h_s.device)
        loss = torch.zeros((), dtype=torch.float64, device=h_s.device)
        ws_up, wt_up = _upcast(w_s), _upcast(w_t)  # CPU + bf16/fp16 only
        inv_s, inv_t = 1.0 / tau_s, 1.0 / tau_t
        # rows of the row math at a time: the whole chunk on CUDA; on CPU a few rows, so that its
        # (rows, V) temporaries stay in cache while the chunk's GEMMs stay large (benchmarks/kl_ops.py)
        rows = chunk if (h_s.is_cuda or backend == "triton") else _row_block(V, chunk)
        for start in range(0, N, chunk):
            end = min(start + chunk, N)
            hs = h_s[start:end]  # (c, H)
            zs = _logits(hs, w_s, b_s, ws_up, inv_s)  # (c, V) = z_S/τ_S: the temperatures ride on the GEMMs
            zt = _logits(h_t[start:end], w_t, b_t, wt_up, inv_t)  # (c, V) = z_T/τ_T
            if any_grad and zs.dtype != cdt:
                zs = zs.to(cdt)  # the buffer that takes ∂L/∂z_S below
            c = coef[start:end]  # (c,)
            for a in range(0, end - start, rows):
                b = min(a + rows, end - start)
                div, g, st = row_fn(
                    zs[a:b], zt[a:b], start + a, start + b, kind=kind, tau_s=1.0, tau_t=1.0, beta=beta,
                    compute_dtype=cdt, need_grad=any_grad, with_stats=want_stats,
                )  # g = ∂D/∂(z_S/τ_S) of rows a..b
                loss += (div.to(torch.float64) * c[a:b].to(torch.float64)).sum()
                if want_stats:
                    stats[start + a : start + b] = st
                if any_grad:  # c_i ∂D/∂z_S over the rows' logits, which are not read again
                    torch.mul(g, (c[a:b] * inv_s).to(g.dtype).unsqueeze(1), out=zs[a:b])
                del g
            del zt
            if any_grad:
                g = zs  # (c, V) = ∂L/∂z_S
                if need_h:
                    w_g = ws_up if ws_up is not None else w_s
                    gh = g.to(w_g.dtype)
                    if gh.dtype == h_s.dtype:
                        torch.mm(gh, w_g, out=grad_h[start:end])  # (c, H)
                    else:
                        grad_h[start:end] = (gh @ w_g).to(h_s.dtype)
                if need_w:
                    grad_w.addmm_(g.t().to(acc), hs.to(acc))  # (V, H)
                if need_b:
                    grad_b += g.sum(0).to(acc)
            del zs
        del ws_up, wt_up
        ctx.save_for_backward(
            grad_h if need_h else None,
            grad_w.to(w_s.dtype) if need_w else None,
            grad_b.to(b_s.dtype) if need_b else None,
        )
        ctx.mark_non_differentiable(stats)
        return loss.to(cdt), stats

    @staticmethod
    def backward(ctx, grad_loss, grad_stats):
        grad_h, grad_w, grad_b = ctx.saved_tensors
        one = bool(torch.equal(grad_loss, torch.ones_like(grad_loss)))
        scale = (lambda x: x) if one else (lambda x: None if x is None else x * grad_loss.to(x.dtype))
        return scale(grad_h), scale(grad_w), scale(grad_b), None, None, None, None, None


# ---------------------------------------------------------------------------- public API


def _check_2d(name: str, t: Tensor, rows: int | None = None) -> None:
    if not isinstance(t, Tensor) or not t.is_floating_point():
        raise TypeError(f"{name} must be a floating-point torch.Tensor")
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D, got shape {tuple(t.shape)}")
    if rows is not None and t.shape[0] != rows:
        raise ValueError(f"{name} has {t.shape[0]} rows, expected {rows}")


def _check_inputs(student_hidden: Tensor, student_weight: Tensor, teacher_hidden: Tensor, teacher_weight: Tensor,
                  student_bias: Tensor | None, teacher_bias: Tensor | None, reduction: str, backend: str) -> None:
    """`chunked_distill_loss`'s argument checks (its Raises), before any compute."""
    check_choice("reduction", reduction, REDUCTIONS)
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; allowed values: {', '.join(map(repr, BACKENDS))}")
    for name, t in (("student_hidden", student_hidden), ("teacher_hidden", teacher_hidden)):
        if not isinstance(t, Tensor) or not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point torch.Tensor")
    _check_2d("student_weight", student_weight)
    _check_2d("teacher_weight", teacher_weight)
    check_vocab_sizes(student_weight.shape[0], teacher_weight.shape[0])
    V = student_weight.shape[0]
    for who, h, w in (("student", student_hidden, student_weight), ("teacher", teacher_hidden, teacher_weight)):
        if h.shape[-1] != w.shape[1]:
            raise ValueError(f"{who}_hidden width {h.shape[-1]} != {who}_weight width {w.shape[1]}")
    if student_hidden.shape[:-1] != teacher_hidden.shape[:-1]:
        raise ValueError(
            f"student_hidden rows {tuple(student_hidden.shape[:-1])} != teacher_hidden rows "
            f"{tuple(teacher_hidden.shape[:-1])}"
        )
    for name, b in (("student_bias", student_bias), ("teacher_bias", teacher_bias)):
        if b is not None and tuple(b.shape) != (V,):
            raise ValueError(f"{name} must have shape (V,) = ({V},), got {tuple(b.shape)}")


def _select_rows(student_hidden: Tensor, teacher_hidden: Tensor, mask: Tensor | None, seq_index: Tensor | None,
                 num_seqs: int | None) -> tuple[Tensor, Tensor, Tensor, int]:
    """The rows the loss reads: ``(h_S, h_T)`` (N, H) each, the (N,) int64 sequence of each
    row and the number of sequences B; from (B, T, H) states and a (B, T) bool ``mask``, or
    from (N, H) rows with ``seq_index`` / ``num_seqs`` (default: one sequence)."""
    if mask is not None:
        if student_hidden.dim() != 3:
            raise ValueError(f"with mask, hidden states must be (B, T, H), got {tuple(student_hidden.shape)}")
        _check_mask(mask, tuple(student_hidden.shape[:2]), "student_hidden (B, T)")
        if seq_index is not None:
            raise ValueError("give either mask (with (B, T, H) hidden states) or seq_index, not both")
        seq = torch.arange(mask.shape[0], device=mask.device).unsqueeze(1).expand_as(mask)[mask]  # (N,)
        return student_hidden[mask], teacher_hidden[mask], seq, mask.shape[0]
    if student_hidden.dim() != 2:
        raise ValueError(
            f"without mask, hidden states must be pre-selected rows (N, H), got {tuple(student_hidden.shape)}"
        )
    N = student_hidden.shape[0]
    if seq_index is None:
        return student_hidden, teacher_hidden, torch.zeros(N, dtype=torch.int64, device=student_hidden.device), 1
    if tuple(seq_index.shape) != (N,):
        raise ValueError(f"seq_index must have shape (N,) = ({N},), got {tuple(seq_index.shape)}")
    seq = seq_index.to(torch.int64)
    return student_hidden, teacher_hidden, seq, int(num_seqs) if num_seqs is not None else (int(seq.max()) + 1 if N else 1)


def _rows_targets(targets: Tensor | None, mask: Tensor | None, rows: int) -> Tensor | None:
    """The rollout token of each selected row (k1/k2/k3), or None; checks the shape."""
    if targets is None:
        return None
    want = tuple(mask.shape) if mask is not None else (rows,)
    if not isinstance(targets, Tensor) or tuple(targets.shape) != want:
        got = tuple(targets.shape) if isinstance(targets, Tensor) else type(targets).__name__
        raise ValueError(f"targets must have shape {want} (one rollout token per position), got {got}")
    return targets[mask] if mask is not None else targets


def _chunk_rows(chunk_size: int | None, N: int, V: int, H: int) -> int:
    """Rows per chunk: ``chunk_size``, or Liger's rule (the next power of two of
    ceil(N / ceil(V / H)), at least `MIN_CHUNK`). Raises ValueError below 1."""
    if chunk_size is None:
        inc = max(1, math.ceil(V / max(H, 1)))
        chunk_size = max(MIN_CHUNK, 1 << max(0, math.ceil(math.log2(max(1, math.ceil(N / inc))))))
    if int(chunk_size) < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    return int(chunk_size)


def triton_fits(est, kind: str, device: torch.device, compute_dtype: torch.dtype) -> bool:
    """Whether ``backend="auto"`` may run the Triton kernels: estimator ``full`` (``est`` None,
    `estimator_rows`), a divergence the kernels know (``ops.triton_kl.TRITON_KINDS``; a kind added
    to `registry.KINDS` without a kernel keeps the torch rows), a CUDA ``device`` and float32
    ``compute_dtype``."""
    return est is None and kind in TRITON_KINDS and device.type == "cuda" and compute_dtype == torch.float32


def _pick_backend(backend: str, triton_fits: bool, device: torch.device) -> str:
    """``"auto"``: Triton where it fits (``triton_fits``: estimator full, CUDA, float32) and
    imports, torch otherwise; ``"triton"`` is checked usable on ``device`` (RuntimeError)."""
    if backend == "auto":
        return "triton" if triton_fits and triton_available() else "torch"
    if backend == "triton":
        check_triton_usable(device)
    return backend


def chunked_distill_loss(
    student_hidden: Tensor,
    student_weight: Tensor,
    teacher_hidden: Tensor,
    teacher_weight: Tensor,
    mask: Tensor | None = None,
    *,
    seq_index: Tensor | None = None,
    num_seqs: int | None = None,
    student_bias: Tensor | None = None,
    teacher_bias: Tensor | None = None,
    kind: str = "forward",
    tau_s: float = 1.0,
    tau_t: float = 0.5,
    beta: float = 0.5,
    reduction: str = "seq_mean",
    weights: Tensor | None = None,
    chunk_size: int | None = None,
    compute_dtype: torch.dtype = torch.float32,
    backend: str = "auto",
    return_stats: bool = False,
    estimator: str = "full",
    top_k: int = 64,
    topk_source: str = "teacher",
    topk_tail: bool = False,
    k_gradient: str = "auto",
    targets: Tensor | None = None,
) -> Tensor | ChunkedOutput:
    r"""``ops.kl.distill_loss`` of the logits h W_ᵀ + b, computed in row chunks.

    Equals ``distill_loss(h_S W_Sᵀ + b_S, h_T W_Tᵀ + b_T, mask, ...)`` (same kinds,
    temperatures, floor, reductions and weights) with gradients for the student
    hidden states, weight and bias; the teacher inputs are constants.

    Rows are given either as ``(B, T, H)`` hidden states plus a ``(B, T)`` bool
    ``mask`` (True = completion position), or pre-selected as ``(N, H)`` with
    ``seq_index`` (N,) and ``num_seqs`` for ``seq_mean``/``weights`` (without
    ``seq_index`` the N rows are one sequence). Positions with ``mask`` False are
    never read: NaN/inf there cannot leak, and their gradient is 0.

    Args:
        student_hidden: (B, T, H_S) or (N, H_S), any float dtype; final (normed)
            hidden states of the student.
        student_weight: (V, H_S) student lm_head weight.
        teacher_hidden: (B, T, H_T) or (N, H_T), same rows as the student.
        teacher_weight: (V, H_T) teacher lm_head weight; V must equal the student's
            (else ValueError naming both sizes; see ``pad_vocab``).
        mask: (B, T) bool, with 3-D hidden states.
        seq_index, num_seqs: with 2-D hidden states: (N,) int64 sequence of each row,
            and B. Default: all rows in one sequence.
        student_bias, teacher_bias: optional (V,) lm_head biases.
        kind, tau_s, tau_t, beta: as in ``ops.divergence.token_divergence``.
        reduction, weights: as in ``ops.reduction.reduce_loss``.
        chunk_size: rows per chunk; default: Liger's rule, next power of two of
            ceil(N / ceil(V / H_S)) (chunk logits about the size of the hidden
            states), at least `MIN_CHUNK` (256). On CPU the row math then runs over
            blocks of a few rows of the chunk (`_row_block`), its gradient written over
            the chunk's student logits, which the two gradient GEMMs read.
        compute_dtype: float32 (default) or float64 for the divergence math.
        backend: ``"auto"`` | ``"torch"`` | ``"triton"`` (module docstring).
        return_stats: also return per-row diagnostics (``ChunkedOutput``).
        estimator: ``"full"`` (the divergence), ``"topk"`` or ``"k1"`` | ``"k2"`` | ``"k3"``
            (``ops.topk``, ``ops.rollout_token``; their rows are torch math, so ``"auto"``
            picks torch for them and ``"triton"`` is an error). The loss is then
            Σ_i c_i of the estimator's value, with the estimator's gradient.
        top_k, topk_source, topk_tail: the top-k support (``ops.topk.topk_support``).
        k_gradient: ``"auto"`` | ``"score"`` | ``"pathwise"`` (k1/k2/k3).
        targets: the rollout tokens (k1/k2/k3): (B, T) int64 with ``mask``, else (N,).

    Returns:
        0-dim loss in ``compute_dtype`` (nats), or ``ChunkedOutput(loss, stats)``.

    Raises:
        ValueError: vocab sizes differ (both named), shape mismatches, bad
            kind/τ/β/reduction/backend/chunk_size, weights of the wrong shape.
        TypeError: mask not bool, non-float tensors.
        RuntimeError: ``backend="triton"`` where triton cannot run.
    """
    check_estimator(estimator, kind)
    tau_s, tau_t, beta = _check_tau("tau_s", tau_s), _check_tau("tau_t", tau_t), _check_beta(beta)
    _check_compute_dtype(compute_dtype)
    _check_inputs(student_hidden, student_weight, teacher_hidden, teacher_weight, student_bias, teacher_bias,
                  reduction, backend)
    h_s, h_t, seq, B = _select_rows(student_hidden, teacher_hidden, mask, seq_index, num_seqs)
    coef = row_coefficients(seq, B, reduction=reduction, weights=weights, dtype=torch.float64)
    est = estimator_rows(estimator, top_k=top_k, topk_source=topk_source, topk_tail=topk_tail, k_gradient=k_gradient,
                         targets=_rows_targets(targets, mask, h_s.shape[0]))
    if est is not None and backend == "triton":
        raise ValueError(f"backend 'triton' has kernels for estimator 'full' only; estimator {estimator!r} "
                         "runs its rows with backend 'torch' (or 'auto')")
    if backend == "triton" and kind not in TRITON_KINDS:
        raise ValueError(f"backend 'triton' has kernels for kind {list(TRITON_KINDS)} only; kind {kind!r} "
                         "runs its rows with backend 'torch' (or 'auto')")
    chunk_size = _chunk_rows(chunk_size, h_s.shape[0], student_weight.shape[0], h_s.shape[1])
    backend = _pick_backend(backend, triton_fits(est, kind, h_s.device, compute_dtype), h_s.device)
    grad_on = torch.is_grad_enabled()
    need = (
        grad_on and h_s.requires_grad,
        grad_on and student_weight.requires_grad,
        grad_on and student_bias is not None and student_bias.requires_grad,
    )
    opts = (kind, tau_s, tau_t, beta, int(chunk_size), compute_dtype, backend, bool(return_stats), need, est)
    loss, stats = _ChunkedDivergence.apply(
        h_s, student_weight, student_bias, h_t.detach(), teacher_weight.detach(),
        None if teacher_bias is None else teacher_bias.detach(), coef, opts,
    )
    if return_stats:
        return ChunkedOutput(loss, stats)
    return loss
