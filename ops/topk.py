r"""The top-k estimators of a divergence (``loss.estimator: topk``).

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
tail-bucket gradient is the full-vocabulary formula (``ops.divergence``) with
ℓ_S, ℓ_T replaced by ℓ^e_S, ℓ^e_T (weights π_S(v) kept), and for the forward KL
π_T(v) replaced off S by q_T(t) · π_S(v)/q_S(t) (the teacher's tail mass spread like
the student's):

    forward   ∂D̃/∂z_S(v) = (π_S(v) − w_T(v)) / τ_S,   w_T = π_T on S, q_T(t) π_S/q_S(t) off S
    reverse   ∂D̃/∂z_S(v) = π_S(v) (ℓ^e_S(v) − ℓ^e_T(v) − D̃) / τ_S
    jsd       the JSD formula with g^e = ℓ^e_S − log M^e

(``topk_divergence_and_grad``, checked against autograd of ``topk_divergence``).
The renormalised gradient is the full formula on the renormalised log-probs (zero
off S). The per-token diagnostics (kl/forward, ...) stay the full-vocabulary values.
"""

from __future__ import annotations

import torch
from torch import Tensor

from distillab.ops._checks import _check_divergence, _check_logits_pair
from distillab.ops.divergence import (
    LOGPROB_FLOOR,
    _closed_form,
    _kl_pair,
    _logprob_divergence,
    _stats,
    token_divergence,
)
from distillab.registry import TOPK_SOURCES, check_choice

__all__ = ["TOPK_SOURCES", "topk_support", "topk_divergence", "topk_divergence_and_grad"]


def _check_topk(k: int, source: str) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"top_k must be an integer >= 1, got {k!r}")
    check_choice("topk_source", source, TOPK_SOURCES)
    return k


def topk_support(student_logits: Tensor, teacher_logits: Tensor, *, top_k: int, topk_source: str = "teacher") -> Tensor:
    r"""The top-k support S of each position (module docstring): the entries
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
    r"""The divergence ``kind`` of the top-k estimator at each position (module docstring),
    differentiable (the float64-safe reference).

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
    (module docstring): the row math of the chunked top-k loss.

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
