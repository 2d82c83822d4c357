"""Argument checks shared by the ops: each raises where the bad value enters, naming the argument
and the allowed values (``TypeError`` for a wrong type, ``ValueError`` for a wrong value), before
any compute."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from distillab.registry import KINDS, check_choice

COMPUTE_DTYPES = (torch.float32, torch.float64)


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
    check_choice("kind", kind, allowed)


def _check_beta(beta: float) -> float:
    beta = float(beta)
    if not 0.0 <= beta <= 1.0:  # also rejects NaN
        raise ValueError(f"beta must be in [0, 1], got {beta}")
    return beta


def _check_compute_dtype(dtype: torch.dtype) -> None:
    if dtype not in COMPUTE_DTYPES:
        raise ValueError(f"compute_dtype must be torch.float32 or torch.float64, got {dtype}")


def _check_divergence(kind: str, tau_s: float, tau_t: float, beta: float,
                      compute_dtype: torch.dtype = torch.float32) -> tuple[str, float, float, float]:
    """Validated ``(kind, tau_s, tau_t, beta)`` of a divergence, a JSD endpoint named as the KL
    it is (β = 0: forward, β = 1: reverse; ``ops.divergence``). Raises as ``token_divergence``."""
    tau_s, tau_t = _check_tau("tau_s", tau_s), _check_tau("tau_t", tau_t)
    _check_kind(kind, KINDS)
    beta = _check_beta(beta)
    _check_compute_dtype(compute_dtype)
    if kind == "jsd" and beta in (0.0, 1.0):
        kind = "forward" if beta == 0.0 else "reverse"
    return kind, tau_s, tau_t, beta


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
