"""A micro distillation step against its compute floor: the step's own model passes with
nothing around them.

    python benchmarks/step_floor.py                    # OnPD and OffPD, 8 steps each (~6 min on 2 cores)
    python benchmarks/step_floor.py --plumbing         # the path on tiny random models (seconds)

Same setting as benchmarks/peer_trl.py (the prepared micro models of ``--config``, its
training prompts, ``--batch`` (16) prompts per step, up to ``--max-tokens`` (32) new
tokens, τ = 1, forward KL, one torch thread). For each step it times, one after the
other on the same rollouts:

- the real step: one pass of `distill.run_worker`'s loop (``peer_trl.distillab_step``:
  prompts, rollouts, loss, DeepSpeed update, log);
- the forward/backward floor: the teacher's forward (inference mode) and the student's
  forward and backward on the step's packed batch, called on the bare models (the
  transformer, then the chunked lm_head + KL over the completion tokens, which is part of
  the model's last layer here), no DeepSpeed, no optimizer, no packing or bookkeeping;
- the decode floor (OnPD; an OffPD step reads a cached set and decodes nothing): the same
  decode as the step's sampler (prefill, then one step per generated token up to the
  batch's longest completion, softmax and ``torch.multinomial`` each step) traced into
  one TorchScript graph with the step's own tokens fed back, so no Python runs between
  tokens.

floor = forward/backward + decode; it prints each, the real step and real/floor, in wall
time and in CPU time of this (single-threaded) process, which other processes on a shared
machine stretch less. The decode floors are traced and timed after all the real steps
(`run` says why); the study's setting is ``--batch 48``. ``--plumbing``: both policies, 2 steps,
batch 2, 4 new tokens on `_plumbing.tiny_models` (what a fast test runs; the numbers mean nothing).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peer_trl  # noqa: E402  (the shared setting and the timed distillab step)

from distillab.recipe.loss import pack_batch  # noqa: E402
from distillab.ops.chunked import chunked_distill_loss  # noqa: E402
from distillab.rollout.decode import StaticKVDecoder  # noqa: E402
from distillab.rollout.types import left_pad  # noqa: E402


def _clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _since(t: tuple[float, float]) -> tuple[float, float]:
    now = _clock()
    return now[0] - t[0], now[1] - t[1]


def forward_backward_s(w, rollouts) -> tuple[float, float]:
    """(wall, CPU) seconds of the teacher forward and the student forward + backward on
    the packed batch (bare models; the gradients are dropped afterwards)."""
    L, student = w.trial.loss, w.engine.module
    batch = pack_batch(rollouts, w.tok.pad_token_id)
    t0 = _clock()
    with torch.inference_mode():
        h_t = w.teacher.model.base_model(**batch.teacher_inputs).last_hidden_state  # (B, T, H_T)
    h_s = student.base_model(**batch.inputs).last_hidden_state  # (B, T, H_S)
    loss = chunked_distill_loss(h_s, student.lm_head.weight, h_t.clone(), w.teacher.w_t, batch.cmask,
                                kind=L.kind, tau_s=L.tau_s, tau_t=L.tau_t, beta=L.beta)
    loss.backward()
    secs = _since(t0)
    for p in student.parameters():
        p.grad = None
    return secs


def decode_floor_s(w, rollouts, repeats: int = 3) -> tuple[float, float]:
    """(wall, CPU) seconds of the step's decode as one traced graph (module docstring):
    the best of ``repeats`` runs after a warm-up."""
    model = copy.deepcopy(w.engine.module).eval().requires_grad_(False)  # traced weights are constants
    prompts = [p for p in rollouts.prompt_ids]
    ids, attn = left_pad(prompts, w.tok.pad_token_id)
    n = max(rollouts.lengths)
    fed = torch.full((len(prompts), n), w.tok.pad_token_id, dtype=torch.long)
    for i, c in enumerate(rollouts.completion_ids):
        fed[i, : len(c)] = torch.tensor(c, dtype=torch.long)

    def decode(ids, attn, fed):
        dec = StaticKVDecoder(model, attn, n)
        logits, out = dec.prefill(ids), []
        for t in range(n):
            out.append(torch.multinomial(F.softmax(logits, dim=-1), 1))
            if t < n - 1:
                logits = dec.step(fed[:, t])
        return torch.cat(out, 1)

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchScript's tracer warnings (Python ints baked into the graph: intended)
        graph = torch.jit.trace(decode, (ids, attn, fed), check_trace=False)
        graph(ids, attn, fed)
        runs = []
        for _ in range(repeats):
            t0 = _clock()
            graph(ids, attn, fed)
            runs.append(_since(t0))
    return min(r[0] for r in runs), min(r[1] for r in runs)


def run(args, policy: str) -> list[dict]:
    """The steps of one policy: real step, forward/backward floor, decode floor (wall and CPU s).
    Every real step (each followed by its eager forward/backward floor) runs before any decode
    floor: after a few TorchScript traces and runs in the process, later eager steps ran about
    2x slower (OnPD at 48 prompts: 225-250 ms before, 430-560 ms after the third traced decode)."""
    rows = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as d:
        w = peer_trl.distillab_worker(args, policy, args.steps, d)
        for step in range(args.steps):
            c0 = time.process_time()
            secs, rollouts, t_gen = peer_trl.distillab_step(w, step)
            real = (secs, time.process_time() - c0)
            rows.append({"step": step, "real": real, "fb": forward_backward_s(w, rollouts), "rollout_s": t_gen,
                         "rollouts": rollouts, "longest": max(rollouts.lengths)})
        for r in rows:
            r["decode"] = decode_floor_s(w, r.pop("rollouts")) if w.source.fresh else (0.0, 0.0)
            real, fb, dec = r["real"], r["fb"], r["decode"]
            print(f"  {policy} step {r['step']}: real {real[0] * 1e3:7.1f} ms (rollout {r['rollout_s'] * 1e3:6.1f})  "
                  f"floor {(fb[0] + dec[0]) * 1e3:7.1f} ms (fwd/bwd {fb[0] * 1e3:6.1f} + decode {dec[0] * 1e3:6.1f}; "
                  f"{r['longest']} tokens)  real/floor {real[0] / (fb[0] + dec[0]):.2f} wall, "
                  f"{real[1] / (fb[1] + dec[1]):.2f} CPU", flush=True)
    return rows[1:]  # the first step warms up


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=str(peer_trl.REPO / "search_spaces" / "micro.yaml"),
                   help="sweep YAML whose prepared micro models are timed (default: micro.yaml)")
    p.add_argument("--cache", default=str(peer_trl.REPO / ".cache" / "models"),
                   help="models.cache_dir holding the prepared models")
    p.add_argument("--batch", type=int, default=16, help="prompts per step (the micro study: 48)")
    p.add_argument("--max-tokens", dest="max_tokens", type=int, default=32, help="new tokens per rollout, at most")
    p.add_argument("--steps", type=int, default=8, help="steps per policy (the first is a warm-up, not counted)")
    p.add_argument("--policies", default="onpd,offpd", help="comma-separated: onpd, offpd")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="extra sweep override")
    p.add_argument("--plumbing", action="store_true",
                   help="2 steps on tiny random models (seconds; the numbers mean nothing)")
    args = p.parse_args(argv)
    if args.plumbing:
        import _plumbing

        with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as d:
            sets = [f"{k}={v}" for k, v in _plumbing.plumbing_sets(d).items()]
            return measure(argparse.Namespace(**{**vars(args), "config": _plumbing.CONFIG, "cache": d, "batch": 2,
                                                 "max_tokens": 4, "steps": 2, "set": args.set + sets}))
    return measure(args)


def measure(args) -> int:
    """Every policy's steps (`run`), then the table of medians."""
    torch.set_num_threads(1)
    peer_trl.one_rank()
    print(f"{args.config}: batch {args.batch}, <= {args.max_tokens} new tokens, tau 1, 1 torch thread", flush=True)
    results = {policy: run(args, policy) for policy in args.policies.split(",")}
    print("\npolicy  clock  real ms  floor ms (fwd/bwd + decode)  real/floor (median over steps)")
    for policy, rows in results.items():
        for i, clock in enumerate(("wall", "CPU")):
            med = {k: statistics.median(r[k][i] for r in rows) for k in ("real", "fb", "decode")}
            ratio = statistics.median(r["real"][i] / (r["fb"][i] + r["decode"][i]) for r in rows)
            print(f"{policy:6s}  {clock:5s} {med['real'] * 1e3:8.1f} {(med['fb'] + med['decode']) * 1e3:9.1f} "
                  f"({med['fb'] * 1e3:.1f} + {med['decode'] * 1e3:.1f})        {ratio:.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
