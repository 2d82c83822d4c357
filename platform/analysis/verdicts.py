"""The verdicts of PROTOCOL.md §9 on findings F1-F5: one rule function per finding, on the cells of
`analysis.cells`, each giving a `Verdict` with the `Clause`s it checked and their statistics.
``FINDINGS[f](trials)`` decides finding f; `analysis.confidence` reruns the same rule on redrawn
cells (`SPLIT`). The rules' text: `analysis.rules.RULES`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import polars as pl

from distillab.analysis.cells import (
    CellView,
    Stat,
    _grid,
    _spectrum,
    clearly,
    mean_of,
    power_note,
    ratio_note,
    value_range,
)
from distillab.analysis.rules import (
    INCONCLUSIVE,
    KINDS,
    NOT_REPRODUCED,
    PAPER,
    POLICIES,
    REPRODUCED,
    RULES,
    SPECTRUM,
)
from distillab.registry import OFFPD, ONPD
from distillab.registry import SPECTRUM as SPECTRUM_POLICY

__all__ = ["Clause", "Verdict", "f1", "f2", "f3", "f4", "f5", "FINDINGS", "SPLIT"]

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
    ``rule``: `RULES`' claim and rule text."""

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


def _holds(condition: bool, *stats: Stat) -> bool | None:
    return bool(condition) if all(s.finite for s in stats) else None


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
    paper, rule = tuple((q, v, s) for f, q, v, s in PAPER if f == finding), RULES[finding]
    return Verdict(finding, verdict, rule.claim, rule.text, tuple(clauses), ours, dict(reported or {}),
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
        d = v.stat("acc", ONPD, "forward", lr) - v.stat("acc", OFFPD, "forward", lr)
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
    pol_eff = [abs(v.stat("f", ONPD, k, lr) - v.stat("f", OFFPD, k, lr)) for k in KINDS for lr in lrs]
    L, P = mean_of(lr_eff), mean_of(pol_eff)
    holds = _holds(L.mean > P.mean, L, P)
    clauses.insert(4, Clause("(b)", holds,
                             f"LR effect mean|f(ηm) − f(η1)| = {L.text()} > policy effect mean|f(onpd) − f(offpd)| "
                             f"= {P.text()}", {"lr_effect": L, "policy_effect": P},
                             ratio_note(L, P, "the LR effect over the policy effect", "> 1×") if holds is False else ""))
    sp = mean_of([v.stat("S", OFFPD, k, lr) - v.stat("S", ONPD, k, lr) for k in KINDS for lr in lrs])
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
    acc = {(lam, k): v.stat("acc", SPECTRUM_POLICY, k, lr, lam) for lam in SPECTRUM for k in KINDS}
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
    matched += [(SPECTRUM_POLICY, lam, lr) for lam in SPECTRUM for lr in v.lrs((SPECTRUM_POLICY,))]
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
            s = {lam: v.stat(q, SPECTRUM_POLICY, k, lr, lam) for lam in (-2.0, -1.0, 1.0, 2.0)}
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
SPLIT: dict[str, tuple[Callable[[pl.DataFrame], CellView], Callable[[CellView], Verdict]]] = {
    "F1": (_grid_view, _f1), "F2": (_grid_view, _f2), "F3": (_spectrum_view, _f3), "F4": (_coverage_view, _f4),
    "F5": (_rlvr_view, _f5)}
