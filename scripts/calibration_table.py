"""The calibration table of docs/calibration.md (issue 17): per completed trial of the
given sweeps, its LR and master-weight precision against the three dependent variables
the findings study needs to move: forgetting (ΔOOD, ``eval/forgetting``), update
sparsity S_τ (PROTOCOL.md §4, τ = 1e-6, both checkpoints compared in
``evaluation.sparsity_dtype``; with the touched-entries diagnostic beside it) and
Countdown-3 accuracy and pass@10 and Countdown-4E pass@10, before (stage ``pre``) and
after distillation.

    python scripts/calibration_table.py runs/calib_lr_precision runs/calib_lr_precision_b

Prints a Markdown table (one row per trial, sorted by policy, KL, master weights, LR).
"""

from __future__ import annotations

import argparse

import polars as pl

from distillab.results import load, trial_metrics

COLUMNS = {
    "rollout.policy": "policy",
    "loss.kind": "KL",
    "master_weights": "masters",
    "optimizer.lr": "LR",
    "eval/pre/countdown3/accuracy": "cd3 acc (pre)",
    "eval/distill/countdown3/accuracy": "cd3 acc",
    "eval/distill/countdown3/pass@10": "cd3 pass@10",
    "eval/pre/countdown4e/pass@10": "4E pass@10 (pre)",
    "eval/distill/countdown4e/pass@10": "4E pass@10",
    "eval/distill/ood/ood_mean": "OOD mean",
    "eval/forgetting": "ΔOOD",
    "eval/distill/params/sparsity@1e-06": "S_1e-6",
    "eval/distill/params/touched_share": "touched share",
    "eval/distill/params/sparsity_touched@1e-06": "S_1e-6 (touched)",
}


def table(paths: list[str]) -> pl.DataFrame:
    """One row per completed trial of the sweeps at ``paths``: the `COLUMNS` (renamed),
    floats rounded to 3 places."""
    frames = [trial_metrics(load(p)).filter(pl.col("status") == "completed") for p in paths]
    wide = pl.concat([f.select([c for c in COLUMNS if c in f.columns]) for f in frames], how="diagonal_relaxed")
    wide = wide.rename({k: v for k, v in COLUMNS.items() if k in wide.columns})
    wide = wide.sort([c for c in ("policy", "KL", "masters", "LR") if c in wide.columns])
    return wide.with_columns(pl.col(pl.Float64).exclude("LR").round(3))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="+", help="sweep directories (<storage_path>/<name>)")
    args = ap.parse_args()
    with pl.Config(tbl_formatting="MARKDOWN", tbl_hide_column_data_types=True, tbl_hide_dataframe_shape=True,
                   tbl_rows=-1, tbl_cols=-1, fmt_str_lengths=40, tbl_width_chars=400):
        print(table(args.paths))


if __name__ == "__main__":
    main()
