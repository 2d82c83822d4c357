r"""The paper's single-token estimators (``loss.estimator: sampled``).

Sampled (single-token) estimators, one extra token drawn independently per position
-----------------------------------------------------------------------------------
(``loss.estimator: sampled``; PROTOCOL.md §2, the paper's robustness ablation.)

forward: y ~ π_T,  ℓ = −log π_S(y).  E[ℓ] = H(π_T, π_S) = KL(π_T‖π_S) + H(π_T), so
         its expectation equals the forward KL up to the teacher-entropy constant
         and E[∇ℓ] = ∇ KL(π_T‖π_S) = (π_S − π_T)/τ_S. Its estimate of the KL itself
         (``return_estimate``, the oracle's bias) is log π_T(y) − log π_S(y):
         E_{y~π_T} = KL(π_T‖π_S) exactly.
reverse: y ~ π_S,  ℓ = sg[log π_S(y) − log π_T(y)] · log π_S(y).
         E[∇ℓ] = Σ_y π_S(y) r_y ∇log π_S(y) = ∇ KL(π_S‖π_T) (because
         E[∇log π_S(y)] = 0); the *value* of ℓ is not a KL estimate; its estimate
         of the KL is log π_S(y) − log π_T(y): E_{y~π_S} = KL(π_S‖π_T) exactly.
"""

from __future__ import annotations

import torch
from torch import Tensor

from distillab.ops._checks import _check_batch, _check_kind, _check_tau, _mask_logits
from distillab.ops.divergence import LOGPROB_FLOOR
from distillab.ops.reduction import reduce_loss
from distillab.registry import REDUCTIONS, SAMPLED_KINDS, check_choice

__all__ = ["SAMPLED_KINDS", "sampled_token_loss"]


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
    return_estimate: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
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
        return_estimate: also return each position's single-draw estimate of the KL
            itself (module docstring): log π_T(y) − log π_S(y) for
            ``"forward"``, log π_S(y) − log π_T(y) for ``"reverse"`` (unbiased for
            KL(π_T‖π_S) and KL(π_S‖π_T) respectively; the oracle's bias uses it).

    Returns:
        0-dim tensor (nats for ``"forward"``), float32 or float64; with
        ``return_estimate`` the pair ``(loss, estimate)``, ``estimate`` (B, T) detached
        (meaningful at ``mask`` positions).

    Raises:
        ValueError: shape/vocab mismatch, bad τ, kind not "forward"/"reverse",
            unknown reduction. TypeError: mask not bool.
    """
    _check_batch(student_logits, teacher_logits, mask)
    tau_s = _check_tau("tau_s", tau_s)
    tau_t = _check_tau("tau_t", tau_t)
    _check_kind(kind, SAMPLED_KINDS)
    check_choice("reduction", reduction, REDUCTIONS)
    dtype = torch.promote_types(student_logits.dtype, torch.float32)
    V = student_logits.shape[-1]

    logp_s = torch.log_softmax(_mask_logits(student_logits, mask).to(dtype) / tau_s, dim=-1)
    logp_t = torch.log_softmax(_mask_logits(teacher_logits.detach(), mask).to(dtype) / tau_t, dim=-1)

    with torch.no_grad():
        probs = (logp_t if kind == "forward" else logp_s).exp().reshape(-1, V)
        y = torch.multinomial(probs, 1, generator=generator).view(*logp_s.shape[:-1], 1)

    lp_s_y = logp_s.gather(-1, y).squeeze(-1).clamp_min(LOGPROB_FLOOR)
    lp_t_y = logp_t.gather(-1, y).squeeze(-1).clamp_min(LOGPROB_FLOOR)
    if kind == "forward":
        per_token = -lp_s_y
    else:
        per_token = (lp_s_y - lp_t_y).detach() * lp_s_y
    loss = reduce_loss(per_token, mask, reduction=reduction, weights=weights)
    if not return_estimate:
        return loss
    sign = -1.0 if kind == "forward" else 1.0  # forward: log π_T(y) − log π_S(y); reverse: log π_S(y) − log π_T(y)
    return loss, (sign * (lp_s_y - lp_t_y)).detach()
