"""`TransformersEngine`: sampling in-process with a transformers causal LM, the engine that
runs anywhere transformers runs. Llama and Qwen2 models sample with the static-KV-cache
decoder (`rollout.decode.sample_tokens`), others with ``model.generate``; both draw the
same tokens under the same seed (tests/rollout/test_decode.py). `sample_chunks` is the loop the
λ-spectrum sampler (`rollout.spectrum`) shares.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import torch
from transformers import LogitsProcessorList, PreTrainedModel

from distillab.ops.kl import token_logprobs
from distillab.rollout.decode import sample_tokens, static_decode_supported
from distillab.rollout.types import Rollouts, SamplingParams, left_pad, load_named_tensors, model_device


def _generate_batch(model: PreTrainedModel, ids: torch.Tensor, attn: torch.Tensor, sampling: SamplingParams,
                    eos_token_id: int, pad_token_id: int, proc) -> tuple[torch.Tensor, torch.Tensor | None]:
    """New tokens (B, L) of one left-padded chunk and, without a processor, their logprobs
    under softmax(logits/τ) (B, L): `rollout.decode.sample_tokens` (static KV cache) where
    `rollout.decode.static_decode_supported`, else ``model.generate`` (same warpers, same draws)."""
    if static_decode_supported(model):
        return sample_tokens(model, ids, attn, temperature=sampling.temperature, top_p=sampling.top_p,
                             max_new=sampling.max_tokens, eos_token_id=eos_token_id, pad_token_id=pad_token_id,
                             processor=proc, logprobs=proc is None)
    res = model.generate(
        input_ids=ids,
        attention_mask=attn,
        do_sample=True,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=0,
        max_new_tokens=sampling.max_tokens,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        output_logits=proc is None,
        return_dict_in_generate=True,
        **({"logits_processor": LogitsProcessorList([proc])} if proc is not None else {}),
    )
    new = res.sequences[:, ids.shape[1] :]  # (B, L)
    return new, token_logprobs(torch.stack(res.logits, dim=1), new, sampling.temperature) if proc is None else None


def sample_chunks(
    model: PreTrainedModel,
    prompt_ids: Sequence[Sequence[int]],
    sampling: SamplingParams,
    eos_token_id: int,
    pad_token_id: int,
    batch_size: int,
    processor_factory=None,
) -> tuple[Rollouts, list]:
    """`_generate_batch` over left-padded chunks of the expanded prompts, seeded per
    chunk from ``sampling.seed``. ``processor_factory(attention_mask, max_new)`` (optional)
    returns a logits processor that runs before temperature and top-p (as transformers
    merges custom processors first). Returns the rollouts (logprobs under
    softmax(logits/τ), or the processor's ``token_logprobs`` when it has them) and
    the processors used, one per chunk."""
    was_training = model.training
    model.eval()
    gen = torch.Generator().manual_seed(sampling.seed)
    expanded = [list(p) for p in prompt_ids for _ in range(sampling.n)]
    out = Rollouts([], [], [], [])
    procs = []
    for start in range(0, len(expanded), batch_size):
        chunk = expanded[start : start + batch_size]
        ids, attn = (t.to(model_device(model)) for t in left_pad(chunk, pad_token_id))
        proc = processor_factory(attn, sampling.max_tokens) if processor_factory is not None else None
        procs.append(proc)
        # The global RNG drives the sampler's multinomial; seed it from our generator
        # so that each chunk is reproducible under `sampling.seed`.
        torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
        new, lp = _generate_batch(model, ids, attn, sampling, eos_token_id, pad_token_id, proc)
        if proc is not None:
            proc.finish(new)
            lp = proc.token_logprobs["lambda"]  # (B, L)
        rows, lps = new.tolist(), lp.tolist()
        for b, p in enumerate(chunk):
            row = rows[b]
            if eos_token_id in row:
                n = row.index(eos_token_id) + 1
                reason = "stop"
            else:
                n = len(row)
                reason = "length"
            out.prompt_ids.append(p)
            out.completion_ids.append(row[:n])
            out.logprobs.append(lps[b][:n])
            out.finish_reasons.append(reason)
            if proc is not None:
                for name in ("student", "teacher"):
                    vals = proc.token_logprobs[name][b, :n]
                    out.extras.setdefault(f"{name}_loglik", []).append(float(vals.mean()) if n else float("nan"))
    if was_training:
        model.train()
    return out, procs


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
        """Copy tensors into the held model by parameter name (`load_named_tensors`).

        Raises:
            KeyError: a name the model does not have.
        """
        load_named_tensors(self.model, named_tensors)

    @torch.inference_mode()
    def generate(self, prompt_ids: Sequence[Sequence[int]], sampling: SamplingParams) -> Rollouts:
        """Sample ``sampling.n`` completions per prompt at temperature τ and top-p.
        ``logprobs`` are under softmax(logits/τ) (before top-p truncation)."""
        out, _ = sample_chunks(
            self.model, prompt_ids, sampling, self.eos_token_id, self.pad_token_id, self.batch_size
        )
        return out

    def generate_many(self, jobs: Sequence[tuple[Sequence[Sequence[int]], SamplingParams]]) -> list[Rollouts]:
        """`generate` for each (prompts, sampling) job in turn."""
        return [self.generate(p, sp) for p, sp in jobs]
