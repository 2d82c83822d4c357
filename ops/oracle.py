r"""The full-vocabulary oracle of an estimator: on the rows of one batch, the exact
divergences and their gradients w.r.t. the student logits, against which the
estimator's value (bias) and gradient (cosine) are measured (DESIGN.md "Ops").

Definitions
-----------
N selected rows i (completion positions) with reduction coefficients c_i
(``ops.chunked.row_coefficients``: the loss is L = Σ_i c_i D_i). The estimator in use
has the estimate L̂ of the reduced divergence of ``kind`` (``ops.kl.EstimatorLoss``'s
``estimate``) and the gradient Ĝ = ∂(training loss)/∂z_S, (N, V). The exact
gradients are G_k = c_i ∂D_k(i)/∂z_S for k ∈ {forward, reverse, kind}
(``ops.divergence.token_divergence_and_grad``, the closed forms of ``ops.divergence``):

    bias             = L̂ − Σ_i c_i D_kind(i)                     (nats)
    grad_cos         = ⟨Ĝ, G_kind⟩ / (‖Ĝ‖ ‖G_kind‖)               (Frobenius, over all rows)
    grad_norm_ratio  = ‖Ĝ‖ / ‖G_kind‖
    grad_cos_forward, grad_cos_reverse: the cosine with G_forward, G_reverse

The estimators k1, k2, k3 estimate the reverse KL, so ``kind`` is ``reverse`` for them
(`config.LossConfig` enforces it). ``full`` gives bias 0 and grad_cos 1 up to rounding.
A cosine is NaN where an exact gradient is 0 (student = teacher on every row).

Cost
----
The sums accumulate over chunks of rows in float64 and never hold more than one chunk
of (c, V) gradients. `chunked_oracle` recomputes the logits from the hidden states
(two lm_head matmuls per chunk, no backward, no model forward); `logits_oracle` reads
Ĝ from autograd on the logits a reference-path loss materialised anyway.
"""

from __future__ import annotations

import torch
from torch import Tensor

from distillab.ops._checks import _check_kind
from distillab.ops.chunked import RowEstimator, _check_2d, _logits, _upcast
from distillab.ops.divergence import token_divergence_and_grad
from distillab.registry import KINDS

__all__ = ["ORACLE_METRICS", "oracle_kinds", "oracle_sums", "oracle_metrics", "logits_oracle", "chunked_oracle"]

#: the names of `oracle_metrics` (``estimator/<name>`` in ``distillab.registry``)
ORACLE_METRICS = ("bias", "grad_cos", "grad_norm_ratio", "grad_cos_forward", "grad_cos_reverse")


def oracle_kinds(kind: str) -> tuple[str, ...]:
    """The divergences the oracle computes: forward and reverse KL, and ``kind`` (jsd) when it is neither."""
    _check_kind(kind, KINDS)
    return ("forward", "reverse") + (() if kind in ("forward", "reverse") else (kind,))


def oracle_sums(zs: Tensor, zt: Tensor, g_est: Tensor, coef: Tensor, *, kind: str, beta: float = 0.5,
                tau_s: float = 1.0, tau_t: float = 0.5, compute_dtype: torch.dtype = torch.float32) -> Tensor:
    r"""The oracle's sums over a chunk of rows (module docstring), to be added over chunks.

    Args:
        zs, zt: (c, V) student and teacher logits of the rows.
        g_est: (c, V) the estimator's gradient of the training loss w.r.t. ``zs``
            (coefficients included).
        coef: (c,) the rows' reduction coefficients c_i.
        kind, beta, tau_s, tau_t, compute_dtype: as in ``ops.divergence.token_divergence``.

    Returns:
        (1 + 3·K,) float64: [‖Ĝ‖², then per k of `oracle_kinds` (Σ c_i D_k, ⟨Ĝ, G_k⟩, ‖G_k‖²)].
    """
    c = coef.detach().to(torch.float64)
    g = g_est.detach().to(torch.float64)
    out = [torch.linalg.vecdot(g, g).sum()]
    for k in oracle_kinds(kind):
        div, grad, _ = token_divergence_and_grad(zs, zt, kind=k, tau_s=tau_s, tau_t=tau_t, beta=beta,
                                                 compute_dtype=compute_dtype)
        gk = grad.to(torch.float64).mul_(c.unsqueeze(1))  # (c, V) = c_i ∂D_k/∂z_S
        out += [(div.to(torch.float64) * c).sum(), torch.linalg.vecdot(g, gk).sum(), torch.linalg.vecdot(gk, gk).sum()]
    return torch.stack(out)


def oracle_metrics(sums: Tensor, estimate: float, kind: str) -> dict[str, float]:
    """`ORACLE_METRICS` from the summed `oracle_sums` and the estimator's estimate L̂ (module docstring)."""
    kinds = oracle_kinds(kind)
    s = sums.tolist()
    est_sq, per = s[0], {k: s[1 + 3 * i: 4 + 3 * i] for i, k in enumerate(kinds)}
    def cos(k: str) -> float:
        _, dot, sq = per[k]
        den = (est_sq * sq) ** 0.5
        return dot / den if den > 0 else float("nan")

    exact, _, sq = per[kind]
    return {
        "bias": float(estimate) - exact,
        "grad_cos": cos(kind),
        "grad_norm_ratio": (est_sq / sq) ** 0.5 if sq > 0 else float("nan"),
        "grad_cos_forward": cos("forward"),
        "grad_cos_reverse": cos("reverse"),
    }


def logits_oracle(student_logits: Tensor, teacher_logits: Tensor, g_est: Tensor, coef: Tensor, *, estimate: float,
                  kind: str, beta: float = 0.5, tau_s: float = 1.0, tau_t: float = 0.5, chunk_size: int = 1024,
                  compute_dtype: torch.dtype = torch.float32) -> dict[str, float]:
    """`oracle_metrics` of an estimator whose loss was computed on materialised logits.

    Args:
        student_logits, teacher_logits: (N, V) logits of the selected rows.
        g_est: (N, V) ∂(training loss)/∂``student_logits`` (e.g. ``torch.autograd.grad``).
        coef: (N,) reduction coefficients. estimate: the estimator's L̂ (nats).
        kind, beta, tau_s, tau_t, compute_dtype: the divergence (``ops.divergence``).
        chunk_size: rows per chunk of the exact gradients.

    Returns:
        ``{name: value}`` for `ORACLE_METRICS` ({} without rows).
    """
    for name, t in (("student_logits", student_logits), ("teacher_logits", teacher_logits), ("g_est", g_est)):
        _check_2d(name, t, student_logits.shape[0])
    if student_logits.shape[0] == 0:
        return {}
    sums = sum(oracle_sums(student_logits[lo:lo + chunk_size], teacher_logits[lo:lo + chunk_size],
                           g_est[lo:lo + chunk_size], coef[lo:lo + chunk_size], kind=kind, beta=beta, tau_s=tau_s,
                           tau_t=tau_t, compute_dtype=compute_dtype)
               for lo in range(0, student_logits.shape[0], chunk_size))
    return oracle_metrics(sums, estimate, kind)


@torch.no_grad()
def chunked_oracle(h_s: Tensor, w_s: Tensor, b_s: Tensor | None, h_t: Tensor, w_t: Tensor, b_t: Tensor | None,
                   coef: Tensor, *, est: RowEstimator | None, kind: str, beta: float = 0.5, tau_s: float = 1.0,
                   tau_t: float = 0.5, chunk_size: int = 1024,
                   compute_dtype: torch.dtype = torch.float32) -> dict[str, float]:
    """`oracle_metrics` of a chunked-path estimator (``ops.chunked.chunked_distill_loss``), from
    the hidden states and lm_heads of the selected rows: per chunk, the logits, the
    estimator's rows (``est``, None for ``full``: the divergence ``kind`` itself; the same
    row math as the loss) and the exact rows.

    Args:
        h_s, h_t: (N, H_S), (N, H_T) hidden states of the rows. w_s, w_t: (V, H) lm_heads;
            b_s, b_t: (V,) biases or None.
        coef: (N,) reduction coefficients (the loss's ``row_coefficients``).
        est: ``ops.chunked.estimator_rows`` of the estimator (its targets are the rows').
        kind, beta, tau_s, tau_t, chunk_size, compute_dtype: as in the loss.

    Returns:
        ``{name: value}`` for `ORACLE_METRICS` ({} without rows).
    """
    if h_s.shape[0] == 0:
        return {}
    ws_up, wt_up = _upcast(w_s), _upcast(w_t)
    sums, estimate = 0, 0.0
    for lo in range(0, h_s.shape[0], chunk_size):
        hi = min(lo + chunk_size, h_s.shape[0])
        zs, zt = _logits(h_s[lo:hi], w_s, b_s, ws_up), _logits(h_t[lo:hi], w_t, b_t, wt_up)  # (c, V)
        kw = dict(kind=kind, tau_s=tau_s, tau_t=tau_t, beta=beta, compute_dtype=compute_dtype)
        if est is None:
            div, grad, _ = token_divergence_and_grad(zs, zt, **kw)
        else:
            div, grad, _ = est(zs, zt, lo, hi, **kw)
        c = coef[lo:hi].to(torch.float64)
        estimate += float((div.to(torch.float64) * c).sum())
        sums = sums + oracle_sums(zs, zt, grad.to(torch.float64) * c.unsqueeze(1), c, **kw)
    return oracle_metrics(sums, estimate, kind)
