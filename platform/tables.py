"""The results tables of a sweep (DESIGN.md "Results schema"), as the recipe writes them:
long, tidy Parquet tables written atomically, one file per writer unit.

Layout under a sweep's storage path (local filesystem)::

    <root>/trials/<key>.parquet     one row per trial: status, times, config columns
    <root>/metrics/<key>.parquet    training diagnostics per step
    <root>/evals/<key>.parquet      evaluation results per (stage, step)
    <root>/samples/<key>.parquet    generated texts with rewards, for inspection
    <root>/runs.json                one record per command that wrote here (`record_run`)

Each writer unit (a trial's eval at one step, a trial's row, ...) owns one file named by
its ``key``; rewriting a key replaces the file, so a retried or resumed trial never
duplicates rows, and a crash never leaves a half-written file (`atomic_write_bytes`).
This module holds the schema (`SCHEMAS`), the writers (`write_rows`, `record_run`) and the
one read the recipe needs (`report_metrics`: a trial's own evaluations, for a resumed
worker); `distillab.analysis.results` reads whole sweeps as Polars frames.

    >>> import tempfile
    >>> root = tempfile.mkdtemp()
    >>> _ = write_rows(root, "evals", [dict(trial_id="t0", stage="pre", step=0,
    ...     task="countdown3", metric="accuracy", value=0.25, n=200)], key="t0__pre__0")
    >>> scan_table(Path(root), "evals").select("metric", "value").collect().rows()
    [('accuracy', 0.25)]
"""

from __future__ import annotations

import contextlib
import json
import numbers
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from distillab.registry import eval_key, with_forgetting

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

TRIAL_COLUMNS = tuple(c.name for c in SCHEMAS["trials"])
EVAL_COLUMNS = tuple(c.name for c in SCHEMAS["evals"])
_KEY_RE = re.compile(r"[A-Za-z0-9_.+@-]+")


def polars_schema(table: str) -> pl.Schema:
    return pl.Schema({c.name: _POLARS[c.kind] for c in SCHEMAS[table]})


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


def table_files(root: Path, table: str) -> list[Path]:
    directory = root / table
    if not directory.is_dir():
        return []
    return sorted(
        p for p in directory.glob("*.parquet") if p.is_file() and not p.name.startswith(".")
    )


def scan_table(root: Path, table: str) -> pl.LazyFrame:
    files = table_files(root, table)
    if not files:
        return pl.LazyFrame(schema=polars_schema(table))
    if table != "trials":
        return pl.scan_parquet(files, schema=polars_schema(table), hive_partitioning=False)
    # Config columns may differ between trials (and ints vs floats): per-file scans.
    frames = [pl.scan_parquet(f, hive_partitioning=False) for f in files]
    return pl.concat(frames, how="diagonal_relaxed")


def report_dict(evals: pl.DataFrame) -> dict[str, float]:
    """`with_forgetting` of ``{"eval/<stage>/<task>/<metric>": value}`` from one trial's final evals."""
    return with_forgetting({eval_key(s, t, m): float(v)
                            for s, t, m, v in evals.select("stage", "task", "metric", "value").iter_rows()})


def report_metrics(root: str | Path, trial_id: str) -> dict[str, float]:
    """The evaluation part of a trial's final report, rebuilt from ``<root>/evals``:
    the same keys ``distill`` reports to Ray Tune (``eval/<stage>/<task>/<metric>``,
    the last step of each stage, and ``eval/forgetting``). For trials whose report is
    not in memory: a completed trial the sweep skips, and the stages a resumed worker
    did not run itself. Empty if the trial has no evals yet."""
    if not table_files(Path(root), "evals"):
        return {}
    ev = scan_table(Path(root), "evals").filter(pl.col("trial_id") == trial_id).collect()
    last = ev.group_by("stage").agg(pl.col("step").max().alias("_last"))
    ev = ev.join(last, on="stage").filter(pl.col("step") == pl.col("_last"))
    return report_dict(ev)
