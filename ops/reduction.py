r"""The reduction of per-token losses to the batch loss, and its coefficients.

Sequence objective (PROTOCOL.md §2)
-----------------------------------
    L(θ) = mean over examples of (1/L_y) Σ_n D(π_S(·|x,y<n), π_T(·|x,y<n))

over the completion positions (``mask`` True) only: ``reduce_loss(...,
reduction="seq_mean")``. Every reduction is L = Σ_i c_i D_i over the selected rows i
(``row_coefficients``), which is how the chunked and Triton paths reduce.
"""

from __future__ import annotations

import torch
from torch import Tensor

from distillab.ops._checks import _check_mask
from distillab.registry import REDUCTIONS, check_choice

__all__ = ["REDUCTIONS", "reduce_loss", "row_coefficients"]


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
    check_choice("reduction", reduction, REDUCTIONS)

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


def row_coefficients(
    seq_index: Tensor,
    num_seqs: int,
    *,
    reduction: str = "seq_mean",
    weights: Tensor | None = None,
    dtype: torch.dtype = torch.float64,
) -> Tensor:
    """The coefficients c_i with ``reduce_loss(D, mask)`` = Σ_i c_i D_i over the selected rows i
    (the chunked and Triton paths weight each row's divergence and gradient by them:
    ``ops.chunked``'s module docstring).

    Args:
        seq_index: (N,) int64, the sequence (0 ≤ b < num_seqs) of each selected row.
        num_seqs: B, the number of sequences (weights has B entries).
        reduction: ``"seq_mean"`` | ``"token_mean"`` | ``"sum"`` (as ``reduce_loss``).
        weights: optional (B,) per-sequence weights, detached; entries of sequences
            without rows are ignored (may be NaN).
        dtype: dtype of the result.

    Returns:
        (N,) tensor of coefficients, no grad.
    """
    check_choice("reduction", reduction, REDUCTIONS)
    if seq_index.dim() != 1 or seq_index.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"seq_index must be a 1-D integer tensor, got {seq_index.dtype} {tuple(seq_index.shape)}")
    n = seq_index.shape[0]
    if n and (int(seq_index.min()) < 0 or int(seq_index.max()) >= num_seqs):
        raise ValueError(f"seq_index values must be in [0, {num_seqs}), got [{int(seq_index.min())}, {int(seq_index.max())}]")
    with torch.no_grad():
        if reduction == "seq_mean":
            counts = torch.bincount(seq_index, minlength=num_seqs).to(dtype)  # (B,)
            k = (counts > 0).sum().clamp_min(1).to(dtype)
            coef = 1.0 / (counts[seq_index] * k)
        elif reduction == "token_mean":
            coef = torch.full((n,), 1.0 / max(n, 1), dtype=dtype, device=seq_index.device)
        else:
            coef = torch.ones(n, dtype=dtype, device=seq_index.device)
        if weights is not None:
            if not isinstance(weights, Tensor) or tuple(weights.shape) != (num_seqs,):
                got = tuple(weights.shape) if isinstance(weights, Tensor) else type(weights).__name__
                raise ValueError(f"weights must have shape (B,) = ({num_seqs},), got {got}")
            coef = coef * weights.detach().to(device=coef.device, dtype=dtype)[seq_index]
    return coef
