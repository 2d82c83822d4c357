r"""The token-level divergences of knowledge distillation: the math written out, the float64-safe
PyTorch reference (``token_divergence``, ground truth of every test and of the chunked, Triton and
oracle paths, which import it from here) and the closed-form per-row math with its gradient
(``token_divergence_and_grad``, the rows of the chunked and Triton ops).

Source
------
PROTOCOL.md §2 (the objective), restating "On-Policy or Off-Policy Learning? A
Systematic Study of Distillation Dynamics" (Piskorz, Berthon, van der Schaar,
2026). The generalised Jensen–Shannon divergence JSD(β) is from GKD (Agarwal et
al., 2024, "On-Policy Distillation of Language Models", Eq. 1). The estimators of
``loss.estimator`` (``ops.kl.estimator_loss``: full, sampled, topk, k1, k2, k3) each
cite their source in their module (``ops.sampled``, ``ops.topk``, ``ops.rollout_token``).
Everything here is plain PyTorch (no custom kernels); a fused kernel must match it.

Notation
--------
z_S, z_T ∈ R^V are the student and teacher logits at one position, τ_S, τ_T > 0
the loss temperatures (PROTOCOL.md: τ_T = 0.5, τ_S = 1.0), and

    π_S = softmax(z_S / τ_S),        π_T = softmax(z_T / τ_T).

All divergences are in nats, per position, summed over the full vocabulary. No
τ² factor (Hinton-style) is applied.

Definitions and gradients w.r.t. the student logits z_S
-------------------------------------------------------
forward  D_F = KL(π_T ‖ π_S) = Σ_v π_T(v) (log π_T(v) − log π_S(v))

    ∂D_F/∂z_S(v) = (π_S(v) − π_T(v)) / τ_S

reverse  D_R = KL(π_S ‖ π_T) = Σ_v π_S(v) (log π_S(v) − log π_T(v))

    with r_v = log π_S(v) − log π_T(v):
    ∂D_R/∂z_S(v) = π_S(v) (r_v − D_R) / τ_S

jsd      M = β π_T + (1 − β) π_S,
         D_β = β KL(π_T ‖ M) + (1 − β) KL(π_S ‖ M)          for 0 < β < 1

    with g_v = log π_S(v) − log M(v):
    ∂D_β/∂z_S(v) = (1 − β) π_S(v) (g_v − Σ_u π_S(u) g_u) / τ_S

    Endpoint convention (same as TRL's ``GKDTrainer.generalized_jsd_loss``):
    β = 0 returns exactly the forward KL(π_T ‖ π_S) and β = 1 exactly the
    reverse KL(π_S ‖ π_T); both endpoints run the forward/reverse code path, so
    the results are bitwise equal. Note that the unscaled D_β tends to 0 (not to
    a KL) as β → 0 or β → 1 (D_β ≈ β·KL(π_T‖π_S) near 0 and
    ≈ (1−β)·KL(π_S‖π_T) near 1), so the family is discontinuous at its
    endpoints; the endpoints are a naming convenience, not a limit.

Gradient with the log-probability floor (what the code below differentiates to)
-------------------------------------------------------------------------------
With ℓ_S = max(log π_S, F), ℓ_T = max(log π_T, F), F = LOGPROB_FLOOR and
k_v = 1[log π_S(v) > F] (the floor has zero gradient):

    forward   ∂D_F/∂z_S(v) = (π_S(v) Σ_u π_T(u) k_u − π_T(v) k_v) / τ_S
    reverse   ∂D_R/∂z_S(v) = π_S(v) (r_v − D_R) / τ_S,   r_v = ℓ_S(v) − ℓ_T(v)
    jsd       ∂D_β/∂z_S(v) = (1 − β) π_S(v) (g_v − Σ_u π_S(u) g_u) / τ_S,  g_v = ℓ_S(v) − log M(v)

The forward form equals (π_S − π_T)/τ_S unless the student puts (numerically) zero
mass where the teacher does not (then the floor cuts that entry's pull). In the
other two the floor only touches entries with π_S(v) = 0 exactly, which multiply
by π_S(v). ``token_divergence_and_grad`` evaluates these closed forms without
autograd: it is the per-row math of the chunked and Triton ops. Forward and reverse
are autograd of ``token_divergence``; its JSD has this closed form as its backward
(section "Precision of the JSD gradient" below).

Precision of the JSD gradient
-----------------------------
The JSD gradient (1 − β) π_S (g − Σ π_S g), g = ℓ_S − log M, cancels when the
divergence saturates: where π_S ≫ π_T, g → −log(1 − β) on all of π_S's mass, and
g − ḡ is a difference of two numbers ≈ 0.69 that agree to many digits (float32
relative error 1.8e-2 at V = 32,000 with logit std 8, β = 0.5; 1.4e2 at std 16).
The gradient is invariant to a constant shift of g, so the row math uses

    h = g + log(1 − β) = −log(1 + (β/(1 − β)) e^{ℓ_T − ℓ_S}) = −softplus(ℓ_T − ℓ_S + log(β/(1 − β)))

which is tiny where the mass is (computed with relative precision) and exact in
both regimes: ∂D_β/∂z_S = (1 − β) π_S (h − Σ π_S h)/τ_S (``_closed_form``; the
Triton kernel computes log1p with Goldberg's formula). The value keeps the
log M form (accurate near D = 0, where h − Σ π_S h would cancel instead).
Autograd through log M (and the log-softmax) computes the g − ḡ form, so the
reference ``token_divergence`` (and with it ``distill_loss``, the ``full`` and
renormalised ``topk`` estimators and the oracle's reference-path gradient) runs
its JSD as an autograd function whose backward is ``_closed_form`` itself
(``_JSDivergence``; w.r.t. the teacher logits the same form with S, T and β,
1 − β swapped): float32 within 1e-6 of float64 at std 8 and 16
(``benchmarks/jsd_precision.py``; autograd through log M: up to 1e-2 and 2e2).
The top-k tail bucket (``topk_divergence(tail=True)``) is still autograd of the
log M form; its closed form is ``topk_divergence_and_grad``.

Numerics
--------
* Inputs of any float dtype (bf16, fp16, fp32, fp64) are cast to
  ``compute_dtype`` (float32 by default, float64 allowed) before
  ``log_softmax``; nothing is computed as ``log(softmax(·))``.
* Masked vocabulary entries (logit −inf) are allowed: 0·log 0 is taken as 0.
* Log-probabilities entering a difference are clamped below at
  ``LOGPROB_FLOOR = -1e4`` nats. A log-probability below −1e4 is a probability
  < e^-10000, exactly 0 in every float format, so the clamp changes nothing
  except that (a) 0·(−∞) becomes 0·(finite) = 0 and (b) a support mismatch
  (π_T(v) = 0 < π_S(v) in the reverse KL, or π_S(v) = 0 < π_T(v) in the forward
  KL), mathematically +∞, becomes the large finite penalty
  π(v)·(log π(v) + 1e4). Logits of ±1e4 therefore give finite values and
  gradients. The clamp has zero gradient below the floor.
* Positions with ``mask`` False are replaced by zero logits before any
  computation in ``ops.kl.distill_loss``/``ops.sampled.sampled_token_loss`` and
  excluded with ``torch.where`` in ``ops.reduction.reduce_loss``, so garbage there
  (NaN, ±inf) affects neither the value nor the gradient (their gradient is exactly 0).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from distillab.ops._checks import _check_divergence, _check_logits_pair

__all__ = ["LOGPROB_FLOOR", "STAT_NAMES", "token_divergence", "token_divergence_and_grad"]

LOGPROB_FLOOR = -1e4
"""Floor (nats) for log-probabilities inside differences; see the module docstring."""


def _xlogratio(p: Tensor, logp_a: Tensor, logp_b: Tensor) -> Tensor:
    """Σ_v p (logp_a − logp_b) with 0·(−inf) = 0 and the documented log-prob floor."""
    a = logp_a.clamp_min(LOGPROB_FLOOR)
    b = logp_b.clamp_min(LOGPROB_FLOOR)
    return (p * (a - b)).sum(dim=-1)


def token_divergence(
    student_logits: Tensor,
    teacher_logits: Tensor,
    *,
    kind: str,
    tau_s: float = 1.0,
    tau_t: float = 0.5,
    beta: float = 0.5,
    compute_dtype: torch.dtype = torch.float32,
) -> Tensor:
    r"""Per-position divergence between π_S = softmax(z_S/τ_S) and π_T = softmax(z_T/τ_T).

    Args:
        student_logits: (..., V) float tensor (bf16/fp16/fp32/fp64), the student's
            logits z_S. Gradients flow to it.
        teacher_logits: (..., V) float tensor of the same shape, the teacher's
            logits z_T. Not detached here (``distill_loss`` detaches it).
        kind: ``"forward"`` = KL(π_T‖π_S), ``"reverse"`` = KL(π_S‖π_T), or
            ``"jsd"`` = generalised JSD(β) with M = β π_T + (1−β) π_S
            (β = 0 is exactly forward, β = 1 exactly reverse; see module docstring).
        tau_s, tau_t: softmax temperatures (> 0) of student and teacher.
        beta: JSD interpolation weight in [0, 1] (ignored unless ``kind == "jsd"``,
            but always validated).
        compute_dtype: ``torch.float32`` (default) or ``torch.float64``; the logits
            are cast to it before ``log_softmax``.

    Returns:
        (...) tensor in ``compute_dtype``: the divergence in nats at each position,
        ≥ 0 up to rounding. Finite for −inf logits (masked vocabulary entries) and
        logits of magnitude up to ~1e4 (log-probs floored at ``LOGPROB_FLOOR``).
        Differentiable w.r.t. both logits (module docstring's gradients); for ``"jsd"``
        the backward is the closed form (``_JSDivergence``; once differentiable).

    Raises:
        ValueError: shapes differ (a vocabulary-size mismatch names both sizes);
            τ ≤ 0 or non-finite; unknown ``kind``; ``beta`` outside [0, 1];
            ``compute_dtype`` not float32/float64.
        TypeError: non-tensor or non-floating-point logits.
    """
    _check_logits_pair(student_logits, teacher_logits)
    kind, tau_s, tau_t, beta = _check_divergence(kind, tau_s, tau_t, beta, compute_dtype)

    z_s, z_t = student_logits.to(compute_dtype) / tau_s, teacher_logits.to(compute_dtype) / tau_t
    if kind == "jsd":  # the closed-form backward: "Precision of the JSD gradient"
        return _JSDivergence.apply(z_s, z_t, beta)
    return _logprob_divergence(torch.log_softmax(z_s, dim=-1), torch.log_softmax(z_t, dim=-1), kind, beta)


def _logprob_divergence(logp_s: Tensor, logp_t: Tensor, kind: str, beta: float) -> Tensor:
    """Σ_v of the per-entry terms of ``kind`` given log-probabilities (..., V) -> (...):
    the math of ``token_divergence`` after its log-softmax. The terms are summed as
    given (no normalisation here), so entries of −inf log-probability add nothing and
    a top-k tail bucket is one more entry (``topk_divergence``)."""
    if kind == "forward" or (kind == "jsd" and beta == 0.0):
        return _xlogratio(logp_t.exp(), logp_t, logp_s)
    if kind == "reverse" or (kind == "jsd" and beta == 1.0):
        return _xlogratio(logp_s.exp(), logp_s, logp_t)

    # 0 < beta < 1. Floored log-probs keep logsumexp's inputs finite (an all -inf pair
    # would give a NaN gradient); e^-1e4 is 0 in every dtype, so M is unchanged.
    ls = logp_s.clamp_min(LOGPROB_FLOOR)
    lt = logp_t.clamp_min(LOGPROB_FLOOR)
    log_m = torch.logsumexp(torch.stack([lt + math.log(beta), ls + math.log1p(-beta)]), dim=0)
    return beta * _xlogratio(logp_t.exp(), lt, log_m) + (1.0 - beta) * _xlogratio(logp_s.exp(), ls, log_m)


class _JSDivergence(torch.autograd.Function):
    r"""JSD(β) per position of scaled logits ``z_s`` = z_S/τ_S, ``z_t`` = z_T/τ_T (..., V) in the
    compute dtype, 0 < β < 1: the value of ``_logprob_divergence`` (the log M form) and, as the
    backward, the closed form of the chunked row math (``_closed_form``: (1 − β) π_S (h − Σ π_S h)
    with h = −softplus(ℓ_T − ℓ_S + log(β/(1 − β))), module docstring "Precision of the JSD
    gradient"), where autograd through log M would cancel when the divergence saturates.
    W.r.t. ``z_t`` the same form with the roles swapped: D_β(π_T, π_S) = D_{1−β}(π_S, π_T) read the
    other way round, so ∂D_β/∂z_t = β π_T (h' − Σ π_T h'), h' = −softplus(ℓ_S − ℓ_T + log((1 − β)/β)).
    Saves the two floored log-probabilities (..., V); not twice differentiable."""

    @staticmethod
    def forward(ctx, z_s: Tensor, z_t: Tensor, beta: float) -> Tensor:
        logp_s, logp_t = torch.log_softmax(z_s, dim=-1), torch.log_softmax(z_t, dim=-1)
        ctx.beta = beta
        ctx.save_for_backward(logp_s.clamp_min(LOGPROB_FLOOR), logp_t.clamp_min(LOGPROB_FLOOR))
        return _logprob_divergence(logp_s, logp_t, "jsd", beta)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_div: Tensor) -> tuple[Tensor | None, Tensor | None, None]:
        ls, lt = ctx.saved_tensors
        beta, scale = ctx.beta, grad_div.unsqueeze(-1)
        row = dict(keep=None, kind="jsd", tau_s=1.0, need_grad=True, with_stats=False)
        g_s = g_t = None
        if ctx.needs_input_grad[0]:  # _closed_form overwrites only its own temporaries for jsd (not ls, lt)
            g_s = _closed_form(ls, lt, ls.exp(), lt.exp(), beta=beta, **row)[1].mul_(scale)
        if ctx.needs_input_grad[1]:
            g_t = _closed_form(lt, ls, lt.exp(), ls.exp(), beta=1.0 - beta, **row)[1].mul_(scale)
        return g_s, g_t, None


STAT_NAMES = ("forward_kl", "reverse_kl", "teacher_entropy", "cross_entropy")
"""Column order of the ``stats`` returned by ``token_divergence_and_grad`` (nats)."""


def _scaled(logits: Tensor, tau: float, compute_dtype: torch.dtype) -> Tensor:
    """z/τ in ``compute_dtype``, detached (no division, and no copy of a ``compute_dtype``
    input, when τ = 1: the result may then be ``logits`` itself, which callers do not modify)."""
    z = logits.detach().to(compute_dtype)
    return z if tau == 1.0 else z / tau


def _rowdot(a: Tensor, b: Tensor) -> Tensor:
    """Σ_v a·b over the last dim, (..., V) x (..., V) -> (...), with pairwise-accurate
    summation (a batched ``a @ b`` accumulates sequentially: ~20x the rounding error)."""
    return torch.linalg.vecdot(a, b)


def token_divergence_and_grad(
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
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    r"""``token_divergence`` and its gradient w.r.t. the student logits, in closed form.

    The per-row math of the chunked and Triton ops (no autograd graph, so the
    memory is a few (..., V) temporaries). Values equal ``token_divergence``
    (same log-softmax, floor and endpoint conventions) and the gradient equals
    autograd of it (module docstring, "Gradient with the log-probability floor").

    Args:
        student_logits, teacher_logits: (..., V) float tensors of equal shape.
        kind, tau_s, tau_t, beta, compute_dtype: as in ``token_divergence``.
        need_grad: compute the gradient (else it is returned as None).
        with_stats: also return the diagnostics of ``STAT_NAMES`` per position.

    Returns:
        ``(div, grad, stats)``: ``div`` (...) the divergence in nats; ``grad``
        (..., V) = ∂div/∂z_S per position, or None; ``stats`` (..., 4) detached
        [forward KL, reverse KL, H(π_T), H(π_T, π_S)] or None. All in
        ``compute_dtype``; nothing requires grad.

    Raises:
        As ``token_divergence``.
    """
    _check_logits_pair(student_logits, teacher_logits)
    kind, tau_s, tau_t, beta = _check_divergence(kind, tau_s, tau_t, beta, compute_dtype)

    with torch.no_grad():
        # Each line is one pass over (..., V): the passes, not the flops, set the time of this function
        # at a large V (benchmarks/kl_ops.py). So: no division by τ = 1, the floor's clamp and the forward
        # gradient's mask only where a log-probability is below the floor (an −inf or ±1e4 logit), and
        # only the row sums the requested outputs need.
        ls = torch.log_softmax(_scaled(student_logits, tau_s, compute_dtype), dim=-1)  # (..., V)
        lt = torch.log_softmax(_scaled(teacher_logits, tau_t, compute_dtype), dim=-1)  # (..., V)
        ps, pt = ls.exp(), lt.exp()
        # the floor's clamp and mask only where a log-prob is below it (no pass over (..., V) otherwise)
        floored_s = ls.numel() > 0 and bool(ls.amin() <= LOGPROB_FLOOR)
        keep = ls > LOGPROB_FLOOR if (need_grad and kind == "forward" and floored_s) else None
        if floored_s:
            ls.clamp_min_(LOGPROB_FLOOR)
        if lt.numel() and bool(lt.amin() < LOGPROB_FLOOR):
            lt.clamp_min_(LOGPROB_FLOOR)
        return _closed_form(ls, lt, ps, pt, keep, kind=kind, beta=beta, tau_s=tau_s, need_grad=need_grad,
                            with_stats=with_stats)


def _kl_pair(ls: Tensor, lt: Tensor, ps: Tensor, pt: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(diff, fwd, rev)``: ℓ_T − ℓ_S (..., V), KL(π_T‖π_S) and KL(π_S‖π_T) (...) from floored log-probs."""
    diff = lt - ls  # (..., V)
    return diff, _rowdot(pt, diff), -_rowdot(ps, diff)


def _stats(ls: Tensor, lt: Tensor, ps: Tensor, pt: Tensor, fwd: Tensor, rev: Tensor) -> Tensor:
    """The ``STAT_NAMES`` columns (..., 4) from floored log-probs and both KLs."""
    return torch.stack([fwd, rev, -_rowdot(pt, lt), -_rowdot(pt, ls)], dim=-1)


def _closed_form(ls: Tensor, lt: Tensor, ps: Tensor, pt: Tensor, keep: Tensor | None, *, kind: str, beta: float,
                 tau_s: float, need_grad: bool, with_stats: bool) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """The rows of ``token_divergence_and_grad`` from floored log-probabilities ``ls``,
    ``lt`` and probability weights ``ps``, ``pt`` (..., V), all four overwritten;
    ``keep`` (forward gradient only; None: every entry) marks entries with ℓ_S above the
    floor. The top-k estimators call it with their own log-probs and weights (module
    docstring, "Top-k")."""
    stats = None
    if with_stats or kind != "jsd":
        diff, fwd, rev = _kl_pair(ls, lt, ps, pt)
        if with_stats:
            stats = _stats(ls, lt, ps, pt, fwd, rev)
    grad = None
    if kind == "forward":
        div = fwd
        if need_grad:
            if keep is not None:
                pt.masked_fill_(~keep, 0.0)
            grad = ps.mul_(pt.sum(-1, keepdim=True)).sub_(pt)
    elif kind == "reverse":
        div = rev
        if need_grad:  # π_S (r − D) = −π_S (diff + D)
            grad = diff.add_(div.unsqueeze(-1)).mul_(ps).neg_()
    else:
        log_m = torch.logaddexp(lt + math.log(beta), ls + math.log1p(-beta))  # (..., V)
        div = beta * _rowdot(pt, lt - log_m) + (1.0 - beta) * _rowdot(ps, ls - log_m)
        if need_grad:  # h = g + log(1 − β) = −softplus(ℓ_T − ℓ_S + log(β/(1 − β))): "Precision of the JSD gradient"
            h = F.softplus(log_m.copy_(lt).sub_(ls).add_(math.log(beta) - math.log1p(-beta))).neg_()
            grad = h.sub_(_rowdot(ps, h).unsqueeze(-1)).mul_(ps).mul_((1.0 - beta) / tau_s)
    if grad is not None and kind != "jsd" and tau_s != 1.0:
        grad.div_(tau_s)
    return div, grad, stats
