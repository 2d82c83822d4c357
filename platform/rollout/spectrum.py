"""The rollout-policy spectrum π_λ between the student (λ = 1) and the teacher (λ = −1)
and beyond them (PROTOCOL.md §3): `spectrum_logits` (z_λ), `plausibility_mask`,
`SpectrumEngine` (both models step on the same prefix with KV caches) and
`loglik_along_lambda` (the paper's check that λ moves the trajectories).
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import torch
from transformers import DynamicCache, PreTrainedModel

from distillab.rollout.decode import StaticKVDecoder, static_decode_supported
from distillab.rollout.engine import sample_chunks
from distillab.rollout.types import Rollouts, SamplingParams, load_named_tensors, position_ids

#: Defaults of PROTOCOL.md §3: plausibility threshold α and log-ratio clip c.
SPECTRUM_ALPHA = 0.2
SPECTRUM_CLIP = 2.0 * math.log(3.0)


def plausibility_mask(logp: torch.Tensor, alpha: float) -> torch.Tensor:
    """M_P(v) = 1 iff log π_P(v) ≥ max_u log π_P(u) + log α (PROTOCOL.md §3).

    Args:
        logp: (..., V) float log-probabilities of one model.
        alpha: threshold in (0, 1].

    Returns:
        bool (..., V).
    """
    return logp >= logp.amax(dim=-1, keepdim=True) + math.log(alpha)


def spectrum_logits(
    logp_s: torch.Tensor,
    logp_t: torch.Tensor,
    lam: float,
    *,
    alpha: float = SPECTRUM_ALPHA,
    c: float = SPECTRUM_CLIP,
) -> torch.Tensor:
    """Unnormalised log-probabilities z_λ of the student–teacher spectrum π_λ = softmax(z_λ)
    (PROTOCOL.md §3; the paper's rollout-policy spectrum). With r_v = log π_S(v) − log π_T(v):

    - |λ| ≤ 1: z = ((1+λ)/2)·log π_S + ((1−λ)/2)·log π_T (geometric interpolation);
    - λ > 1:  z = log π_S + ((λ−1)/2)·M_S·min(max(r, 0), c) (beyond the student);
    - λ < −1: z = log π_T + ((−λ−1)/2)·M_T·min(max(−r, 0), c) (beyond the teacher);

    M_P the plausibility mask (`plausibility_mask`, threshold α). λ = −1 gives π_T and
    λ = 1 gives π_S exactly (the other model's −inf entries do not leak in); the
    extrapolation raises the odds of any pair of tokens relative to the anchor by at
    most exp(c·(|λ|−1)/2).

    Args:
        logp_s, logp_t: (..., V) float log-probabilities (log-softmax, at the sampling
            temperatures τ_S and τ_T) of student and teacher on the same prefix.
        lam: λ in [−2, 2].
        alpha: plausibility threshold α in (0, 1].
        c: clip of the log-ratio (nats, ≥ 0).

    Returns:
        z_λ, same shape and dtype as the inputs (−inf where π_λ is 0).

    Raises:
        ValueError: λ outside [−2, 2], α outside (0, 1], c < 0, or shape mismatch.
    """
    if not -2.0 <= lam <= 2.0:
        raise ValueError(f"lambda must be in [-2, 2], got {lam}")
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"alpha must be in (0, 1], got {alpha}")
    if c < 0:
        raise ValueError(f"c must be >= 0, got {c}")
    if logp_s.shape != logp_t.shape:
        raise ValueError(f"student and teacher log-probs differ in shape: {tuple(logp_s.shape)} vs {tuple(logp_t.shape)}")
    if lam == 1.0:
        return logp_s.clone()
    if lam == -1.0:
        return logp_t.clone()
    if -1.0 < lam < 1.0:
        a, b = (1.0 + lam) / 2.0, (1.0 - lam) / 2.0
        return a * logp_s + b * logp_t  # both weights > 0: −inf in either stays −inf
    if lam > 1.0:
        anchor, r, mask = logp_s, logp_s - logp_t, plausibility_mask(logp_s, alpha)
    else:
        anchor, r, mask = logp_t, logp_t - logp_s, plausibility_mask(logp_t, alpha)
    bonus = torch.where(mask, r.clamp(0.0, c), torch.zeros_like(r))  # masked-out (incl. −inf anchor): 0
    return anchor + ((abs(lam) - 1.0) / 2.0) * bonus


class _CachedForward:
    """The other model of the λ-spectrum stepped through its own ``forward`` with a
    ``DynamicCache`` (models `rollout.decode.static_decode_supported` rejects): the same
    ``prefill(ids)`` / ``step(tokens)`` → (B, V) float32 logits as `rollout.decode.StaticKVDecoder`,
    at the positions of `position_ids` (counting real tokens)."""

    def __init__(self, model, attention_mask: torch.Tensor):
        self.model, self.attn, self.cache = model, attention_mask, DynamicCache()
        self.pos = position_ids(attention_mask)

    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=ids, attention_mask=self.attn, position_ids=self.pos, past_key_values=self.cache,
                         use_cache=True)
        self.pos = self.pos[:, -1:]
        return out.logits[:, -1, :].float()

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.attn = torch.cat([self.attn, self.attn.new_ones((self.attn.shape[0], 1))], dim=1)
        self.pos = self.pos + 1
        out = self.model(input_ids=tokens.view(-1, 1), attention_mask=self.attn, position_ids=self.pos,
                         past_key_values=self.cache, use_cache=True)
        return out.logits[:, -1, :].float()


def _other_stepper(model, attention_mask: torch.Tensor, max_new: int):
    """`rollout.decode.StaticKVDecoder` over ``model`` at the positions of `position_ids`
    continued by one per new token, or `_CachedForward` where the static path does not apply."""
    if not static_decode_supported(model):
        return _CachedForward(model, attention_mask)
    pos = position_ids(attention_mask)  # (B, T)
    pos = torch.cat([pos, pos[:, -1:] + torch.arange(1, max_new + 1, device=pos.device)], dim=1)  # (B, T + max_new)
    return StaticKVDecoder(model, attention_mask, max_new, positions=pos)


class _SpectrumProcessor:
    """Logits processor run inside the anchor model's sampling loop: steps the other
    model on the same prefix with its own KV cache (`_other_stepper`), replaces the
    anchor's scores by z_λ·τ_A (the temperature warper that follows divides by τ_A), and
    records, per generated token, log π_λ, log π_S and log π_T of the sampled token."""

    def __init__(self, other, attention_mask, max_new, lam, anchor_is_student, tau_anchor, tau_other, alpha, c):
        self.other = _other_stepper(other, attention_mask, max_new)
        self.lam = lam
        self.anchor_is_student, self.tau_a, self.tau_o = anchor_is_student, tau_anchor, tau_other
        self.alpha, self.c = alpha, c
        self.prev: dict[str, torch.Tensor] | None = None  # (B, V) rows of the previous step
        self.cols: dict[str, list[torch.Tensor]] = {"lambda": [], "student": [], "teacher": []}
        self.token_logprobs: dict[str, torch.Tensor] = {}

    def _record(self, tokens: torch.Tensor) -> None:
        for k, rows in self.prev.items():
            self.cols[k].append(rows.gather(-1, tokens.view(-1, 1)).squeeze(-1))

    @torch.no_grad()
    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.prev is None:  # first step: the other model reads the whole prompt
            other_logits = self.other.prefill(input_ids)  # (B, V_O)
        else:
            self._record(input_ids[:, -1])
            other_logits = self.other.step(input_ids[:, -1])
        if other_logits.shape[-1] != scores.shape[-1]:
            raise ValueError(
                f"student and teacher vocabularies differ ({scores.shape[-1]} vs {other_logits.shape[-1]})"
            )
        logp_a = torch.log_softmax(scores.float() / self.tau_a, dim=-1)  # (B, V)
        logp_o = torch.log_softmax(other_logits / self.tau_o, dim=-1)
        logp_s, logp_t = (logp_a, logp_o) if self.anchor_is_student else (logp_o, logp_a)
        z = spectrum_logits(logp_s, logp_t, self.lam, alpha=self.alpha, c=self.c)
        self.prev = {"lambda": torch.log_softmax(z, dim=-1), "student": logp_s, "teacher": logp_t}
        if abs(self.lam) == 1.0:  # exactly the anchor's sampler (same ops, same RNG draws)
            return scores
        return z * self.tau_a

    def finish(self, new_tokens: torch.Tensor) -> None:
        """Record the last generated token and stack the columns into (B, L) tensors."""
        if self.prev is not None and new_tokens.shape[1] > len(self.cols["lambda"]):
            self._record(new_tokens[:, -1])
        B = new_tokens.shape[0]
        self.token_logprobs = {
            k: torch.stack(v, dim=1) if v else torch.zeros((B, 0)) for k, v in self.cols.items()
        }


class SpectrumEngine:
    """`RolloutEngine` sampling from the λ-spectrum π_λ between student (λ = 1) and
    teacher (λ = −1) and beyond (PROTOCOL.md §3). Both models step on the same
    prefix with KV caches: the anchor (student for λ ≥ 0, teacher for λ < 0) runs
    ``generate`` and a logits processor steps the other model and replaces the
    scores by z_λ (`spectrum_logits`); top-p then applies to π_λ. λ = ±1 reproduces
    `TransformersEngine` on the anchor token for token under the same seed.

    ``generate`` ignores ``sampling.temperature``: the spectrum's temperatures are
    ``tau_s`` (student) and ``tau_t`` (teacher). ``Rollouts.logprobs`` are log π_λ of
    each sampled token (before top-p); ``Rollouts.extras`` holds, per rollout, the
    mean ``student_loglik`` (log π_S at τ_S) and ``teacher_loglik`` (log π_T at τ_T)
    of its tokens, in nats (the paper's Figure 4 check).

    Raises:
        ValueError: λ, α or c out of range (at construction); vocabularies that
            differ in size (at the first step).
    """

    def __init__(
        self,
        student: PreTrainedModel,
        teacher: PreTrainedModel,
        eos_token_id: int,
        pad_token_id: int,
        *,
        lam: float,
        tau_s: float = 1.0,
        tau_t: float = 1.0,
        alpha: float = SPECTRUM_ALPHA,
        c: float = SPECTRUM_CLIP,
        batch_size: int = 256,
    ):
        spectrum_logits(torch.zeros(1), torch.zeros(1), lam, alpha=alpha, c=c)  # validates λ, α, c
        if tau_s <= 0 or tau_t <= 0:
            raise ValueError(f"tau_s and tau_t must be > 0, got {tau_s}, {tau_t}")
        self.student, self.teacher = student, teacher
        self.eos_token_id, self.pad_token_id = eos_token_id, pad_token_id
        self.lam, self.tau_s, self.tau_t, self.alpha, self.c = lam, tau_s, tau_t, alpha, c
        self.batch_size = batch_size

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load new student weights (by parameter name; `load_named_tensors`)."""
        load_named_tensors(self.student, named_tensors)

    @torch.inference_mode()
    def generate(self, prompt_ids: Sequence[Sequence[int]], sampling: SamplingParams) -> Rollouts:
        """Sample ``sampling.n`` completions per prompt from π_λ (top-p, max tokens, seed
        from ``sampling``)."""
        anchor_is_student = self.lam >= 0
        anchor, other = (self.student, self.teacher) if anchor_is_student else (self.teacher, self.student)
        tau_a, tau_o = (self.tau_s, self.tau_t) if anchor_is_student else (self.tau_t, self.tau_s)
        other_was_training = other.training
        other.eval()
        sp = SamplingParams(tau_a, sampling.top_p, sampling.max_tokens, sampling.n, sampling.seed)

        def factory(attn, max_new):
            return _SpectrumProcessor(other, attn, max_new, self.lam, anchor_is_student, tau_a, tau_o, self.alpha,
                                      self.c)

        try:
            out, _ = sample_chunks(anchor, prompt_ids, sp, self.eos_token_id, self.pad_token_id,
                                    self.batch_size, factory)
        finally:
            if other_was_training:
                other.train()
        return out


def loglik_along_lambda(
    student: PreTrainedModel,
    teacher: PreTrainedModel,
    tokenizer,
    prompt_ids: Sequence[Sequence[int]],
    lambdas: Sequence[float],
    *,
    tau_s: float = 1.0,
    tau_t: float = 1.0,
    top_p: float = 1.0,
    max_tokens: int = 32,
    n: int = 4,
    seed: int = 0,
) -> list[dict[str, float]]:
    """The paper's Figure 4 check: sample from π_λ for each λ and return, per λ, the
    mean over rollouts of the per-rollout mean student and teacher log-likelihood
    (nats per token, at τ_S and τ_T) and the mean completion length (tokens).

    Returns:
        one dict per λ: ``lambda``, ``student_loglik``, ``teacher_loglik``, ``length``.
    """
    rows = []
    for lam in lambdas:
        eng = SpectrumEngine(student, teacher, tokenizer.eos_token_id, tokenizer.pad_token_id,
                             lam=float(lam), tau_s=tau_s, tau_t=tau_t)
        ro = eng.generate(prompt_ids, SamplingParams(1.0, top_p, max_tokens, n, seed))
        k = max(1, len(ro.completion_ids))
        rows.append({
            "lambda": float(lam),
            "student_loglik": sum(ro.extras["student_loglik"]) / k,
            "teacher_loglik": sum(ro.extras["teacher_loglik"]) / k,
            "length": sum(ro.lengths) / k,
        })
    return rows
