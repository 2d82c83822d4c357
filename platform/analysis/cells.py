"""The cells of PROTOCOL.md §9 and their statistics: each trial's quantities (`trial_values`), one row
per cell with mean, SEM and seeds of each (`cell_table`), a finding's view of its cells
(`CellView`), and §9's arithmetic on them (`Stat`: the difference rule; `mean_of`: the
mean-over-cells rule; `clearly`; `value_range`), with the notes that say why a clause fails
(`power_note`, `ratio_note`). How §9 is read: `analysis.rules`.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any, Sequence

import polars as pl

from distillab.analysis.plots import KL, LAMBDA, LR, POLICY, SEED
from distillab.analysis.results import Results, aggregate, final_evals, forgetting, mean_sem_text
from distillab.analysis.rules import KINDS, MIN_SEEDS, POLICIES
from distillab.registry import AXES
from distillab.registry import SPECTRUM as SPECTRUM_POLICY

__all__ = ["TASK", "EVALS", "QUANTITIES", "DERIVED", "NAMES", "ON_TASK", "evals_of", "name_of", "Stat", "NAN",
           "mean_of", "value_range", "clearly", "power_note", "ratio_note", "trial_values", "cell_table", "CellView",
           "groups_of"]

#: the task §9's acc, pass@1 and pass@10 are read on (``--task`` names another; see the module docstring)
TASK = "countdown3"
#: quantity → (stage, task, metric) of the final eval it is (f and gap are derived: see `trial_values`)
EVALS = {
    "acc": ("distill", "countdown3", "accuracy"),
    "S": ("distill", "params", "sparsity@1e-06"),
    "pass1": ("distill", "countdown3", "pass@1"),
    "pass10": ("distill", "countdown3", "pass@10"),
    "hard10": ("distill", "countdown4e", "pass@10"),
    "hard10_rlvr": ("rlvr", "countdown4e", "pass@10"),
    "hard10_pre": ("pre", "countdown4e", "pass@10"),
    "c4_10_pre": ("pre", "countdown4", "pass@10"),
    "c4_10": ("distill", "countdown4", "pass@10"),
    "c4_10_rlvr": ("rlvr", "countdown4", "pass@10"),
}
QUANTITIES = ("acc", "f", "S", "gap", "hard10", "hard10_rlvr", "hard10_pre", "c4_10_pre", "c4_10", "c4_10_rlvr")
#: the derived quantities' evals (stage, task, metric), for messages
DERIVED = {"f": ("pre and distill", "ood", "ood_mean"), "gap": ("distill", "countdown3", "pass@10 and pass@1")}
NAMES = {"acc": "Countdown-3 accuracy", "f": "forgetting (ΔOOD)", "S": "S_1e-6", "gap": "pass@10 − pass@1",
         "hard10": "Countdown-4E pass@10 (distill)", "hard10_rlvr": "Countdown-4E pass@10 (rlvr)",
         "hard10_pre": "Countdown-4E pass@10 (pre)", "c4_10_pre": "Countdown-4 pass@10 (pre)",
         "c4_10": "Countdown-4 pass@10 (distill)", "c4_10_rlvr": "Countdown-4 pass@10 (rlvr)"}
#: the quantities read on the task of ``--task`` (`TASK` by default)
ON_TASK = ("acc", "pass1", "pass10", "gap")


def evals_of(task: str = TASK) -> dict[str, tuple[str, str, str]]:
    """`EVALS` with ``acc``, ``pass1`` and ``pass10`` read on ``task`` (a task name of the
    evals frame, e.g. ``math``) in place of Countdown-3."""
    return {**EVALS, **{q: (stage, task, metric) for q, (stage, t, metric) in EVALS.items() if q in ON_TASK}}


def name_of(q: str, task: str = TASK) -> str:
    """`NAMES` of quantity ``q``, naming ``task`` where ``q`` is read on it and it is not Countdown-3."""
    if task == TASK or q not in ON_TASK:
        return NAMES[q]
    return {"acc": f"{task} accuracy", "gap": f"pass@10 − pass@1 on {task}"}.get(q, f"{task} {q}")


#: a cell's columns in `trial_values` rows: (ρ, λ, k, η)
_CELL = ["policy", "lambda", "kind", "lr"]


# --------------------------------------------------------------------------- statistics


@dataclass(frozen=True)
class Stat:
    """A value with its SEM over seeds (``n`` seeds for a cell; None for a derived value).
    ``a - b`` and ``abs`` apply §9's difference rule, `mean_of` its mean-over-cells rule."""

    mean: float
    sem: float
    n: int | None = None

    def __sub__(self, other: "Stat") -> "Stat":
        """§9: SEM of a difference = √(SEM_a² + SEM_b²)."""
        return Stat(self.mean - other.mean, math.sqrt(self.sem ** 2 + other.sem ** 2))

    def __abs__(self) -> "Stat":
        return Stat(abs(self.mean), self.sem)

    @property
    def finite(self) -> bool:
        return math.isfinite(self.mean) and math.isfinite(self.sem)

    def text(self) -> str:
        """``mean ± sem`` (3 significant digits)."""
        return mean_sem_text(self.mean, None if math.isnan(self.sem) else self.sem, 3)


NAN = Stat(math.nan, math.nan, 0)


def mean_of(stats: Sequence[Stat]) -> Stat:
    """§9: the mean over n cells, SEM = √(Σ SEM²) / n. NaN for no cells."""
    n = len(stats)
    if not n:
        return Stat(math.nan, math.nan)
    return Stat(sum(s.mean for s in stats) / n, math.sqrt(sum(s.sem ** 2 for s in stats)) / n)


def value_range(stats: Sequence[Stat]) -> Stat:
    """max − min of the means (the two cells picked by their means), SEM by the difference rule."""
    if not stats or any(math.isnan(s.mean) for s in stats):
        return Stat(math.nan, math.nan)
    return max(stats, key=lambda s: s.mean) - min(stats, key=lambda s: s.mean)


def clearly(d: Stat) -> bool | None:
    """§9 "clearly": the difference ``d`` exceeds 2 SEM (None when not finite)."""
    return bool(d.mean > 2 * d.sem) if d.finite else None


def power_note(d: Stat, seeds: int) -> str:
    """Why a "clearly > 0" clause failed, for findings.md's evidence (not part of any rule), from
    the difference ``d`` (mean ± SEM over ``seeds`` seeds) and its z = mean / SEM:

    - not positive: no evidence for the finding's direction; the estimate points the other way
      (or is zero), clearly so when z < −2, else within the noise of these seeds;
    - positive but within 2 SEM: the smallest effect these seeds show clearly is 2 SEM; if the
      mean and the spread between seeds stayed as measured, about ``seeds · (2 SEM / d)²``
      seeds would show this one (SEM ∝ 1/√n; "more than 1,000" beyond that).

    "" where ``d`` is clear or not finite. Zero means |mean| ≤ 1e-12 (float rounding)."""
    if not d.finite or d.mean > 2 * d.sem:
        return ""
    z = d.mean / d.sem if d.sem > 0 else math.copysign(math.inf, d.mean)
    if abs(d.mean) <= 1e-12:
        return f"the difference is zero ({d.text()}): no evidence for the finding's direction"
    if d.mean < 0:
        how = ("clearly so (z < −2)" if z < -2 else
               f"but not clearly (z = {z:.2g}: within 2 SEM of zero, so these seeds tell neither direction apart)")
        return (f"the estimate points the other way ({d.text()}), {how}; an effect in the finding's direction "
                f"would need to exceed 2 SEM = {2 * d.sem:.3g} to show with these seeds")
    need = math.ceil(seeds * (2 * d.sem / d.mean) ** 2)
    more = f"about {need} seeds" if need <= 1000 else "more than 1,000 seeds"
    return (f"positive but within 2 SEM ({d.text()}, z = {z:.2g}); if the mean and the spread between seeds "
            f"stayed as measured, {more} would show a difference of this size clearly (SEM ∝ 1/√n)")


def ratio_note(a: Stat, b: Stat, what: str, needed: str) -> str:
    """Why a magnitude comparison (not "clearly") failed: ``a / b`` with the rule's threshold
    ``needed`` (text), e.g. "forward's range is 1.57× reverse's; the rule needs ≤ 0.5×"."""
    if not (a.finite and b.finite) or b.mean == 0:
        return ""
    return f"{what} is {a.mean / b.mean:.3g}× (the rule needs {needed})"


def _seeds(trials: pl.DataFrame) -> int:
    """The number of distinct seeds among the completed trials (for `power_note`)."""
    return trials.filter(pl.col("status") == "completed")["seed"].n_unique()


# --------------------------------------------------------------------------- frames


def _keys(res: Results) -> list[str]:
    return ["sweep", "trial_id"] if "sweep" in res.trials.collect_schema().names() else ["trial_id"]


def trial_values(res: Results, task: str = TASK) -> pl.DataFrame:
    """One row per trial (every status): its keys, ``status``, ``seed``, the cell columns
    ``policy``, ``lambda``, ``kind``, ``lr``, ``has_rlvr`` (its config has an RLVR stage),
    every config column, the quantities of `QUANTITIES` (null where a completed trial
    lacks the eval, and for trials that are not completed): ``acc``, ``S``, ``hard10`` and
    ``hard10_rlvr`` as in `evals_of` ``(task)``, ``f`` = `analysis.results.forgetting`, ``gap`` =
    pass@10 − pass@1, and ``on_task`` = ``task`` (the task acc and gap are read on)."""
    keys = _keys(res)
    trials = res.trials.collect()
    have = set(trials.columns)

    def col(name: str, dtype) -> pl.Expr:
        return pl.col(name).cast(dtype) if name in have else pl.lit(None, dtype)

    out = trials.with_columns(
        col(SEED, pl.Int64).alias("seed"), col(POLICY, pl.String).alias("policy"),
        col(LAMBDA, pl.Float64).alias("lambda"), col(KL, pl.String).alias("kind"), col(LR, pl.Float64).alias("lr"),
        col("rlvr.task", pl.String).is_not_null().alias("has_rlvr"))
    fe = final_evals(res).collect()
    for name, (stage, on, metric) in evals_of(task).items():
        v = fe.filter((pl.col("stage") == stage) & (pl.col("task") == on) & (pl.col("metric") == metric))
        out = out.join(v.select(*keys, pl.col("value").alias(name)), on=keys, how="left", validate="1:1")
    f = forgetting(res).select(*keys, pl.col("value").alias("f")).collect()
    out = out.join(f, on=keys, how="left", validate="1:1")
    return out.with_columns((pl.col("pass10") - pl.col("pass1")).alias("gap"), pl.lit(task).alias("on_task"))


def cell_table(trials: pl.DataFrame) -> pl.DataFrame:
    """One row per cell (``policy``, ``lambda``, ``kind``, ``lr``) of `trial_values` rows:
    ``<q>_mean``, ``<q>_sem``, ``<q>_n`` (seeds with a value) for each quantity q over the
    completed trials, averaged per seed first; ``n_trials``, ``n_failed`` (not completed),
    ``failed`` (their seeds and statuses) and ``mixed`` (config columns other than the cell's that
    vary inside the cell, the axes that do not group a report row, `registry.Axis.groups`, left out:
    the seed). Cells whose trials all failed are kept."""
    config = _config(trials)
    others = [c for c in trials.columns if c in config and c not in (POLICY, LAMBDA, KL, LR)
              and (c not in AXES or AXES[c].groups)]
    done = pl.col("status") == "completed"
    out = trials.group_by(_CELL).agg(
        pl.len().cast(pl.Int64).alias("n_trials"), (~done).sum().cast(pl.Int64).alias("n_failed"),
        pl.concat_str(pl.lit("seed "), pl.col("seed").cast(pl.String), pl.lit(": "), pl.col("status"))
        .filter(~done).alias("failed"),
        *[pl.col(c).n_unique().alias(f"__n_{c}") for c in others])
    out = out.with_columns(pl.concat_list([pl.when(pl.col(f"__n_{c}") > 1).then(pl.lit(c)) for c in others])
                           .list.drop_nulls().alias("mixed") if others else pl.lit([], pl.List(pl.String)).alias("mixed"))
    out = out.select(*_CELL, "n_trials", "n_failed", "failed", "mixed")
    per_seed = (trials.filter(done).group_by([*_CELL, "seed"]).agg(pl.col(q).mean() for q in QUANTITIES)
                .sort([*_CELL, "seed"], nulls_last=True))  # seeds in order: a cell's mean sums them alike every run
    for q in QUANTITIES:
        agg = aggregate(per_seed, _CELL, value=q).rename({"mean": f"{q}_mean", "sem": f"{q}_sem", "n": f"{q}_n"})
        out = out.join(agg, on=_CELL, how="left", nulls_equal=True).with_columns(pl.col(f"{q}_n").fill_null(0))
    return out.sort(_CELL, nulls_last=True)


_TRIAL_COLUMNS = {"trial_id", "sweep", "status", "error", "start_time", "end_time", "checkpoint", "seed", "policy",
                  "lambda", "kind", "lr", "has_rlvr", "on_task", *EVALS, *QUANTITIES}


def _config(trials: pl.DataFrame) -> set[str]:
    """The config columns of a `trial_values` frame (dotted names, e.g. ``loss.estimator``)."""
    return {c for c in trials.columns if c not in _TRIAL_COLUMNS}


def _label(policy: str, lam: float | None, kind: str, lr: float | None) -> str:
    who = f"λ={lam:g}" if policy == SPECTRUM_POLICY else policy
    return f"({who}, {kind}, η={'?' if lr is None else f'{lr:g}'})"


class CellView:
    """The cells of one finding: `stat` returns a cell's `Stat` of a quantity and records in
    ``problems`` (cell → why) every needed cell that is missing, failed, mixed or has fewer
    than `MIN_SEEDS` seeds with the value (its Stat is then NaN for a missing cell, and the
    finding inconclusive)."""

    def __init__(self, trials: pl.DataFrame, note: str = ""):
        self.cells = cell_table(trials)
        self._rows = {tuple(r[c] for c in _CELL): r for r in self.cells.iter_rows(named=True)}
        self.problems: dict[str, str] = {}
        self.note = note
        self.task = trials["on_task"][0] if "on_task" in trials.columns and trials.height else TASK
        #: distinct seeds among the completed trials (for `power_note`)
        self.seeds = _seeds(trials)
        #: the redraw this view's `stat` returns (`analysis.confidence.Redraws`, `redrawn`); None: the measured means
        self.draw: Any = None
        self._measured: dict[tuple, tuple[float, float, int]] = {}  # (q, cell) → mean, SEM, n of a checked cell

    def lrs(self, policies: Sequence[str] | None = None) -> list[float]:
        """The distinct LRs of the cells (any status) with a policy in ``policies`` (default all), ascending."""
        return sorted({k[3] for k in self._rows if k[3] is not None and (policies is None or k[0] in policies)})

    def redrawn(self, draw: Any) -> "CellView":
        """This view with `stat` returning the means of ``draw`` (its current redraw ``draw.b``)."""
        view = copy.copy(self)
        view.problems, view.draw = {}, draw
        return view

    def stat(self, q: str, policy: str, kind: str, lr: float | None, lam: float | None = None) -> Stat:
        """The `Stat` of quantity ``q`` (`QUANTITIES`) in cell (``policy``, ``lam``, ``kind``,
        ``lr``): mean and SEM over seeds, n seeds; NaN for a missing cell. Records why the cell
        cannot decide (missing, not completed, mixed, < `MIN_SEEDS` seeds) in ``problems``."""
        key = (policy, lam, kind, lr)
        if self.draw is not None and (q, key) in self._measured:  # a redraw: the cell's checks are done
            return self.draw.stat(key, q, *self._measured[q, key])
        label = _label(policy, lam, kind, lr) + self.note
        row = self._rows.get(key)
        if row is None:
            self.problems[label] = "missing (no trial)"
            return NAN
        why = []
        if row["n_failed"]:
            why.append(f"{row['n_failed']} of {row['n_trials']} trials not completed ({', '.join(row['failed'])})")
        if row["mixed"]:
            why.append(f"its trials differ in {', '.join(row['mixed'])}, not only in seed (split with --by)")
        n, name = row[f"{q}_n"], name_of(q, self.task)
        if n == 0 and row["n_trials"] > row["n_failed"]:  # completed trials without the value: never evaluated
            stage, task, metric = evals_of(self.task).get(q) or DERIVED[q]
            task = self.task if q == "gap" else task
            why.append(f"its completed trials have no {name} (not evaluated: e.g. {task} {metric} at stage "
                       f"{stage}, or the evaluation.pass_k / countdown_tasks that give it)")
        elif n < MIN_SEEDS:
            why.append(f"{n} seed(s) with {name} (< {MIN_SEEDS})")
        if why:
            self.problems[f"{label} {name}"] = "; ".join(why)
        mean, sem = row[f"{q}_mean"], row[f"{q}_sem"]
        self._measured[q, key] = (math.nan if mean is None else mean, math.nan if sem is None else sem, n)
        return Stat(*self._measured[q, key]) if self.draw is None else self.draw.stat(key, q, *self._measured[q, key])


def _grid(trials: pl.DataFrame) -> pl.DataFrame:
    return trials.filter(pl.col("policy").is_in(POLICIES) & pl.col("kind").is_in(KINDS))


def _spectrum(trials: pl.DataFrame) -> pl.DataFrame:
    return trials.filter((pl.col("policy") == SPECTRUM_POLICY) & pl.col("kind").is_in(KINDS))


def groups_of(trials: pl.DataFrame, by: str | None) -> dict[str, pl.DataFrame]:
    """`trial_values` rows by the value of the trials column ``by`` (``findings --by``): ``{"<by>=<value>":
    rows}``, or ``{"all": trials}`` for None.

    Raises:
        ValueError: ``by`` is not a config column or ``sweep``; the message names the study axes
            (`registry.AXES`) that vary among these trials."""
    if by is None:
        return {"all": trials}
    if by not in trials.columns or by in _TRIAL_COLUMNS - {"sweep"}:
        swept = [c for c in AXES if c in trials.columns and trials[c].n_unique() > 1]
        raise ValueError(f"--by {by!r} is not a trials column; allowed: sweep (several paths) or a config column, "
                         f"e.g. the study axes that vary here {swept} or {sorted(_config(trials))[:12]}")
    values = trials[by].unique().sort(nulls_last=True).to_list()
    return {f"{by}={v}": trials.filter(pl.col(by).is_null() if v is None else pl.col(by) == v) for v in values}
