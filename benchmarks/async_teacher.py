"""Issue 35, item 4: asynchronous rollouts and the shared teacher, measured side by side.

    python benchmarks/async_teacher.py                      # all three parts (~2-4 min on 2 shared cores)
    python benchmarks/async_teacher.py --rounds 6 --steps 40   # a longer throughput comparison
    python benchmarks/async_teacher.py --parts memory,payload  # the computed tables only (seconds)
    python benchmarks/async_teacher.py --config search_spaces/smoke.yaml --rounds 1 --steps 4   # plumbing

1. **Throughput, max_staleness 0 against 1.** The micro OnPD trial of ``--config``
   (micro.yaml: its prepared models, its prompts per step (48), its ``max_tokens``; the
   transformers engine, ``resources.torch_threads`` torch threads) runs ``--steps`` steps of
   `distill.run_worker`'s loop body (``peer_trl.distillab_step``: prompts, rollouts, loss,
   update, sync, log; `session.LocalSession`) at k = 0 and at k = 1, one after the other in
   ``--rounds`` rounds whose order alternates, so that the machine's load hits both. The
   first ``--warmup`` steps of each run are not counted. Per k it prints steps/s (counted
   steps / their wall seconds) and the ratio k1/k0, and per step: the learner's wait for its
   rollouts, the update (loss + optimizer step + log; wall and the learner thread's CPU), the
   weight snapshot (k = 1), and the generation's own wall and CPU seconds (on the learner's
   thread at k = 0, on the producer thread at k = 1; CPU seconds: ``time.thread_time`` of
   that thread, which a thread waiting for a core or for Python's GIL does not accrue). With overlap the best
   a step can be is max(generation, update); without, their sum; the cores the two threads
   share decide how close k = 1 gets.
2. **Teacher memory per sweep** of N concurrent trials on one node: N teachers held in the
   workers (``teacher.serve: worker``) against one per node (``shared``), parameter bytes
   only (no activations, no KV cache); with the ``hidden`` payload each trial also holds the
   teacher's lm_head (V × H), so shared + hidden is one teacher + N lm_heads. The real micro
   teacher (parameters counted from its prepared checkpoint) and the paper's teachers
   (Llama-3.1-8B, Qwen2.5-7B), counted on the meta device from their published
   architectures (`PAPER_TEACHERS`), in each sweep file's ``trial.precision``, N its
   ``resources.max_concurrent_trials``.
3. **Payload bytes per token** of a teacher answer (`distillab.recipe.payload.payload_bytes_per_token`):
   ``hidden`` (H values), ``topk`` for k in ``--top-k`` (k values + k int32 ids + the tail)
   against full logits (V values), at the micro and the paper vocabularies.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, Qwen2Config

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peer_trl  # the shared micro setting and the timed distillab step (after the path insert)

from distillab.config import RuntimeContext, load_sweep
from distillab.recipe.distill import setup_trial
from distillab.models import load_model
from distillab.recipe.payload import payload_bytes_per_token
from distillab.models.sources import count_params  # the dry-run's meta-device count, the one there is
from distillab.recipe.prepare import prepare
from distillab.recipe.session import LocalSession

REPO = peer_trl.REPO
#: The paper's teachers (PROTOCOL.md §1), as their ``config.json`` on the Hugging Face Hub gives them
#: (meta-llama/Llama-3.1-8B, Qwen/Qwen2.5-7B): the fields that set the parameter count. Keyed by the
#: sweep file that distils from them.
PAPER_TEACHERS = {
    "paper_llama.yaml": ("Llama-3.1-8B", LlamaConfig(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, tie_word_embeddings=False)),
    "paper_qwen.yaml": ("Qwen2.5-7B", Qwen2Config(
        vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, tie_word_embeddings=False)),
}
BYTES = {"fp32": 4, "bf16": 2}
#: The evaluation before training that `distill.setup_trial` runs (not timed here): as small as it goes
TINY_EVAL = {"id_items": 1, "pass_items": 1, "pass_n": 1, "pass_k": [1], "ood_items": 1, "max_tokens": 4,
             "countdown_tasks": ["countdown3"]}


def _gib(n: float) -> str:
    return f"{n / 2**30:.3g} GiB" if n >= 2**27 else f"{n / 2**20:.3g} MiB"


def timed_source(w, record: list) -> None:
    """Wrap the rollout source that samples (the worker's own at k = 0, the producer's inner one at
    k = 1) so that each generation appends (wall s, CPU s of the calling thread) to ``record``."""
    inner = getattr(w.source, "source", w.source)
    real = inner.get

    def get(*a, **kw):
        t0, c0 = time.perf_counter(), time.thread_time()
        out = real(*a, **kw)
        record.append((time.perf_counter() - t0, time.thread_time() - c0))
        return out

    inner.get = get


def micro_sweep(args, k: int = 0):
    """(sweep, teacher path, student path) of the benchmark's trial: ``--config``'s, OnPD, the
    transformers engine, ``rollout.max_staleness`` k, ``--steps`` steps, ``--batch`` prompts and
    ``--max-tokens`` (defaults: the config's), `TINY_EVAL`; its models from ``prepare`` of the
    config as it is (cached: the trial's overrides would change the prepared models' key)."""
    base = {"models.cache_dir": str(Path(args.cache).resolve()), **peer_trl.extra_sets(args)}
    teacher, student = prepare(load_sweep(args.config, base), threads=1)
    sets = {**base, "trial.rollout.policy": "onpd", "trial.rollout.engine": "transformers",
            "trial.rollout.offpd_reuse": False, "trial.rollout.max_staleness": k, "trial.optimizer.steps": args.steps,
            "trial.optimizer.warmup_steps": 1,  # the config's warm-up may exceed a short run (LR only: same work)
            "trial.evaluation": TINY_EVAL, "search.grid": {"rollout.policy": ["onpd"]}}  # the file's grid: one point
    if args.batch:
        sets["trial.optimizer.prompts_per_step"] = args.batch
    if args.max_tokens:
        sets["trial.rollout.max_tokens"] = args.max_tokens
    return load_sweep(args.config, sets), teacher, student


def one_run(args, k: int) -> dict:
    """``--steps`` steps of the micro OnPD trial at ``rollout.max_staleness`` k: per counted step its
    seconds, the learner's rollout wait, the update, the snapshot, and the generation's wall and CPU s."""
    sweep, teacher, student = micro_sweep(args, k)
    gens: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as d:
        ctx = RuntimeContext(teacher_path=str(teacher), student_path=str(student), results_root=d,
                             shared_cache=str(sweep.shared_cache_dir()), resources=sweep.resources)
        w = setup_trial(sweep.trial, ctx, f"async_teacher_k{k}", LocalSession())
        timed_source(w, gens)
        rows = []
        for step in range(args.steps):
            c0 = time.thread_time()
            secs, rollouts, t_gen = peer_trl.distillab_step(w, step)
            sync = w.last.get("time/sync_s", 0.0)
            rows.append({"step_s": secs, "wait_s": t_gen, "update_s": secs - t_gen - sync, "sync_s": sync,
                         "learner_cpu_s": time.thread_time() - c0, "tokens": sum(rollouts.lengths)})
        w.source.close()
    for r, g in zip(rows, gens):  # generation j produced step j's rollouts (the producer runs them in order)
        r["gen_s"], r["gen_cpu_s"] = g
        r["update_cpu_s"] = r.pop("learner_cpu_s") - (g[1] if k == 0 else 0.0)  # k = 0: the learner generated too
    return {"k": k, "rows": rows[args.warmup:]}


def throughput(args) -> list[str]:
    """Part 1 (module docstring): the runs, alternating, and the table."""
    runs: dict[int, list[dict]] = {0: [], 1: []}
    for rnd in range(args.rounds):
        for k in ((0, 1) if rnd % 2 == 0 else (1, 0)):
            res = one_run(args, k)
            n, s = len(res["rows"]), sum(r["step_s"] for r in res["rows"])
            print(f"  round {rnd} k={k}: {n / s:.2f} steps/s over {n} steps", flush=True)
            runs[k] += res["rows"]
    rate = {k: len(rows) / sum(r["step_s"] for r in rows) for k, rows in runs.items()}
    lines = [("| max_staleness | steps/s | step ms | rollout wait ms | update ms (CPU ms) | snapshot ms | "
              "generation ms (CPU ms) | tokens/step |"), "|---|---|---|---|---|---|---|---|"]
    for k, rows in runs.items():
        med = {f: statistics.median(r[f] for r in rows) * 1e3 for f in
               ("step_s", "wait_s", "update_s", "update_cpu_s", "sync_s", "gen_s", "gen_cpu_s")}
        lines.append(f"| {k} | {rate[k]:.2f} | {med['step_s']:.0f} | {med['wait_s']:.0f} | {med['update_s']:.0f} "
                     f"({med['update_cpu_s']:.0f}) | {med['sync_s']:.1f} | {med['gen_s']:.0f} "
                     f"({med['gen_cpu_s']:.0f}) | "
                     f"{statistics.mean(r['tokens'] for r in rows):.0f} |")
    lines.append(f"\nratio k=1 / k=0: {rate[1] / rate[0]:.2f}x steps/s ({len(runs[0])} + {len(runs[1])} counted steps, "
                 f"{args.rounds} rounds alternating; medians per step; load average now "
                 f"{', '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cores)")
    return lines


def memory(args) -> list[str]:
    """Part 2 (module docstring): teacher parameter bytes per sweep, N in-worker copies against one per node."""
    micro, teacher, _ = micro_sweep(args)
    model = load_model(teacher)
    rows = [("micro teacher", sum(p.numel() for p in model.parameters()), model.lm_head.weight.numel(),
             micro.trial.precision, micro.resources.max_concurrent_trials)]
    for f, (name, cfg) in PAPER_TEACHERS.items():
        s = load_sweep(REPO / "search_spaces" / f, {})
        rows.append((f"{name} ({f})", count_params(cfg), cfg.vocab_size * cfg.hidden_size, s.trial.precision,
                     s.resources.max_concurrent_trials))
    lines = [("| teacher | parameters (lm_head) | dtype | one copy | N trials/node | N in-worker | shared: 1/node, "
              "topk | shared: 1/node + N lm_heads, hidden |"), "|---|---|---|---|---|---|---|---|"]
    for name, n, head, prec, conc in rows:
        one, heads = n * BYTES[prec], conc * head * BYTES[prec]
        lines.append(f"| {name} | {n:,} ({head:,}) | {prec} | {_gib(one)} | {conc} | {_gib(conc * one)} | "
                     f"{_gib(one)} ({conc}x less) | {_gib(one + heads)} ({conc * one / (one + heads):.2g}x less) |")
    return lines


def payload(args) -> list[str]:
    """Part 3 (module docstring): bytes per token of each payload against full logits."""
    micro, teacher, _ = micro_sweep(args)
    c = load_model(teacher).config  # the real micro teacher's lm_head rows and hidden size
    shapes = [("micro", c.vocab_size, c.hidden_size, BYTES[micro.trial.precision])]
    for f, (name, cfg) in PAPER_TEACHERS.items():
        prec = load_sweep(REPO / "search_spaces" / f, {}).trial.precision
        shapes.append((name, cfg.vocab_size, cfg.hidden_size, BYTES[prec]))
    ks = [int(k) for k in args.top_k.split(",")]
    lines = ["| teacher | V | H | dtype bytes | logits B/token | hidden B/token (x less) | "
             + " | ".join(f"top-{k} B/token (x less)" for k in ks) + " |", "|---" * (6 + len(ks)) + "|"]
    for name, v, h, b in shapes:
        full = payload_bytes_per_token("logits", vocab_size=v, hidden_size=h, value_bytes=b)
        cells = [payload_bytes_per_token("hidden", vocab_size=v, hidden_size=h, value_bytes=b)]
        cells += [payload_bytes_per_token("topk", vocab_size=v, hidden_size=h, top_k=k, value_bytes=b) for k in ks]
        lines.append(f"| {name} | {v:,} | {h:,} | {b} | {full:,} | "
                     + " | ".join(f"{c:,} ({full / c:.3g}x)" for c in cells) + " |")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=str(REPO / "search_spaces" / "micro.yaml"),
                   help="sweep YAML whose prepared micro models and trial are timed (default: micro.yaml)")
    p.add_argument("--cache", default=str(REPO / ".cache" / "models"), help="models.cache_dir of the prepared models")
    p.add_argument("--rounds", type=int, default=3, help="rounds of (k=0, k=1) runs, order alternating")
    p.add_argument("--steps", type=int, default=20, help="steps per run")
    p.add_argument("--warmup", type=int, default=2, help="first steps of each run not counted")
    p.add_argument("--batch", type=int, default=None, help="prompts per step (default: the config's)")
    p.add_argument("--max-tokens", dest="max_tokens", type=int, default=None, help="rollout.max_tokens (default: "
                   "the config's)")
    p.add_argument("--top-k", dest="top_k", default="1,2,8,64", help="k values of the top-k payload rows")
    p.add_argument("--parts", default="throughput,memory,payload", help="comma-separated parts to run")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="extra sweep override")
    args = p.parse_args(argv)
    if not 0 <= args.warmup < args.steps:
        p.error(f"--warmup must be in [0, --steps); got {args.warmup} with --steps {args.steps}")
    sweep = micro_sweep(args)[0]
    cfg = sweep.trial
    torch.set_num_threads(sweep.resources.torch_threads)
    parts = args.parts.split(",")
    out = []
    if "throughput" in parts:
        peer_trl.one_rank()
        print(f"{args.config}: OnPD, {cfg.optimizer.prompts_per_step} prompts/step, <= {cfg.rollout.max_tokens} new "
              f"tokens, {sweep.resources.torch_threads} torch thread(s)", flush=True)
        out += ["\n## Throughput: rollout.max_staleness 0 against 1", *throughput(args)]
    if "memory" in parts:
        out += ["\n## Teacher parameter memory per sweep", *memory(args)]
    if "payload" in parts:
        out += ["\n## Teacher payload per token", *payload(args)]
    print("\n".join(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
