"""RLVR after distillation (PROTOCOL.md §6): the GRPO pieces that do not depend on
the training loop: rewards, group-normalised advantages and the DAPO token-level
policy-gradient loss. (The RLVR stage that runs them inside a trial is not built
yet: issue 5.)

- GRPO: Shao et al. 2024, "DeepSeekMath", §4.1 (group-relative advantages).
- DAPO: Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at
  Scale", Eq. 8 (token-level loss, decoupled clip ε_low / ε_high).
"""

from __future__ import annotations

import torch
from torch import Tensor

from distillab.tasks import CountdownProblem, extract_answer, score_countdown


def countdown_reward(completion: str, problem: CountdownProblem, *, correct: float = 2.0,
                     format_reward: float = 0.0) -> float:
    """Reward of one completion (PROTOCOL.md §6): ``correct`` (2.0) when the verifier
    accepts its ``<answer>`` (`tasks.score_countdown`; model text is parsed, never
    evaluated), else 0, plus ``format_reward`` (≤ 0.5) when it has exactly one
    ``<answer>...</answer>`` block.

    Raises:
        ValueError: ``format_reward`` outside [0, 0.5] or ``correct`` < 0.
    """
    if not 0.0 <= format_reward <= 0.5:
        raise ValueError(f"format_reward must be in [0, 0.5], got {format_reward}")
    if correct < 0:
        raise ValueError(f"correct must be >= 0, got {correct}")
    r = correct if score_countdown(completion, problem) else 0.0
    if format_reward and completion.count("<answer>") == 1 and extract_answer(completion) is not None:
        r += format_reward
    return r


def group_advantages(rewards: Tensor, group_size: int, *, eps: float = 1e-4, scale: bool = True) -> Tensor:
    r"""GRPO group-normalised advantages (DeepSeekMath §4.1.2):
    Â_i = (R_i − mean_g R) / (std_g R + eps) over each group g of ``group_size``
    consecutive samples of the same prompt (``std`` with Bessel's correction, as in
    TRL's GRPOTrainer); ``scale=False`` gives R_i − mean_g R. A group whose rewards are
    all equal gets 0 for every sample (no NaN).

    Args:
        rewards: (B,) float tensor, B = prompts × ``group_size``, prompt-major.
        group_size: samples per prompt, ≥ 2.

    Returns:
        (B,) float tensor, dtype of ``rewards`` (float32 at least).

    Raises:
        ValueError: ``rewards`` not 1-D, ``group_size`` < 2, or B not a multiple of it.
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be (B,), got shape {tuple(rewards.shape)}")
    if group_size < 2:
        raise ValueError(f"group_size (samples per prompt) must be >= 2, got {group_size}")
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards are not a multiple of group_size {group_size}")
    r = rewards.to(torch.promote_types(rewards.dtype, torch.float32)).view(-1, group_size)
    centred = r - r.mean(dim=1, keepdim=True)
    if scale:
        centred = centred / (r.std(dim=1, keepdim=True) + eps)
    return centred.reshape(-1)


def dapo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    beta: float = 0.0,
    ref_logp: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    r"""DAPO token-level clipped policy-gradient loss (Yu et al. 2025, Eq. 8), to minimise:

        L = − (1 / Σ_i |o_i|) Σ_i Σ_t [ min(ρ_it Â_i, clip(ρ_it, 1 − ε_low, 1 + ε_high) Â_i)
                                        − β · KL_it ]

    with ρ_it = exp(log π_θ(o_it) − log π_old(o_it)), every completion token of the
    batch weighted equally (the token-level sum, not a mean per sequence), and, when
    β > 0, the k3 estimator KL_it = exp(r_it) − r_it − 1 with r_it = log π_ref − log π_θ
    (PROTOCOL.md §6 uses β = 0: no reference model).

    Args:
        logp: (B, T) float, log π_θ of the sampled tokens (with gradient).
        old_logp: (B, T) float, log π_old of the same tokens (the sampling policy;
            treated as constants).
        advantages: (B,) float, one per sequence (`group_advantages`).
        mask: (B, T) bool, True = completion token.
        eps_low, eps_high: clip range (DAPO: 0.2, 0.28), both ≥ 0.
        beta: reference-KL coefficient (≥ 0); needs ``ref_logp`` when > 0.
        ref_logp: (B, T) float log π_ref, constants.

    Returns:
        ``(loss, stats)``: 0-dim tensor (nats), and floats ``clip_frac`` (share of
        tokens whose ratio was clipped), ``ratio_mean`` and ``kl`` (0 when β = 0).

    Raises:
        ValueError: shape mismatches, negative ε or β, β > 0 without ``ref_logp``.
        TypeError: ``mask`` not bool.
    """
    if logp.dim() != 2 or old_logp.shape != logp.shape or mask.shape != logp.shape:
        raise ValueError(f"logp, old_logp and mask must share one (B, T) shape, got {tuple(logp.shape)}, "
                         f"{tuple(old_logp.shape)}, {tuple(mask.shape)}")
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be bool, got {mask.dtype}")
    if advantages.shape != (logp.shape[0],):
        raise ValueError(f"advantages must be (B,) = ({logp.shape[0]},), got {tuple(advantages.shape)}")
    if eps_low < 0 or eps_high < 0 or beta < 0:
        raise ValueError(f"eps_low, eps_high and beta must be >= 0, got {eps_low}, {eps_high}, {beta}")
    if beta > 0 and (ref_logp is None or ref_logp.shape != logp.shape):
        raise ValueError("beta > 0 needs ref_logp of the same (B, T) shape as logp")
    n = mask.sum().clamp_min(1)
    diff = torch.where(mask, logp - old_logp.detach(), 0.0)
    ratio = diff.exp()
    adv = advantages.detach().to(ratio.dtype)[:, None]
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    per_token = torch.minimum(ratio * adv, clipped * adv)
    kl = torch.zeros_like(per_token)
    if beta > 0:
        r = torch.where(mask, ref_logp.detach() - logp, 0.0)
        kl = r.exp() - r - 1.0
        per_token = per_token - beta * kl
    loss = -(torch.where(mask, per_token, 0.0).sum() / n)
    with torch.no_grad():
        was_clipped = mask & ((ratio < 1.0 - eps_low) | (ratio > 1.0 + eps_high))
        stats = {
            "clip_frac": float(was_clipped.sum() / n),
            "ratio_mean": float(torch.where(mask, ratio, 0.0).sum() / n),
            "kl": float(torch.where(mask, kl, 0.0).sum() / n),
        }
    return loss, stats


__all__ = ["countdown_reward", "group_advantages", "dapo_loss"]
