r"""Token-level divergences for knowledge distillation: a float64-safe PyTorch reference.

Source
------
PROTOCOL.md §2 (the objective), restating "On-Policy or Off-Policy Learning? A
Systematic Study of Distillation Dynamics" (Piskorz, Berthon, van der Schaar,
2026). The generalised Jensen–Shannon divergence JSD(β) is from GKD (Agarwal et
al., 2024, "On-Policy Distillation of Language Models", Eq. 1). Everything here
is plain PyTorch (no custom kernels); a fused kernel must match it.

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

Gradient with the log-probability floor (what autograd of the code below gives)
------------------------------------------------------------------------------
With ℓ_S = max(log π_S, F), ℓ_T = max(log π_T, F), F = LOGPROB_FLOOR and
k_v = 1[log π_S(v) > F] (the floor has zero gradient):

    forward   ∂D_F/∂z_S(v) = (π_S(v) Σ_u π_T(u) k_u − π_T(v) k_v) / τ_S
    reverse   ∂D_R/∂z_S(v) = π_S(v) (r_v − D_R) / τ_S,   r_v = ℓ_S(v) − ℓ_T(v)
    jsd       ∂D_β/∂z_S(v) = (1 − β) π_S(v) (g_v − Σ_u π_S(u) g_u) / τ_S,  g_v = ℓ_S(v) − log M(v)

The forward form equals (π_S − π_T)/τ_S unless the student puts (numerically) zero
mass where the teacher does not (then the floor cuts that entry's pull). In the
other two the floor only touches entries with π_S(v) = 0 exactly, which multiply
by π_S(v). ``token_divergence_and_grad`` evaluates these closed forms without
autograd: it is the per-row math of the chunked and Triton ops.

Sequence objective (PROTOCOL.md §2)
-----------------------------------
    L(θ) = mean over examples of (1/L_y) Σ_n D(π_S(·|x,y<n), π_T(·|x,y<n))

over the completion positions (``mask`` True) only: ``reduce_loss(...,
reduction="seq_mean")``.

Sampled (single-token) estimators, one extra token drawn independently per position
-----------------------------------------------------------------------------------
forward: y ~ π_T,  ℓ = −log π_S(y).  E[ℓ] = H(π_T, π_S) = KL(π_T‖π_S) + H(π_T), so
         its expectation equals the forward KL up to the teacher-entropy constant
         and E[∇ℓ] = ∇ KL(π_T‖π_S) = (π_S − π_T)/τ_S.
reverse: y ~ π_S,  ℓ = sg[log π_S(y) − log π_T(y)] · log π_S(y).
         E[∇ℓ] = Σ_y π_S(y) r_y ∇log π_S(y) = ∇ KL(π_S‖π_T) (because
         E[∇log π_S(y)] = 0); the *value* of ℓ is not a KL estimate.

Engine-mismatch correction (PROTOCOL.md §2)
--------------------------------------------
w(y) = (1/|y|) Σ_t min(clip, exp(log p_θ(y_t) − log q(y_t))), detached, one
weight per sequence, multiplying that sequence's token loss (clip = 2).

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
  computation in ``distill_loss``/``sampled_token_loss`` and excluded with
  ``torch.where`` in ``reduce_loss``, so garbage there (NaN, ±inf) affects
  neither the value nor the gradient (their gradient is exactly 0).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = [
    "KINDS",
    "REDUCTIONS",
    "LOGPROB_FLOOR",
    "token_divergence",
    "token_divergence_and_grad",
    "STAT_NAMES",
    "reduce_loss",
    "distill_loss",
    "sampled_token_loss",
    "engine_mismatch_weights",
    "entropy_and_cross_entropy",
    "token_logprobs",
    "token_stats",
]

KINDS = ("forward", "reverse", "jsd")
SAMPLED_KINDS = ("forward", "reverse")
REDUCTIONS = ("seq_mean", "token_mean", "sum")
COMPUTE_DTYPES = (torch.float32, torch.float64)
LOGPROB_FLOOR = -1e4
"""Floor (nats) for log-probabilities inside differences; see the module docstring."""


# --------------------------------------------------------------------------- checks


def _check_logits_pair(student_logits: Tensor, teacher_logits: Tensor) -> None:
    for name, t in (("student_logits", student_logits), ("teacher_logits", teacher_logits)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
        if t.dim() < 1 or t.shape[-1] < 1:
            raise ValueError(f"{name} must have shape (..., V) with V >= 1, got {tuple(t.shape)}")
    s, t = tuple(student_logits.shape), tuple(teacher_logits.shape)
    if s[-1] != t[-1]:
        raise ValueError(
            f"vocab size mismatch: student V={s[-1]}, teacher V={t[-1]} "
            f"(student_logits shape {s}, teacher_logits shape {t}); teacher and student "
            "must share a tokenizer and an output vocabulary of the same size"
        )
    if s != t:
        raise ValueError(f"shape mismatch: student_logits shape {s} != teacher_logits shape {t}")


def _check_tau(name: str, tau: float) -> float:
    tau = float(tau)
    if not (math.isfinite(tau) and tau > 0):
        raise ValueError(f"{name} must be a finite temperature > 0, got {tau}")
    return tau


def _check_kind(kind: str, allowed: tuple[str, ...]) -> None:
    if kind not in allowed:
        raise ValueError(f"unknown kind {kind!r}; allowed values: {', '.join(map(repr, allowed))}")


def _check_beta(beta: float) -> float:
    beta = float(beta)
    if not 0.0 <= beta <= 1.0:  # also rejects NaN
        raise ValueError(f"beta must be in [0, 1], got {beta}")
    return beta


def _check_compute_dtype(dtype: torch.dtype) -> None:
    if dtype not in COMPUTE_DTYPES:
        raise ValueError(f"compute_dtype must be torch.float32 or torch.float64, got {dtype}")


def _check_batch(student_logits: Tensor, teacher_logits: Tensor, mask: Tensor) -> None:
    _check_logits_pair(student_logits, teacher_logits)
    if student_logits.dim() != 3:
        raise ValueError(f"logits must have shape (B, T, V), got {tuple(student_logits.shape)}")
    _check_mask(mask, tuple(student_logits.shape[:2]), "logits (B, T)")


def _check_mask(mask: Tensor, shape: tuple[int, ...], what: str) -> None:
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
        raise TypeError(f"mask must be a torch.bool tensor (True = completion token), got {got}")
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(f"mask shape {tuple(mask.shape)} != {what} shape {tuple(shape)}")


def _mask_logits(logits: Tensor, mask: Tensor) -> Tensor:
    """Zero the logits of positions with ``mask`` False (finite, NaN-free, zero gradient there)."""
    return torch.where(mask.unsqueeze(-1), logits, torch.zeros((), dtype=logits.dtype, device=logits.device))


# ----------------------------------------------------------------------- divergences


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

    Raises:
        ValueError: shapes differ (a vocabulary-size mismatch names both sizes);
            τ ≤ 0 or non-finite; unknown ``kind``; ``beta`` outside [0, 1];
            ``compute_dtype`` not float32/float64.
        TypeError: non-tensor or non-floating-point logits.
    """
    _check_logits_pair(student_logits, teacher_logits)
    tau_s = _check_tau("tau_s", tau_s)
    tau_t = _check_tau("tau_t", tau_t)
    _check_kind(kind, KINDS)
    beta = _check_beta(beta)
    _check_compute_dtype(compute_dtype)

    logp_s = torch.log_softmax(student_logits.to(compute_dtype) / tau_s, dim=-1)
    logp_t = torch.log_softmax(teacher_logits.to(compute_dtype) / tau_t, dim=-1)

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
    tau_s = _check_tau("tau_s", tau_s)
    tau_t = _check_tau("tau_t", tau_t)
    _check_kind(kind, KINDS)
    beta = _check_beta(beta)
    _check_compute_dtype(compute_dtype)
    if kind == "jsd" and beta in (0.0, 1.0):
        kind = "forward" if beta == 0.0 else "reverse"

    with torch.no_grad():
        # Each line is one pass over (..., V): the passes, not the flops, set the time of this function
        # at a large V (benchmarks/kl_ops.py). So: no division by τ = 1, the floor's clamp and the forward
        # gradient's mask only where a log-probability is below the floor (an −inf or ±1e4 logit), and
        # only the row sums the requested outputs need.
        ls = torch.log_softmax(_scaled(student_logits, tau_s, compute_dtype), dim=-1)  # (..., V)
        lt = torch.log_softmax(_scaled(teacher_logits, tau_t, compute_dtype), dim=-1)  # (..., V)
        ps, pt = ls.exp(), lt.exp()
        floored_s = ls.numel() > 0 and bool(ls.amin() <= LOGPROB_FLOOR)
        keep = ls > LOGPROB_FLOOR if (need_grad and kind == "forward" and floored_s) else None
        if floored_s:
            ls.clamp_min_(LOGPROB_FLOOR)
        if lt.numel() and bool(lt.amin() < LOGPROB_FLOOR):
            lt.clamp_min_(LOGPROB_FLOOR)
        stats = None
        if with_stats or kind != "jsd":
            diff = lt - ls  # (..., V)
            fwd = _rowdot(pt, diff)
            rev = -_rowdot(ps, diff) if (with_stats or kind == "reverse") else None
            if with_stats:  # H(π_T) = −π_T·ℓ_T; H(π_T, π_S) = −π_T·ℓ_S = H(π_T) + KL(π_T‖π_S)
                h_t = -_rowdot(pt, lt)
                stats = torch.stack([fwd, rev, h_t, h_t + fwd], dim=-1)
        grad = None
        if kind == "forward":
            div = fwd
            if need_grad:
                if keep is not None:
                    pt.mul_(keep)
                grad = ps.mul_(pt.sum(-1, keepdim=True)).sub_(pt)
                if tau_s != 1.0:
                    grad.div_(tau_s)
        elif kind == "reverse":
            div = rev
            if need_grad:  # π_S (r − D) = −π_S (diff + D)
                grad = diff.add_(div.unsqueeze(-1)).mul_(ps).neg_()
                if tau_s != 1.0:
                    grad.div_(tau_s)
        else:
            log_m = torch.logaddexp(lt + math.log(beta), ls + math.log1p(-beta))  # (..., V)
            g_t = _rowdot(pt, lt - log_m)
            g = ls.sub_(log_m)  # ℓ_S − log M, in place
            g_s = _rowdot(ps, g)
            div = beta * g_t + (1.0 - beta) * g_s
            if need_grad:
                grad = g.sub_(g_s.unsqueeze(-1)).mul_(ps).mul_((1.0 - beta) / tau_s)
    return div, grad, stats


# ------------------------------------------------------------------------ reductions


def reduce_loss(
    per_token: Tensor,
    mask: Tensor,
    *,
    reduction: str = "seq_mean",
    weights: Tensor | None = None,
) -> Tensor:
    r"""Reduce a per-token loss over the completion positions of a batch.

    Args:
        per_token: (B, T) float tensor of per-position losses (nats). Values at
            positions with ``mask`` False are ignored (may be NaN/inf) and get a
            zero gradient.
        mask: (B, T) bool tensor, True = completion token that counts.
        reduction:
            ``"seq_mean"`` (PROTOCOL.md §2, default): mean over each sequence's
            masked tokens, then mean over the sequences with ≥ 1 masked token
            (sequences with none contribute nothing);
            ``"token_mean"``: sum over all masked tokens / number of masked tokens;
            ``"sum"``: sum over masked tokens.
        weights: optional (B,) per-sequence weights (e.g. ``engine_mismatch_weights``),
            detached here. ``seq_mean``: mean_b w_b · mean_t ℓ_bt (over sequences
            with tokens; not renormalised by Σ w); ``token_mean``/``sum``: each
            token of sequence b is multiplied by w_b.

    Returns:
        0-dim tensor, dtype of ``per_token``. With no masked token at all it is a
        zero still connected to ``per_token``'s graph (backward gives zero grads).

    Raises:
        ValueError: ``per_token`` not 2-D, ``mask``/``weights`` shape mismatch,
            unknown ``reduction`` (the message names the allowed values).
        TypeError: ``mask`` not bool, ``per_token`` not floating point.
    """
    if not isinstance(per_token, Tensor) or not per_token.is_floating_point():
        raise TypeError("per_token must be a floating-point torch.Tensor")
    if per_token.dim() != 2:
        raise ValueError(f"per_token must have shape (B, T), got {tuple(per_token.shape)}")
    _check_mask(mask, tuple(per_token.shape), "per_token (B, T)")
    if reduction not in REDUCTIONS:
        raise ValueError(f"unknown reduction {reduction!r}; allowed values: {', '.join(map(repr, REDUCTIONS))}")

    zero = torch.zeros((), dtype=per_token.dtype, device=per_token.device)
    safe = torch.where(mask, per_token, zero)
    n_tok = mask.sum(dim=1)  # (B,)
    has = n_tok > 0

    w = None
    if weights is not None:
        if not isinstance(weights, Tensor) or tuple(weights.shape) != (per_token.shape[0],):
            got = tuple(weights.shape) if isinstance(weights, Tensor) else type(weights).__name__
            raise ValueError(f"weights must have shape (B,) = ({per_token.shape[0]},), got {got}")
        w = weights.detach().to(per_token.dtype)

    if reduction == "seq_mean":
        per_seq = safe.sum(dim=1) / n_tok.clamp_min(1).to(per_token.dtype)
        if w is not None:
            per_seq = per_seq * torch.where(has, w, zero)
        return torch.where(has, per_seq, zero).sum() / has.sum().clamp_min(1).to(per_token.dtype)

    if w is not None:
        safe = safe * torch.where(mask, w.unsqueeze(1), zero)
    total = safe.sum()
    if reduction == "sum":
        return total
    return total / n_tok.sum().clamp_min(1).to(per_token.dtype)


# ------------------------------------------------------------------------- the loss


def distill_loss(
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
    compute_dtype: torch.dtype = torch.float32,
) -> Tensor:
    r"""Full-vocabulary distillation loss of PROTOCOL.md §2 for a padded batch.

    ``reduce_loss(token_divergence(z_S, sg[z_T]), mask)``: the divergence is
    computed at every position (positions with ``mask`` False get zero logits
    first, so garbage there cannot leak NaN into the value or the gradient),
    then reduced over the masked positions. The teacher logits are detached.
    Memory is O(B·T·V) in ``compute_dtype`` (reference, not a fused kernel).

    Args:
        student_logits: (B, T, V) float tensor, any float dtype; row (b, t) is
            the student's next-token logits at completion position t.
        teacher_logits: (B, T, V) float tensor, same shape; treated as constants.
        mask: (B, T) bool, True = completion token (padding and prompt False).
        kind, tau_s, tau_t, beta, compute_dtype: as in ``token_divergence``.
        reduction, weights: as in ``reduce_loss`` (default ``"seq_mean"``).

    Returns:
        0-dim tensor in ``compute_dtype``, nats.

    Raises:
        ValueError: logits not (B, T, V), shape/vocab mismatch (names both
            sizes), mask shape mismatch, bad τ/kind/beta/reduction/dtype.
        TypeError: mask not bool, logits not floating point.
    """
    _check_batch(student_logits, teacher_logits, mask)
    per_token = token_divergence(
        _mask_logits(student_logits, mask),
        _mask_logits(teacher_logits.detach(), mask),
        kind=kind,
        tau_s=tau_s,
        tau_t=tau_t,
        beta=beta,
        compute_dtype=compute_dtype,
    )
    return reduce_loss(per_token, mask, reduction=reduction, weights=weights)


def sampled_token_loss(
    student_logits: Tensor,
    teacher_logits: Tensor,
    mask: Tensor,
    *,
    kind: str = "forward",
    tau_s: float = 1.0,
    tau_t: float = 0.5,
    generator: torch.Generator | None = None,
    reduction: str = "seq_mean",
    weights: Tensor | None = None,
) -> Tensor:
    r"""Single-sampled-token estimators of PROTOCOL.md §2 (the robustness ablation).

    At every position one extra token y is drawn independently (not the rollout
    token) with ``torch.multinomial(..., generator=generator)``:

    * ``"forward"``: y ~ π_T (no grad), ℓ = −log π_S(y). E_y[ℓ] = H(π_T, π_S)
      = KL(π_T‖π_S) + H(π_T): the forward KL up to the teacher-entropy constant,
      with the same expected gradient (π_S − π_T)/τ_S.
    * ``"reverse"``: y ~ π_S (sampled from detached probabilities),
      ℓ = sg[log π_S(y) − log π_T(y)] · log π_S(y). E_y[∇ℓ] = ∇ KL(π_S‖π_T);
      the value of ℓ itself is not a KL estimate.

    log π_S(y) and log π_T(y) are floored at ``LOGPROB_FLOOR`` (finite loss when
    the sampled token has zero probability under the other model). Computation
    is in float32, or float64 when the student logits are float64. Positions with
    ``mask`` False get zero logits (so they still draw a token, consuming the
    generator identically whatever their contents) and are reduced away.

    Args:
        student_logits: (B, T, V) float tensor; gradients flow to it.
        teacher_logits: (B, T, V) float tensor, same shape; detached.
        mask: (B, T) bool, True = completion token.
        kind: ``"forward"`` or ``"reverse"``.
        tau_s, tau_t: temperatures (> 0) of π_S and π_T.
        generator: ``torch.Generator`` on the logits' device; a seeded generator
            makes the result reproducible. None uses the global RNG.
        reduction, weights: as in ``reduce_loss``.

    Returns:
        0-dim tensor (nats for ``"forward"``), float32 or float64.

    Raises:
        ValueError: shape/vocab mismatch, bad τ, kind not "forward"/"reverse",
            unknown reduction. TypeError: mask not bool.
    """
    _check_batch(student_logits, teacher_logits, mask)
    tau_s = _check_tau("tau_s", tau_s)
    tau_t = _check_tau("tau_t", tau_t)
    _check_kind(kind, SAMPLED_KINDS)
    if reduction not in REDUCTIONS:
        raise ValueError(f"unknown reduction {reduction!r}; allowed values: {', '.join(map(repr, REDUCTIONS))}")
    dtype = torch.promote_types(student_logits.dtype, torch.float32)
    V = student_logits.shape[-1]

    logp_s = torch.log_softmax(_mask_logits(student_logits, mask).to(dtype) / tau_s, dim=-1)
    logp_t = torch.log_softmax(_mask_logits(teacher_logits.detach(), mask).to(dtype) / tau_t, dim=-1)

    with torch.no_grad():
        probs = (logp_t if kind == "forward" else logp_s).exp().reshape(-1, V)
        y = torch.multinomial(probs, 1, generator=generator).view(*logp_s.shape[:-1], 1)

    lp_s_y = logp_s.gather(-1, y).squeeze(-1).clamp_min(LOGPROB_FLOOR)
    if kind == "forward":
        per_token = -lp_s_y
    else:
        lp_t_y = logp_t.gather(-1, y).squeeze(-1).clamp_min(LOGPROB_FLOOR)
        per_token = (lp_s_y - lp_t_y).detach() * lp_s_y
    return reduce_loss(per_token, mask, reduction=reduction, weights=weights)


# ------------------------------------------------------------------ weights / diagnostics


def token_logprobs(logits: Tensor, targets: Tensor, tau: float = 1.0) -> Tensor:
    r"""log softmax(z/τ)[y]: the log-probability of each target token under the
    temperature-τ distribution of its logits. The one definition every caller uses:
    the sampler's logprobs (``rollout``), the trainer's log p_θ of rollout tokens
    (importance weights, RLVR's π_θ and π_old), ``ops.chunked.token_logprobs_from_hidden``.

    Args:
        logits: (..., V) float tensor (any float dtype; cast to float32, or kept float64).
        targets: (...) int64 token ids.
        tau: temperature (> 0).

    Returns:
        (...) float32 (float64 for float64 logits), nats, with gradient w.r.t. ``logits``.

    Raises:
        ValueError: τ ≤ 0; ``targets`` shape not ``logits.shape[:-1]``.
    """
    tau = _check_tau("tau", tau)
    if tuple(targets.shape) != tuple(logits.shape[:-1]):
        raise ValueError(f"targets must have shape {tuple(logits.shape[:-1])}, got {tuple(targets.shape)}")
    z = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return torch.log_softmax(z / tau, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def token_stats(student_logits: Tensor, teacher_logits: Tensor, *, tau_s: float = 1.0, tau_t: float = 0.5,
                compute_dtype: torch.dtype = torch.float32) -> Tensor:
    r"""The per-position diagnostics of ``STAT_NAMES`` from the reference definitions:
    [KL(π_T‖π_S), KL(π_S‖π_T), H(π_T), H(π_T, π_S)], detached.

    Args:
        student_logits, teacher_logits: (..., V) float tensors of equal shape.
        tau_s, tau_t, compute_dtype: as in ``token_divergence``.

    Returns:
        (..., 4) tensor in ``compute_dtype``, nats (the same columns as
        ``token_divergence_and_grad(..., with_stats=True)``).
    """
    _check_logits_pair(student_logits, teacher_logits)
    with torch.no_grad():
        s, t = student_logits.detach(), teacher_logits.detach()
        kw = dict(tau_s=tau_s, tau_t=tau_t, compute_dtype=compute_dtype)
        fwd = token_divergence(s, t, kind="forward", **kw)
        rev = token_divergence(s, t, kind="reverse", **kw)
        logp_s = torch.log_softmax(s.to(compute_dtype) / _check_tau("tau_s", tau_s), dim=-1)
        logp_t = torch.log_softmax(t.to(compute_dtype) / _check_tau("tau_t", tau_t), dim=-1)
        p_t = logp_t.exp()
        ent = -(p_t * logp_t.clamp_min(LOGPROB_FLOOR)).sum(-1)
        ce = -(p_t * logp_s.clamp_min(LOGPROB_FLOOR)).sum(-1)
        return torch.stack([fwd, rev, ent, ce], dim=-1)


def engine_mismatch_weights(
    logp_train: Tensor,
    logp_engine: Tensor,
    mask: Tensor,
    clip: float = 2.0,
) -> Tensor:
    r"""Per-sequence engine-mismatch weights w(y) of PROTOCOL.md §2.

    w_b = (1/|y_b|) Σ_{t: mask} min(clip, exp(log p_θ(y_bt) − log q(y_bt))), where
    p_θ is the trainer's sampling distribution (softmax(z/τ)) and q the inference
    engine's; sequences with no masked token get weight 0.

    Args:
        logp_train: (B, T) float, log p_θ of the sampled tokens (nats).
        logp_engine: (B, T) float, log q of the same tokens (nats).
        mask: (B, T) bool, True = completion token. Values at False positions
            are ignored (may be NaN/inf).
        clip: upper clip of the per-token ratio (> 0; PROTOCOL.md: 2).

    Returns:
        (B,) detached tensor, dtype of ``logp_train`` promoted to ≥ float32.

    Raises:
        ValueError: shape mismatch or ``clip`` ≤ 0. TypeError: mask not bool.
    """
    if tuple(logp_train.shape) != tuple(logp_engine.shape) or logp_train.dim() != 2:
        raise ValueError(
            f"logp_train and logp_engine must both be (B, T), got {tuple(logp_train.shape)} "
            f"and {tuple(logp_engine.shape)}"
        )
    _check_mask(mask, tuple(logp_train.shape), "logp_train (B, T)")
    clip = float(clip)
    if not clip > 0:
        raise ValueError(f"clip must be > 0, got {clip}")
    dtype = torch.promote_types(torch.promote_types(logp_train.dtype, logp_engine.dtype), torch.float32)
    with torch.no_grad():
        diff = torch.where(mask, logp_train.detach().to(dtype) - logp_engine.detach().to(dtype), 0.0)
        ratio = torch.where(mask, diff.exp().clamp_max(clip), 0.0)
        n = mask.sum(dim=1)
        return torch.where(n > 0, ratio.sum(dim=1) / n.clamp_min(1).to(dtype), 0.0)


def entropy_and_cross_entropy(
    student_logits: Tensor,
    teacher_logits: Tensor,
    mask: Tensor,
    tau_s: float = 1.0,
    tau_t: float = 0.5,
) -> tuple[Tensor, Tensor]:
    r"""Training diagnostics of PROTOCOL.md §4: teacher entropy and cross-entropy.

    Token means over the masked positions (no grad) of
    H(π_T) = −Σ_v π_T log π_T and H(π_T, π_S) = −Σ_v π_T log π_S
    (= H(π_T) + KL(π_T‖π_S)), with 0·log 0 = 0 and log π_S floored at
    ``LOGPROB_FLOOR``.

    Args:
        student_logits, teacher_logits: (B, T, V) float tensors of equal shape.
        mask: (B, T) bool, True = completion token.
        tau_s, tau_t: temperatures (> 0) of π_S and π_T.

    Returns:
        (teacher_entropy, cross_entropy): two 0-dim detached tensors in nats,
        float32 (float64 for float64 input); both 0 when no token is masked.

    Raises:
        ValueError / TypeError: as ``distill_loss``.
    """
    _check_batch(student_logits, teacher_logits, mask)
    tau_s = _check_tau("tau_s", tau_s)
    tau_t = _check_tau("tau_t", tau_t)
    dtype = torch.promote_types(torch.promote_types(student_logits.dtype, teacher_logits.dtype), torch.float32)
    with torch.no_grad():
        logp_s = torch.log_softmax(_mask_logits(student_logits.detach(), mask).to(dtype) / tau_s, dim=-1)
        logp_t = torch.log_softmax(_mask_logits(teacher_logits.detach(), mask).to(dtype) / tau_t, dim=-1)
        p_t = logp_t.exp()
        ent = -(p_t * logp_t.clamp_min(LOGPROB_FLOOR)).sum(-1)
        ce = -(p_t * logp_s.clamp_min(LOGPROB_FLOOR)).sum(-1)
        return (
            reduce_loss(ent, mask, reduction="token_mean"),
            reduce_loss(ce, mask, reduction="token_mean"),
        )
