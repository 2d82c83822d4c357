r"""The log-probabilities of sampled tokens and the engine-mismatch importance weights built from them.

``token_logprobs``: log softmax(z/τ)[y], the one definition that the sampler, the trainer's
importance weights and RLVR's π_θ / π_old all use.

Engine-mismatch correction (PROTOCOL.md §2)
--------------------------------------------
w(y) = (1/|y|) Σ_t min(clip, exp(log p_θ(y_t) − log q(y_t))), detached, one
weight per sequence, multiplying that sequence's token loss (clip = 2).
"""

from __future__ import annotations

import torch
from torch import Tensor

from distillab.ops._checks import _check_mask, _check_tau

__all__ = ["token_logprobs", "engine_mismatch_weights"]


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
