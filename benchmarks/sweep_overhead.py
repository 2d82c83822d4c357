"""Per-trial overhead of Ray Tune + Ray Train start-up, and how a sweep's wall time
grows with its number of trials, on this machine.

Runs the smoke sweep (search_spaces/smoke.yaml: tiny models, 4 steps, so start-up
dominates) as a grid over N seeds, for N = 2 and N = 8, 2 trials at a time, and prints
per trial: wall time (its ``trials`` row: end − start), in-loop time (the training
loop's ``time/train_s``) and overhead = wall − in-loop (Tune actor, TorchTrainer
controller and worker start-up, DeepSpeed initialise, model loading, evaluations
before and after, checkpoint upload); then the sweep wall times and their ratio.

    python benchmarks/sweep_overhead.py            # about 5 minutes on 2 cores
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(n: int, storage: Path) -> dict[str, float]:
    import polars as pl
    import ray

    from distillab.config import load_sweep
    from distillab.prepare import prepare
    from distillab.results import load
    from distillab.sweep import run_sweep

    sweep = load_sweep(REPO / "search_spaces" / "smoke.yaml", {
        "name": f"overhead{n}", "storage_path": str(storage), "models.cache_dir": str(REPO / ".cache" / "models"),
        "search.grid": {"seed": list(range(n))},
    })
    teacher, student = prepare(sweep, threads=1)
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    try:
        t0 = time.perf_counter()
        root = run_sweep(sweep, teacher, student, verbose=0)
        wall = time.perf_counter() - t0
    finally:
        ray.shutdown()
    res = load(root)
    trials = res.trials.select("trial_id", (pl.col("end_time") - pl.col("start_time")).alias("wall")).collect()
    loop = res.metrics.filter(pl.col("name") == "time/train_s").select("trial_id", pl.col("value").alias("loop")).collect()
    t = trials.join(loop, on="trial_id")
    over = (t["wall"] - t["loop"]).to_list()
    return {"n": n, "sweep_wall": wall, "trial_wall": statistics.mean(t["wall"]), "loop": statistics.mean(t["loop"]),
            "overhead": statistics.mean(over), "overhead_sd": statistics.pstdev(over)}


def main() -> int:
    with tempfile.TemporaryDirectory() as d:
        rows = [run(n, Path(d)) for n in (2, 8)]
    print(f"{'trials':>6} {'sweep wall s':>12} {'trial wall s':>12} {'in-loop s':>9} {'overhead s':>10}")
    for r in rows:
        print(f"{r['n']:>6} {r['sweep_wall']:>12.1f} {r['trial_wall']:>12.1f} {r['loop']:>9.2f} "
              f"{r['overhead']:>7.1f} ± {r['overhead_sd']:.1f}")
    a, b = rows
    print(f"sweep wall time 8 vs 2 trials: {b['sweep_wall'] / a['sweep_wall']:.2f}x "
          f"(4x the trials; 2 run at a time)")
    print(f"overhead share of a trial's wall time: {a['overhead'] / a['trial_wall']:.0%} (smoke trials: 4 steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
