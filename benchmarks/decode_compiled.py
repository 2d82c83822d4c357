"""The OnPD sampler's decode, eager against compiled: how far ``torch.compile`` takes the
static-KV-cache decoder (`rollout.decode.StaticKVDecoder`) toward its own matrix products.

    python benchmarks/decode_compiled.py                 # peer_trl's setting: 16 prompts x 32 tokens
    python benchmarks/decode_compiled.py --batch 48      # the micro study's 48 prompts
    python benchmarks/decode_compiled.py --plumbing      # the path on a tiny random model (seconds)

The prepared micro student of ``--config`` (``distillab prepare`` first; the benchmark calls
`prepare.prepare`, which finds it cached), one torch thread, ``--batch`` random prompts of 20
tokens (every third row left-padded by 4), a prefill and ``--max-tokens`` - 1 decode steps fed
fixed tokens (no sampling: the same work in every variant). Variants, in one process:

- eager: `StaticKVDecoder` as the sampler runs it (its step attends over the filled slots);
- compiled: the same layer arithmetic with shapes that do not change from token to token (each
  step attends over the whole static cache under a slot mask and writes K/V with
  ``index_copy_`` at a tensor position), through ``torch.compile`` (inductor, static shapes), so
  one graph serves every step. The benchmark's own code: the platform's sampler stays eager.

It prints the milliseconds per decode (prefill included) and per step of each, compiled/eager,
the first compiled call's seconds, the largest |logit difference| between the two, and the
time of the compiled step's matrix products (``aten::mm``, torch profiler): the floor that
compiling the rest cannot go below. ``--plumbing``: 2 prompts x 3 tokens, one repeat, on
`_plumbing.tiny_models`' student, compiled with ``--backend eager`` (TorchDynamo's graph capture
without inductor's code generation): what a fast test runs; the numbers mean nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from distillab.config import load_sweep
from distillab.models import load_model
from distillab.recipe.prepare import prepare
from distillab.rollout.decode import StaticKVDecoder, _rms, _rotate_half

REPO = Path(__file__).resolve().parents[1]
PROMPT_LEN = 20


class FullWidthDecoder(StaticKVDecoder):
    """`StaticKVDecoder` whose decode step has the same shapes at every token (module docstring)."""

    def _layer_full(self, i, L, h, cos, sin, mask, t):
        B, q, d = h.shape[0], h.shape[1], self.head_dim
        x = _rms(h, L.ln1, L.eps1)
        qkv = F.linear(x, L.qkv_w, L.qkv_b).view(B, q, -1, d).transpose(1, 2)
        nq, nk = self.heads, self.kv // d
        qk = qkv[:, : nq + nk]
        qk = qk * cos + _rotate_half(qk) * sin
        kc, vc = self.k_cache[i], self.v_cache[i]
        kc.index_copy_(2, t, qk[:, nq:])
        vc.index_copy_(2, t, qkv[:, nq + nk:])
        a = F.scaled_dot_product_attention(qk[:, :nq], kc, vc, attn_mask=mask, dropout_p=0.0, scale=self.scaling)
        h = h + F.linear(a.transpose(1, 2).reshape(B, q, -1), L.o.weight, L.o.bias)
        gu = F.linear(_rms(h, L.ln2, L.eps2), L.gu_w, L.gu_b)
        return h + F.linear(F.silu(gu[..., : self.inter]) * gu[..., self.inter:], L.down.weight, L.down.bias)

    def step_full(self, tokens, t, valid):
        """(B,) tokens at slot ``t`` (a one-element int64 tensor); ``valid``: (B, width) bool, the
        prompts' real tokens and every generated slot. Returns (B, V) float32 logits."""
        h = F.embedding(tokens.view(self.B, 1), self.inner.embed_tokens.weight)
        cos, sin = self.cos.index_select(1, t).unsqueeze(1), self.sin.index_select(1, t).unsqueeze(1)
        mask = (valid & (torch.arange(self.width) <= t))[:, None, None, :]
        for i, L in enumerate(self.layers):
            h = self._layer_full(i, L, h, cos, sin, mask, t)
        n = self.inner.norm
        return F.linear(_rms(h, n.weight, n.variance_epsilon), self.head.weight)[:, -1].float()


def _inputs(batch: int, vocab: int):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, vocab, (batch, PROMPT_LEN), generator=g)
    attn = torch.ones(batch, PROMPT_LEN, dtype=torch.long)
    attn[::3, :4] = 0
    return ids, attn


def decode(model, ids, attn, n: int, step=None):
    """Prefill, then ``n - 1`` steps fed the prompt's tokens; ``step``: a compiled or eager
    `FullWidthDecoder.step_full`, or None for `StaticKVDecoder.step`. Returns the last logits."""
    dec = (StaticKVDecoder if step is None else FullWidthDecoder)(model, attn, n)
    valid = torch.cat([attn.bool(), torch.ones(attn.shape[0], n, dtype=torch.bool)], 1)
    with torch.no_grad():
        logits = dec.prefill(ids)
        for t in range(n - 1):
            tok = ids[:, t % ids.shape[1]]
            logits = dec.step(tok) if step is None else step(dec, tok, torch.tensor([ids.shape[1] + t]), valid)
    return logits


def mm_ms_per_step(model, ids, attn, n: int, step) -> float:
    """Self time of ``aten::mm`` per compiled step (torch profiler, 20 steps)."""
    from torch.profiler import profile

    dec = FullWidthDecoder(model, attn, n)
    valid = torch.cat([attn.bool(), torch.ones(attn.shape[0], n, dtype=torch.bool)], 1)
    with torch.no_grad():
        dec.prefill(ids)
        t, tok = torch.tensor([ids.shape[1]]), ids[:, 0]
        step(dec, tok, t, valid)
        with profile() as prof:
            for _ in range(20):
                step(dec, tok, t, valid)
    return sum(e.self_cpu_time_total for e in prof.key_averages() if e.key == "aten::mm") / 20 / 1e3


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=str(REPO / "search_spaces" / "micro.yaml"))
    p.add_argument("--batch", type=int, default=16, help="prompts (the micro study: 48)")
    p.add_argument("--max-tokens", dest="max_tokens", type=int, default=32, help="tokens per decode")
    p.add_argument("--repeats", type=int, default=7, help="timed decodes per variant (median)")
    p.add_argument("--backend", default="inductor", help="torch.compile backend (inductor: what is measured)")
    p.add_argument("--plumbing", action="store_true",
                   help="2 prompts x 3 tokens on a tiny random model, backend eager (seconds; the numbers mean nothing)")
    args = p.parse_args(argv)
    if args.plumbing:
        import tempfile

        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import _plumbing

        with tempfile.TemporaryDirectory() as d:
            _, student = _plumbing.tiny_models(d)
            return measure(argparse.Namespace(**{**vars(args), "batch": 2, "max_tokens": 3, "repeats": 1,
                                                 "backend": "eager"}), student)
    _, student = prepare(load_sweep(args.config), threads=1)
    return measure(args, student)


def measure(args, student) -> int:
    """The decode of ``student``'s model eager and compiled (module docstring), printed."""
    torch.set_num_threads(1)
    model = load_model(student).eval().requires_grad_(False)
    ids, attn = _inputs(args.batch, model.config.vocab_size)
    n = args.max_tokens
    compiled = torch.compile(FullWidthDecoder.step_full, dynamic=False, backend=args.backend)
    t0 = time.perf_counter()
    out_c = decode(model, ids, attn, n, compiled)
    first = time.perf_counter() - t0
    diff = (decode(model, ids, attn, n) - out_c).abs().max().item()
    times = {"eager": [], "compiled": []}
    for _ in range(args.repeats):  # interleaved
        for name, step in (("eager", None), ("compiled", compiled)):
            t0 = time.perf_counter()
            decode(model, ids, attn, n, step)
            times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    mm = mm_ms_per_step(model, ids, attn, n, compiled)
    print(f"{args.batch} prompts x {n} tokens, 1 thread, {student}")
    print(f"decode ms (prefill + {n - 1} steps, median of {args.repeats}): eager {med['eager']:.1f}, "
          f"compiled {med['compiled']:.1f}; compiled/eager {med['compiled'] / med['eager']:.2f}")
    print(f"per step ms (decode / {n}): eager {med['eager'] / n:.3f}, compiled {med['compiled'] / n:.3f}; "
          f"its matrix products (aten::mm) {mm:.3f}")
    print(f"first compiled decode {first:.1f} s; max |logit difference| compiled vs eager {diff:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
