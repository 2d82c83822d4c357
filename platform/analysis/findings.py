"""`distillab findings`: the pre-registered verdicts of PROTOCOL.md §9 on the study's
five findings (§7), decided from a sweep's result frames (`distillab.analysis.results.load`).

    distillab findings runs/micro_findings                      # verdicts; findings.md + figures there
    distillab findings runs/micro_findings runs/micro_noclip --by sweep --only F1,F4   # per ablation

Pure functions over Polars frames, one short function per finding:

    trial_values(res)    one row per trial: status, seed, its cell (policy ρ, λ, KL k, LR η), whether it
                         had an RLVR stage, its config columns and every quantity a rule reads
    cell_table(trials)   one row per cell: mean, SEM and seed count of each quantity, failed trials, and the
                         config columns that vary inside the cell
    f1 … f5(trials)      one `Verdict` each: the clauses of §9 with the statistics they used
    decide(res, by=...)  the verdicts, for all trials or per group of an ablation key
    findings_markdown / write_findings   findings.md, its cell tables and figures

How §9 is read (the literal reading wherever the text leaves a choice; fixed before any
findings run, never tuned to a result):

- **Cells.** A grid cell is (ρ, k, η) over trials with ``rollout.policy`` offpd or onpd; a
  spectrum cell is (λ, k, η) over trials with ``rollout.policy: spectrum``. Only ``loss.kind``
  forward and reverse form cells (JSD trials are ignored). The trials of a cell must differ in
  ``seed`` only: a cell whose trials differ in any other config column (e.g. ``loss.estimator``
  when ablation sweeps are loaded together) is not a set of seeds, and a rule that needs it is
  inconclusive, naming the columns (split them with ``--by``).
- **Seeds.** A cell's trials are grouped by ``seed``; a seed's value is the mean of its trials
  (the same trial found in two sweep directories). A cell's value is the mean over its seeds,
  SEM = sample standard deviation (ddof 1) / √n over seeds (`analysis.results.aggregate`), n the seeds
  that have the value. Values are the evals at the last step of the stage
  (`analysis.results.final_evals`): stage ``distill`` unless a rule says ``rlvr``.
- **Failed.** A cell is failed when any of its trials is not ``completed`` (failed, or still
  running): its completed seeds are not used alone, since a failure may be the outcome (a
  collapse). With the §9 rule "missing, failed, or fewer than 3 seeds", such a cell makes
  the finding **inconclusive**, as does a value that is NaN.
- **SEM rules.** A difference of two cells (or of two means over cells): SEM = √(SEM_a² +
  SEM_b²); a mean over n cells: SEM = √(Σ SEM²) / n; |x| keeps x's SEM. "Clearly above": the
  difference exceeds 2 SEM. Where a clause compares magnitudes without "clearly" (F1 b "at
  least twice", F2 b "exceeds", F3 a "at most half", F5 b "smaller than") it compares the
  means; their SEMs are printed.
- **LRs.** η1 < … < ηm are the distinct ``optimizer.lr`` of the grid trials (any status);
  F1 and F2 need m ≥ 3 and every cell of {offpd, onpd} × {forward, reverse} × {η1..ηm}.
- **Ranges.** "The range of acc over η" is max − min of the cell means over η (the two cells
  picked by their means), its SEM by the difference rule. F1 b takes that range per ρ, then
  the mean over ρ (the mean-over-cells rule); F3 a the range over the five λ per k.
- **F2.** f = forgetting, ``ood_mean`` at distill − pre (`analysis.results.forgetting`); S =
  ``sparsity@1e-06`` of task ``params`` at stage distill, in whatever dtype the study's
  ``evaluation.sparsity_dtype`` compares weights. The LR effect is the mean over the four
  (ρ, k) of |f(ηm) − f(η1)|, the policy effect the mean over the 2·m (k, η) of
  |f(onpd) − f(offpd)|.
- **F3, F5.** The spectrum is λ ∈ {−2, −1, 0, 1, 2} at one LR: spectrum trials at several LRs
  make them inconclusive (decide each with ``--by optimizer.lr``). F5's cells hold only the
  spectrum trials with an RLVR stage (``rlvr`` set in their config); (a) reads their
  Countdown-4E pass@10 at stage distill, (b) the same trials at stage rlvr. "That gap" is
  mean(λ ∈ {1, 2}) − mean(λ ∈ {−2, −1}) for one KL direction; (b) holds for a direction
  when its rlvr gap is not clearly positive (≤ 2 SEM) or its mean is below the distill
  gap's mean, and F5 b needs one direction where it holds.
- **F4.** Matched cells are every (ρ, η) of the grid and every (λ, η) of the spectrum trials
  present; each needs a forward and a reverse cell. The coverage gap is computed per trial
  (pass@10 − pass@1 on Countdown-3 of the same evaluation), then averaged over seeds per
  cell; G_k is its mean over the matched cells, and F4 holds when G_forward − G_reverse > 2 SEM.
- **Verdicts.** Inconclusive when a needed cell is missing, failed, mixed, has fewer than 3
  seeds with the value, or a statistic is NaN (the cells are listed); otherwise reproduced
  when every clause holds, else not reproduced.
- **Task.** ``acc``, pass@1 and pass@10 are read on Countdown-3 (§9). ``--task NAME`` reads them on
  another scored task instead, with the rules unchanged: the long-reasoning ablation
  (``search_spaces/micro_math.yaml``, ``trial.domain: math``) distils on task ``math``, so its F1
  and F4 are decided on ``--task math``; findings.md then says so above the verdicts.
- **Confidence (§9.1).** `assess` keeps each verdict (the rule on the measured means) and reruns
  the same rule function (`_SPLIT`: each finding's cells, then its rule on a `CellView`) on
  `DRAWS` redraws of the cell means, mean + SEM · t with t ~ Student t (n − 1 degrees of freedom,
  n the cell's seeds; RNG seed `DRAW_SEED`), with the SEMs as measured: a clause's confidence is
  the share of redraws in which it holds as observed, a finding's the share giving its verdict;
  firm at ≥ `FIRM`. An inconclusive verdict is not redrawn. For a fragile clause `seeds_needed`
  finds the smallest n' (≤ `SEEDS_CAP`) at which it is firm when every cell has n' seeds with its
  mean and standard deviation as measured (SEM' = sd / √n', n' − 1 degrees of freedom; the
  reference then is the rule on the measured means with SEM', which may flip a "clearly").
- **Replication.** Beside the confidence, `assess` reports the share of redraws with the means
  spread √2 times as far, mean + √2 · SEM · t (`REPLICATION_SPREAD`), the SEMs the rule reads
  unchanged: a replication of the same design lands about √2 · SEM from this run's mean (its own
  noise plus this run's), so this is the chance that a rerun (another seed draw, or another CPU's
  arithmetic, which acts as one) gives the same verdict. Reported, never a rule; it answers the
  case the confidence cannot: a conjunction of near-threshold clauses that is firm "not reproduced"
  given this run's means and still flips on a rerun (docs/findings.md, F1).
- **Retention or transfer.** findings.md's table of pass@10 before → after distillation → after
  RLVR on Countdown-4E (and Countdown-4) per cell, with `regime`: transfer when some cell gains
  by more than 2 SEM of the difference, else retention (issue 33; reported, not a rule).
- **Ablations.** ``--by KEY`` partitions the trials by the value of a trials column (``sweep``
  when several directories are loaded, or a config column such as ``loss.estimator``,
  ``optimizer.clip``) and decides each group on its own; ``--only F1,F4`` restricts the
  findings (the robustness check asks whether F1 and F4 hold under each ablation).
"""

from __future__ import annotations

import copy
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import polars as pl

from distillab.analysis.plots import (
    KL,
    LAMBDA,
    LR,
    POLICY,
    SEED,
    fig_accuracy_lr,
    fig_coverage_gap,
    fig_hard_pass_lambda,
    fig_lambda,
    fig_lr,
    figure_notes,
    save_figure,
)
from distillab.analysis.results import (
    Results,
    aggregate,
    filter_trials,
    final_evals,
    forgetting,
    format_table,
    mean_sem_text,
)
from distillab.tables import code_version, run_records

__all__ = [
    "Stat", "mean_of", "Clause", "Verdict", "PAPER", "FINDINGS", "MIN_SEEDS", "SPECTRUM",
    "trial_values", "cell_table", "CellView", "f1", "f2", "f3", "f4", "f5", "decide",
    "format_verdicts", "findings_markdown", "DRAWS", "DRAW_SEED", "FIRM", "SEEDS_CAP", "Redraws", "agreement",
    "seeds_needed", "assess", "confidence_text", "REPLICATION_SPREAD", "replication_text", "CONFIDENCE_NOTE",
    "verdict_table_lines", "NOT_RECORDED",
    "run_arithmetic", "STAGED", "TRANSFER", "RETENTION", "regime", "retention_lines", "TASK", "evals_of", "name_of", "provenance_lines", "not_reproduced_lines", "power_note", "ratio_note", "FINDINGS_FIGURES", "figure_finding", "write_findings",
]

#: §9: fewer seeds than this make a cell inconclusive
MIN_SEEDS = 3
#: §9, F3: the spectrum's λ values
SPECTRUM = (-2.0, -1.0, 0.0, 1.0, 2.0)
POLICIES = ("offpd", "onpd")
KINDS = ("forward", "reverse")
REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"

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
_CELL = ["policy", "lambda", "kind", "lr"]

#: The paper's values (Piskorz, Berthon, van der Schaar 2026, as our sources restate them), one row
#: each: (finding, quantity, value, source). Numbers only where a source gives one.
PAPER: tuple[tuple[str, str, str, str], ...] = (
    ("F1", "final in-distribution accuracy", "no consistent advantage of either rollout policy; forward KL "
     "stable across policies and LRs, reverse KL sensitive to LR", "PROTOCOL.md §7.1"),
    ("F2", "ΔOOD (forgetting)", "within ~1.3 points at LR 1e-5; −11 to −14 points at LR 5e-5", "the paper, as distillab issue 17 quotes it"),
    ("F2", "update sparsity S_1e-6", "85–90 % at LR 1e-5; 52–60 % at LR 5e-5 (falls roughly linearly with LR; "
     "OffPD at least as sparse)", "the paper, as distillab issue 17 quotes it; PROTOCOL.md §7.2"),
    ("F3", "accuracy along λ", "forward KL robust along the spectrum; reverse KL needs λ > 0 and can collapse "
     "at high LR", "PROTOCOL.md §7.3"),
    ("F4", "coverage pass@k at similar pass@1", "higher for forward KL than for reverse KL", "PROTOCOL.md §7.4"),
    ("F5", "Countdown-4E generalisation", "λ > 0 generalises better under both KL directions; the advantage "
     "does not reliably survive RLVR", "PROTOCOL.md §7.5"),
)


#: Finding → (the claim of PROTOCOL.md §7, the rule of §9 that decides it), as written there.
RULES: dict[str, tuple[str, str]] = {
    "F1": ("Rollout policy gives no consistent advantage in final in-distribution accuracy; forward KL is stable "
           "across policies and LRs, reverse KL is sensitive to LR.",
           "(a) for forward KL at every η, |acc(onpd) − acc(offpd)| ≤ max(0.05, 2 SEM), and (b) the range of acc "
           "over η, averaged over ρ, is at least twice as large for reverse KL as for forward KL"),
    "F2": ("Learning rate, not rollout policy, governs forgetting and update sparsity.",
           "(a) for every (ρ, k), f(η1) is clearly above f(ηm), (b) the LR effect, mean over (ρ, k) of "
           "|f(ηm) − f(η1)|, exceeds the policy effect, mean over (k, η) of |f(onpd) − f(offpd)|, and (c) for every "
           "(ρ, k), S(η1) is clearly above S(ηm); reported: mean over (k, η) of S(offpd) − S(onpd)"),
    "F3": ("Along the spectrum, forward KL is robust; reverse KL needs λ > 0 and can collapse at high LR.",
           "(a) the range of acc over λ for forward KL is at most half that for reverse KL, and (b) for reverse KL, "
           "mean acc over λ ∈ {1, 2} is clearly above mean acc over λ ∈ {−2, −1}"),
    "F4": ("Forward KL gives higher pass@k at similar pass@1 (coverage).",
           "the coverage gap pass@10 − pass@1 on Countdown-3, averaged over matched cells (same ρ or λ, same η), "
           "is clearly larger for forward than for reverse KL"),
    "F5": ("Student-favoured rollouts (λ > 0) generalise better to Countdown-4E under both directions; the "
           "advantage does not reliably survive later RLVR.",
           "(a) for both KL directions, Countdown-4E pass@10 averaged over λ ∈ {1, 2} is clearly above that over "
           "λ ∈ {−2, −1} at stage distill, and (b) for at least one direction, that gap at stage rlvr is not clearly "
           "positive or is smaller than at distill"),
}


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


def _holds(condition: bool, *stats: Stat) -> bool | None:
    return bool(condition) if all(s.finite for s in stats) else None


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
    ``failed`` (their seeds and statuses) and ``mixed`` (config columns other than the seed and
    the cell's that vary inside the cell). Cells whose trials all failed are kept."""
    config = _config(trials)
    others = [c for c in trials.columns if c in config and c not in (SEED, POLICY, LAMBDA, KL, LR)]
    done = pl.col("status") == "completed"
    out = trials.group_by(_CELL).agg(
        pl.len().cast(pl.Int64).alias("n_trials"), (~done).sum().cast(pl.Int64).alias("n_failed"),
        pl.concat_str(pl.lit("seed "), pl.col("seed").cast(pl.String), pl.lit(": "), pl.col("status"))
        .filter(~done).alias("failed"),
        *[pl.col(c).n_unique().alias(f"__n_{c}") for c in others])
    out = out.with_columns(pl.concat_list([pl.when(pl.col(f"__n_{c}") > 1).then(pl.lit(c)) for c in others])
                           .list.drop_nulls().alias("mixed") if others else pl.lit([], pl.List(pl.String)).alias("mixed"))
    out = out.select(*_CELL, "n_trials", "n_failed", "failed", "mixed")
    per_seed = trials.filter(done).group_by([*_CELL, "seed"]).agg(pl.col(q).mean() for q in QUANTITIES)
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
    who = f"λ={lam:g}" if policy == "spectrum" else policy
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
        #: the redraw this view's `stat` returns (`Redraws`, `redrawn`); None: the measured means
        self.draw: Redraws | None = None
        self._measured: dict[tuple, tuple[float, float, int]] = {}  # (q, cell) → mean, SEM, n of a checked cell

    def lrs(self, policies: Sequence[str] | None = None) -> list[float]:
        """The distinct LRs of the cells (any status) with a policy in ``policies`` (default all), ascending."""
        return sorted({k[3] for k in self._rows if k[3] is not None and (policies is None or k[0] in policies)})

    def redrawn(self, draw: "Redraws") -> "CellView":
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
    return trials.filter((pl.col("policy") == "spectrum") & pl.col("kind").is_in(KINDS))


# --------------------------------------------------------------------------- verdicts


@dataclass(frozen=True)
class Clause:
    """One clause of a rule: its name, whether it holds (None: a statistic is NaN), the
    statistics it used, as text, and for a clause that fails a note on why (``note``)."""

    name: str
    holds: bool | None
    text: str
    stats: dict[str, Stat] = field(default_factory=dict)
    #: where the clause fails, what the data say about why (`power_note`, `ratio_note`); "" otherwise
    note: str = ""
    #: PROTOCOL.md §9.1: the share of redraws in which the clause holds as observed (`assess`); None: not redrawn
    confidence: float | None = None
    #: for a fragile clause, the seeds per cell at which it would be firm (`seeds_needed`); None: firm, not
    #: redrawn, or not firm up to the search's cap (then ``needed_text`` says so)
    needed: int | None = None
    #: ``needed`` as findings.md prints it ("" where the clause is not fragile)
    needed_text: str = ""


@dataclass(frozen=True)
class Verdict:
    """A finding's verdict with the clauses (and their statistics) it used, our values of the
    quantities the paper reports (``ours``), the statistics reported but not required, the
    needed cells that make it inconclusive, and the paper's values (`PAPER`). ``claim`` and
    ``rule``: `RULES`."""

    finding: str
    verdict: str
    claim: str
    rule: str
    clauses: tuple[Clause, ...]
    ours: dict[str, Stat] = field(default_factory=dict)
    reported: dict[str, Stat] = field(default_factory=dict)
    problems: tuple[str, ...] = ()
    paper: tuple[tuple[str, str, str], ...] = field(default=())
    #: PROTOCOL.md §9.1: the share of redraws in which the finding's verdict is the observed one (`assess`);
    #: None for an inconclusive verdict (no redraw) or a verdict decided without redraws
    confidence: float | None = None
    #: the share of redraws spread by `REPLICATION_SPREAD` giving the observed verdict (`assess`): how
    #: likely a rerun of the design is to agree; None where ``confidence`` is
    replication: float | None = None


def _verdict(finding: str, clauses: list[Clause], views: Sequence[CellView], ours: dict[str, Stat],
             reported: dict[str, Stat] | None = None, extra: dict[str, str] | None = None) -> Verdict:
    problems = {**(extra or {})}
    for v in views:
        problems.update(v.problems)
    undecided = [c.name for c in clauses if c.holds is None]
    if undecided and not problems:
        problems["statistics"] = f"NaN in clause(s) {', '.join(undecided)}"
    if not clauses and not problems:
        problems["cells"] = "no cell to decide on"
    verdict = INCONCLUSIVE if problems else REPRODUCED if all(c.holds for c in clauses) else NOT_REPRODUCED
    paper = tuple((q, v, s) for f, q, v, s in PAPER if f == finding)
    return Verdict(finding, verdict, *RULES[finding], tuple(clauses), ours, dict(reported or {}),
                   tuple(f"{k}: {v}" for k, v in problems.items()), paper)


def _grid_view(trials: pl.DataFrame) -> CellView:
    """F1's and F2's cells: the grid (offpd, onpd)."""
    return CellView(_grid(trials))


def _spectrum_view(trials: pl.DataFrame) -> CellView:
    """F3's cells: the spectrum."""
    return CellView(_spectrum(trials))


def _coverage_view(trials: pl.DataFrame) -> CellView:
    """F4's cells: the grid and the spectrum."""
    return CellView(pl.concat([_grid(trials), _spectrum(trials)]))


def _rlvr_view(trials: pl.DataFrame) -> CellView:
    """F5's cells: the spectrum trials with an RLVR stage."""
    return CellView(_spectrum(trials).filter(pl.col("has_rlvr")), note=" with RLVR")


def _need_lrs(lrs: list[float]) -> dict[str, str]:
    return {} if len(lrs) >= 3 else {"LRs": f"the grid has {len(lrs)} LR(s) {[f'{x:g}' for x in lrs]}; "
                                            "§9 needs m ≥ 3"}


def f1(trials: pl.DataFrame) -> Verdict:
    """F1: (a) forward KL, every η: |acc(onpd) − acc(offpd)| ≤ max(0.05, 2 SEM); (b) the range
    of acc over η, averaged over ρ, at least twice as large for reverse as for forward KL."""
    return _f1(_grid_view(trials))


def _f1(v: "CellView") -> Verdict:
    lrs = v.lrs(POLICIES)
    clauses, diffs = [], []
    for lr in lrs:
        d = v.stat("acc", "onpd", "forward", lr) - v.stat("acc", "offpd", "forward", lr)
        diffs.append(d)
        bound = max(0.05, 2 * d.sem) if d.finite else math.nan
        holds = _holds(abs(d.mean) <= bound, d)
        clauses.append(Clause(f"(a) η={lr:g}", holds,
                              f"forward KL: acc(onpd) − acc(offpd) = {d.text()}; |·| ≤ max(0.05, 2 SEM) = {bound:.3g}",
                              {"difference": d}, ratio_note(abs(d), Stat(bound, 0.0), "|difference| / tolerance",
                                                            "≤ 1×") if holds is False else ""))
    rng = {k: mean_of([value_range([v.stat("acc", p, k, lr) for lr in lrs]) for p in POLICIES]) for k in KINDS}
    holds = _holds(rng["reverse"].mean >= 2 * rng["forward"].mean, *rng.values())
    clauses.append(Clause("(b)", holds, f"range of acc over η, mean over ρ: reverse {rng['reverse'].text()} ≥ 2 × "
                          f"forward {rng['forward'].text()} (= {2 * rng['forward'].mean:.3g})", dict(rng),
                          ratio_note(rng["reverse"], rng["forward"], "reverse KL's range over forward KL's",
                                     "≥ 2×") if holds is False else ""))
    ours = {"forward KL: acc(onpd) − acc(offpd), mean over η": mean_of(diffs),
            "range of acc over η (mean over ρ), forward KL": rng["forward"],
            "range of acc over η (mean over ρ), reverse KL": rng["reverse"]}
    return _verdict("F1", clauses, [v], ours, extra=_need_lrs(lrs))


def f2(trials: pl.DataFrame) -> Verdict:
    """F2: for every (ρ, k) (a) f(η1) clearly above f(ηm) and (c) S(η1) clearly above S(ηm);
    (b) the LR effect (mean |f(ηm) − f(η1)| over (ρ, k)) exceeds the policy effect (mean
    |f(onpd) − f(offpd)| over (k, η)). Reported: mean over (k, η) of S(offpd) − S(onpd)."""
    return _f2(_grid_view(trials))


def _f2(v: "CellView") -> Verdict:
    lrs = v.lrs(POLICIES)
    lo, hi = (lrs[0], lrs[-1]) if lrs else (None, None)
    clauses, lr_eff = [], []
    for q, tag in (("f", "(a)"), ("S", "(c)")):
        for p in POLICIES:
            for k in KINDS:
                d = v.stat(q, p, k, lo) - v.stat(q, p, k, hi)
                if q == "f":
                    lr_eff.append(abs(d))
                clauses.append(Clause(f"{tag} {p}, {k}", clearly(d), f"{q}(η1={lo}) − {q}(ηm={hi}) = {d.text()}; "
                                      f"clearly > 0 iff > 2 SEM = {2 * d.sem:.3g}", {"difference": d},
                                      power_note(d, v.seeds)))
    pol_eff = [abs(v.stat("f", "onpd", k, lr) - v.stat("f", "offpd", k, lr)) for k in KINDS for lr in lrs]
    L, P = mean_of(lr_eff), mean_of(pol_eff)
    holds = _holds(L.mean > P.mean, L, P)
    clauses.insert(4, Clause("(b)", holds,
                             f"LR effect mean|f(ηm) − f(η1)| = {L.text()} > policy effect mean|f(onpd) − f(offpd)| "
                             f"= {P.text()}", {"lr_effect": L, "policy_effect": P},
                             ratio_note(L, P, "the LR effect over the policy effect", "> 1×") if holds is False else ""))
    sp = mean_of([v.stat("S", "offpd", k, lr) - v.stat("S", "onpd", k, lr) for k in KINDS for lr in lrs])
    ours = {f"{q} at {name} (mean over ρ, k)": mean_of([v.stat(q, p, k, lr) for p in POLICIES for k in KINDS])
            for q in ("f", "S") for name, lr in ((f"η1={lo:g}" if lrs else "η1", lo), (f"ηm={hi:g}" if lrs else "ηm", hi))}
    return _verdict("F2", clauses, [v], ours, reported={"mean over (k, η) of S(offpd) − S(onpd)": sp},
                    extra=_need_lrs(lrs))


def _one_lr(lrs: list[float], what: str) -> tuple[float | None, dict[str, str]]:
    if len(lrs) > 1:
        return lrs[0], {"LR": f"{what} at several LRs {[f'{x:g}' for x in lrs]}; §9 decides at one LR "
                              "(split with --by optimizer.lr)"}
    return (lrs[0] if lrs else None), {}


def f3(trials: pl.DataFrame) -> Verdict:
    """F3 (λ ∈ {−2, −1, 0, 1, 2}, one LR): (a) the range of acc over λ for forward KL is at most
    half that for reverse KL; (b) reverse KL: mean acc over λ ∈ {1, 2} clearly above the mean
    over λ ∈ {−2, −1}."""
    return _f3(_spectrum_view(trials))


def _f3(v: "CellView") -> Verdict:
    lr, extra = _one_lr(v.lrs(), "spectrum trials")
    acc = {(lam, k): v.stat("acc", "spectrum", k, lr, lam) for lam in SPECTRUM for k in KINDS}
    rf, rr = (value_range([acc[lam, k] for lam in SPECTRUM]) for k in KINDS)
    d = mean_of([acc[1.0, "reverse"], acc[2.0, "reverse"]]) - mean_of([acc[-2.0, "reverse"], acc[-1.0, "reverse"]])
    holds = _holds(rf.mean <= 0.5 * rr.mean, rf, rr)
    clauses = [
        Clause("(a)", holds,
               f"range of acc over λ: forward {rf.text()} ≤ ½ × reverse {rr.text()} (= {0.5 * rr.mean:.3g})",
               {"forward": rf, "reverse": rr},
               ratio_note(rf, rr, "forward KL's range over reverse KL's", "≤ 0.5×") if holds is False else ""),
        Clause("(b)", clearly(d), f"reverse KL: mean acc(λ ∈ {{1, 2}}) − mean acc(λ ∈ {{−2, −1}}) = {d.text()}; "
                                  f"clearly > 0 iff > 2 SEM = {2 * d.sem:.3g}", {"difference": d},
               power_note(d, v.seeds)),
    ]
    ours = {"range of acc over λ, forward KL": rf, "range of acc over λ, reverse KL": rr,
            "reverse KL: mean acc(λ ∈ {1, 2}) − mean acc(λ ∈ {−2, −1})": d}
    return _verdict("F3", clauses, [v], ours, extra=extra)


def f4(trials: pl.DataFrame) -> Verdict:
    """F4: the coverage gap pass@10 − pass@1 (Countdown-3), averaged over matched cells (same ρ
    or λ, same η), clearly larger for forward than for reverse KL."""
    return _f4(_coverage_view(trials))


def _f4(v: "CellView") -> Verdict:
    matched = [(p, None, lr) for p in POLICIES for lr in v.lrs(POLICIES)]
    matched += [("spectrum", lam, lr) for lam in SPECTRUM for lr in v.lrs(("spectrum",))]
    g = {k: mean_of([v.stat("gap", p, k, lr, lam) for p, lam, lr in matched]) for k in KINDS}
    d = g["forward"] - g["reverse"]
    clauses = [Clause("", clearly(d) if matched else None,
                      f"mean gap over {len(matched)} matched cells: forward {g['forward'].text()} − reverse "
                      f"{g['reverse'].text()} = {d.text()}; clearly > 0 iff > 2 SEM = {2 * d.sem:.3g}",
                      {**g, "difference": d}, power_note(d, v.seeds))]
    ours = {"pass@10 − pass@1, forward KL": g["forward"], "pass@10 − pass@1, reverse KL": g["reverse"]}
    extra = {} if matched else {"cells": "no matched cells (no offpd/onpd or spectrum trials with forward/reverse KL)"}
    return _verdict("F4", clauses, [v], ours, extra=extra)


def f5(trials: pl.DataFrame) -> Verdict:
    """F5 (spectrum trials with an RLVR stage): (a) for both k, Countdown-4E pass@10 averaged
    over λ ∈ {1, 2} clearly above that over λ ∈ {−2, −1} at stage distill; (b) for at least one
    k, that gap at stage rlvr is not clearly positive or smaller than at distill."""
    return _f5(_rlvr_view(trials))


def _f5(v: "CellView") -> Verdict:
    lr, extra = _one_lr(v.lrs(), "spectrum trials with an RLVR stage")
    clauses, after, ours = [], [], {}
    for k in KINDS:
        gap = {}
        for q in ("hard10", "hard10_rlvr"):
            s = {lam: v.stat(q, "spectrum", k, lr, lam) for lam in (-2.0, -1.0, 1.0, 2.0)}
            gap[q] = mean_of([s[1.0], s[2.0]]) - mean_of([s[-2.0], s[-1.0]])
        dist, rl = gap["hard10"], gap["hard10_rlvr"]
        ours |= {f"Countdown-4E pass@10 gap λ>0 − λ<0, {k} KL, distill": dist,
                 f"Countdown-4E pass@10 gap λ>0 − λ<0, {k} KL, rlvr": rl}
        clauses.append(Clause(f"(a) {k}", clearly(dist), f"pass@10, mean λ ∈ {{1, 2}} − mean λ ∈ {{−2, −1}}, at distill = {dist.text()}; "
                              f"clearly > 0 iff > 2 SEM = {2 * dist.sem:.3g}", {"distill": dist},
                              power_note(dist, v.seeds)))
        c = clearly(rl)
        holds = None if c is None or not dist.finite else (not c) or rl.mean < dist.mean
        after.append((k, holds, rl, dist))
    known = [h for _, h, _, _ in after if h is not None]
    holds = any(known) if len(known) == len(after) or any(known) else None
    clauses.append(Clause("(b)", holds, "; ".join(
        f"{k}: gap at rlvr = {rl.text()} (clearly > 0 iff > {2 * rl.sem:.3g}), at distill {dist.mean:.3g} → "
        f"{'holds' if h else 'does not hold' if h is not None else 'NaN'}" for k, h, rl, dist in after),
        {f"rlvr {k}": rl for k, _, rl, _ in after},
        "in both directions the gap after RLVR is clearly positive and not smaller than before it: the advantage "
        "survived RLVR" if holds is False else ""))
    return _verdict("F5", clauses, [v], ours, extra=extra)


#: Finding → its decision function (in order).
FINDINGS: dict[str, Callable[[pl.DataFrame], Verdict]] = {"F1": f1, "F2": f2, "F3": f3, "F4": f4, "F5": f5}
#: Finding → (the cells it reads, from `trial_values` rows; its rule on them): ``FINDINGS[f](trials)`` is
#: ``rule(cells(trials))``, split so that `assess` reruns the same rule on redrawn cells
_SPLIT: dict[str, tuple[Callable[[pl.DataFrame], CellView], Callable[[CellView], Verdict]]] = {
    "F1": (_grid_view, _f1), "F2": (_grid_view, _f2), "F3": (_spectrum_view, _f3), "F4": (_coverage_view, _f4),
    "F5": (_rlvr_view, _f5)}


# --------------------------------------------------------------------------- confidence (§9.1)


#: PROTOCOL.md §9.1: redraws per confidence (B ≥ 2,000), their RNG seed, the share at which a verdict is firm,
#: and the largest seed count the seeds-needed search tries
DRAWS, DRAW_SEED, FIRM, SEEDS_CAP = 2000, 91, 0.9, 50
#: the replication redraw's spread in SEMs (module docstring, "Replication"): a rerun's mean differs from this
#: run's by its own sampling error and this run's, √(SEM² + SEM²) = √2 · SEM when both have the same design
REPLICATION_SPREAD = math.sqrt(2)


class Redraws:
    """``draws`` redraws of every cell mean of a `CellView` (PROTOCOL.md §9.1): redraw b gives each
    cell's quantity q the mean ``mean + SEM · t[b]``, t ~ Student t with n − 1 degrees of freedom
    (n the cell's seeds with q; numpy ``default_rng(seed).standard_t``, drawn per (cell, q) in a
    fixed order, so the same view and seed give the same redraws). With ``seeds`` = n', every
    cell is as if it had n' seeds with its mean and standard deviation as measured: SEM' =
    sd / √n' = SEM · √(n / n'), t with n' − 1 degrees of freedom, and the rule's SEMs are SEM'.
    ``spread`` scales the draw, mean + spread · SEM · t, leaving the SEMs the rule reads as they are
    (`REPLICATION_SPREAD` for a rerun's mean). ``b`` = −1 (the start) gives the measured means (with
    SEM' where ``seeds`` is set)."""

    def __init__(self, view: CellView, draws: int = DRAWS, seed: int = DRAW_SEED, seeds: int | None = None,
                 spread: float = 1.0):
        rng = np.random.default_rng(seed)
        self.draws, self.seeds, self.b, self.spread = draws, seeds, -1, spread
        self._t: dict[tuple, list[float]] = {}
        for key in sorted(view._rows, key=repr):
            row = view._rows[key]
            for q in QUANTITIES:
                df = (seeds or row[f"{q}_n"]) - 1
                self._t[key, q] = rng.standard_t(df, draws).tolist() if df >= 1 else [math.nan] * draws

    def stat(self, key: tuple, q: str, mean: float, sem: float, n: int) -> Stat:
        """The `Stat` of quantity ``q`` in cell ``key`` (measured ``mean``, ``sem``, ``n``) in redraw ``b``."""
        if self.seeds and n:
            sem, n = sem * math.sqrt(n / self.seeds), self.seeds
        return Stat(mean if self.b < 0 else mean + self.spread * sem * self._t[key, q][self.b], sem, n)


def agreement(view: CellView, rule: Callable[[CellView], Verdict], draw: Redraws,
              reference: Verdict) -> tuple[list[float], float]:
    """The shares of ``draw``'s redraws in which ``rule`` on the redrawn ``view`` gives each clause of
    ``reference`` its ``holds``, and the finding its verdict (PROTOCOL.md §9.1): (per clause, finding)."""
    v = view.redrawn(draw)
    same, overall = [0] * len(reference.clauses), 0
    for b in range(draw.draws):
        draw.b = b
        r = rule(v)
        same = [s + (c.holds == o.holds) for s, c, o in zip(same, r.clauses, reference.clauses)]
        overall += r.verdict == reference.verdict
    draw.b = -1
    return [s / draw.draws for s in same], overall / draw.draws


def seeds_needed(view: CellView, rule: Callable[[CellView], Verdict], clauses: Sequence[int], start: int,
                 draws: int = DRAWS, seed: int = DRAW_SEED, cap: int = SEEDS_CAP) -> dict[int, tuple[int | None, bool | None]]:
    """For each clause index in ``clauses``: the smallest seed count n' in (``start``, ``cap``] at which the
    clause is firm (PROTOCOL.md §9.1: confidence ≥ `FIRM` over `Redraws` with ``seeds`` = n', the
    reference being the rule on the measured means with SEM'), and whether the clause then holds;
    (None, None) when it is not firm at ``cap``. Search: bisection between ``start`` and ``cap``,
    which assumes a clause once firm stays firm with more seeds (SEM' shrinks as 1/√n')."""
    memo: dict[int, list[tuple[bool, bool | None]]] = {}

    def at(m: int) -> list[tuple[bool, bool | None]]:
        if m not in memo:
            d = Redraws(view, draws, seed, seeds=m)
            ref = rule(view.redrawn(d))
            shares, _ = agreement(view, rule, d, ref)
            memo[m] = [(x >= FIRM, c.holds) for x, c in zip(shares, ref.clauses)]
        return memo[m]

    out: dict[int, tuple[int | None, bool | None]] = {}
    for i in clauses:
        if cap <= start or not at(cap)[i][0]:
            out[i] = (None, None)
            continue
        lo, hi = start, cap  # fragile at lo (the measured seeds), firm at hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if at(mid)[i][0] else (mid, hi)
        out[i] = (hi, at(hi)[i][1])
    return out


def assess(finding: str, trials: pl.DataFrame, draws: int = DRAWS, seed: int = DRAW_SEED,
           cap: int = SEEDS_CAP) -> Verdict:
    """``FINDINGS[finding](trials)`` with PROTOCOL.md §9.1's confidence: each clause's and the
    finding's share of ``draws`` redraws (`Redraws`, RNG ``seed``) in which the same rule gives the
    observed outcome, and for each fragile clause (confidence < `FIRM`) the seeds needed
    (`seeds_needed`, up to ``cap``), and the finding's replication share (the same redraws spread by
    `REPLICATION_SPREAD`). The verdict itself is the rule on the measured means, unchanged; an
    inconclusive verdict is not redrawn (confidence and replication None).

    Raises:
        KeyError: an unknown finding."""
    cells, rule = _SPLIT[finding]
    view = cells(trials)
    verdict = rule(view)
    if verdict.verdict == INCONCLUSIVE:
        return verdict
    shares, overall = agreement(view, rule, Redraws(view, draws, seed), verdict)
    _, rerun = agreement(view, rule, Redraws(view, draws, seed, spread=REPLICATION_SPREAD), verdict)
    fragile = [i for i, x in enumerate(shares) if x < FIRM]
    need = seeds_needed(view, rule, fragile, view.seeds, draws, seed, cap) if fragile else {}
    clauses = []
    for i, (c, x) in enumerate(zip(verdict.clauses, shares)):
        n, holds = need.get(i, (None, None))
        text = "" if i not in need else f"> {cap}" if n is None else (
            f"{n}" + ("" if holds == c.holds else f" (where it then {'holds' if holds else 'fails'})"))
        clauses.append(replace(c, confidence=x, needed=n, needed_text=text))
    return replace(verdict, clauses=tuple(clauses), confidence=overall, replication=rerun)


def replication_text(x: float | None) -> str:
    """A replication share as printed: "0.71"; "–" for None (not redrawn)."""
    return "–" if x is None else f"{x:.2f}"


def confidence_text(x: float | None) -> str:
    """A §9.1 confidence as printed: "0.953 firm", "0.61 fragile"; "–" for None (not redrawn)."""
    return "–" if x is None else f"{x:.3f} {'firm' if x >= FIRM else 'fragile'}"


def decide(res: Results, by: str | None = None, only: Sequence[str] | None = None,
           task: str = TASK) -> dict[str, list[Verdict]]:
    """The verdicts of the findings ``only`` (default all of `FINDINGS`) on the trials of
    ``res``: ``{"all": [...]}``, or with ``by`` one entry per value of that trials column
    (``"<by>=<value>"``), each group decided on its own; acc, pass@1 and pass@10 read on
    ``task`` (default Countdown-3, as §9 says); each with its §9.1 confidence (`assess`, `DRAWS`
    redraws: the number findings.md states).

    Raises:
        ValueError: an unknown finding, ``by`` not a trials column (names the columns), or
            ``task`` not a task with an accuracy in the evals (names those tasks)."""
    names = list(only) if only else list(FINDINGS)
    bad = [n for n in names if n not in FINDINGS]
    if bad:
        raise ValueError(f"unknown finding(s) {bad}; allowed: {list(FINDINGS)}")
    scored = res.evals.filter(pl.col("metric") == "accuracy").select(pl.col("task").unique()).collect()
    tasks = sorted(scored["task"].to_list())
    if task != TASK and task not in tasks:
        raise ValueError(f"--task {task!r} is not a task these sweeps score for accuracy; allowed: {tasks}")
    trials = trial_values(res, task)
    return {g: [assess(n, t) for n in names] for g, t in _groups(trials, by).items()}


def _groups(trials: pl.DataFrame, by: str | None) -> dict[str, pl.DataFrame]:
    if by is None:
        return {"all": trials}
    if by not in trials.columns or by in _TRIAL_COLUMNS - {"sweep"}:
        raise ValueError(f"--by {by!r} is not a trials column; allowed: sweep (several paths) or a config column, "
                         f"e.g. {sorted(_config(trials))[:12]}")
    values = trials[by].unique().sort(nulls_last=True).to_list()
    return {f"{by}={v}": trials.filter(pl.col(by).is_null() if v is None else pl.col(by) == v) for v in values}


# --------------------------------------------------------------------------- text


_MARK = {True: "✓", False: "✗", None: "?"}


def format_verdicts(result: dict[str, list[Verdict]]) -> str:
    """The verdicts as text, each with the statistics its clauses used, the cells that make it
    inconclusive, and the paper's values (one block per group)."""
    lines = []
    for group, verdicts in result.items():
        lines.append(f"== findings ({group}) ==")
        for v in verdicts:
            lines.append(f"{v.finding}  {v.verdict.upper()}  (confidence {confidence_text(v.confidence)}; "
                         f"replication {replication_text(v.replication)})  — {v.claim}")
            lines.append(f"    rule (§9): {v.rule}")
            lines += [f"    {_MARK[c.holds]} {c.name + ': ' if c.name else ''}{c.text}{_why(c)}{_sure(c)}"
                      for c in v.clauses]
            lines += [f"    reported (not required): {r} = {s.text()}" for r, s in v.reported.items()]
            lines += [f"    inconclusive: {p}" for p in v.problems]
            lines.append(f"    ours: {_ours(v)}")
            lines += [f"    paper: {q}: {val} [{src}]" for q, val, src in v.paper]
    return "\n".join(lines)


def _why(c: Clause) -> str:
    return f" — why: {c.note}" if c.note else ""


def _sure(c: Clause) -> str:
    """A clause's §9.1 confidence and, where fragile, the seeds that would make it firm ("" when not redrawn)."""
    if c.confidence is None:
        return ""
    return f" [confidence {confidence_text(c.confidence)}" + (f"; firm at {c.needed_text} seeds" if c.needed_text else "") + "]"


def not_reproduced_lines(result: dict[str, list[Verdict]]) -> list[str]:
    """findings.md's section on the findings that did not reproduce: per finding (and group),
    each failed clause with what the data say about why (its `Clause.note`: the sign of the
    difference or the seeds a difference of its size would need, `power_note`; the ratio a
    magnitude comparison reached, `ratio_note`). Empty when every finding reproduced or is
    inconclusive."""
    lines = []
    for g, verdicts in result.items():
        for v in verdicts:
            if v.verdict != NOT_REPRODUCED:
                continue
            lines += [f"### {v.finding}{'' if len(result) == 1 else f' ({g})'}: {v.claim}", ""]
            lines += [f"- {c.name + ': ' if c.name else ''}{c.note or c.text}" for c in v.clauses if c.holds is False]
            lines.append("")
    if not lines:
        return []
    return ["## Not reproduced: what the data say", "",
            "For each clause that fails: where the estimate of a difference points the other way, whether it does "
            "so clearly (z = mean / SEM below −2) or within the noise of these seeds, and the smallest effect they "
            "could show (2 SEM); for a positive difference within 2 SEM, the seeds that would show it if its mean "
            "and spread stayed as measured; for a magnitude comparison, the ratio reached. "
            "The calibration curves behind the settings (student, LR grid, spectrum LR, RLVR LR) are in "
            "docs/calibration.md of the repository; the cell tables below hold every value.", "", *lines]


#: findings.md's account of §9.1 under the verdict table
CONFIDENCE_NOTE = (
    "Confidence (PROTOCOL.md §9.1, reported beside the rules, never a rule): the share of {draws:,} redraws "
    "(fixed RNG seed {seed}) in which the same §9 rule gives the observed verdict when every cell's mean is "
    "redrawn as mean + SEM · t, t ~ Student t with n − 1 degrees of freedom (n the cell's seeds); **firm** at ≥ "
    "{firm:g}, else **fragile**; \"–\" for an inconclusive verdict (no redraw). For a fragile clause, \"firm at n' "
    "seeds\" is the seed count per cell at which it would be firm if every cell's mean and standard deviation "
    "stayed as measured (SEM' = sd / √n', t with n' − 1 degrees of freedom; searched up to {cap}). A study may "
    "raise the seeds of all its cells at once, to a number committed before it runs; never of some cells after "
    "seeing them. Replication: the share of the same redraws spread √2 times as far (mean + √2 · SEM · t, the rule's "
    "SEMs unchanged) giving the observed verdict: how likely a rerun of the same design (new seeds, or another "
    "CPU's arithmetic) is to agree, since a rerun's mean lies about √2 · SEM from this one's. Reported, never a "
    "rule.")


def verdict_table_lines(result: dict[str, list[Verdict]], sources: Sequence[str] | None = None) -> list[str]:
    """findings.md's verdict table: for one group the columns finding, verdict, confidence, firm/fragile,
    replication, ours and paper; for several groups one column per group holding "verdict (confidence
    firm/fragile; replication)",
    side by side. With ``sources`` (the sweep directories of ``--by sweep``) its first rows name
    each run's CPU and bf16-product arithmetic (`run_arithmetic`). Then `CONFIDENCE_NOTE`."""
    first = next(iter(result.values()))
    paper = {"paper": ["; ".join(f"{q}: {val}" for q, val, _ in v.paper) for v in first]}
    if len(result) == 1:
        table = {"finding": [v.finding for v in first], "verdict": [v.verdict for v in first],
                 "confidence": [confidence_text(v.confidence).split(" ")[0] for v in first],
                 "firm/fragile": [confidence_text(v.confidence).split(" ")[-1] for v in first],
                 "replication": [replication_text(v.replication) for v in first],
                 "ours": [_ours(v) for v in first], **paper}
    else:
        runs = {g: run_arithmetic([s for s in sources if Path(s).name == g.split("=", 1)[1]])
                for g in result} if sources else {}
        head = ["CPU", "bf16 products"] if runs else []
        table = {"finding": [*head, *(v.finding for v in first)],
                 **{g: [*([runs[g]["cpu"], runs[g]["bf16_products"]] if runs else []),
                        *(f"{v.verdict} ({confidence_text(v.confidence)}; replication {replication_text(v.replication)})"
                          for v in vs)] for g, vs in result.items()},
                 "paper": [*[""] * len(head), *paper["paper"]]}
    return [format_table(pl.DataFrame(table)), "",
            CONFIDENCE_NOTE.format(draws=DRAWS, seed=DRAW_SEED, firm=FIRM, cap=SEEDS_CAP), ""]


#: what a run record without the CPU or the arithmetic says (runs recorded before issue 33)
NOT_RECORDED = "not recorded"


def run_arithmetic(sources: Sequence[str]) -> dict[str, str]:
    """The CPU model and bf16-product arithmetic of the runs that wrote the sweep directories
    ``sources`` (`tables.run_records`: keys ``cpu`` and ``bf16_products``, written by ``distillab
    sweep``): ``{"cpu": ..., "bf16_products": ...}``, each the distinct values joined with " + "
    (a resume on another machine), `NOT_RECORDED` where no record has it."""
    records = [r for s in sources for r in run_records(s)]
    return {k: " + ".join(dict.fromkeys(str(r[k]) for r in records if r.get(k))) or NOT_RECORDED
            for k in ("cpu", "bf16_products")}


def _ours(v: Verdict) -> str:
    return "; ".join(f"{name} {s.text()}" for name, s in v.ours.items())


def _cells_frame(cells: pl.DataFrame, spectrum: bool, task: str = TASK) -> pl.DataFrame:
    """A cell table for findings.md: the cell, mean ± SEM (n seeds) of each quantity, failed trials."""
    qs = (("acc", "gap", "hard10_pre", "hard10", "hard10_rlvr", "f", "S") if spectrum
          else ("acc", "f", "S", "gap", "hard10_pre", "hard10"))
    rows = []
    for r in cells.iter_rows(named=True):
        row = {"λ" if spectrum else "policy": f"{r['lambda']:g}" if spectrum else r["policy"], "KL": r["kind"],
               "LR": "–" if r["lr"] is None else f"{r['lr']:g}"}
        for q in qs:
            row[name_of(q, task)] = (f"{mean_sem_text(r[f'{q}_mean'], r[f'{q}_sem'], 3)} (n={r[f'{q}_n']})"
                             if r[f"{q}_n"] else "–")
        row["not completed"] = ", ".join(r["failed"]) or "–"
        rows.append(row)
    return pl.DataFrame(rows)


#: the retention/transfer table's tasks: name → its pass@10 quantities (pre, distill, rlvr) in `QUANTITIES`
STAGED = {"Countdown-4E": ("hard10_pre", "hard10", "hard10_rlvr"), "Countdown-4": ("c4_10_pre", "c4_10", "c4_10_rlvr")}
TRANSFER, RETENTION = "transfer", "retention"


def regime(cells: pl.DataFrame, pre: str = "hard10_pre", after: str = "hard10") -> tuple[str, str]:
    """Transfer or retention (issue 33), from a `cell_table`: ``"transfer"`` when some cell's
    quantity ``after`` (pass@10 after distillation) exceeds its ``pre`` (before distillation) by
    more than 2 SEM, SEM of the difference = √(SEM_pre² + SEM_after²) (PROTOCOL.md §9's rules),
    else ``"retention"``; with the evidence: the cell with the largest (after − pre) / SEM.
    Cells lacking either value, or its SEM (< 2 seeds), are skipped; none left: ("", why)."""
    best = None
    for r in cells.iter_rows(named=True):
        if not (r[f"{pre}_n"] and r[f"{after}_n"]):
            continue
        d = Stat(r[f"{after}_mean"], r[f"{after}_sem"]) - Stat(r[f"{pre}_mean"], r[f"{pre}_sem"])
        if d.finite and d.sem > 0 and (best is None or d.mean / d.sem > best[1].mean / best[1].sem):
            best = (_label(r["policy"], r["lambda"], r["kind"], r["lr"]), d)
    if best is None:
        return "", "no cell has the value before and after distillation with an SEM"
    label, d = best
    return (TRANSFER if d.mean > 2 * d.sem else RETENTION,
            f"the largest gain over its SEM: {label}, after − before = {d.text()} (2 SEM = {2 * d.sem:.3g})")


def retention_lines(trials: pl.DataFrame) -> list[str]:
    """findings.md's before → after distillation → after RLVR table of pass@10 on Countdown-4E (and
    Countdown-4 where evaluated) for every grid and spectrum cell ("–" where a stage is missing), each
    task's `regime` line, and what Countdown-4E's regime means for F5. [] when no cell has them."""
    cells = cell_table(pl.concat([_grid(trials), _spectrum(trials)]))
    tasks = {t: qs for t, qs in STAGED.items() if any(cells[f"{q}_n"].sum() for q in qs)} if cells.height else {}
    if not tasks:
        return []
    rows = []
    for r in cells.iter_rows(named=True):
        row = {"cell": _label(r["policy"], r["lambda"], r["kind"], r["lr"])}
        for t, qs in tasks.items():
            row[f"{t} pass@10"] = " → ".join(mean_sem_text(r[f"{q}_mean"], r[f"{q}_sem"], 3) if r[f"{q}_n"] else "–"
                                             for q in qs)
        rows.append(row)
    lines = ["Pass@10 before distillation → after distillation → after RLVR (mean ± SEM over seeds; \"–\": stage "
             "missing).", "", format_table(pl.DataFrame(rows)), ""]
    for t, (pre, after, _) in tasks.items():
        name, why = regime(cells, pre, after)
        lines.append(f"- {t}: **{name or 'undecided'}** ({why}; transfer when some cell's pass@10 after distillation "
                     "exceeds its value before by more than 2 SEM of the difference)." + (
                         "" if t != "Countdown-4E" or name != RETENTION else
                         " In retention, F5's λ comparison asks which rollouts make the student forget its prior "
                         "Countdown-4E skill least, not which generalise better."))
    return [*lines, ""]


def _counts(trials: pl.DataFrame) -> str:
    done = trials.filter(pl.col("status") == "completed").height
    return f"{trials.height} trials, {done} completed, {trials.height - done} not completed"


def findings_markdown(res: Results, result: dict[str, list[Verdict]], figures: dict[str, tuple[Path, list[str]]],
                      sources: Sequence[str], by: str | None = None, task: str = TASK,
                      here: dict | None = None) -> str:
    """findings.md: the verdict table (one column per group), each finding's clauses with their
    statistics, the cell tables (mean ± SEM over seeds), the figures and the paper's values;
    ``task``: the task acc, pass@1 and pass@10 were read on (`decide`); ``here``: the deciding
    code's `tables.code_version` (default: now)."""
    trials = trial_values(res, task)
    groups = _groups(trials, by)
    names = [v.finding for v in next(iter(result.values()))]
    cmd = " ".join(["distillab findings", *sources, *([f"--by {by}"] if by else []),
                    *([f"--only {','.join(names)}"] if names != list(FINDINGS) else []),
                    *([f"--task {task}"] if task != TASK else [])])
    on_task = ([f"Task: acc, pass@1 and pass@10 are read on task `{task}` in place of Countdown-3 (`--task "
                f"{task}`); every rule of §9 is otherwise as written, including where its text says Countdown-3.", ""]
               if task != TASK else [])
    lines = ["# Findings: the verdicts of PROTOCOL.md §9", "",
             f"Generated by `{cmd}` from {_counts(trials)}. Every number below is computed by that command "
             "(`distillab.analysis.findings`); values are means over seeds ± SEM, n = seeds. Cells: ρ the rollout policy "
             "(OffPD: teacher samples, OnPD: student samples), k the token-level KL (forward KL(π_T‖π_S), reverse "
             "KL(π_S‖π_T)), η the learning rate, λ the rollout-policy spectrum (−1 = the teacher's samples, +1 = "
             "the student's, 0 their normalised geometric midpoint, beyond ±1 amplified; PROTOCOL.md §3).", "",
             *on_task, *provenance_lines(sources, here), "## Verdicts", ""]
    lines += [*verdict_table_lines(result, sources if by == "sweep" else None), *not_reproduced_lines(result)]
    for g, verdicts in result.items():
        lines += [f"## Statistics ({g}: {_counts(groups[g])})", ""]
        for v in verdicts:
            lines += [f"### {v.finding}: {v.verdict} (confidence {confidence_text(v.confidence)}; replication "
                      f"{replication_text(v.replication)})", "",
                      f"Finding (PROTOCOL.md §7): {v.claim}", "", f"Rule (§9): {v.rule}.", "", f"Ours: {_ours(v)}.", ""]
            lines += [f"- {_MARK[c.holds]} {c.name + ': ' if c.name else ''}{c.text}{_why(c)}{_sure(c)}"
                      for c in v.clauses]
            lines += [f"- reported (not required): {r} = {s.text()}" for r, s in v.reported.items()]
            lines += [f"- inconclusive: {p}" for p in v.problems]
            lines += [f"- paper: {q}: {val} ({src})" for q, val, src in v.paper] + [""]
        if staged := retention_lines(groups[g]):
            lines += [f"### Retention or transfer, {g}", "", *staged]
        for title, part, spectrum in (("grid cells (ρ, k, η)", _grid(groups[g]), False),
                                      ("spectrum cells (λ, k, η)", _spectrum(groups[g]), True)):
            if part.height:
                lines += [f"### {title}, {g}", "", format_table(_cells_frame(cell_table(part), spectrum, task)), ""]
    if figures:
        lines += ["## Figures", ""]
        for stem, (path, notes) in figures.items():
            lines += [f"![{stem}]({path.name})", *[f"- {n}" for n in notes], ""]
    lines += ["## The paper's values", "", format_table(pl.DataFrame(
        [{"finding": f, "quantity": q, "paper": val, "source": s} for f, q, val, s in PAPER if f in names])), ""]
    return "\n".join(lines)


def provenance_lines(sources: Sequence[str], here: dict | None = None) -> list[str]:
    """findings.md's account of how each sweep directory in ``sources`` was produced, from its
    run records (`tables.run_records`): per run the command, the code's git commit (and whether
    tracked files were modified), when it started, the CPUs and each stage's wall seconds; then
    the commit of the code deciding the verdicts (``here``, default `tables.code_version` now)."""
    lines = []
    for src in sources:
        for r in run_records(src):
            commit = r.get("commit") or "unknown (not a git checkout)"
            state = {True: ", with modified tracked files", False: ""}.get(r.get("dirty"), "")
            times = ", ".join(f"{k} {v:.0f} s" for k, v in r.get("seconds", {}).items())
            lines.append(f"- `{src}`: `{r.get('command', '?')}` at commit `{commit}`{state}, started "
                         f"{r.get('started', '?')} on {r.get('cpus', '?')} CPUs ({r.get('cpu') or NOT_RECORDED}; bf16 "
                         f"products: {r.get('bf16_products') or NOT_RECORDED}), {r.get('trials_completed', '?')} "
                         f"trials completed; wall time: {times}")
    here = here or code_version()
    lines.append(f"- these verdicts: `distillab.analysis.findings` at commit `{here['commit'] or 'unknown (not a git checkout)'}`"
                 + (", with modified tracked files" if here["dirty"] else ""))
    return ["Produced by:", "", *lines, ""]


#: findings.md's figures: file stem → (figure function of `distillab.analysis.plots`, the trials it draws,
#: whether it draws a quantity read on ``--task`` (the function then takes ``task=``))
FINDINGS_FIGURES: dict[str, tuple[Callable, Sequence[str], bool]] = {
    "findings_f1_accuracy_lr": (fig_accuracy_lr, POLICIES, True),
    "findings_f2_forgetting_sparsity_lr": (fig_lr, POLICIES, False),
    "findings_f3_lambda": (fig_lambda, ("spectrum",), False),
    "findings_f4_coverage_gap": (fig_coverage_gap, (*POLICIES, "spectrum"), True),
    "findings_f5_countdown4e_lambda": (fig_hard_pass_lambda, ("spectrum",), False),
}


def figure_finding(stem: str) -> str:
    """The finding a `FINDINGS_FIGURES` stem draws: ``findings_f3_lambda`` → ``F3``."""
    return stem.split("_")[1].upper()


def write_findings(res: Results, out_dir: str | os.PathLike[str], result: dict[str, list[Verdict]],
                   sources: Sequence[str], by: str | None = None, dpi: int = 120,
                   task: str = TASK) -> dict[str, Path]:
    """Draw the `FINDINGS_FIGURES` of the findings decided in ``result`` (each over the trials of its
    policies, all groups together: a ``--by`` column that varies becomes part of the legend; accuracy
    and coverage on ``task``) into ``out_dir`` and write ``<out_dir>/findings.md``. Returns
    ``{stem: png path, ..., "findings": md path}``."""
    out = Path(out_dir)
    here = code_version()  # before anything is written: the figures may be tracked files (docs/)
    figures: dict[str, tuple[Path, list[str]]] = {}
    have_policy = POLICY in res.trials.collect_schema().names()
    decided = {v.finding for v in next(iter(result.values()))}
    for stem, (draw, policies, on_task) in FINDINGS_FIGURES.items():
        if figure_finding(stem) not in decided:  # `--only`: no empty panels of findings not decided
            continue
        part = filter_trials(res, **{POLICY: list(policies)}) if have_policy else res
        fig = draw(part, task=task) if on_task else draw(part)
        figures[stem] = (save_figure(fig, out, stem, dpi=dpi), figure_notes(fig))
    md = out / "findings.md"
    md.write_text(findings_markdown(res, result, figures, sources, by, task, here), encoding="utf-8")
    return {**{k: p for k, (p, _) in figures.items()}, "findings": md}
