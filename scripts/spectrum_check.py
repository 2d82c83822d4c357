"""The paper's Figure 4 check on the prepared micro models: sample Countdown-3 rollouts
from the λ-spectrum π_λ (PROTOCOL.md §3) for λ = −2, −1, 0, 1, 2 and print the mean
student and teacher log-likelihood (nats per token, at τ_S and τ_T) of the samples.
The student's must rise and the teacher's fall along λ; exit status 1 if not.

    python scripts/spectrum_check.py search_spaces/micro.yaml      # prepare is cached
"""

from __future__ import annotations

import argparse
import sys

import torch


def spectrum_table(sweep, *, lambdas=(-2.0, -1.0, 0.0, 1.0, 2.0), prompts: int = 64, n: int = 4,
                   threads: int = 2) -> list[dict[str, float]]:
    """Prepare (cached) the sweep's micro models and run `loglik_along_lambda` on
    ``prompts`` Countdown-3 training prompts, ``n`` samples each, at the trial's
    rollout settings (τ_S, τ_T, top-p, max tokens, α, c)."""
    from distillab.models import load_model, load_tokenizer
    from distillab.recipe.prepare import prepare
    from distillab.rollout.spectrum import loglik_along_lambda
    from distillab.tasks.data import train_prompts

    torch.set_num_threads(threads)
    teacher_dir, student_dir = prepare(sweep, threads=threads)
    tok = load_tokenizer(student_dir)
    teacher, student = load_model(teacher_dir).eval(), load_model(student_dir).eval()
    r = sweep.trial.rollout
    ids = train_prompts(sweep.trial, tok, rank=0)[:prompts]
    return loglik_along_lambda(student, teacher, tok, ids, list(lambdas), tau_s=r.tau_s, tau_t=r.tau_t,
                               top_p=r.top_p, max_tokens=r.max_tokens, n=n, seed=sweep.trial.seed)


def monotone(rows: list[dict[str, float]]) -> bool:
    """Student log-likelihood strictly rising and teacher's strictly falling along λ."""
    s = [r["student_loglik"] for r in rows]
    t = [r["teacher_loglik"] for r in rows]
    return all(b > a for a, b in zip(s, s[1:])) and all(b < a for a, b in zip(t, t[1:]))


def main(argv: list[str] | None = None) -> int:
    from distillab.config import load_sweep

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=4, help="samples per prompt")
    args = ap.parse_args(argv)
    rows = spectrum_table(load_sweep(args.config), prompts=args.prompts, n=args.n)
    print(f"{'λ':>5} {'student loglik':>15} {'teacher loglik':>15} {'length':>7}")
    for r in rows:
        print(f"{r['lambda']:>5.1f} {r['student_loglik']:>15.4f} {r['teacher_loglik']:>15.4f} {r['length']:>7.1f}")
    ok = monotone(rows)
    print("student rises and teacher falls along λ:", "yes" if ok else "NO")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
