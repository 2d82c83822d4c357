"""The calibration table of docs/calibration.md (issue 17): per completed trial of the
given sweeps, its LR and master-weight precision against the three dependent variables
the findings study needs to move: forgetting (ΔOOD, ``eval/forgetting``), update
sparsity S_τ (PROTOCOL.md §4, τ = 1e-6, both checkpoints compared in
``evaluation.sparsity_dtype``; with the touched-entries diagnostic beside it) and
Countdown-3 accuracy and pass@10 and Countdown-4E pass@10, before (stage ``pre``) and
after distillation.

    python scripts/calibration_table.py runs/calib_lr_precision runs/calib_lr_precision_b
    python scripts/calibration_table.py --rlvr runs/calib_rlvr
    python scripts/calibration_table.py --models search_spaces/micro_findings.yaml search_spaces/calibration/student_a.yaml
    python scripts/calibration_table.py --task math runs/calib_math_lr runs/calib_math_lr_400
    python scripts/calibration_table.py --tensors runs/calib_smol_masters

Prints a Markdown table (one row per trial, sorted by policy, KL, master weights, LR).
``--rlvr``: one row per trial with an RLVR stage instead: its λ, KL, distillation and RLVR
LRs, the mean training reward over the stage's first and last ``--window`` steps
(`analysis.results.rlvr_reward_summary`) and Countdown-3 accuracy, Countdown-4E pass@10 and
Countdown-4 accuracy after distillation and after RLVR. ``--models``: the arguments are
sweep YAMLs; one row per prepared micro model they name (teacher and student, each once), the
scores `distillab prepare` evaluated it with (its ``prepare.json``: float32, all threads of
the machine it was prepared on) and its SFT seconds; a model not prepared yet is left out.
``--task math``: the long-reasoning ablation's table instead (`MATH_COLUMNS`: the math task's
accuracy and pass@10 and the OOD mean before and after distillation, ΔOOD, S_1e-6, steps).
``--tensors``: S_1e-6 per tensor kind (`tensor_table`) instead, one column per trial. The prose
loss columns (nats/token) appear for a sweep with ``evaluation.ood_backend: pretrained``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import polars as pl

from distillab.analysis.plots import tensor_kind
from distillab.analysis.results import final_evals, load, rlvr_reward_summary, trial_metrics
from distillab.driver.cli import parse_overrides
from distillab.config import load_sweep
from distillab.recipe.prepare import prepare_key

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
    "eval/pre/ood/prose/loss": "prose loss (pre)",
    "eval/distill/ood/prose/loss": "prose loss",
    "eval/distill/params/sparsity@1e-06": "S_1e-6",
    "eval/distill/params/touched_share": "touched share",
    "eval/distill/params/sparsity_touched@1e-06": "S_1e-6 (touched)",
}

#: ``--task math`` (search_spaces/micro_math.yaml and its calibration): the student distils on the math task
MATH_COLUMNS = {
    "rollout.policy": "policy",
    "loss.kind": "KL",
    "optimizer.steps": "steps",
    "optimizer.lr": "LR",
    "eval/pre/math/accuracy": "math acc (pre)",
    "eval/distill/math/accuracy": "math acc",
    "eval/pre/math/pass@10": "math pass@10 (pre)",
    "eval/distill/math/pass@10": "math pass@10",
    "eval/pre/ood/ood_mean": "OOD mean (pre)",
    "eval/distill/ood/ood_mean": "OOD mean",
    "eval/forgetting": "ΔOOD",
    "eval/distill/params/sparsity@1e-06": "S_1e-6",
}


RLVR_COLUMNS = {
    "rollout.lambda": "λ",
    "loss.kind": "KL",
    "optimizer.lr": "LR",
    "rlvr.lr": "RLVR LR",
    "first": "reward (first)",
    "last": "reward (last)",
    "eval/distill/countdown3/accuracy": "cd3 acc (distill)",
    "eval/rlvr/countdown3/accuracy": "cd3 acc (rlvr)",
    "eval/distill/countdown4e/pass@10": "4E pass@10 (distill)",
    "eval/rlvr/countdown4e/pass@10": "4E pass@10 (rlvr)",
    "eval/distill/countdown4/accuracy": "cd4 acc (distill)",
    "eval/rlvr/countdown4/accuracy": "cd4 acc (rlvr)",
}


def rlvr_table(paths: list[str], window: int) -> pl.DataFrame:
    """One row per completed trial with an RLVR stage of the sweeps at ``paths``: the
    `RLVR_COLUMNS` (renamed; the rewards are means over the first and last ``window``
    steps), floats rounded to 3 places."""
    frames = []
    for p in paths:
        res = load(p)
        frames.append(trial_metrics(res).join(rlvr_reward_summary(res, window), on="trial_id", how="inner"))
    wide = pl.concat([f.select([c for c in RLVR_COLUMNS if c in f.columns]) for f in frames], how="diagonal_relaxed")
    wide = wide.rename({k: v for k, v in RLVR_COLUMNS.items() if k in wide.columns})
    return wide.sort("RLVR LR", "KL", "λ").with_columns(pl.col(pl.Float64).exclude("LR", "RLVR LR").round(3))


MODEL_SCORES = {
    "countdown3:accuracy": "cd3 acc", "countdown3:pass@10": "cd3 pass@10", "countdown4e:accuracy": "4E acc",
    "countdown4e:pass@10": "4E pass@10", "countdown4:accuracy": "cd4 acc", "countdown4:pass@10": "cd4 pass@10",
    "math:accuracy": "math acc", "math:pass@10": "math pass@10", "ood:ood_mean": "OOD mean",
}


def models_table(configs: list[str], overrides: dict | None = None) -> pl.DataFrame:
    """One row per prepared micro model of the sweep YAMLs ``configs`` with the ``--set``
    ``overrides`` (`prepare.prepare_key`; each model once): its config, role, directory, SFT
    seconds and `MODEL_SCORES` from its ``prepare.json``."""
    rows, seen = [], set()
    for cfg in configs:
        sweep = load_sweep(cfg, overrides)
        for role in ("teacher", "student"):
            d = Path(sweep.models.cache_dir).expanduser() / f"{role}-{prepare_key(sweep, role)}"
            if d.name in seen or not (d / "prepare.json").exists():
                continue
            seen.add(d.name)
            info = json.loads((d / "prepare.json").read_text())
            scores = {r["task"] + ":" + r["metric"]: r["value"] for r in info["evals"]}
            rows.append({"config": cfg.removeprefix("search_spaces/"), "model": d.name, "SFT s": info["train_seconds"],
                         **{name: round(scores[k], 3) for k, name in MODEL_SCORES.items() if k in scores}})
    return pl.DataFrame(rows)


def _trial_label(row: dict) -> str:
    """``policy KL masters LR seed`` of a trial's row (its config columns)."""
    return " ".join(str(row.get(c)) for c in ("rollout.policy", "loss.kind", "master_weights", "optimizer.lr", "seed"))


def tensor_table(paths: list[str], tau: str = "1e-06") -> pl.DataFrame:
    """S_τ after distillation per tensor kind (`analysis.plots.tensor_kind`: the layer index as ``*``)
    for each completed trial of the sweeps at ``paths``: the kind's per-tensor values
    (evals task ``params/<name>``, metric ``sparsity@<tau>``) weighted by their element counts
    ``n``, so a row is the share of the kind's entries unchanged; the first row (``all``) is
    the trial's overall S_τ (task ``params``). One column per trial (`_trial_label`), floats
    rounded to 3 places; columns sorted by label."""
    metric = f"sparsity@{tau}"
    frames = []
    for p in paths:
        fe = final_evals(load(p)).filter((pl.col("stage") == "distill") & (pl.col("metric") == metric)
                                         & pl.col("task").str.starts_with("params")).collect()
        labels = pl.Series("trial", [_trial_label(r) for r in fe.iter_rows(named=True)], dtype=pl.String)
        frames.append(fe.with_columns(labels).select("trial", "task", "value", "n"))
    df = pl.concat(frames)
    kinds = df.filter(pl.col("task") != "params").with_columns(
        pl.col("task").str.strip_prefix("params/").map_elements(tensor_kind, return_dtype=pl.String).alias("tensor"))
    per_kind = kinds.group_by("trial", "tensor").agg(((pl.col("value") * pl.col("n")).sum() / pl.col("n").sum())
                                                     .alias("value"), pl.col("n").sum().alias("entries"))
    overall = df.filter(pl.col("task") == "params").select("trial", pl.lit("all").alias("tensor"), "value")
    entries = per_kind.group_by("tensor").agg(pl.col("entries").first())
    entries = pl.concat([entries, pl.DataFrame({"tensor": ["all"], "entries": [entries["entries"].sum()]})],
                        how="vertical_relaxed")
    wide = pl.concat([overall, per_kind.select("trial", "tensor", "value")]).pivot(
        on="trial", index="tensor", values="value", sort_columns=True)
    wide = wide.join(entries, on="tensor", how="left").sort(pl.col("tensor") != "all", "tensor")
    return wide.select("tensor", "entries", pl.exclude("tensor", "entries").round(3))


def table(paths: list[str], columns: dict[str, str] = COLUMNS) -> pl.DataFrame:
    """One row per completed trial of the sweeps at ``paths``: the ``columns`` (`COLUMNS`, or
    `MATH_COLUMNS`; renamed), floats rounded to 3 places."""
    frames = [trial_metrics(load(p)).filter(pl.col("status") == "completed") for p in paths]
    wide = pl.concat([f.select([c for c in columns if c in f.columns]) for f in frames], how="diagonal_relaxed")
    wide = wide.rename({k: v for k, v in columns.items() if k in wide.columns})
    wide = wide.sort([c for c in ("policy", "KL", "masters", "steps", "LR") if c in wide.columns])
    return wide.with_columns(pl.col(pl.Float64).exclude("LR").round(3))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="+", help="sweep directories (<storage_path>/<name>)")
    ap.add_argument("--rlvr", action="store_true", help="the RLVR table (trials with an RLVR stage)")
    ap.add_argument("--models", action="store_true", help="PATHS are sweep YAMLs: their prepared models' scores")
    ap.add_argument("--tensors", action="store_true", help="S_1e-6 per tensor kind, one column per trial")
    ap.add_argument("--window", type=int, default=30, help="--rlvr: steps averaged for the first/last reward")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="--models: a config override, as distillab prepare's --set")
    ap.add_argument("--task", choices=("countdown", "math"), default="countdown",
                    help="math: the long-reasoning ablation's columns (MATH_COLUMNS)")
    args = ap.parse_args()
    with pl.Config(tbl_formatting="MARKDOWN", tbl_hide_column_data_types=True, tbl_hide_dataframe_shape=True,
                   tbl_rows=-1, tbl_cols=-1, fmt_str_lengths=60, tbl_width_chars=400):
        if args.models:
            print(models_table(args.paths, parse_overrides(args.set)))
        elif args.tensors:
            print(tensor_table(args.paths))
        else:
            print(rlvr_table(args.paths, args.window) if args.rlvr
                  else table(args.paths, MATH_COLUMNS if args.task == "math" else COLUMNS))


if __name__ == "__main__":
    main()
