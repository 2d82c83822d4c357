"""Results of a sweep read as Polars LazyFrames and aggregated as mean ± SEM over seeds
(DESIGN.md "Results schema", PROTOCOL.md §4). The tables are written by the recipe through
`distillab.tables` (schema, atomic writes); this module reads them: `load` (one sweep or
several, with a ``sweep`` column), `joined_evals`, `aggregate`, `group_columns` (what a report row
is), `final_table`, the per-trial
derived quantities (`forgetting`, `generalisation_gain`, `rlvr_gain`, `stage_delta`), the
search objectives (`trial_metrics`, `pareto_front`) and the table formatting of the CLI.

    >>> import tempfile
    >>> from distillab.tables import write_rows
    >>> root = tempfile.mkdtemp()
    >>> _ = write_rows(root, "evals", [dict(trial_id="t0", stage="pre", step=0,
    ...     task="countdown3", metric="accuracy", value=0.25, n=200)], key="t0__pre__0")
    >>> load(root).evals.select("metric", "value").collect().rows()
    [('accuracy', 0.25)]
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import polars as pl

from distillab.registry import AXES, FORGETTING_EVAL, FORGETTING_STAGES, require
from distillab.registry import forgetting as forgetting_value
from distillab.tables import EVAL_COLUMNS, STAGES, TABLES, TRIAL_COLUMNS, report_dict, scan_table, table_files

_STAGE_ORDER = {"pre": 0, "distill": 1, "rlvr": 2}


@dataclass(frozen=True)
class Results:
    """The four tables of one sweep (or several, with a ``sweep`` column)."""

    trials: pl.LazyFrame
    metrics: pl.LazyFrame
    evals: pl.LazyFrame
    samples: pl.LazyFrame


def is_sweep_dir(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a sweep directory: it holds the ``sweep.json`` a sweep writes when
    it starts, or a ``trials`` table (results written by hand or by `write_rows`)."""
    root = Path(path)
    return (root / "sweep.json").is_file() or bool(table_files(root, "trials"))


def _load_one(root: Path) -> Results:
    if not root.is_dir():
        raise FileNotFoundError(f"results path {str(root)!r} is not a directory")
    return Results(*(scan_table(root, t) for t in TABLES))


def load(path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> Results:
    """Read a sweep's tables lazily.

    Args:
        path: a sweep's storage path, or a list/tuple of them.

    Returns:
        :class:`Results` of ``polars.LazyFrame``s. A missing table is an empty frame
        with the table's fixed schema. For a list of paths the sweeps are
        concatenated (``trials`` with ``how="diagonal_relaxed"``, since config
        columns may differ) and every frame gets a leading ``sweep`` column holding
        the path's final component; join on ``(sweep, trial_id)`` then.

    Raises:
        FileNotFoundError: a path is not a directory.
        ValueError: an empty list, or two paths with the same final component.
    """
    if isinstance(path, (str, os.PathLike)):
        return _load_one(Path(path))
    roots = [Path(p) for p in path]
    if not roots:
        raise ValueError("load() needs at least one path")
    names = [Path(os.path.abspath(r)).name for r in roots]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"sweep names (final path components) must be unique, repeated: {dupes}")
    parts = [_load_one(r) for r in roots]

    def tagged(table: str) -> Iterable[pl.LazyFrame]:
        for name, res in zip(names, parts):
            yield getattr(res, table).select(pl.lit(name, dtype=pl.String).alias("sweep"), pl.all())

    return Results(
        *(
            pl.concat(list(tagged(t)), how="diagonal_relaxed" if t == "trials" else "vertical")
            for t in TABLES
        )
    )


def _names(frame: pl.LazyFrame) -> list[str]:
    return frame.collect_schema().names()


def _trial_keys(res: Results) -> list[str]:
    return ["sweep", "trial_id"] if "sweep" in _names(res.evals) else ["trial_id"]


def config_columns(res: Results) -> list[str]:
    """The config columns of ``res.trials``: all but the fixed ones and ``sweep``."""
    return [c for c in _names(res.trials) if c not in TRIAL_COLUMNS and c != "sweep"]


def group_columns(res: Results, exclude: Sequence[str] = ()) -> list[str]:
    """The columns a report row is (`distillab report`, ``--full``, the plots' series and labels):
    with several sweeps, ``sweep`` when they differ; every study axis (`registry.AXES`) that groups
    and takes more than one value; then, so that no two configurations are ever averaged together,
    each other config column that still varies inside those groups. In trials-column order,
    without ``exclude``. An axis that does not group (the seed) is what a row's mean is over."""
    trials = res.trials.collect()
    if not trials.height:
        return []
    names = config_columns(res) + (["sweep"] if "sweep" in trials.columns else [])
    varies = [c for c in names if c not in exclude and trials[c].n_unique() > 1]
    keys = [c for c in varies if c == "sweep" or (c in AXES and AXES[c].groups)]
    for c in varies:
        if c in AXES or c in keys:
            continue
        inside = trials.group_by(keys).agg(pl.col(c).n_unique())[c].max() if keys else 2
        if inside > 1:
            keys.append(c)
    return (["sweep"] if "sweep" in keys else []) + [c for c in names if c in keys and c != "sweep"]


def joined_evals(res: Results) -> pl.LazyFrame:
    """``evals`` left-joined with their trial's row (status, times, config columns).

    Joined on ``trial_id`` (``(sweep, trial_id)`` for several sweeps). A trials
    column whose name clashes with an evals column gets the suffix ``_trial``.
    Evals of a trial without a trials row keep null trial columns. A trial_id
    repeated in ``trials`` raises at collect time (``validate="m:1"``).
    """
    return res.evals.join(
        res.trials, on=_trial_keys(res), how="left", suffix="_trial", validate="m:1"
    )


def aggregate(
    frame: pl.LazyFrame | pl.DataFrame, by: list[str], value: str = "value"
) -> pl.DataFrame:
    """Mean, standard error and count of ``value`` within each group of ``by``.

    ``sem`` = sample standard deviation (ddof = 1) / sqrt(n), null when n < 2;
    ``n`` counts the non-null values. Typically the rows of a group are seeds.

    Returns:
        A DataFrame with columns ``by + ["mean", "sem", "n"]`` (n: Int64), sorted
        by ``by`` (nulls last). With ``by = []`` one row over the whole frame.

    Raises:
        ValueError: a column of ``by`` or ``value`` is not in the frame.
    """
    lf = frame.lazy()
    names = _names(lf)
    for col in [*by, value]:
        if col not in names:
            raise ValueError(f"aggregate: column {col!r} not in frame (columns: {names})")
    v = pl.col(value)
    aggs = [v.mean().alias("mean"), v.std(ddof=1).alias("_std"), v.count().cast(pl.Int64).alias("n")]
    out = lf.group_by(by).agg(aggs) if by else lf.select(aggs)
    out = out.select(
        *by,
        pl.col("mean").cast(pl.Float64),
        pl.when(pl.col("n") >= 2).then(pl.col("_std") / pl.col("n").sqrt()).alias("sem"),
        "n",
    )
    if by:
        out = out.sort(by, nulls_last=True)
    return out.collect()


def final_table(res: Results, group_by: list[str]) -> pl.DataFrame:
    """The table ``distillab report`` prints: final evals, mean ± SEM over seeds.

    For every configuration (the values of ``group_by``: config columns, usually
    all but ``seed``) and every ``(stage, task, metric)``, the evals each trial
    wrote at the last step it reached in that stage are averaged over the trials
    whose status is ``"completed"``; other trials are excluded and counted.

    Returns:
        A long DataFrame with columns ``group_by + [stage, task, metric, mean, sem,
        n, n_failed]``, where ``n`` counts the completed trials averaged and
        ``n_failed`` the trials of the configuration whose status is not
        ``"completed"`` (errored, stopped, still running). A configuration with no
        completed evals keeps one row with null stage/task/metric/mean/sem and
        ``n = 0``, so failures stay visible. Sorted by configuration, then stage
        (pre, distill, rlvr), task, metric.

    Raises:
        ValueError: a ``group_by`` column is not a trials column, or clashes with
            an evals column.
    """
    trial_cols = _names(res.trials)
    for col in group_by:
        if col not in trial_cols:
            raise ValueError(f"final_table: group_by column {col!r} is not a trials column")
        if col in EVAL_COLUMNS:
            raise ValueError(f"final_table: group_by column {col!r} clashes with an evals column")
    group = list(group_by) or ["__all__"]
    lit_all = [pl.lit(0).alias("__all__")] if not group_by else []

    done = final_evals(res).with_columns(*lit_all)
    table = aggregate(done, [*group, "stage", "task", "metric"])

    failed = (
        res.trials.with_columns(*lit_all)
        .group_by(group)
        .agg((pl.col("status") != "completed").sum().cast(pl.Int64).alias("n_failed"))
        .collect()
    )
    out = (
        table.join(failed, on=group, how="full", coalesce=True, nulls_equal=True)
        .with_columns(pl.col("n").fill_null(0), pl.col("n_failed").fill_null(0))
        .with_columns(
            pl.col("stage").replace_strict(_STAGE_ORDER, default=len(_STAGE_ORDER),
                                           return_dtype=pl.Int64).alias("__stage__")
        )
        .sort([*group, "__stage__", "task", "metric"], nulls_last=True)
        .select(*group_by, "stage", "task", "metric", "mean", "sem", "n", "n_failed")
    )
    return out


def mean_sem_text(mean: float | None, sem: float | None, digits: int = 4) -> str:
    """``"mean ± sem"`` with ``digits`` significant digits for the mean; ``"–"``
    when the mean is missing, the mean alone when the SEM is missing or NaN."""
    if mean is None:
        return "–"
    if sem is None or math.isnan(sem):
        return f"{mean:.{digits}g}"
    return f"{mean:.{digits}g} ± {sem:.2g}"


def format_table(df: pl.DataFrame) -> str:
    """A text table (Markdown-style) of ``df`` with all rows and columns shown.

    When ``df`` has ``mean`` and ``sem`` columns they are merged into one
    ``mean ± sem`` column of strings (4 and 2 significant digits; the SEM is
    omitted when null, a dash stands for a null mean).
    """
    if "mean" in df.columns and "sem" in df.columns:
        cells = [mean_sem_text(m, s) for m, s in zip(df["mean"].to_list(), df["sem"].to_list())]
        at = df.columns.index("mean")
        df = df.drop("mean", "sem").insert_column(at, pl.Series("mean ± sem", cells, pl.String))
    with pl.Config(
        tbl_rows=-1,
        tbl_cols=-1,
        tbl_width_chars=65_535,
        fmt_str_lengths=1_000,
        tbl_hide_dataframe_shape=True,
        tbl_hide_column_data_types=True,
        tbl_formatting="ASCII_MARKDOWN",
    ):
        return str(df)


def final_evals(res: Results, *, completed_only: bool = True) -> pl.LazyFrame:
    """The evals each trial wrote at the last step it reached in each stage, joined
    with the trial's row (status, config columns; see :func:`joined_evals`).

    Args:
        completed_only: keep only trials whose status is ``"completed"`` (what every
            aggregate of the report uses); ``False`` keeps failed and running trials.
    """
    last = pl.col("step") == pl.col("step").max().over([*_trial_keys(res), "stage"])
    ev = joined_evals(res).filter(last)
    return ev.filter(pl.col("status") == "completed") if completed_only else ev


def filter_trials(res: Results, *predicates: pl.Expr, **fields: Any) -> Results:
    """The trials matching every condition, with only their metrics, evals and samples.

    Args:
        *predicates: Polars expressions over ``res.trials``, e.g.
            ``pl.col("optimizer.lr") <= 1e-4``.
        **fields: ``column=value`` tests on trials columns (config fields are dotted,
            so pass them as ``**{"loss.kind": "forward"}``): a list/tuple/set means
            "any of these", ``None`` means null.

    Returns:
        A :class:`Results` whose ``trials`` are filtered and whose other frames are
        semi-joined on the trial id (``(sweep, trial_id)`` for several sweeps).

        >>> import tempfile
        >>> root = tempfile.mkdtemp()
        >>> for i, kind in enumerate(["forward", "reverse"]):
        ...     _ = write_rows(root, "trials", [{"trial_id": f"t{i}", "status": "completed",
        ...         "start_time": 0.0, "end_time": 1.0, "loss.kind": kind}], key=f"t{i}")
        >>> filter_trials(load(root), **{"loss.kind": "reverse"}).trials.select("trial_id").collect().rows()
        [('t1',)]

    Raises:
        ValueError: a field that is not a trials column (the columns are named).
    """
    names = _names(res.trials)
    conds = list(predicates)
    for col, want in fields.items():
        if col not in names:
            raise ValueError(f"filter_trials: {col!r} is not a trials column (columns: {names})")
        c = pl.col(col)
        if want is None:
            conds.append(c.is_null())
        elif isinstance(want, (list, tuple, set, frozenset)):
            values = list(want)
            cond = c.is_in([v for v in values if v is not None])
            conds.append(cond | c.is_null() if None in values else cond)
        else:
            conds.append(c == want)
    if not conds:
        return res
    keys = _trial_keys(res)
    trials = res.trials.filter(*conds)
    ids = trials.select(keys)
    return Results(
        trials,
        *(getattr(res, t).join(ids, on=keys, how="semi") for t in ("metrics", "evals", "samples")),
    )


def trial_counts(res: Results, group_by: list[str]) -> pl.DataFrame:
    """Trials per configuration: ``group_by + [n_trials, n_completed, n_failed]``,
    where ``n_failed`` counts every status but ``"completed"`` (errored, stopped,
    running). Sorted by ``group_by`` (nulls last); one row when ``group_by = []``.

    Raises:
        ValueError: a ``group_by`` column is not a trials column.
    """
    names = _names(res.trials)
    for col in group_by:
        if col not in names:
            raise ValueError(f"trial_counts: group_by column {col!r} is not a trials column")
    done = pl.col("status") == "completed"
    aggs = [
        pl.len().cast(pl.Int64).alias("n_trials"),
        done.sum().cast(pl.Int64).alias("n_completed"),
        (~done).sum().cast(pl.Int64).alias("n_failed"),
    ]
    if not group_by:
        return res.trials.select(aggs).collect()
    return res.trials.group_by(group_by).agg(aggs).sort(group_by, nulls_last=True).collect()


# --------------------------------------------------------------------------- before/after


def stage_delta(
    res: Results, task: str, metric: str, *, before: str = "pre", after: str = "distill"
) -> pl.LazyFrame:
    """Per completed trial: the final ``(task, metric)`` eval of stage ``after`` minus
    that of stage ``before`` (each at the last step the trial reached in the stage).

    Returns:
        A LazyFrame, one row per completed trial that has both values: the trial
        keys, the trial's other columns (status, config columns, ...), ``before``,
        ``after`` and ``value`` = after − before, ready for :func:`aggregate`
        (mean, SEM and n over seeds). Failed trials are excluded; count them with
        :func:`trial_counts`.

    Raises:
        ValueError: a stage that is not an evals stage.
    """
    for stage in (before, after):
        if stage not in STAGES["evals"]:
            raise ValueError(f"stage_delta: stage must be one of {list(STAGES['evals'])}, got {stage!r}")
    keys = _trial_keys(res)
    fe = final_evals(res).filter((pl.col("task") == task) & (pl.col("metric") == metric))

    def side(stage: str, name: str) -> pl.LazyFrame:
        return fe.filter(pl.col("stage") == stage).select(*keys, pl.col("value").alias(name))

    delta = side(after, "after").join(side(before, "before"), on=keys, how="inner", validate="1:1")
    trial_cols = [c for c in _names(res.trials) if c not in keys]
    return delta.join(res.trials, on=keys, how="left", suffix="_trial", validate="m:1").select(
        *keys,
        *trial_cols,
        "before",
        "after",
        (pl.col("after") - pl.col("before")).alias("value"),
    )


def forgetting(res: Results) -> pl.LazyFrame:
    """ΔOOD per trial: mean OOD score after distillation − before (PROTOCOL.md §4;
    negative = forgotten): `stage_delta` of `registry.FORGETTING_EVAL` with
    ``value`` = `registry.forgetting` (before, after)."""
    (task, metric), (before, after) = FORGETTING_EVAL, FORGETTING_STAGES
    return stage_delta(res, task, metric, before=before, after=after).with_columns(
        forgetting_value(pl.col("before"), pl.col("after")).alias("value"))


def generalisation_gain(
    res: Results, task: str = "countdown4e", metric: str = "accuracy"
) -> pl.LazyFrame:
    """Harder-task gain per trial: Countdown-4E accuracy after distillation − before."""
    return stage_delta(res, task, metric, before="pre", after="distill")


def rlvr_gain(res: Results, task: str = "countdown4e", metric: str = "accuracy") -> pl.LazyFrame:
    """RLVR gain per trial: accuracy after RLVR − after distillation (empty when no
    trial has ``rlvr`` evals)."""
    return stage_delta(res, task, metric, before="distill", after="rlvr")


def rlvr_reward_summary(res: Results, window: int = 10) -> pl.DataFrame:
    """Per trial with an RLVR stage: the mean training reward (``rlvr/reward_mean``)
    over its first and last ``window`` steps, and the change. Columns ``trial_id``,
    ``first``, ``last``, ``change``, ``steps``; empty when no trial ran RLVR."""
    m = res.metrics.filter((pl.col("stage") == "rlvr") & (pl.col("name") == require("rlvr/reward_mean"))).collect()
    if m.is_empty():
        return pl.DataFrame(schema={"trial_id": pl.String, "first": pl.Float64, "last": pl.Float64,
                                    "change": pl.Float64, "steps": pl.Int64})
    m = m.unique(["trial_id", "step"]).sort("trial_id", "step")
    return (
        m.group_by("trial_id", maintain_order=True)
        .agg(pl.col("value").head(window).mean().alias("first"), pl.col("value").tail(window).mean().alias("last"),
             pl.len().cast(pl.Int64).alias("steps"))
        .with_columns((pl.col("last") - pl.col("first")).alias("change"))
        .select("trial_id", "first", "last", "change", "steps")
    )


def trial_metrics(res: Results) -> pl.DataFrame:
    """One row per completed trial: its config columns and every final-report key as a
    column (``eval/distill/countdown3/accuracy``, ``eval/forgetting``, ...), the names a
    sweep's ``search.metric`` uses, ready for :func:`pareto_front`."""
    keys = _trial_keys(res)
    fe = final_evals(res).collect()
    rows = []
    for key_vals, group in fe.group_by(keys, maintain_order=True):
        rows.append({**dict(zip(keys, key_vals)), **report_dict(group)})
    wide = pl.DataFrame(rows) if rows else pl.DataFrame(schema={k: pl.String for k in keys})
    return res.trials.filter(pl.col("status") == "completed").collect().join(wide, on=keys, how="inner")


def pareto_front(df: pl.DataFrame, objectives: Sequence[tuple[str, str]]) -> pl.DataFrame:
    """Mark the non-dominated rows of ``df`` for several objectives.

    A row dominates another when it is at least as good on every objective and
    strictly better on one (``mode`` ``"max"`` or ``"min"`` per column). Rows with a
    null or NaN objective are never on the front.

    Args:
        df: one row per trial.
        objectives: ``[(column, mode), ...]``, ``mode`` in ``{"max", "min"}``.

    Returns:
        ``df`` with a bool column ``pareto``.

    Raises:
        ValueError: a missing column (named) or a mode other than max/min.
    """
    cols = []
    for col, mode in objectives:
        if col not in df.columns:
            raise ValueError(f"pareto_front: no column {col!r}; have {df.columns}")
        if mode not in ("max", "min"):
            raise ValueError(f"pareto_front: mode for {col!r} must be 'max' or 'min', got {mode!r}")
        cols.append([None if v is None or math.isnan(v) else (v if mode == "max" else -v)
                     for v in df[col].cast(pl.Float64).to_list()])
    points = list(zip(*cols)) if cols else [() for _ in range(df.height)]

    def dominates(a, b) -> bool:
        return all(x >= y for x, y in zip(a, b)) and any(x > y for x, y in zip(a, b))

    valid = [all(v is not None for v in p) for p in points]
    flags = [
        valid[i] and not any(valid[j] and dominates(points[j], points[i]) for j in range(len(points)) if j != i)
        for i in range(len(points))
    ]
    return df.with_columns(pl.Series("pareto", flags, dtype=pl.Boolean))
