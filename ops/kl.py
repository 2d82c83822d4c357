r"""Token-level divergences for knowledge distillation and every estimator of them: the loss on
(B, T, V) logits (``distill_loss``), every estimator behind one switch (``estimator_loss``), and
the public face of the ops, which re-exports each op from its module:

- ``ops.divergence``: the math (definitions, gradients, the log-probability floor, the precision of
  the JSD gradient, numerics) and the float64-safe reference ``token_divergence`` with its
  closed-form rows ``token_divergence_and_grad``: the one reference every path and test uses;
- ``ops.reduction``: ``reduce_loss`` (the sequence objective) and ``row_coefficients``;
- ``ops.sampled``, ``ops.topk``, ``ops.rollout_token``: the estimators (sampled single token,
  top-k with or without a tail bucket, k1/k2/k3 on the rollout token), each with its source;
- ``ops.weights``: ``token_logprobs`` and the engine-mismatch importance weights;
- ``ops.diagnostics``: ``token_stats`` and ``entropy_and_cross_entropy``.

Source
------
PROTOCOL.md §2 (the objective) and GKD (Agarwal et al., 2024, Eq. 1) for JSD(β), in full in
``ops.divergence``; each estimator cites its own source in its module (above).

Sequence objective (PROTOCOL.md §2)
-----------------------------------
    L(θ) = mean over examples of (1/L_y) Σ_n D(π_S(·|x,y<n), π_T(·|x,y<n))

over the completion positions (``mask`` True) only: ``reduce_loss(...,
reduction="seq_mean")``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from distillab.ops._checks import COMPUTE_DTYPES, _check_batch, _mask_logits
from distillab.ops.diagnostics import entropy_and_cross_entropy, token_stats
from distillab.ops.divergence import LOGPROB_FLOOR, STAT_NAMES, token_divergence, token_divergence_and_grad
from distillab.ops.reduction import reduce_loss, row_coefficients
from distillab.ops.rollout_token import (
    LOG_RATIO_MAX,
    resolve_k_gradient,
    rollout_token_estimate_and_grad,
    rollout_token_loss,
    rollout_token_terms,
)
from distillab.ops.sampled import sampled_token_loss
from distillab.ops.topk import topk_divergence, topk_divergence_and_grad, topk_support
from distillab.ops.weights import engine_mismatch_weights, token_logprobs
from distillab.registry import (
    ESTIMATORS,
    K_GRADIENTS,
    KINDS,
    REDUCTIONS,
    ROLLOUT_ESTIMATORS,
    SAMPLED_KINDS,
    TOPK_SOURCES,
    check_estimator,
)

__all__ = [
    "KINDS",
    "SAMPLED_KINDS",
    "COMPUTE_DTYPES",
    "REDUCTIONS",
    "row_coefficients",
    "LOGPROB_FLOOR",
    "token_divergence",
    "token_divergence_and_grad",
    "STAT_NAMES",
    "reduce_loss",
    "distill_loss",
    "sampled_token_loss",
    "ESTIMATORS",
    "TOPK_SOURCES",
    "ROLLOUT_ESTIMATORS",
    "K_GRADIENTS",
    "LOG_RATIO_MAX",
    "topk_support",
    "topk_divergence",
    "topk_divergence_and_grad",
    "resolve_k_gradient",
    "rollout_token_terms",
    "rollout_token_loss",
    "rollout_token_estimate_and_grad",
    "EstimatorLoss",
    "estimator_loss",
    "engine_mismatch_weights",
    "entropy_and_cross_entropy",
    "token_logprobs",
    "token_stats",
]

# KINDS, SAMPLED_KINDS, ESTIMATORS, TOPK_SOURCES, ROLLOUT_ESTIMATORS, K_GRADIENTS, REDUCTIONS: the names of
# `distillab.registry` (imported above), which `config.LossConfig` reads too


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



class EstimatorLoss(NamedTuple):
    """``estimator_loss``: the training loss (with the estimator's gradient) and the
    estimator's value of the divergence it estimates (0-dim, detached; equal to the
    loss except for ``sampled``, whose loss is the paper's surrogate)."""

    loss: Tensor
    estimate: Tensor


def estimator_loss(
    student_logits: Tensor,
    teacher_logits: Tensor,
    mask: Tensor,
    *,
    estimator: str = "full",
    kind: str = "forward",
    tau_s: float = 1.0,
    tau_t: float = 0.5,
    beta: float = 0.5,
    top_k: int = 64,
    topk_source: str = "teacher",
    topk_tail: bool = False,
    k_gradient: str = "auto",
    targets: Tensor | None = None,
    generator: torch.Generator | None = None,
    reduction: str = "seq_mean",
    weights: Tensor | None = None,
    compute_dtype: torch.dtype = torch.float32,
) -> EstimatorLoss:
    r"""Every estimator of the token-level divergence behind one switch, on (B, T, V)
    logits (module docstring): ``full`` (``distill_loss``), ``sampled``
    (``sampled_token_loss``, kind forward/reverse), ``topk`` (``topk_divergence``
    reduced), ``k1`` | ``k2`` | ``k3`` (``rollout_token_loss``, kind reverse, needs
    ``targets``).

    Args:
        student_logits, teacher_logits, mask, kind, tau_s, tau_t, beta, reduction,
            weights, compute_dtype: as in ``distill_loss`` (``compute_dtype`` is read by
            full and topk; the others compute in float32, float64 for float64 logits).
        estimator: one of ``ESTIMATORS``.
        top_k, topk_source, topk_tail: the top-k support and tail bucket (``topk``).
        k_gradient: the rollout-token gradient (``k1``/``k2``/``k3``).
        targets: (B, T) int64 rollout tokens (``k1``/``k2``/``k3``).
        generator: the draws of ``sampled``.

    Returns:
        `EstimatorLoss` ``(loss, estimate)``.

    Raises:
        ValueError: an unknown estimator, a kind the estimator does not estimate
            (sampled: forward/reverse; k1/k2/k3: reverse), k-estimators without targets,
            and the errors of the functions above.
    """
    check_estimator(estimator, kind)
    common = dict(tau_s=tau_s, tau_t=tau_t, reduction=reduction, weights=weights)
    if estimator == "full":
        loss = distill_loss(student_logits, teacher_logits, mask, kind=kind, beta=beta, compute_dtype=compute_dtype,
                            **common)
        return EstimatorLoss(loss, loss.detach())
    if estimator == "sampled":
        loss, est = sampled_token_loss(student_logits, teacher_logits, mask, kind=kind, generator=generator,
                                       return_estimate=True, **common)
        return EstimatorLoss(loss, reduce_loss(est, mask, reduction=reduction, weights=weights))
    if estimator == "topk":
        _check_batch(student_logits, teacher_logits, mask)
        per_token = topk_divergence(_mask_logits(student_logits, mask), _mask_logits(teacher_logits.detach(), mask),
                                    kind=kind, top_k=top_k, topk_source=topk_source, topk_tail=topk_tail,
                                    tau_s=tau_s, tau_t=tau_t, beta=beta, compute_dtype=compute_dtype)
        loss = reduce_loss(per_token, mask, reduction=reduction, weights=weights)
        return EstimatorLoss(loss, loss.detach())
    if targets is None:
        raise ValueError(f"estimator {estimator!r} scores the rollout tokens: give targets (B, T)")
    loss = rollout_token_loss(student_logits, teacher_logits, targets, mask, estimator=estimator,
                              k_gradient=k_gradient, **common)
    return EstimatorLoss(loss, loss.detach())
