"""Supervised fine-tuning on (prompt, completion) token lists: the loop that
`distillab prepare` uses to train the micro teacher and the micro student.

Loss: mean token cross-entropy over completion tokens only (prompt and padding
positions masked). LR: linear warm-up then cosine decay to 10 % (`optim.lr_lambda`;
PROTOCOL.md §6 teacher recipe: cosine, 10 warm-up steps).
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from distillab.recipe.optim import lr_lambda
from distillab.rollout.types import model_device, pack_rollouts, position_ids

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Example:
    """One SFT example: prompt ids and target completion ids (eos included)."""

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]


def completion_logits(
    model: PreTrainedModel, prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward prompt+completion and return the logits that predict completion
    tokens, flattened: ``(N, V)`` in the model's dtype, and the targets ``(N,)``
    int64, N = total completion tokens in the batch."""
    ids, attn, cmask = pack_rollouts(prompt_ids, completion_ids, pad_id, device=model_device(model))
    logits = model(input_ids=ids, attention_mask=attn, position_ids=position_ids(attn)).logits  # (B, T, V)
    targets = torch.roll(ids, shifts=-1, dims=1)[cmask]
    return logits[cmask], targets


def sft_train(
    model: PreTrainedModel,
    examples: Sequence[Example],
    *,
    steps: int,
    batch_size: int,
    lr: float,
    warmup: int,
    pad_id: int,
    seed: int,
    clip: float | None = 1.0,
    schedule: str = "cosine",
    callback: Callable[[int, float], None] | None = None,
    callback_every: int = 0,
) -> list[float]:
    """Train ``model`` in place on ``examples`` for ``steps`` optimizer steps with
    AdamW (0.9, 0.999, eps 1e-8, no weight decay), with a progress bar on a terminal
    (tqdm, stderr). Returns the per-step losses.

    Raises:
        ValueError: empty ``examples`` or non-positive steps/batch/lr.
    """
    if not examples:
        raise ValueError("sft_train: examples is empty")
    if steps < 1 or batch_size < 1 or lr <= 0:
        raise ValueError(f"sft_train: need steps, batch_size, lr > 0, got {steps}, {batch_size}, {lr}")
    rng = random.Random(seed)
    torch.manual_seed(seed)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(warmup, steps, schedule))
    losses: list[float] = []
    t0 = time.perf_counter()
    bar = tqdm(total=steps, desc="SFT", unit="step", disable=None, leave=False)  # None: off when not a TTY
    for step in range(steps):
        batch = [examples[rng.randrange(len(examples))] for _ in range(batch_size)]
        logits, targets = completion_logits(
            model, [e.prompt_ids for e in batch], [e.completion_ids for e in batch], pad_id
        )
        loss = F.cross_entropy(logits.float(), targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        sched.step()
        losses.append(loss.item())
        bar.update()
        if step % 20 == 0:
            bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
        if callback is not None and callback_every and (step + 1) % callback_every == 0:
            callback(step + 1, sum(losses[-callback_every:]) / callback_every)
        if (step + 1) % 200 == 0:
            log.info("sft step %d/%d loss %.4f (%.1f s)", step + 1, steps, losses[-1], time.perf_counter() - t0)
    bar.close()
    model.eval()
    return losses
