"""PROTOCOL.md §9.1: the confidence of a verdict and of each clause (the share of redraws of the cell
means in which the same rule gives the observed outcome), the seeds a fragile clause would need, and
the replication share (`assess`). How they are read: `analysis.rules`.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable, Sequence

import numpy as np
import polars as pl

from distillab.analysis.cells import QUANTITIES, CellView, Stat
from distillab.analysis.rules import DRAW_SEED, DRAWS, FIRM, INCONCLUSIVE, REPLICATION_SPREAD, SEEDS_CAP
from distillab.analysis.verdicts import SPLIT, Verdict

__all__ = ["Redraws", "agreement", "seeds_needed", "assess", "confidence_text", "replication_text"]


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
    cells, rule = SPLIT[finding]
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
