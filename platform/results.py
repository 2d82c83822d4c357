"""Results of a sweep: long, tidy Parquet tables written atomically, read as
Polars LazyFrames, aggregated as mean ± SEM over seeds (DESIGN.md "Results
schema", PROTOCOL.md §4).

Layout under a sweep's storage path (local filesystem)::

    <root>/trials/<key>.parquet     one row per trial: status, times, config columns
    <root>/metrics/<key>.parquet    training diagnostics per step
    <root>/evals/<key>.parquet      evaluation results per (stage, step)
    <root>/samples/<key>.parquet    generated texts with rewards, for inspection

Each writer unit (a trial's eval at one step, a trial's row, ...) owns one file
named by its ``key``; rewriting a key replaces the file, so a retried or resumed
trial never duplicates rows, and a crash never leaves a half-written file.

    >>> import tempfile
    >>> root = tempfile.mkdtemp()
    >>> _ = write_rows(root, "evals", [dict(trial_id="t0", stage="pre", step=0,
    ...     task="countdown3", metric="accuracy", value=0.25, n=200)], key="t0__pre__0")
    >>> load(root).evals.select("metric", "value").collect().rows()
    [('accuracy', 0.25)]
"""

from __future__ import annotations

import contextlib
import json
import math
import numbers
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from distillab.evals.metrics import FORGETTING_EVAL, FORGETTING_STAGES
from distillab.evals.metrics import forgetting as forgetting_value
from distillab.registry import FORGETTING_KEY, eval_key

__all__ = [
    "TABLES",
    "is_sweep_dir",
    "STAGES",
    "SCHEMAS",
    "Results",
    "write_rows",
    "load",
    "config_columns",
    "joined_evals",
    "aggregate",
    "final_table",
    "format_table",
    "final_evals",
    "filter_trials",
    "trial_counts",
    "stage_delta",
    "forgetting",
    "generalisation_gain",
    "rlvr_gain",
    "mean_sem_text",
    "FORGETTING_KEY",
    "with_forgetting",
    "report_metrics",
    "trial_metrics",
    "pareto_front",
]

TABLES: tuple[str, ...] = ("trials", "metrics", "evals", "samples")

#: Allowed ``stage`` values per table (``samples`` takes any string).
STAGES: dict[str, tuple[str, ...]] = {
    "metrics": ("distill", "rlvr"),
    "evals": ("pre", "distill", "rlvr"),
}

_STR, _INT, _FLOAT = "str", "int", "float"
_ARROW = {_STR: pa.string(), _INT: pa.int64(), _FLOAT: pa.float64()}
_POLARS = {_STR: pl.String, _INT: pl.Int64, _FLOAT: pl.Float64}


@dataclass(frozen=True)
class _Column:
    name: str
    kind: str  # _STR | _INT | _FLOAT
    nullable: bool = False


#: Fixed columns of each table. ``trials`` also holds one column per config field.
SCHEMAS: dict[str, tuple[_Column, ...]] = {
    "trials": (
        _Column("trial_id", _STR),
        _Column("status", _STR),
        _Column("error", _STR, nullable=True),
        _Column("start_time", _FLOAT),  # unix seconds
        _Column("end_time", _FLOAT),
        _Column("checkpoint", _STR, nullable=True),
    ),
    "metrics": (
        _Column("trial_id", _STR),
        _Column("stage", _STR),
        _Column("step", _INT),
        _Column("name", _STR),
        _Column("value", _FLOAT),
    ),
    "evals": (
        _Column("trial_id", _STR),
        _Column("stage", _STR),
        _Column("step", _INT),
        _Column("task", _STR),
        _Column("metric", _STR),
        _Column("value", _FLOAT),
        _Column("n", _INT),
    ),
    "samples": (
        _Column("trial_id", _STR),
        _Column("stage", _STR),
        _Column("step", _INT),
        _Column("task", _STR),
        _Column("prompt", _STR),
        _Column("completion", _STR),
        _Column("reward", _FLOAT),
    ),
}

_TRIAL_FIXED = tuple(c.name for c in SCHEMAS["trials"])
_EVAL_COLUMNS = tuple(c.name for c in SCHEMAS["evals"])
_KEY_RE = re.compile(r"[A-Za-z0-9_.+@-]+")
_STAGE_ORDER = {"pre": 0, "distill": 1, "rlvr": 2}


def _polars_schema(table: str) -> pl.Schema:
    return pl.Schema({c.name: _POLARS[c.kind] for c in SCHEMAS[table]})


# --------------------------------------------------------------------------- writing


def _check_table(table: str) -> None:
    if table not in TABLES:
        raise ValueError(f"table must be one of {list(TABLES)}, got {table!r}")


def _check_key(key: str) -> None:
    if not isinstance(key, str) or not key:
        raise ValueError(f"key must be a non-empty string, got {key!r}")
    if "/" in key or "\\" in key or os.sep in key or (os.altsep and os.altsep in key):
        raise ValueError(f"key must not contain path separators, got {key!r}")
    if ".." in key:
        raise ValueError(f"key must not contain '..', got {key!r}")
    if key.startswith(".") or not _KEY_RE.fullmatch(key):
        raise ValueError(
            f"key must match [A-Za-z0-9_.+@-]+ and not start with '.', got {key!r}"
        )


def _check_value(table: str, col: str, kind: str, value: Any, row: int) -> None:
    where = f"{table}.{col} (row {row})"
    if kind == _STR:
        ok = isinstance(value, str)
    elif kind == _INT:
        ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    else:
        ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if not ok:
        raise ValueError(f"{where}: expected {kind}, got {type(value).__name__} {value!r}")


def _config_array(col: str, values: list[Any]) -> pa.Array:
    """One config column of ``trials``: str, int, float or bool (None allowed)."""
    for i, v in enumerate(values):
        if v is not None and not isinstance(v, (str, numbers.Real)):  # bool is Real
            raise ValueError(
                f"trials.{col} (row {i}): config values must be str/int/float/bool/None, got "
                f"{type(v).__name__}; flatten nested config first (TrialConfig.flat())"
            )
    try:
        return pa.array(values)  # ints and floats mixed → float64
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise ValueError(f"trials.{col}: values of mixed types across rows: {e}") from None


def _to_arrow(table: str, rows: list[dict[str, Any]]) -> pa.Table:
    """Validate ``rows`` against the table's schema and build the Arrow table."""
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise ValueError(f"rows must be a list of dicts for table {table!r}")
    fixed = SCHEMAS[table]
    fixed_names = {c.name for c in fixed}
    for i, row in enumerate(rows):
        for c in fixed:
            if c.name not in row and not c.nullable:
                raise ValueError(f"{table}: row {i} is missing required column {c.name!r}")
    extra: list[str] = []
    for row in rows:
        extra.extend(k for k in row if k not in fixed_names and k not in extra)
    if extra and table != "trials":
        raise ValueError(
            f"{table}: unknown column(s) {extra}; allowed: {[c.name for c in fixed]}"
        )
    for k in extra:
        if not isinstance(k, str) or not k:
            raise ValueError(f"trials: config column names must be non-empty strings, got {k!r}")

    arrays: list[pa.Array] = []
    fields: list[pa.Field] = []
    for c in fixed:
        values = [row.get(c.name) for row in rows]
        for i, v in enumerate(values):
            if v is None:
                if not c.nullable:
                    raise ValueError(f"{table}.{c.name} (row {i}): must not be None")
            else:
                _check_value(table, c.name, c.kind, v, i)
        if c.name == "stage" and table in STAGES:
            bad = sorted({v for v in values if v not in STAGES[table]})
            if bad:
                raise ValueError(f"{table}.stage must be one of {list(STAGES[table])}, got {bad}")
        arrays.append(pa.array(values, type=_ARROW[c.kind]))
        fields.append(pa.field(c.name, _ARROW[c.kind], nullable=c.nullable))
    for k in extra:
        arr = _config_array(k, [row.get(k) for row in rows])
        arrays.append(arr)
        fields.append(pa.field(k, arr.type))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def _fsync_dir(directory: Path) -> None:
    """Persist a rename (POSIX); a no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_rows(root: str | Path, table: str, rows: list[dict[str, Any]], *, key: str) -> Path:
    """Write ``rows`` as ``<root>/<table>/<key>.parquet``, atomically, replacing
    any file of the same key.

    Validation happens before anything touches the disk. The bytes are then
    written to a hidden temporary file in the same directory, fsynced, and moved
    over the target with ``os.replace`` (atomic on POSIX and Windows), so readers
    see the old file or the new one, never a partial one, and an error leaves the
    old file intact and no temporary file behind.

    Args:
        root: the sweep's storage path (a local directory; created if needed).
        table: one of :data:`TABLES`.
        rows: dicts, one per row. Fixed columns per :data:`SCHEMAS` (str columns take
            ``str``; int columns integers, not bools; float columns ints or floats).
            ``trials`` rows also carry every config field as a flattened dotted key
            (``"loss.kind"``) with a str/int/float/bool/None value (see
            ``TrialConfig.flat()``); ``error`` and ``checkpoint`` may be omitted
            (null). May be empty (an empty file replaces the key's rows).
        key: the writer's unit, e.g. ``f"{trial_id}__{stage}__{step}"``: characters
            ``[A-Za-z0-9_.+@-]``, no path separators, no ``..``, no leading dot.

    Returns:
        The path of the written file.

    Raises:
        ValueError: unknown table (names the allowed ones), bad key, a missing
            required column or an unknown column (named), a None or wrongly typed
            value (column and row named), a ``stage`` not allowed for the table.
    """
    _check_table(table)
    _check_key(key)
    arrow = _to_arrow(table, rows)
    buf = pa.BufferOutputStream()
    pq.write_table(arrow, buf)
    data = buf.getvalue()

    return atomic_write_bytes(Path(root) / table / f"{key}.parquet", data)


#: the sweep directory's file of run records (`record_run`)
RUNS_FILE = "runs.json"


def code_version(path: str | Path | None = None) -> dict[str, Any]:
    """The code that is running: ``{"commit": <git HEAD>, "dirty": <tracked files modified>}``
    of the git checkout holding ``path`` (default: this package's source, so an editable
    install in a clone names its commit); both None where that is not a git checkout or
    git is missing."""
    where = Path(path) if path is not None else Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "-C", str(where), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10)
        if head.returncode != 0:
            return {"commit": None, "dirty": None}
        status = subprocess.run(["git", "-C", str(where), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return {"commit": None, "dirty": None}
    return {"commit": head.stdout.strip(), "dirty": bool(status.stdout.strip()) if status.returncode == 0 else None}


def record_run(root: str | Path, record: dict[str, Any]) -> Path:
    """Append ``record`` (JSON-able: the command, the code version, the stages' wall seconds)
    to ``<root>/runs.json``, a list with one record per invocation that wrote into the sweep
    directory (a resumed sweep adds one); written atomically. Returns the file's path."""
    path = Path(root) / RUNS_FILE
    runs = run_records(root)
    return atomic_write_bytes(path, json.dumps([*runs, record], indent=1).encode())


def run_records(root: str | Path) -> list[dict[str, Any]]:
    """The records of ``<root>/runs.json`` (`record_run`), oldest first; [] when there are none."""
    path = Path(root) / RUNS_FILE
    return json.loads(path.read_text()) if path.exists() else []


def atomic_write_bytes(target: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``target`` atomically: a hidden temporary file in the same
    directory (created if needed), fsynced, then ``os.replace``; on any error the old
    file stays intact and no temporary file is left. Returns ``target`` as a Path."""
    target = Path(target)
    directory = target.parent
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{target.stem}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(memoryview(data))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(directory)
    return target


# --------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class Results:
    """The four tables of one sweep (or several, with a ``sweep`` column)."""

    trials: pl.LazyFrame
    metrics: pl.LazyFrame
    evals: pl.LazyFrame
    samples: pl.LazyFrame


def _files(root: Path, table: str) -> list[Path]:
    directory = root / table
    if not directory.is_dir():
        return []
    return sorted(
        p for p in directory.glob("*.parquet") if p.is_file() and not p.name.startswith(".")
    )


def _scan(root: Path, table: str) -> pl.LazyFrame:
    files = _files(root, table)
    if not files:
        return pl.LazyFrame(schema=_polars_schema(table))
    if table != "trials":
        return pl.scan_parquet(files, schema=_polars_schema(table), hive_partitioning=False)
    # Config columns may differ between trials (and ints vs floats): per-file scans.
    frames = [pl.scan_parquet(f, hive_partitioning=False) for f in files]
    return pl.concat(frames, how="diagonal_relaxed")


def is_sweep_dir(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a sweep directory: it holds the ``sweep.json`` a sweep writes when
    it starts, or a ``trials`` table (results written by hand or by `write_rows`)."""
    root = Path(path)
    return (root / "sweep.json").is_file() or bool(_files(root, "trials"))


def _load_one(root: Path) -> Results:
    if not root.is_dir():
        raise FileNotFoundError(f"results path {str(root)!r} is not a directory")
    return Results(*(_scan(root, t) for t in TABLES))


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
    return [c for c in _names(res.trials) if c not in _TRIAL_FIXED and c != "sweep"]


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
        if col in _EVAL_COLUMNS:
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


# --------------------------------------------------------------------------- selections


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
    negative = forgotten): `stage_delta` of `evals.metrics.FORGETTING_EVAL` with
    ``value`` = `evals.metrics.forgetting` (before, after)."""
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


# --------------------------------------------------------------------------- search objectives


def with_forgetting(report: dict[str, float]) -> dict[str, float]:
    """``report`` (``eval/<stage>/<task>/<metric>`` keys) plus ``eval/forgetting``
    (`evals.metrics.forgetting` of the OOD means before and after) when both are there."""
    (task, metric), (before, after) = FORGETTING_EVAL, FORGETTING_STAGES
    pre, post = report.get(eval_key(before, task, metric)), report.get(eval_key(after, task, metric))
    if pre is None or post is None:
        return dict(report)
    return {**report, FORGETTING_KEY: forgetting_value(pre, post)}


def _report_dict(evals: pl.DataFrame) -> dict[str, float]:
    """`with_forgetting` of ``{"eval/<stage>/<task>/<metric>": value}`` from one trial's final evals."""
    return with_forgetting({eval_key(s, t, m): float(v)
                            for s, t, m, v in evals.select("stage", "task", "metric", "value").iter_rows()})


def report_metrics(root: str | Path, trial_id: str) -> dict[str, float]:
    """The evaluation part of a trial's final report, rebuilt from ``<root>/evals``:
    the same keys ``distill`` reports to Ray Tune (``eval/<stage>/<task>/<metric>``,
    the last step of each stage, and ``eval/forgetting``). For trials whose report is
    not in memory: a completed trial the sweep skips, and the stages a resumed worker
    did not run itself. Empty if the trial has no evals yet."""
    if not _files(Path(root), "evals"):
        return {}
    ev = _scan(Path(root), "evals").filter(pl.col("trial_id") == trial_id).collect()
    last = ev.group_by("stage").agg(pl.col("step").max().alias("_last"))
    ev = ev.join(last, on="stage").filter(pl.col("step") == pl.col("_last"))
    return _report_dict(ev)


def rlvr_reward_summary(res: Results, window: int = 10) -> pl.DataFrame:
    """Per trial with an RLVR stage: the mean training reward (``rlvr/reward_mean``)
    over its first and last ``window`` steps, and the change. Columns ``trial_id``,
    ``first``, ``last``, ``change``, ``steps``; empty when no trial ran RLVR."""
    m = res.metrics.filter((pl.col("stage") == "rlvr") & (pl.col("name") == "rlvr/reward_mean")).collect()
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
        rows.append({**dict(zip(keys, key_vals)), **_report_dict(group)})
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
