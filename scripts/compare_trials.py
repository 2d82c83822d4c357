"""The same trials in two sweep directories, side by side: how far apart two runs of one
config are (e.g. a bf16 sweep on torch's native bf16 kernels against the same sweep with its
products in float32, `distillab.models.Bf16MatmulsInFloat32`).

For every trial id present in both: the mean and max relative difference of the per-step
``loss`` and ``grad_norm`` over the steps both logged, and the final metrics named by
``--metric`` (default: Countdown-3 accuracy and pass@10, Countdown-4E pass@10, update
sparsity S_1e-6, forgetting) from each run.

    DISTILLAB_BF16_MATMULS=native distillab sweep search_spaces/micro_noclip.yaml --no-dashboard \\
        --set storage_path=runs/native --set "search.grids=[{grid: {rollout.policy: [offpd], \\
        loss.kind: [forward], optimizer.lr: [1.0e-4], seed: [42, 43]}}]"
    DISTILLAB_BF16_MATMULS=float32 distillab sweep ...same, --set storage_path=runs/float32
    python scripts/compare_trials.py runs/native/micro_noclip runs/float32/micro_noclip
"""

from __future__ import annotations

import argparse

import polars as pl

from distillab.analysis.results import load, trial_metrics

METRICS = ["eval/distill/countdown3/accuracy", "eval/distill/countdown3/pass@10", "eval/distill/countdown4e/pass@10",
           "eval/distill/params/sparsity@1e-06", "eval/forgetting"]


def step_differences(a: pl.DataFrame, b: pl.DataFrame, trial_id: str, name: str) -> tuple[int, float, float]:
    """(steps compared, mean, max) of |a − b| / |a| of metric ``name`` per step of ``trial_id``."""
    def steps(m: pl.DataFrame) -> pl.DataFrame:
        return m.filter((pl.col("trial_id") == trial_id) & (pl.col("name") == name)).select("step", "value")

    j = steps(a).join(steps(b), on="step", suffix="_b")
    rel = ((j["value"] - j["value_b"]).abs() / j["value"].abs())
    return j.height, float(rel.mean() or 0.0), float(rel.max() or 0.0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_a")
    p.add_argument("run_b")
    p.add_argument("--metric", action="append", help="a final metric to compare (repeatable)")
    args = p.parse_args()
    ra, rb = load(args.run_a), load(args.run_b)
    ma, mb = ra.metrics.collect(), rb.metrics.collect()
    wa, wb = trial_metrics(ra), trial_metrics(rb)
    common = sorted(set(wa["trial_id"]) & set(wb["trial_id"]))
    if not common:
        raise SystemExit(f"no trial id in both {args.run_a} and {args.run_b}")
    for tid in common:
        print(tid)
        for name in ("loss", "grad_norm"):
            n, mean, mx = step_differences(ma, mb, tid, name)
            print(f"  {name:10s} {n} steps: relative difference mean {mean:.2e}, max {mx:.2e}")
        for m in args.metric or METRICS:
            va = wa.filter(pl.col("trial_id") == tid)[m][0] if m in wa.columns else None
            vb = wb.filter(pl.col("trial_id") == tid)[m][0] if m in wb.columns else None
            print(f"  {m:36s} {va!s:>10.8s} {vb!s:>10.8s}")


if __name__ == "__main__":
    main()
