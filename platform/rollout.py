"""Rollout engines: one interface, `RolloutEngine`, for every way of sampling
completions (DESIGN.md "Rollout engines").

This module holds the interface, the batched-sequence helpers shared by training
and evaluation, and `TransformersEngine` (``model.generate`` with a KV cache),
which runs anywhere transformers runs. Rollouts never carry gradients: the
trainer re-scores them with its own forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Protocol, Sequence

import torch
from transformers import PreTrainedModel


@dataclass(frozen=True)
class SamplingParams:
    """How to sample: temperature τ (> 0), nucleus top_p in (0, 1], max new tokens,
    n samples per prompt and the seed of the sampler's RNG."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 64
    n: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens < 1 or self.n < 1:
            raise ValueError(f"max_tokens and n must be >= 1, got {self.max_tokens}, {self.n}")


@dataclass
class Rollouts:
    """Sampled completions, one entry per (prompt, sample), prompt-major
    (prompt i's samples are rows i*n .. i*n+n-1).

    - ``prompt_ids[k]``: the prompt's token ids (list of int).
    - ``completion_ids[k]``: generated ids, eos included when generated, no padding.
    - ``logprobs[k]``: per-token log-probabilities (nats, float) of the sampled
      tokens under the engine's sampling distribution (softmax(z/τ)).
    - ``finish_reasons[k]``: ``"stop"`` (eos) or ``"length"``.
    """

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    logprobs: list[list[float]]
    finish_reasons: list[str]
    extras: dict[str, list[float]] = field(default_factory=dict)

    @property
    def lengths(self) -> list[int]:
        """Completion lengths in tokens."""
        return [len(c) for c in self.completion_ids]


class RolloutEngine(Protocol):
    """What every engine provides (DESIGN.md)."""

    def generate(self, prompt_ids: Sequence[Sequence[int]], sampling: SamplingParams) -> Rollouts:
        """Sample ``sampling.n`` completions for each prompt."""
        ...

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load new weights (on-policy weight sync)."""
        ...


def left_pad(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists into ``(ids, attention_mask)``, both int64 ``(B, T)``."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if len(s):
            ids[i, width - len(s) :] = torch.tensor(list(s), dtype=torch.long)
            mask[i, width - len(s) :] = 1
    return ids, mask


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counting only real tokens, as ``generate`` uses them:
    int64 ``(B, T)``, 0 at each row's first real token (padding gets 0)."""
    return (attention_mask.cumsum(-1) - 1).clamp(min=0)


def pack_rollouts(
    prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Prompt + completion, left-padded, for a teacher/student forward pass.

    Returns ``(ids, attention_mask, completion_mask)``, each int64/bool ``(B, T)``;
    ``completion_mask[b, t]`` is True where the *logits at position t* predict a
    completion token (i.e. token t+1 is a completion token), so that
    ``logits[completion_mask]`` are exactly the distributions the completion was
    sampled from.
    """
    seqs = [list(p) + list(c) for p, c in zip(prompt_ids, completion_ids)]
    ids, attn = left_pad(seqs, pad_id)
    width = ids.shape[1]
    cmask = torch.zeros_like(ids, dtype=torch.bool)
    for i, c in enumerate(completion_ids):
        if len(c):
            cmask[i, width - len(c) - 1 : width - 1] = True
    return ids, attn, cmask


class TransformersEngine:
    """`RolloutEngine` over a transformers causal LM, in-process, with
    ``model.generate`` (KV cache). For environments without vLLM.

    Args:
        model: the policy (its weights are used as they are at each call).
        eos_token_id, pad_token_id: token ids.
        batch_size: prompts per ``generate`` call.
    """

    def __init__(self, model: PreTrainedModel, eos_token_id: int, pad_token_id: int, batch_size: int = 256):
        self.model = model
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.batch_size = batch_size

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy tensors into the held model by parameter name.

        Raises:
            KeyError: a name the model does not have.
        """
        state = self.model.state_dict()
        with torch.no_grad():
            for name, t in named_tensors:
                if name not in state:
                    raise KeyError(f"update_weights: model has no parameter {name!r}")
                state[name].copy_(t)

    @torch.no_grad()
    def generate(self, prompt_ids: Sequence[Sequence[int]], sampling: SamplingParams) -> Rollouts:
        """Sample ``sampling.n`` completions per prompt at temperature τ and top-p."""
        was_training = self.model.training
        self.model.eval()
        gen = torch.Generator().manual_seed(sampling.seed)
        expanded = [list(p) for p in prompt_ids for _ in range(sampling.n)]
        out = Rollouts([], [], [], [])
        for start in range(0, len(expanded), self.batch_size):
            chunk = expanded[start : start + self.batch_size]
            ids, attn = left_pad(chunk, self.pad_token_id)
            # The global RNG drives generate's multinomial; seed it from our generator
            # so that each chunk is reproducible under `sampling.seed`.
            torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
            res = self.model.generate(
                input_ids=ids,
                attention_mask=attn,
                do_sample=True,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=0,
                max_new_tokens=sampling.max_tokens,
                eos_token_id=self.eos_token_id,
                pad_token_id=self.pad_token_id,
                output_logits=True,
                return_dict_in_generate=True,
            )
            new = res.sequences[:, ids.shape[1] :]  # (B, L)
            logits = torch.stack(res.logits, dim=1).float() / sampling.temperature  # (B, L, V)
            lp = torch.log_softmax(logits, dim=-1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
            for b, p in enumerate(chunk):
                row = new[b].tolist()
                if self.eos_token_id in row:
                    n = row.index(self.eos_token_id) + 1
                    reason = "stop"
                else:
                    n = len(row)
                    reason = "length"
                out.prompt_ids.append(p)
                out.completion_ids.append(row[:n])
                out.logprobs.append(lp[b, :n].tolist())
                out.finish_reasons.append(reason)
        if was_training:
            self.model.train()
        return out
