"""bf16 against float32 on this CPU, at the micro models' shapes: whether a bf16 sweep
(``trial.precision: bf16``, as in ``search_spaces/micro_findings.yaml``) is affordable here.

    python benchmarks/bf16_matmul.py                  # micro_findings.yaml's student shapes, 1 thread
    python benchmarks/bf16_matmul.py --tokens 2048 --threads 2
    python benchmarks/bf16_matmul.py --plumbing     # 16 tokens, one repeat (seconds)

torch multiplies bf16 matrices on the CPU with oneDNN's bf16 kernels where the CPU has
AVX-512 (BF16 or BW) or AMX, and with a generic kernel otherwise
(`distillab.models.cpu_has_native_bf16`). On such a CPU a trial computes its bf16 products
on float32 copies of the operands and rounds them to bf16 (`distillab.models.Bf16MatmulsInFloat32`).
Two rows, each timed in float32, in bf16 with torch's kernels (native) and in bf16 under
the mode, in the same run, interleaved, median of ``--repeats``:

- ``linear``: the student's four ``F.linear`` shapes on ``--tokens`` rows (attention
  projection H → H, MLP up H → I, down I → H, lm_head H → V), forward only;
- ``model``: forward + backward of the whole micro student (a Llama of ``--config``'s
  ``models.micro_student`` shape, random weights) on a ``(8, tokens / 8)`` batch.

It prints the seconds of each, each bf16 column / float32, and the CPU capability torch reports.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import LlamaForCausalLM

from distillab.config import load_sweep
from distillab.models import Bf16MatmulsInFloat32, build_char_tokenizer, cpu_has_native_bf16, micro_llama_config

REPO = Path(__file__).resolve().parents[1]


def seconds(fn) -> float:
    """Wall seconds of one call of ``fn()``."""
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def linear_call(shapes: list[tuple[int, int]], tokens: int, dtype: torch.dtype):
    """A call of ``F.linear`` on every (in, out) shape, ``tokens`` rows, in ``dtype``."""
    g = torch.Generator().manual_seed(0)
    args = [(torch.randn(tokens, i, generator=g).to(dtype), torch.randn(o, i, generator=g).to(dtype)) for i, o in shapes]
    return lambda: [F.linear(x, w) for x, w in args]


def model_call(config, tokens: int, dtype: torch.dtype):
    """Forward + backward of a random-weight micro student in ``dtype`` on an (8, tokens/8) batch."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(dtype)
    ids = torch.randint(3, config.vocab_size, (8, max(tokens // 8, 2)))

    def call():
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()

    return call


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=str(REPO / "search_spaces" / "micro_findings.yaml"))
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--plumbing", action="store_true", help="16 tokens, one repeat (seconds; the numbers mean nothing)")
    args = p.parse_args(argv)
    if args.plumbing:
        args.tokens, args.repeats = 16, 1
    torch.set_num_threads(args.threads)
    m = load_sweep(args.config).models.micro_student
    tok = build_char_tokenizer()
    config = micro_llama_config(len(tok), m.hidden_size, m.num_layers, m.num_heads, m.intermediate_size,
                                m.max_position_embeddings, tok)
    h, i, v = m.hidden_size, m.intermediate_size, len(tok)
    print(f"CPU capability {torch.backends.cpu.get_cpu_capability()}, native bf16 matrix products: "
          f"{cpu_has_native_bf16()}; {args.threads} thread(s), {args.tokens} tokens, H={h} I={i} V={v}")
    print(f"{'row':8s} {'float32 s':>11s} {'bf16 s':>11s} {'bf16 mode s':>12s} {'bf16/fp32':>10s} {'mode/fp32':>10s}")
    rows = {"linear": lambda d: linear_call([(h, h), (h, i), (i, h), (h, v)], args.tokens, d),
            "model": lambda d: model_call(config, args.tokens, d)}
    for name, build in rows.items():
        calls = {"fp32": build(torch.float32), "bf16": build(torch.bfloat16), "mode": in_mode(build(torch.bfloat16))}
        for call in calls.values():
            call()  # warm-up, not timed
        t = {k: [] for k in calls}
        for _ in range(args.repeats):  # interleaved: each round times all three
            for k, call in calls.items():
                t[k].append(seconds(call))
        f32, b16, mode = (statistics.median(t[k]) for k in ("fp32", "bf16", "mode"))
        print(f"{name:8s} {f32:11.5f} {b16:11.5f} {mode:12.5f} {b16 / f32:9.1f}x {mode / f32:9.2f}x", flush=True)


def in_mode(call):
    """``call`` run under `Bf16MatmulsInFloat32` (bf16 products in float32, rounded to bf16)."""
    def run():
        with Bf16MatmulsInFloat32():
            call()
    return run

if __name__ == "__main__":
    main()
