r"""Token-level divergences for knowledge distillation and every estimator of them: a float64-safe
PyTorch reference.

Source
------
PROTOCOL.md §2 (the objective), restating "On-Policy or Off-Policy Learning? A
Systematic Study of Distillation Dynamics" (Piskorz, Berthon, van der Schaar,
2026). The generalised Jensen–Shannon divergence JSD(β) is from GKD (Agarwal et
al., 2024, "On-Policy Distillation of Language Models", Eq. 1). The estimators of
``loss.estimator`` (``estimator_loss``: full, sampled, topk, k1, k2, k3) each cite
their source in their section below. Everything here is plain PyTorch (no custom
kernels); a fused kernel must match it.

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

Sequence objective (PROTOCOL.md §2)
-----------------------------------
    L(θ) = mean over examples of (1/L_y) Σ_n D(π_S(·|x,y<n), π_T(·|x,y<n))

over the completion positions (``mask`` True) only: ``reduce_loss(...,
reduction="seq_mean")``.

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

Top-k estimators (``loss.estimator: topk``)
-------------------------------------------
The divergence of ``kind`` restricted to a support S of about k entries per
position, as in TRL's experimental ``DistillationTrainer``
(trl/experimental/distillation/distillation_config.py: ``loss_top_k`` with a
teacher, student or union support and ``loss_add_tail``), NeMo-RL's top-64
teacher logits and verl's teacher top-k forward KL (verl issue #7856).

    S_T = {v : z_T(v) ≥ z_T^(k)},   S_S = {v : z_S(v) ≥ z_S^(k)}      (z^(k): the k-th largest)
    S = S_T (``topk_source: teacher``), S_S (``student``) or S_T ∪ S_S (``union``)

Ties at the k-th value are all kept (|S| ≥ k, and S does not depend on the order
of the vocabulary); k ≥ V gives S = the vocabulary. The same S is used for both
models, and ``kind`` (forward, reverse, jsd(β)) is applied, unchanged, to the two
reduced distributions:

renormalised (``topk_tail: false``):  π̃(v) = π(v) / Σ_{u∈S} π(u) on S, 0 off S,

    D̃ = D(π̃_S, π̃_T)   (= ``token_divergence`` of the logits with −inf off S)

tail bucket (``topk_tail: true``): the |S| + 1 categories S ∪ {t} with
q(v) = π(v) on S and q(t) = Σ_{v∉S} π(v), for each model,

    D̃ = Σ_{c ∈ S ∪ {t}} d(q_S(c), q_T(c))   (d: the per-category term of ``kind``).

Both are exact (D̃ = D) at k ≥ V. The tail bucket is biased below (merging
categories never increases an f-divergence, and KL and JSD(β) are f-divergences:
the data-processing inequality); the renormalised one can err either way.
Gradient: with ℓ = log π (full vocabulary) and the tail's log mass
ℓ(t) = log Σ_{v∉S} π(v), write the *effective* log-probabilities ℓ^e(v) = ℓ(v) on
S and ℓ^e(v) = ℓ(t) off S. Since ∂ℓ(t)/∂z(v) = (π(v)/q(t) − π(v))/τ for v ∉ S, the
tail-bucket gradient is the full-vocabulary formula of the module docstring with
ℓ_S, ℓ_T replaced by ℓ^e_S, ℓ^e_T (weights π_S(v) kept), and for the forward KL
π_T(v) replaced off S by q_T(t) · π_S(v)/q_S(t) (the teacher's tail mass spread like
the student's):

    forward   ∂D̃/∂z_S(v) = (π_S(v) − w_T(v)) / τ_S,   w_T = π_T on S, q_T(t) π_S/q_S(t) off S
    reverse   ∂D̃/∂z_S(v) = π_S(v) (ℓ^e_S(v) − ℓ^e_T(v) − D̃) / τ_S
    jsd       the JSD formula with g^e = ℓ^e_S − log M^e

(``topk_divergence_and_grad``, checked against autograd of ``topk_divergence``).
The renormalised gradient is the full formula on the renormalised log-probs (zero
off S). The per-token diagnostics (kl/forward, ...) stay the full-vocabulary values.

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
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from distillab.registry import (
    ESTIMATORS,
    K_GRADIENTS,
    KINDS,
    REDUCTIONS,
    ROLLOUT_ESTIMATORS,
    SAMPLED_KINDS,
    TOPK_SOURCES,
    check_choice,
    check_estimator,
)

__all__ = [
    "KINDS",
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
    it is (β = 0: forward, β = 1: reverse; module docstring). Raises as ``token_divergence``."""
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
    if reduction not in REDUCTIONS:
        raise ValueError(f"unknown reduction {reduction!r}; allowed values: {', '.join(map(repr, REDUCTIONS))}")
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
            itself (module docstring, "Sampled"): log π_T(y) − log π_S(y) for
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


# ------------------------------------------------------------------ top-k estimators


def _check_topk(k: int, source: str) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"top_k must be an integer >= 1, got {k!r}")
    check_choice("topk_source", source, TOPK_SOURCES)
    return k


def topk_support(student_logits: Tensor, teacher_logits: Tensor, *, top_k: int, topk_source: str = "teacher") -> Tensor:
    r"""The top-k support S of each position (module docstring, "Top-k"): the entries
    whose logit is at least the k-th largest (k = ``top_k``) of the teacher (``topk_source="teacher"``), of
    the student (``"student"``) or either (``"union"``: S_T ∪ S_S). Ties at the k-th
    value are all included, so |S| ≥ k (the support depends on the distributions only,
    not on the order of the vocabulary); k ≥ V gives the whole vocabulary.

    Args:
        student_logits, teacher_logits: (..., V) float tensors of equal shape (ranks are
            the same at any temperature τ > 0).
        top_k: entries per model (≥ 1). topk_source: ``"teacher"`` | ``"student"`` | ``"union"``
            (the names of `config.LossConfig`'s fields).

    Returns:
        (..., V) bool, True on S. No gradient.

    Raises:
        ValueError: shapes differ, k < 1, an unknown source.
    """
    _check_logits_pair(student_logits, teacher_logits)
    k, source = _check_topk(top_k, topk_source), topk_source
    V = student_logits.shape[-1]
    with torch.no_grad():
        def top(z: Tensor) -> Tensor:
            if k >= V:
                return torch.ones_like(z, dtype=torch.bool)
            return z >= torch.topk(z, k, dim=-1).values[..., -1:]

        if source == "teacher":
            return top(teacher_logits.detach())
        if source == "student":
            return top(student_logits.detach())
        return top(teacher_logits.detach()) | top(student_logits.detach())


def _tail_logprob(logp: Tensor, support: Tensor) -> Tensor:
    """log Σ_{v ∉ S} π(v) (...), differentiable; support entries are replaced by 2·floor
    (e^-2e4 = 0 in every dtype, and logsumexp's inputs stay finite when S is everything)."""
    return torch.logsumexp(torch.where(support, 2.0 * LOGPROB_FLOOR, logp), dim=-1)


def topk_divergence(
    student_logits: Tensor,
    teacher_logits: Tensor,
    *,
    kind: str,
    top_k: int = 64,
    topk_source: str = "teacher",
    topk_tail: bool = False,
    tau_s: float = 1.0,
    tau_t: float = 0.5,
    beta: float = 0.5,
    compute_dtype: torch.dtype = torch.float32,
) -> Tensor:
    r"""The divergence ``kind`` of the top-k estimator at each position (module docstring,
    "Top-k"), differentiable (the float64-safe reference).

    ``topk_tail=False``: D(π̃_S, π̃_T) of both distributions restricted to S and renormalised
    (``token_divergence`` of the logits with −inf outside S). ``topk_tail=True``: D over the
    |S| + 1 categories S ∪ {tail}, the tail holding each model's mass outside S.
    With k ≥ V both equal ``token_divergence`` exactly.

    Args:
        student_logits, teacher_logits, kind, tau_s, tau_t, beta, compute_dtype: as in
            ``token_divergence``.
        top_k, topk_source: the support (``topk_support``). topk_tail: the tail bucket.

    Returns:
        (...) tensor in ``compute_dtype``, nats.

    Raises:
        As ``token_divergence`` and ``topk_support``.
    """
    support = topk_support(student_logits, teacher_logits, top_k=top_k, topk_source=topk_source)
    if not topk_tail:
        ninf = torch.tensor(float("-inf"), dtype=student_logits.dtype, device=student_logits.device)
        return token_divergence(torch.where(support, student_logits, ninf), torch.where(support, teacher_logits, ninf),
                                kind=kind, tau_s=tau_s, tau_t=tau_t, beta=beta, compute_dtype=compute_dtype)
    kind, tau_s, tau_t, beta = _check_divergence(kind, tau_s, tau_t, beta, compute_dtype)
    logp_s = torch.log_softmax(student_logits.to(compute_dtype) / tau_s, dim=-1)
    logp_t = torch.log_softmax(teacher_logits.to(compute_dtype) / tau_t, dim=-1)
    ninf = torch.tensor(float("-inf"), dtype=compute_dtype, device=logp_s.device)
    on_support = _logprob_divergence(torch.where(support, logp_s, ninf), torch.where(support, logp_t, ninf), kind, beta)
    tails = _logprob_divergence(_tail_logprob(logp_s, support).unsqueeze(-1),
                                _tail_logprob(logp_t, support).unsqueeze(-1), kind, beta)
    return on_support + tails


def topk_divergence_and_grad(
    student_logits: Tensor,
    teacher_logits: Tensor,
    *,
    kind: str,
    top_k: int = 64,
    topk_source: str = "teacher",
    topk_tail: bool = False,
    tau_s: float = 1.0,
    tau_t: float = 0.5,
    beta: float = 0.5,
    compute_dtype: torch.dtype = torch.float32,
    need_grad: bool = True,
    with_stats: bool = False,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    r"""``topk_divergence`` and its gradient w.r.t. the student logits in closed form
    (module docstring, "Top-k"): the row math of the chunked top-k loss.

    Args and returns as ``token_divergence_and_grad`` (``top_k``, ``topk_source``, ``topk_tail`` as in
    ``topk_divergence``). ``stats`` are the full-vocabulary ``STAT_NAMES`` columns
    (the exact KLs, not the estimator's).

    Raises:
        As ``topk_divergence``.
    """
    support = topk_support(student_logits, teacher_logits, top_k=top_k, topk_source=topk_source)
    kind, tau_s, tau_t, beta = _check_divergence(kind, tau_s, tau_t, beta, compute_dtype)
    with torch.no_grad():
        a_s = student_logits.detach().to(compute_dtype) / tau_s  # (..., V)
        a_t = teacher_logits.detach().to(compute_dtype) / tau_t
        ls, lt = torch.log_softmax(a_s, dim=-1), torch.log_softmax(a_t, dim=-1)
        ps, pt = ls.exp(), lt.exp()
        stats = None
        if with_stats:
            _, fwd, rev = _kl_pair(ls.clamp_min(LOGPROB_FLOOR), lt.clamp_min(LOGPROB_FLOOR), ps, pt)
            stats = _stats(ls.clamp_min(LOGPROB_FLOOR), lt.clamp_min(LOGPROB_FLOOR), ps, pt, fwd, rev)
        if topk_tail:  # effective log-probs: the tail's log mass on every entry outside S
            ninf = torch.tensor(float("-inf"), dtype=compute_dtype, device=ls.device)
            ls_t = torch.logsumexp(torch.where(support, ninf, ls), dim=-1, keepdim=True)  # (..., 1)
            lt_t = torch.logsumexp(torch.where(support, ninf, lt), dim=-1, keepdim=True)
            share = (ls - torch.where(torch.isfinite(ls_t), ls_t, 0.0)).exp()  # π_S(v) / q_S(tail) off S
            pt = torch.where(support, pt, lt_t.exp() * share)  # q_T(tail) spread like π_S inside the tail
            ls, lt = torch.where(support, ls, ls_t), torch.where(support, lt, lt_t)
        else:  # renormalised on S
            ninf = torch.tensor(float("-inf"), dtype=compute_dtype, device=ls.device)
            ls = torch.log_softmax(torch.where(support, a_s, ninf), dim=-1)
            lt = torch.log_softmax(torch.where(support, a_t, ninf), dim=-1)
            ps, pt = ls.exp(), lt.exp()
        keep = ls > LOGPROB_FLOOR if (need_grad and kind == "forward") else None
        div, grad, _ = _closed_form(ls.clamp_min_(LOGPROB_FLOOR), lt.clamp_min_(LOGPROB_FLOOR), ps, pt, keep,
                                    kind=kind, beta=beta, tau_s=tau_s, need_grad=need_grad, with_stats=False)
    return div, grad, stats


# --------------------------------------------------------- rollout-token estimators (k1, k2, k3)

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
    if reduction not in REDUCTIONS:
        raise ValueError(f"unknown reduction {reduction!r}; allowed values: {', '.join(map(repr, REDUCTIONS))}")
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


# ------------------------------------------------------------------ one switch


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
