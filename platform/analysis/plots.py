"""Figures of a sweep, drawn from the Polars result frames (``distillab.analysis.results``).

One function per figure, each taking a :class:`~distillab.analysis.results.Results` and
returning a ``matplotlib.figure.Figure``; the notebook (``notebooks/analysis.ipynb``)
and ``distillab report PATH --plots DIR`` both call them, so there is one drawing
code path. Figures are built on the Agg canvas directly (no ``pyplot``, no global
backend switch), so this works headless and inside Jupyter alike.

    (a) :func:`fig_policy_kl`   ID accuracy, ΔOOD and sparsity per policy × KL at each LR
    (b) :func:`fig_lr`          forgetting and sparsity against LR per policy (× KL)
    (c) :func:`fig_lambda`      accuracy, forgetting and sparsity along λ per KL direction
    (d) :func:`fig_pass_at_k`   pass@1 and pass@k on Countdown-3 and Countdown-4E
    (e) :func:`fig_rlvr`        RLVR reward curves per distilled checkpoint, 4E before/after
    (f) :func:`fig_loglik`      mean student and teacher log-likelihood of rollouts along λ
    (g) :func:`fig_tensor_sparsity` update sparsity S_τ per tensor kind, per swept configuration
    (h) :func:`fig_estimator`   the oracle: each estimator's bias and gradient cosine against steps

and the figures of ``distillab findings`` (`distillab.analysis.findings`): :func:`fig_accuracy_lr`
(accuracy against LR per policy × KL), :func:`fig_coverage_gap` (pass@k − pass@1 against
LR and along λ) and :func:`fig_hard_pass_lambda` (Countdown-4E pass@k along λ, before and
after RLVR).

Every value is a mean over seeds (completed trials only) with SEM error bars. A
panel whose data are absent (no λ column, no ``rlvr`` stage, ...) shows
"no data: <why>" instead of failing; :func:`figure_notes` returns those lines.

    >>> from distillab.analysis.results import load
    >>> from distillab.analysis.plots import write_report
    >>> write_report(load("runs/micro"), "docs/figures")      # doctest: +SKIP
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any, Callable, Sequence

import polars as pl
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from distillab.analysis.results import (
    Results,
    aggregate,
    filter_trials,
    final_evals,
    final_table,
    forgetting,
    format_table,
    generalisation_gain,
    group_columns,
    mean_sem_text,
    rlvr_gain,
    trial_counts,
)
from distillab.registry import AXES, OFFPD, ONPD, SPECTRUM, require

__all__ = [
    "POLICY", "KL", "LR", "LAMBDA", "SEED",
    "REWARD", "STUDENT_LOGLIK", "TEACHER_LOGLIK",
    "FIGURES",
    "fig_policy_kl", "fig_lr", "fig_lambda", "fig_pass_at_k", "fig_rlvr", "fig_loglik", "fig_tensor_sparsity",
    "tensor_kind", "fig_estimator", "ESTIMATOR_BIAS", "ESTIMATOR_GRAD_COS",
    "fig_accuracy_lr", "fig_coverage_gap", "fig_hard_pass_lambda",
    "figure_notes", "save_figure", "swept_columns", "summary_table", "summary_markdown",
    "write_report",
]

#: Config columns the figures are laid out by.
POLICY, KL, LR, LAMBDA, SEED = "rollout.policy", "loss.kind", "optimizer.lr", "rollout.lambda", "seed"
ID_TASK, HARD_TASK = "countdown3", "countdown4e"
#: ``metrics`` name (stage ``rlvr``) of the mean training reward per RLVR step (`distillab.registry`).
REWARD = require("rlvr/reward_mean")
#: ``metrics`` names (stage ``distill``) of the mean per-token log-likelihood of the
#: step's rollouts under the student and the teacher.
STUDENT_LOGLIK = require("rollout/student_loglik")
TEACHER_LOGLIK = require("rollout/teacher_loglik")
#: ``metrics`` names (stage ``distill``, every ``loss.oracle_every`` steps) of the oracle (`ops.oracle`).
ESTIMATOR_BIAS = require("estimator/bias")
ESTIMATOR_GRAD_COS = require("estimator/grad_cos")
#: Label columns that are not study axes and print their value alone (an axis prints as `registry.Axis.text`).
_BARE = ("stage", "metric", "sweep")
_STAGE_ORDER = {"pre": 0, "distill": 1, "rlvr": 2}
_PASS_RE = re.compile(r"pass@(\d+)")


# --------------------------------------------------------------------------- data


def swept_columns(res: Results, exclude: Sequence[str] = ()) -> list[str]:
    """The columns the figures lay out and label: `analysis.results.group_columns` (the swept study
    axes of `registry.AXES` that group, ``sweep`` when several sweeps differ, and any other config
    column that would otherwise pool two configurations), without ``exclude``; never the seed, which
    every mean is over."""
    return group_columns(res, exclude)


def _with_dims(df: pl.DataFrame, dims: Sequence[str]) -> pl.DataFrame:
    missing = [d for d in dims if d not in df.columns]
    return df.with_columns(pl.lit(None).alias(d) for d in missing) if missing else df


def _final(res: Results, stage: str, task: str, metric: str) -> pl.DataFrame:
    """Per completed trial, the final eval value of ``(stage, task, metric)``."""
    return final_evals(res).filter(
        (pl.col("stage") == stage) & (pl.col("task") == task) & (pl.col("metric") == metric)
    ).collect()


def _metrics_available(res: Results, stage: str, task: str) -> list[str]:
    return (
        final_evals(res)
        .filter((pl.col("stage") == stage) & (pl.col("task") == task))
        .select(pl.col("metric").unique())
        .collect()["metric"]
        .to_list()
    )


def _sparsity_metric(res: Results) -> str | None:
    """``sparsity@1e-06`` (PROTOCOL.md §4) when present, else the largest τ present."""
    names = [m for m in _metrics_available(res, "distill", "params") if m.startswith("sparsity@")]
    if not names:
        return None
    if "sparsity@1e-06" in names:
        return "sparsity@1e-06"

    def tau(m: str) -> float:
        try:
            return float(m.split("@", 1)[1])
        except ValueError:
            return -math.inf

    return max(names, key=tau)


def _pass_metrics(res: Results, task: str) -> list[str]:
    """``pass@1`` and the largest ``pass@k`` (k > 1) present for ``task``."""
    ks = sorted(
        int(m.group(1))
        for m in map(_PASS_RE.fullmatch, _metrics_available(res, "distill", task))
        if m
    )
    out = [f"pass@{k}" for k in ks if k == 1]
    if ks and ks[-1] > 1:
        out.append(f"pass@{ks[-1]}")
    return out


def _has_lambda(res: Results) -> bool:
    if LAMBDA not in res.trials.collect_schema().names():
        return False
    return res.trials.select(pl.col(LAMBDA).is_not_null().any()).collect().item()


def _present(res: Results, stage: str, name: str) -> str | None:
    """``name`` when the ``metrics`` table has it at ``stage``, else None."""
    found = res.metrics.filter((pl.col("stage") == stage) & (pl.col("name") == name)).select(pl.len()).collect().item()
    return name if found else None


def _trial_metric_mean(res: Results, stage: str, name: str) -> pl.DataFrame:
    """Per completed trial, the mean over steps of metric ``name`` in ``stage``."""
    keys = ["sweep", "trial_id"] if "sweep" in res.metrics.collect_schema().names() else ["trial_id"]
    per_trial = (
        res.metrics.filter((pl.col("stage") == stage) & (pl.col("name") == name))
        .group_by(keys)
        .agg(pl.col("value").mean())
    )
    return (
        per_trial.join(res.trials, on=keys, how="inner")
        .filter(pl.col("status") == "completed")
        .collect()
    )


# --------------------------------------------------------------------------- drawing


def _new_figure(ncols: int, title: str, width: float = 5.0, height: float = 4.0) -> tuple[Figure, list]:
    fig = Figure(figsize=(width * ncols, height), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, ncols, squeeze=False)[0].tolist()
    fig.suptitle(title)
    fig._distillab_notes = []  # type: ignore[attr-defined]
    return fig, axes


def figure_notes(fig: Figure) -> list[str]:
    """The "no data" notes of a figure's panels (empty when every panel has data)."""
    return list(getattr(fig, "_distillab_notes", []))


def _no_data(fig: Figure, ax, title: str, why: str) -> None:
    ax.set_title(title)
    ax.text(0.5, 0.5, f"no data:\n{why}", ha="center", va="center", wrap=True,
            transform=ax.transAxes, fontsize=10, color="0.35")
    ax.set_xticks([])
    ax.set_yticks([])
    fig._distillab_notes.append(f"{fig.get_suptitle()} / {title}: no data: {why}")


def _fmt(col: str, v: Any) -> str:
    """A label's text of column ``col`` at value ``v``: the axis's `registry.Axis.text` (``λ=0.5``,
    ``offpd``), the value alone for stage, metric and sweep, else ``<last part of the key>=<value>``."""
    if col in AXES:
        return AXES[col].text(v)
    if v is None:
        return "–"
    v = f"{v:g}" if isinstance(v, float) else v
    return f"{v}" if col in _BARE else f"{col.rsplit('.', 1)[-1]}={v}"


def _label(cols: Sequence[str], values: Sequence[Any]) -> str:
    return ", ".join(_fmt(c, v) for c, v in zip(cols, values)) or "all"


def _groups(df: pl.DataFrame, cols: Sequence[str]) -> list[tuple]:
    """The distinct values of ``cols``, sorted (stages in pipeline order, nulls last)."""
    if not cols:
        return [()]
    rows = df.select(cols).unique().sort(list(cols), nulls_last=True).rows()
    if "stage" in cols:
        i = list(cols).index("stage")
        rows.sort(key=lambda r: _STAGE_ORDER.get(r[i], len(_STAGE_ORDER)))  # stable
    return rows


def _match(df: pl.DataFrame, cols: Sequence[str], values: Sequence[Any]) -> pl.DataFrame:
    for c, v in zip(cols, values):
        df = df.filter(pl.col(c).is_null() if v is None else pl.col(c) == v)
    return df


def _sem0(s: Any) -> float:
    return 0.0 if s is None or (isinstance(s, float) and math.isnan(s)) else float(s)


def _bars(ax, agg: pl.DataFrame, cats: Sequence[str], bar: str | None, ylabel: str, title: str) -> None:
    """Grouped bars: one group per value of ``cats``, one bar per value of ``bar``,
    height = mean, error bar = SEM; ``n`` over seeds written above each bar."""
    cat_rows = _groups(agg, cats)
    bar_vals = _groups(agg, [bar]) if bar else [()]
    width = 0.8 / max(1, len(bar_vals))
    for j, bv in enumerate(bar_vals):
        sub = _match(agg, [bar], bv) if bar else agg
        xs, means, sems, ns = [], [], [], []
        for i, cv in enumerate(cat_rows):
            row = _match(sub, cats, cv)
            if row.height:
                xs.append(i - 0.4 + width * (j + 0.5))
                means.append(row["mean"][0])
                sems.append(_sem0(row["sem"][0]))
                ns.append(row["n"][0])
        label = _label([bar], bv) if bar else None
        rects = ax.bar(xs, means, width * 0.95, yerr=sems, capsize=3, label=label)
        ax.bar_label(rects, labels=[f"n={n}" for n in ns], fontsize=7, padding=2)
    ax.set_xticks(range(len(cat_rows)), [_label(cats, cv) for cv in cat_rows],
                  rotation=20 if len(cat_rows) > 3 else 0, ha="right" if len(cat_rows) > 3 else "center")
    ax.axhline(0, color="0.6", lw=0.8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if bar:
        ax.legend(fontsize=8)


def _lines(ax, agg: pl.DataFrame, x: str, series: Sequence[str], ylabel: str, title: str,
           *, linestyle: str = "-", color_offset: int = 0, suffix: str = "", band: bool = False) -> None:
    """One line per value of ``series``: mean against ``x`` with SEM error bars
    (or a shaded band for dense x such as training steps)."""
    for i, sv in enumerate(_groups(agg, series)):
        sub = _match(agg, series, sv).filter(pl.col(x).is_not_null()).sort(x)
        if not sub.height:
            continue
        xs = sub[x].to_list()
        means = sub["mean"].to_list()
        sems = [_sem0(s) for s in sub["sem"].to_list()]
        color = f"C{(i + color_offset) % 10}"
        label = _label(series, sv) + suffix
        if band:
            ax.plot(xs, means, linestyle=linestyle, color=color, label=label)
            ax.fill_between(xs, [m - s for m, s in zip(means, sems)],
                            [m + s for m, s in zip(means, sems)], color=color, alpha=0.2)
        else:
            ax.errorbar(xs, means, yerr=sems, marker="o", capsize=3, linestyle=linestyle,
                        color=color, label=label)
    values = [v for v in agg[x].to_list() if v is not None]
    if x == LR and len(set(values)) > 1 and min(values) > 0:
        ax.set_xscale("log")
    ax.set_xlabel({LR: "learning rate", LAMBDA: "λ (rollout spectrum)", "step": "RLVR step"}.get(x, x))
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)


def _extra(res: Results, used: Sequence[str]) -> list[str]:
    """Swept columns a figure does not lay out explicitly: they join the labels, so
    different configurations are never averaged together."""
    return [c for c in swept_columns(res) if c not in used]


def _quantity(res: Results, name: str, task: str = ID_TASK) -> tuple[pl.DataFrame | None, str, str]:
    """Per-trial frame (with ``value``), axis label and why it is absent (``id_accuracy``: on ``task``)."""
    if name == "id_accuracy":
        df = _final(res, "distill", task, "accuracy")
        return df, f"{task} accuracy", f"no {task} accuracy at stage distill"
    if name == "hard_accuracy":
        df = _final(res, "distill", HARD_TASK, "accuracy")
        return df, f"{HARD_TASK} accuracy", f"no {HARD_TASK} accuracy at stage distill"
    if name == "delta_ood":
        df = forgetting(res).collect()
        return df, "ΔOOD (after − before)", "no ood/ood_mean at both stages pre and distill"
    if name == "sparsity":
        metric = _sparsity_metric(res)
        if metric is None:
            return None, "update sparsity", "no params/sparsity@τ evals at stage distill"
        return _final(res, "distill", "params", metric), f"update {metric}", ""
    raise ValueError(name)


def _panel_bars(fig, ax, res: Results, name: str, cats: list[str], bar: str | None) -> None:
    df, ylabel, why = _quantity(res, name)
    if df is None or df.height == 0:
        _no_data(fig, ax, ylabel, why)
        return
    dims = [*cats, *([bar] if bar else [])]
    agg = aggregate(_with_dims(df, dims), dims)
    _bars(ax, agg, cats, bar, ylabel, ylabel)


def _panel_lines(fig, ax, res: Results, name: str, x: str, series: list[str], why_x: str | None = None,
                 task: str = ID_TASK) -> None:
    df, ylabel, why = _quantity(res, name, task)
    if why_x is not None:
        _no_data(fig, ax, ylabel, why_x)
        return
    if df is None or df.height == 0:
        _no_data(fig, ax, ylabel, why)
        return
    dims = [x, *series]
    agg = aggregate(_with_dims(df, dims), dims)
    _lines(ax, agg, x, series, ylabel, ylabel)


# --------------------------------------------------------------------------- figures


def fig_policy_kl(res: Results) -> Figure:
    """(a) ID accuracy, ΔOOD and update sparsity per rollout policy × KL direction,
    one bar per learning rate, mean ± SEM over seeds (PROTOCOL.md §7, findings 1–2)."""
    fig, axes = _new_figure(3, "(a) per rollout policy × KL direction, at each LR")
    cats = [POLICY, KL, *_extra(res, (POLICY, KL, LR))]
    for ax, name in zip(axes, ("id_accuracy", "delta_ood", "sparsity")):
        _panel_bars(fig, ax, res, name, cats, LR)
    return fig


def fig_lr(res: Results) -> Figure:
    """(b) Forgetting (ΔOOD) and update sparsity against learning rate, one line per
    rollout policy (× KL direction), mean ± SEM over seeds (finding 2)."""
    fig, axes = _new_figure(2, "(b) forgetting and sparsity against learning rate")
    series = [POLICY, KL, *_extra(res, (POLICY, KL, LR))]
    for ax, name in zip(axes, ("delta_ood", "sparsity")):
        _panel_lines(fig, ax, res, name, LR, series)
    return fig


def fig_lambda(res: Results) -> Figure:
    """(c) ID accuracy, forgetting and sparsity along the rollout spectrum λ, one line
    per KL direction (× other swept fields), mean ± SEM over seeds (finding 3)."""
    fig, axes = _new_figure(3, "(c) along the rollout spectrum λ, per KL direction")
    why = None if _has_lambda(res) else f"no {LAMBDA} values (no λ-spectrum trials)"
    series = [KL, *_extra(res, (KL, LAMBDA))]
    for ax, name in zip(axes, ("id_accuracy", "delta_ood", "sparsity")):
        _panel_lines(fig, ax, res, name, LAMBDA, series, why_x=why)
    return fig


def fig_pass_at_k(res: Results) -> Figure:
    """(d) pass@1 and pass@k (largest k evaluated) on Countdown-3 and Countdown-4E
    after distillation: along λ per KL direction when λ was swept, else per rollout
    policy × KL direction (finding 4: forward KL keeps higher pass@k)."""
    lam = _has_lambda(res)
    fig, axes = _new_figure(2, "(d) pass@1 and pass@k" + (" along λ" if lam else " per policy × KL"),
                            width=6.0)
    for ax, task in zip(axes, (ID_TASK, HARD_TASK)):
        metrics = _pass_metrics(res, task)
        title = f"{task}: " + (" vs ".join(metrics) if metrics else "pass@k")
        if not metrics:
            _no_data(fig, ax, title, f"no pass@k evals for {task} at stage distill")
            continue
        df = final_evals(res).filter(
            (pl.col("stage") == "distill") & (pl.col("task") == task) & pl.col("metric").is_in(metrics)
        ).collect()
        if lam:
            series = [KL, *_extra(res, (KL, LAMBDA))]
            agg = aggregate(_with_dims(df, [LAMBDA, *series]), [LAMBDA, "metric", *series])
            for m, style in zip(metrics, ("-", "--")):
                _lines(ax, agg.filter(pl.col("metric") == m), LAMBDA, series, "pass rate", title,
                       linestyle=style, suffix=f" {m}")
        else:
            cats = [POLICY, KL, *_extra(res, (POLICY, KL))]
            agg = aggregate(_with_dims(df, cats), [*cats, "metric"])
            _bars(ax, agg, cats, "metric", "pass rate", title)
    return fig


def fig_rlvr(res: Results) -> Figure:
    """(e) RLVR: mean training reward per 10-step window (plotted at the window's last
    step), one curve per distilled checkpoint's configuration (mean over seeds, SEM
    band); and Countdown-4E accuracy before
    distillation, after it and after RLVR (finding 5)."""
    fig, axes = _new_figure(2, "(e) RLVR from each distilled checkpoint", width=6.0)
    cfg = swept_columns(res)
    name = _present(res, "rlvr", REWARD)
    if name is None:
        _no_data(fig, axes[0], "RLVR training reward", f"no rlvr-stage metric {REWARD!r}")
    else:
        keys = ["sweep", "trial_id"] if "sweep" in res.metrics.collect_schema().names() else ["trial_id"]
        df = (
            res.metrics.filter((pl.col("stage") == "rlvr") & (pl.col("name") == name))
            .join(res.trials, on=keys, how="inner")
            .filter(pl.col("status") == "completed")
            .collect()
        )
        if df.height == 0:
            _no_data(fig, axes[0], "RLVR training reward", "no completed trial has RLVR metrics")
        else:  # 10-step windows (a step's reward is a mean of only prompts × samples rollouts), then seeds
            df = (df.with_columns(((pl.col("step") - 1) // 10 * 10 + 10).alias("window"))
                  .group_by([*keys, *[c for c in cfg if c in df.columns], "window"], maintain_order=True)
                  .agg(pl.col("value").mean()).rename({"window": "step"}))
            agg = aggregate(_with_dims(df, cfg), ["step", *cfg])
            _lines(axes[0], agg, "step", cfg, f"mean reward per 10 steps ({name})", "RLVR training reward",
                   band=True)
    has_rlvr = final_evals(res).filter(
        (pl.col("stage") == "rlvr") & (pl.col("task") == HARD_TASK) & (pl.col("metric") == "accuracy")
    ).select(pl.len()).collect().item()
    title = f"{HARD_TASK} accuracy before/after RLVR"
    if not has_rlvr:
        _no_data(fig, axes[1], title, f"no rlvr-stage {HARD_TASK} accuracy")
    else:
        df = final_evals(res).filter((pl.col("task") == HARD_TASK) & (pl.col("metric") == "accuracy")).collect()
        agg = aggregate(_with_dims(df, cfg), [*cfg, "stage"])
        _bars(axes[1], agg, cfg, "stage", "accuracy", title)
    return fig


def fig_loglik(res: Results) -> Figure:
    """(f) Mean per-token log-likelihood of the distillation rollouts under the
    student (solid) and the teacher (dashed) along λ, per KL direction."""
    fig, axes = _new_figure(1, "(f) log-likelihood of rollouts along λ", width=7.0)
    title = "mean log-likelihood of rollout tokens"
    if not _has_lambda(res):
        _no_data(fig, axes[0], title, f"no {LAMBDA} values (no λ-spectrum trials)")
        return fig
    s_name, t_name = _present(res, "distill", STUDENT_LOGLIK), _present(res, "distill", TEACHER_LOGLIK)
    if s_name is None and t_name is None:
        _no_data(fig, axes[0], title, f"no distill metrics {STUDENT_LOGLIK!r} / {TEACHER_LOGLIK!r}")
        return fig
    series = [KL, *_extra(res, (KL, LAMBDA))]
    for name, who, style in ((s_name, "student", "-"), (t_name, "teacher", "--")):
        if name is None:
            fig._distillab_notes.append(f"{fig.get_suptitle()} / {title}: no data for the {who}")
            continue
        df = _trial_metric_mean(res, "distill", name)
        agg = aggregate(_with_dims(df, [LAMBDA, *series]), [LAMBDA, *series])
        _lines(axes[0], agg, LAMBDA, series, "log-likelihood per token", title, linestyle=style,
               suffix=f" ({who})")
    return fig


def tensor_kind(name: str) -> str:
    """A parameter name with its layer index as ``*`` (``model.layers.*.mlp.up_proj.weight``)."""
    return re.sub(r"\.\d+\.", ".*.", name)


def _config_labels(res: Results, cols: Sequence[str]) -> pl.DataFrame:
    """Per trial (its keys), ``config``: the label of its values of ``cols``."""
    trials = res.trials.collect()
    keys = [k for k in ("sweep", "trial_id") if k in trials.columns]
    labels = [_label(cols, [row.get(c) for c in cols]) for row in trials.iter_rows(named=True)]
    return trials.select(keys).with_columns(pl.Series("config", labels, dtype=pl.String))


def fig_tensor_sparsity(res: Results) -> Figure:
    """(g) Update sparsity S_τ per tensor (PROTOCOL.md §4, evals task ``params/<tensor>``)
    after distillation: one group per tensor kind (the layers' tensors averaged within
    each trial), one bar per swept configuration, mean ± SEM over seeds."""
    metric = _sparsity_metric(res)
    fig, axes = _new_figure(1, "(g) update sparsity per tensor", width=11.0)
    title = f"update {metric or 'sparsity'} per tensor"
    df = pl.DataFrame()
    if metric is not None:
        df = final_evals(res).filter(
            (pl.col("stage") == "distill") & pl.col("task").str.starts_with("params/") & (pl.col("metric") == metric)
        ).collect()
    if df.height == 0:
        _no_data(fig, axes[0], title, "no params/<tensor> sparsity evals at stage distill")
        return fig
    cfg = swept_columns(res)
    keys = [k for k in ("sweep", "trial_id") if k in df.columns]
    df = df.join(_config_labels(res, cfg), on=keys, how="left").with_columns(
        pl.col("task").str.strip_prefix("params/").map_elements(tensor_kind, return_dtype=pl.String).alias("tensor"))
    per_trial = df.group_by([*keys, "config", "tensor"]).agg(pl.col("value").mean())
    agg = aggregate(per_trial, ["tensor", "config"])
    _bars(axes[0], agg, ["tensor"], "config" if cfg else None, f"update {metric}", title)
    return fig


def _step_curves(res: Results, stage: str, name: str, cfg: Sequence[str]) -> pl.DataFrame:
    """Per completed trial and step, metric ``name`` of ``stage`` with the trial's ``cfg`` columns."""
    keys = ["sweep", "trial_id"] if "sweep" in res.metrics.collect_schema().names() else ["trial_id"]
    df = (res.metrics.filter((pl.col("stage") == stage) & (pl.col("name") == name))
          .join(res.trials, on=keys, how="inner").filter(pl.col("status") == "completed").collect())
    return _with_dims(df, cfg)


def fig_estimator(res: Results) -> Figure:
    """(h) The oracle (``loss.oracle_every``; `ops.oracle`): the estimator's bias (its
    estimate − the exact full-vocabulary divergence it estimates, nats) and the cosine
    between its gradient and the exact gradient w.r.t. the student logits, against
    optimizer steps; one curve per swept configuration (e.g. ``loss.estimator``), mean
    over seeds with an SEM band."""
    fig, axes = _new_figure(2, "(h) estimators against the full-vocabulary oracle", width=6.0)
    cfg = swept_columns(res)
    for ax, name, ylabel in ((axes[0], ESTIMATOR_BIAS, "bias (estimate − exact, nats)"),
                             (axes[1], ESTIMATOR_GRAD_COS, "cosine(estimator gradient, exact gradient)")):
        title = f"{name} against steps"
        if _present(res, "distill", name) is None:
            _no_data(fig, ax, title, f"no distill metric {name!r} (loss.oracle_every = 0, or no trial reached an "
                                     "oracle step)")
            continue
        df = _step_curves(res, "distill", name, cfg)
        if df.height == 0:
            _no_data(fig, ax, title, f"no completed trial has {name!r}")
            continue
        _lines(ax, aggregate(df, ["step", *cfg]), "step", cfg, ylabel, title, band=True)
        ax.set_xlabel("optimizer step")
        if name == ESTIMATOR_BIAS:
            ax.axhline(0, color="0.6", lw=0.8)
    return fig


def fig_accuracy_lr(res: Results, task: str = ID_TASK) -> Figure:
    """Countdown-3 (or ``task``'s) accuracy against learning rate, one line per rollout policy × KL
    direction, mean ± SEM over seeds (finding 1: policy gives no consistent advantage; reverse KL
    is the more LR-sensitive direction). `distillab.analysis.findings` draws it over the policy × KL grid."""
    fig, axes = _new_figure(1, "accuracy against learning rate", width=6.0)
    _panel_lines(fig, axes[0], res, "id_accuracy", LR, [POLICY, KL, *_extra(res, (POLICY, KL, LR))], task=task)
    return fig


def _coverage_gap(res: Results, task: str = ID_TASK) -> pl.DataFrame:
    """Per completed trial, pass@k − pass@1 on ``task`` at stage distill (k the largest
    evaluated), as ``value``; empty when either is absent."""
    metrics = _pass_metrics(res, task)
    if len(metrics) < 2:
        return pl.DataFrame()
    df = final_evals(res).filter((pl.col("stage") == "distill") & (pl.col("task") == task)
                                 & pl.col("metric").is_in(metrics)).collect()
    keys = [k for k in ("sweep", "trial_id") if k in df.columns]
    wide = df.pivot("metric", index=keys, values="value")
    gap = wide.select(*keys, (pl.col(metrics[1]) - pl.col(metrics[0])).alias("value"))
    return gap.join(res.trials.collect(), on=keys, how="left").filter(pl.col("value").is_not_null())


def fig_coverage_gap(res: Results, task: str = ID_TASK) -> Figure:
    """The coverage gap pass@k − pass@1 on Countdown-3 (or ``task``) after distillation (finding 4:
    larger for forward KL), computed per trial: against LR per rollout policy × KL direction, and
    along λ per KL direction, mean ± SEM over seeds."""
    fig, axes = _new_figure(2, f"coverage gap on {task}: pass@k − pass@1", width=6.0)
    label = "pass@k − pass@1"
    has_policy = POLICY in res.trials.collect_schema().names()
    for ax, x, policies in ((axes[0], LR, [OFFPD, ONPD]), (axes[1], LAMBDA, [SPECTRUM])):
        title = f"{label} along λ" if x == LAMBDA else f"{label} against LR"
        part = filter_trials(res, **{POLICY: policies}) if has_policy else res
        df = _coverage_gap(part, task)
        if not df.height:
            _no_data(fig, ax, title, f"no {'/'.join(policies)} trials with pass@1 and pass@k on {task}")
            continue
        series = [KL] if x == LAMBDA else [POLICY, KL]
        series += _extra(part, (*series, x, POLICY))  # what else varies among these trials
        agg = aggregate(_with_dims(df, [x, *series]), [x, *series])
        _lines(ax, agg, x, series, label, title)
    return fig


def fig_hard_pass_lambda(res: Results) -> Figure:
    """Countdown-4E pass@k (the largest k evaluated) along λ per KL direction, after distillation
    (solid) and after RLVR (dashed), mean ± SEM over seeds (finding 5)."""
    fig, axes = _new_figure(1, f"{HARD_TASK} pass@k along λ, before and after RLVR", width=7.0)
    metrics = _pass_metrics(res, HARD_TASK)
    title = f"{HARD_TASK} {metrics[-1] if metrics else 'pass@k'}"
    if not _has_lambda(res) or not metrics:
        _no_data(fig, axes[0], title, f"no λ-spectrum trials with {HARD_TASK} pass@k")
        return fig
    df = final_evals(res).filter(pl.col("stage").is_in(["distill", "rlvr"]) & (pl.col("task") == HARD_TASK)
                                 & (pl.col("metric") == metrics[-1])).collect()
    series = [KL, *_extra(res, (KL, LAMBDA))]
    agg = aggregate(_with_dims(df, [LAMBDA, *series]), [LAMBDA, "stage", *series])
    for stage, style in (("distill", "-"), ("rlvr", "--")):  # one colour per KL direction at both stages
        part = agg.filter(pl.col("stage") == stage)
        if part.height:
            _lines(axes[0], part, LAMBDA, series, metrics[-1], title, linestyle=style, suffix=f" ({stage})")
    return fig


#: File stem → figure function, in report order (used by the notebook and the CLI).
FIGURES: dict[str, Callable[[Results], Figure]] = {
    "a_policy_kl": fig_policy_kl,
    "b_lr": fig_lr,
    "c_lambda": fig_lambda,
    "d_pass_at_k": fig_pass_at_k,
    "e_rlvr": fig_rlvr,
    "f_loglik": fig_loglik,
    "g_tensor_sparsity": fig_tensor_sparsity,
    "h_estimator": fig_estimator,
}


def save_figure(fig: Figure, out_dir: str | os.PathLike[str], stem: str, dpi: int = 120) -> Path:
    """Save ``fig`` as ``<out_dir>/<stem>.png`` (the folder is created) and return the path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{stem}.png"
    fig.savefig(path, dpi=dpi)
    return path


# --------------------------------------------------------------------------- summary




def summary_table(res: Results, group_by: list[str] | None = None) -> pl.DataFrame:
    """One row per configuration (``group_by``, default :func:`swept_columns`): the
    headline numbers as ``mean ± SEM`` strings over completed seeds (ID and
    Countdown-4E accuracy, ΔOOD, Countdown-4E gain, sparsity, pass@1/pass@k on
    Countdown-3; RLVR gain, multiple-choice and math accuracy, Countdown-3 style share and the
    oracle's mean ``estimator/bias`` and ``estimator/grad_cos`` over steps when present),
    then ``n_completed`` and ``n_failed``."""
    group = list(swept_columns(res) if group_by is None else group_by)
    key = group or ["__all__"]
    lit = [pl.lit(0).alias("__all__")] if not group else []
    quantities: list[tuple[str, pl.DataFrame]] = [
        (f"{ID_TASK} acc", _final(res, "distill", ID_TASK, "accuracy")),
        (f"{HARD_TASK} acc", _final(res, "distill", HARD_TASK, "accuracy")),
        ("ΔOOD", forgetting(res).collect()),
        (f"{HARD_TASK} gain", generalisation_gain(res).collect()),
    ]
    sp = _sparsity_metric(res)
    if sp:
        quantities.append((sp, _final(res, "distill", "params", sp)))
    for m in _pass_metrics(res, ID_TASK):
        quantities.append((f"{ID_TASK} {m}", _final(res, "distill", ID_TASK, m)))
    gain = rlvr_gain(res).collect()
    if gain.height:
        quantities.append(("RLVR gain", gain))
    for task, metric in (("mcq", "accuracy"), ("math", "accuracy"), (ID_TASK, "style_share")):  # other domains
        df = _final(res, "distill", task, metric)
        if df.height:
            quantities.append((f"{task} {'acc' if metric == 'accuracy' else metric}", df))
    for name in (ESTIMATOR_BIAS, ESTIMATOR_GRAD_COS):  # the oracle: each trial's mean over its oracle steps
        if _present(res, "distill", name):
            quantities.append((name, _trial_metric_mean(res, "distill", name)))

    counts = trial_counts(res, group).with_columns(*lit).drop("n_trials")
    out = counts.select(key)
    for name, df in quantities:
        if df.height == 0:
            out = out.with_columns(pl.lit("–").alias(name))
            continue
        agg = aggregate(_with_dims(df, group).with_columns(*lit), key)
        cells = agg.select(*key, pl.struct("mean", "sem").map_elements(
            lambda r: mean_sem_text(r["mean"], r["sem"], 3), return_dtype=pl.String).alias(name))
        out = out.join(cells, on=key, how="left", nulls_equal=True).with_columns(pl.col(name).fill_null("–"))
    out = out.join(counts, on=key, how="left", nulls_equal=True)
    return out.drop("__all__") if not group else out


def summary_markdown(res: Results, figures: dict[str, tuple[Path, list[str]]] | None = None,
                     group_by: list[str] | None = None, title: str = "distillab report") -> str:
    """The Markdown summary: trial counts, the headline table, the figures (with
    their "no data" notes) and the full table of final metrics (mean ± SEM, n,
    n_failed per configuration × stage × task × metric)."""
    group = list(swept_columns(res) if group_by is None else group_by)
    counts = trial_counts(res, [])
    n, done, failed = (counts[c][0] for c in ("n_trials", "n_completed", "n_failed"))
    lines = [f"# {title}", "",
             f"{n} trials: {done} completed, {failed} failed or unfinished (excluded from every mean).",
             "Values are mean ± SEM over seeds; n counts completed trials.", "",
             "## Headline (after distillation)", "", format_table(summary_table(res, group)), ""]
    if figures:
        lines += ["## Figures", ""]
        for stem, (path, notes) in figures.items():
            lines.append(f"![{stem}]({path.name})")
            lines += [f"- {note}" for note in notes]
            lines.append("")
    lines += ["## Final metrics", "", format_table(final_table(res, group)), ""]
    return "\n".join(lines)


def write_report(res: Results, out_dir: str | os.PathLike[str], group_by: list[str] | None = None,
                 dpi: int = 120) -> dict[str, Path]:
    """Save every figure of :data:`FIGURES` as ``<out_dir>/<stem>.png`` and the
    Markdown summary as ``<out_dir>/summary.md``.

    Returns:
        ``{stem: png path, ..., "summary": summary path}``.
    """
    out = Path(out_dir)
    figures: dict[str, tuple[Path, list[str]]] = {}
    for stem, draw in FIGURES.items():
        fig = draw(res)
        figures[stem] = (save_figure(fig, out, stem, dpi=dpi), figure_notes(fig))
    summary = out / "summary.md"
    summary.write_text(summary_markdown(res, figures, group_by), encoding="utf-8")
    return {**{k: p for k, (p, _) in figures.items()}, "summary": summary}
