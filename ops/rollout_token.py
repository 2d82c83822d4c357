r"""The rollout-token estimators k1, k2, k3 of the reverse KL (``loss.estimator: k1 | k2 | k3``).

Rollout-token estimators (``loss.estimator: k1 | k2 | k3``)
-----------------------------------------------------------
Schulman's estimators of KL(q‖p) from x ~ q ("Approximating KL Divergence", 2020,
http://joschu.net/blog/kl-approx.html), with q = π_S, p = π_T and x = y, the token
the rollout itself sampled at the position (no extra draw). With
x_y = log π_S(y) − log π_T(y) and r = π_T(y)/π_S(y) = e^{−x_y}:

    k1 = x_y              E_{y~π_S}[k1] = KL(π_S‖π_T)                  (unbiased)
    k2 = ½ x_y²           E[k2] = KL(π_S‖π_T) + O(moments³)            (biased, low variance)
    k3 = (r − 1) − log r  E[k3] = KL(π_S‖π_T)  (E[r] = 1), k3 ≥ 0      (unbiased)

verl (verl/trainer/ppo/core_algos.py ``kl_penalty``: "kl"/"k1", "mse"/"k2",
"low_var_kl"/"k3"), OpenRLHF (openrlhf/models/utils.py ``compute_approx_kl``,
``kl_estimator``) and TRL's GRPO (k3) implement these. They are unbiased only on
the student's own samples at the loss temperature: with OffPD rollouts
(y ~ π_T) E[k1] = −KL(π_T‖π_S), so ``config`` refuses them unless
``rollout.policy: onpd``; rollouts sampled at another τ_S, with top-p < 1 or by
a mismatched engine are biased too (the oracle measures it).

The training gradient is a · ∇ log π_S(y) with a detached per-token coefficient
(``loss.k_gradient``):

* ``score``: a = k (REINFORCE with per-token reward −k, no baseline, no future
  tokens): the on-policy distillation of Tinker
  (tinker_cookbook/distillation/train_on_policy.py ``incorporate_kl_penalty``:
  advantage −(log p − log q) with the importance-sampling policy-gradient loss,
  discount 0) and slime (docs/en/advanced/on-policy-distillation.md, ``--use-opd``:
  Â_t = A_t − λ·(log π_S − log π_T)_t). E[k ∇log π_S] = ∇E_{π_S}[k] − E[∇k]: for
  k1 (E[∇k1] = E[∇log π_S] = 0) this is exactly ∇KL(π_S‖π_T); for k2, k3 it is
  biased.
* ``pathwise``: a = ∂k/∂log π_S(y), i.e. autograd of k as a loss, as verl's
  ``use_kl_loss`` / OpenRLHF's ``use_kl_loss`` / TRL's GRPO do with their KL terms:
  k1 → a = 1 (E[∇log π_S] = 0: pure noise), k2 → a = x_y (= the k1 score gradient:
  unbiased for ∇KL(π_S‖π_T)), k3 → a = 1 − r with E[(1 − r)∇log π_S] =
  −Σ_y π_T(y)∇log π_S(y) = ∇KL(π_T‖π_S): the *forward* KL's gradient
  (Shah et al. 2025, "A Comedy of Estimators: On KL Regularization in RL Training
  of LLMs", arXiv:2512.21852, analyse these biases).
* ``auto`` (default): score for k1, pathwise for k2 and k3 (what those tools do).

As a loss the value is the estimate and the gradient the surrogate's:
ℓ = k + a · (log π_S(y) − sg[log π_S(y)]) (``rollout_token_loss``); per row,
∂ℓ/∂z_S = a (e_y − π_S)/τ_S (``rollout_token_estimate_and_grad``). k3 clamps
log r at ``LOG_RATIO_MAX`` = 80 inside exp (finite in float32; active only where
π_S(y) < e^-80), and verl/OpenRLHF's ±10 clamps of k2/k3 are *not* applied.
"""

from __future__ import annotations

import torch
from torch import Tensor

from distillab.ops._checks import _check_batch, _check_compute_dtype, _check_logits_pair, _check_tau, _mask_logits
from distillab.ops.divergence import LOGPROB_FLOOR, _kl_pair, _stats
from distillab.ops.reduction import reduce_loss
from distillab.registry import K_GRADIENTS, REDUCTIONS, ROLLOUT_ESTIMATORS, check_choice

__all__ = ["ROLLOUT_ESTIMATORS", "K_GRADIENTS", "LOG_RATIO_MAX", "resolve_k_gradient", "rollout_token_terms",
           "rollout_token_loss", "rollout_token_estimate_and_grad"]

#: log r = log π_T(y) − log π_S(y) is clamped at this value inside exp (k3 only): e^80 is
#: finite in float32, and the clamp acts only where π_S(y) < e^-80 (r ≤ 1/π_S(y))
LOG_RATIO_MAX = 80.0


def resolve_k_gradient(estimator: str, k_gradient: str = "auto") -> str:
    """``k_gradient`` of a rollout-token estimator, with ``"auto"`` resolved to what the
    tools that use it do (module docstring): ``score`` for k1, ``pathwise`` for k2, k3.

    Raises:
        ValueError: an unknown estimator or gradient."""
    check_choice("rollout-token estimator", estimator, ROLLOUT_ESTIMATORS)
    check_choice("k_gradient", k_gradient, K_GRADIENTS)
    if k_gradient != "auto":
        return k_gradient
    return "score" if estimator == "k1" else "pathwise"


def rollout_token_terms(logp_s_y: Tensor, logp_t_y: Tensor, *, estimator: str,
                        k_gradient: str = "auto") -> tuple[Tensor, Tensor]:
    r"""The value and the gradient coefficient of a rollout-token estimator (module
    docstring, "Rollout-token estimators"), per token, no gradient.

    With x = log π_S(y) − log π_T(y) and r = π_T(y)/π_S(y) = e^{−x}:
    k1 = x, k2 = ½ x², k3 = (r − 1) − log r. The training gradient is a · ∇ log π_S(y)
    with a = the estimate (``score``: REINFORCE with reward −k) or a = ∂k/∂log π_S(y)
    (``pathwise``: autograd of k; 1, x, 1 − r).

    Args:
        logp_s_y, logp_t_y: (...) log π_S(y), log π_T(y) of the rollout tokens (nats;
            floored at ``LOGPROB_FLOOR`` by the callers).
        estimator: ``"k1"`` | ``"k2"`` | ``"k3"``. k_gradient: ``"auto"`` | ``"score"`` | ``"pathwise"``.

    Returns:
        ``(estimate, coef)``, two (...) detached tensors in the inputs' dtype.

    Raises:
        ValueError: unknown estimator or gradient.
    """
    how = resolve_k_gradient(estimator, k_gradient)
    with torch.no_grad():
        x = logp_s_y.detach() - logp_t_y.detach()
        if estimator == "k1":
            est, slope = x, torch.ones_like(x)
        elif estimator == "k2":
            est, slope = 0.5 * x * x, x
        else:
            r_m1 = torch.expm1((-x).clamp_max(LOG_RATIO_MAX))  # r − 1
            est, slope = r_m1 + x, -r_m1
        return est, (est if how == "score" else slope)


def _check_targets(targets: Tensor, shape: tuple[int, ...], V: int, mask: Tensor | None) -> Tensor:
    if not isinstance(targets, Tensor) or targets.dtype not in (torch.int64, torch.int32):
        raise TypeError("targets must be an integer torch.Tensor of rollout token ids")
    if tuple(targets.shape) != tuple(shape):
        raise ValueError(f"targets must have shape {tuple(shape)}, got {tuple(targets.shape)}")
    sel = targets[mask] if mask is not None else targets
    if sel.numel() and (int(sel.min()) < 0 or int(sel.max()) >= V):
        raise ValueError(f"targets must be token ids in [0, {V}), got [{int(sel.min())}, {int(sel.max())}]")
    safe = targets.to(torch.int64)
    return torch.where(mask, safe, 0) if mask is not None else safe


def rollout_token_loss(
    student_logits: Tensor,
    teacher_logits: Tensor,
    targets: Tensor,
    mask: Tensor,
    *,
    estimator: str = "k1",
    k_gradient: str = "auto",
    tau_s: float = 1.0,
    tau_t: float = 0.5,
    reduction: str = "seq_mean",
    weights: Tensor | None = None,
) -> Tensor:
    r"""The rollout-token estimators k1, k2, k3 of KL(π_S‖π_T) as a loss (module
    docstring, "Rollout-token estimators"; the float64-safe reference).

    Each completion position scores its own rollout token y = ``targets`` (the token
    the rollout sampled there, not an extra draw): the per-token term is
    ``k + a · (log π_S(y) − sg[log π_S(y)])`` with (k, a) = `rollout_token_terms`, so
    the loss *value* is the reduced estimate and its gradient is the reduced
    a · ∇ log π_S(y). Computation is in float32 (float64 for float64 logits).

    Args:
        student_logits: (B, T, V) float; gradients flow to it.
        teacher_logits: (B, T, V) float, detached.
        targets: (B, T) int64, the rollout token at each position (read at ``mask`` only).
        mask: (B, T) bool, True = completion position.
        estimator, k_gradient: as in `rollout_token_terms`.
        tau_s, tau_t: temperatures of π_S and π_T (> 0).
        reduction, weights: as in ``reduce_loss``.

    Returns:
        0-dim tensor, nats (the estimate of the reduced reverse KL).

    Raises:
        ValueError: shapes, τ, reduction, estimator, gradient, targets out of range.
        TypeError: mask not bool, targets not integer.
    """
    _check_batch(student_logits, teacher_logits, mask)
    tau_s, tau_t = _check_tau("tau_s", tau_s), _check_tau("tau_t", tau_t)
    check_choice("reduction", reduction, REDUCTIONS)
    y = _check_targets(targets, tuple(mask.shape), student_logits.shape[-1], mask).unsqueeze(-1)  # (B, T, 1)
    dtype = torch.promote_types(student_logits.dtype, torch.float32)
    logp_s = torch.log_softmax(_mask_logits(student_logits, mask).to(dtype) / tau_s, dim=-1)
    logp_t = torch.log_softmax(_mask_logits(teacher_logits.detach(), mask).to(dtype) / tau_t, dim=-1)
    ls_y = logp_s.gather(-1, y).squeeze(-1).clamp_min(LOGPROB_FLOOR)  # (B, T)
    lt_y = logp_t.gather(-1, y).squeeze(-1).clamp_min(LOGPROB_FLOOR)
    est, coef = rollout_token_terms(ls_y, lt_y, estimator=estimator, k_gradient=k_gradient)
    return reduce_loss(est + coef * (ls_y - ls_y.detach()), mask, reduction=reduction, weights=weights)


def rollout_token_estimate_and_grad(
    student_logits: Tensor,
    teacher_logits: Tensor,
    targets: Tensor,
    *,
    estimator: str,
    k_gradient: str = "auto",
    kind: str = "reverse",
    tau_s: float = 1.0,
    tau_t: float = 0.5,
    beta: float = 0.5,
    compute_dtype: torch.dtype = torch.float32,
    need_grad: bool = True,
    with_stats: bool = False,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    r"""`rollout_token_loss`'s rows in closed form: the estimate k, its gradient
    a · (e_y − π_S)/τ_S w.r.t. the student logits, and the full-vocabulary stats.

    Same interface as ``token_divergence_and_grad`` (the row math of the chunked op),
    plus ``targets`` (...) int64 and the estimator; ``kind`` must be ``"reverse"`` (the
    divergence k1, k2, k3 estimate) and ``beta`` is unused.

    Raises:
        ValueError: kind not "reverse", shapes, τ, estimator, gradient, targets.
    """
    _check_logits_pair(student_logits, teacher_logits)
    if kind != "reverse":
        raise ValueError(f"estimator {estimator!r} estimates the reverse KL; kind must be 'reverse', got {kind!r}")
    tau_s, tau_t = _check_tau("tau_s", tau_s), _check_tau("tau_t", tau_t)
    _check_compute_dtype(compute_dtype)
    y = _check_targets(targets, tuple(student_logits.shape[:-1]), student_logits.shape[-1], None).unsqueeze(-1)
    with torch.no_grad():
        ls = torch.log_softmax(student_logits.detach().to(compute_dtype) / tau_s, dim=-1)  # (..., V)
        lt = torch.log_softmax(teacher_logits.detach().to(compute_dtype) / tau_t, dim=-1)
        ps, pt = ls.exp(), lt.exp()
        ls.clamp_min_(LOGPROB_FLOOR)
        lt.clamp_min_(LOGPROB_FLOOR)
        stats = None
        if with_stats:
            _, fwd, rev = _kl_pair(ls, lt, ps, pt)
            stats = _stats(ls, lt, ps, pt, fwd, rev)
        est, coef = rollout_token_terms(ls.gather(-1, y).squeeze(-1), lt.gather(-1, y).squeeze(-1),
                                        estimator=estimator, k_gradient=k_gradient)
        grad = None
        if need_grad:  # a (e_y − π_S) / τ_S
            grad = ps.neg_().scatter_add_(-1, y, torch.ones_like(y, dtype=ps.dtype)).mul_(coef.unsqueeze(-1) / tau_s)
    return est, grad, stats
