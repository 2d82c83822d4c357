r"""The training diagnostics that ride along the loss (PROTOCOL.md §4): per position the
``STAT_NAMES`` columns from the reference definitions (``token_stats``), and the teacher's entropy
and cross-entropy as token means (``entropy_and_cross_entropy``). No gradient."""

from __future__ import annotations

import torch
from torch import Tensor

from distillab.ops._checks import _check_batch, _check_logits_pair, _check_tau, _mask_logits
from distillab.ops.divergence import LOGPROB_FLOOR, token_divergence
from distillab.ops.reduction import reduce_loss

__all__ = ["token_stats", "entropy_and_cross_entropy"]


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
