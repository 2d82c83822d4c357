"""Rollout data and batch packing: what every engine returns and how a batch of them
is laid out for a forward pass (DESIGN.md "Rollout engines").

- `SamplingParams` (τ, top-p, max tokens, n, seed) and `Rollouts` (completion ids and the
  engine's per-token log-probabilities, prompt-major);
- `RolloutEngine`, the interface of every engine (``generate``, ``update_weights``);
- packing shared by training, evaluation and SFT: `left_pad`, `pack_rollouts` (ids,
  attention mask, completion mask), `position_ids`, `model_device`, `engine_logprobs`
  (the engine's log-probabilities at the completion positions), `load_named_tensors`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Protocol, Sequence

import torch


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
    - ``teacher_prompt_ids[k]`` (teacher conditioning only, else None): the
      teacher's prompt for the same problem; ``prompt_ids`` is then the student's.
    - ``staleness``: the update lag of the weights that sampled them (optimizer steps
      behind the learner's step that trains on them; 0 for the current weights and the
      frozen teacher; `rollout.stale`).
    """

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    logprobs: list[list[float]]
    finish_reasons: list[str]
    extras: dict[str, list[float]] = field(default_factory=dict)
    teacher_prompt_ids: list[list[int]] | None = None
    staleness: int = 0

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


def left_pad(seqs: Sequence[Sequence[int]], pad_id: int, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists into ``(ids, attention_mask)``, both int64 ``(B, T)``, with
    T = ``width`` or the longest list.

    Raises:
        ValueError: ``width`` shorter than the longest list.
    """
    longest = max(len(s) for s in seqs)
    if width is not None and width < longest:
        raise ValueError(f"left_pad: width {width} < longest sequence {longest}")
    width = longest if width is None else width
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if len(s):
            ids[i, width - len(s) :] = torch.tensor(list(s), dtype=torch.long)
            mask[i, width - len(s) :] = 1
    return ids, mask


def model_device(model) -> torch.device:
    """The device of ``model``'s parameters (its first one; CPU for a model without
    parameters), or of its ``module``'s for a wrapper that is not a module itself (a
    DeepSpeed engine is one; `optim.TorchStepper` is not): where its inputs must live."""
    if not isinstance(model, torch.nn.Module):
        model = model.module
    return next((p.device for p in model.parameters()), torch.device("cpu"))


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counting only real tokens, as ``generate`` uses them:
    int64 ``(B, T)``, 0 at each row's first real token (padding gets 0)."""
    return (attention_mask.cumsum(-1) - 1).clamp(min=0)


def pack_rollouts(
    prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]], pad_id: int,
    width: int | None = None, device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Prompt + completion, left-padded (to ``width`` when given), for a teacher/student
    forward pass, on ``device`` (default CPU; the model's, `model_device`, on a GPU).
    Completions are right-aligned, so two packs of the same completions under different
    prompts and one ``width`` share their completion mask.

    Returns ``(ids, attention_mask, completion_mask)``, each int64/bool ``(B, T)``;
    ``completion_mask[b, t]`` is True where the *logits at position t* predict a
    completion token (i.e. token t+1 is a completion token), so that
    ``logits[completion_mask]`` are exactly the distributions the completion was
    sampled from.

    Raises:
        ValueError: a row with an empty prompt and a non-empty completion (named): no
            position's logits predict the first token of a sequence, so its first
            completion token could not be scored (the row would be dropped, or scored
            from the padding before it). Every prompt has at least one token (the chat
            template's, or BOS); an empty one is a bug upstream, not a rollout to train on.
    """
    for i, (p, c) in enumerate(zip(prompt_ids, completion_ids)):
        if not len(p) and len(c):
            raise ValueError(f"pack_rollouts: row {i} has an empty prompt and {len(c)} completion tokens: the first "
                             "completion token has no position whose logits predict it (a prompt needs >= 1 token)")
    seqs = [list(p) + list(c) for p, c in zip(prompt_ids, completion_ids)]
    ids, attn = left_pad(seqs, pad_id, width)
    width = ids.shape[1]
    cmask = torch.zeros_like(ids, dtype=torch.bool)
    for i, c in enumerate(completion_ids):
        if len(c):
            cmask[i, width - len(c) - 1 : width - 1] = True
    if device is not None:
        ids, attn, cmask = ids.to(device), attn.to(device), cmask.to(device)
    return ids, attn, cmask


def load_named_tensors(model: torch.nn.Module, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Copy ``(name, tensor)`` pairs into ``model``'s state in place (a weight sync).

    Raises:
        KeyError: a name the model does not have.
    """
    state = model.state_dict()
    with torch.no_grad():
        for name, t in named_tensors:
            if name not in state:
                raise KeyError(f"update_weights: model has no parameter {name!r}")
            state[name].copy_(t)


def engine_logprobs(rollouts: Rollouts, cmask: torch.Tensor) -> torch.Tensor:
    """The sampling engine's log-probabilities (``Rollouts.logprobs``) placed at the
    completion positions of a packed batch: float32 ``(B, T)``, 0 elsewhere, for the
    ``(B, T)`` bool completion mask ``cmask`` of `pack_rollouts` (on its device).

    Raises:
        ValueError: the rollouts carry a different number of logprobs than ``cmask``
            has completion tokens.
    """
    flat = [x for row in rollouts.logprobs for x in row]
    if len(flat) != int(cmask.sum()):
        raise ValueError(f"rollouts carry {len(flat)} logprobs for {int(cmask.sum())} completion tokens")
    out = torch.zeros(cmask.shape, dtype=torch.float32, device=cmask.device)
    out[cmask] = torch.tensor(flat, dtype=torch.float32, device=cmask.device)
    return out
