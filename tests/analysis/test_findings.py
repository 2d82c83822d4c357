"""`distillab findings` (platform/findings.py): PROTOCOL.md §9's verdicts on hand-made result
frames whose verdicts are known: each finding reproduced, not reproduced, and inconclusive
(a missing cell, fewer than 3 seeds, a failed trial, mixed configurations), with the
statistics computed by hand; the SEM rules of §9 on numbers; ablation groups (``--by``).

Every cell of the base study has seeds 42, 43, 44 whose values are the cell's value + 0.01, +0,
−0.01 (for the quantities the rules read), so every cell's SEM over seeds is
S0 = sd(0.01, 0, −0.01) / √3 = 0.01 / √3.
"""

from __future__ import annotations

import math
from pathlib import Path

import polars as pl
import _tolerance as tol
import pytest

from distillab.analysis.findings import (
    FINDINGS_FIGURES,
    INCONCLUSIVE,
    NOT_REPRODUCED,
    REPRODUCED,
    Stat,
    cell_table,
    decide,
    f1,
    f2,
    f3,
    f4,
    f5,
    figure_finding,
    findings_markdown,
    format_verdicts,
    mean_of,
    trial_values,
    value_range,
    write_findings,
)
from distillab.analysis.results import Results
from distillab.tables import SCHEMAS

#: float64 roundings (tests/_tolerance.py, approx64) of a statistic below: a mean, SEM or difference over
#: at most 11 cells of 3 seeds (two sums of at most 33 values, squares, a division and a square root each) and
#: the decimal literals' own rounding, on values in [-1, 1]
ROUNDINGS = 128

DELTA = {42: 0.01, 43: 0.0, 44: -0.01}
S0 = 0.01 / math.sqrt(3)
REPO = Path(__file__).resolve().parents[2]
LRS = (1e-4, 3e-4, 1e-3)
LR_SPEC = 3e-4
LAMBDAS = (-2.0, -1.0, 0.0, 1.0, 2.0)
PRE_OOD = 0.8
#: Countdown-3 accuracy per (policy, KL) at the three LRs: forward flat-ish and policy-blind, reverse LR-sensitive
ACC = {("offpd", "forward"): (0.20, 0.22, 0.24), ("onpd", "forward"): (0.21, 0.23, 0.25),
       ("offpd", "reverse"): (0.10, 0.20, 0.02), ("onpd", "reverse"): (0.12, 0.18, 0.04)}
FORGET = (-0.05, -0.20, -0.50)  # f at the three LRs (onpd forgets 0.01 more)
SPARSE = (0.90, 0.70, 0.50)  # S at the three LRs (offpd 0.02 sparser)
COVER = {"forward": 0.30, "reverse": 0.10}  # pass@10 − pass@1
SPEC_ACC = {"forward": (0.20, 0.21, 0.22, 0.21, 0.20), "reverse": (0.02, 0.05, 0.10, 0.15, 0.18)}
HARD = {"forward": (0.05, 0.05, 0.10, 0.30, 0.35), "reverse": (0.02, 0.04, 0.10, 0.20, 0.30)}  # 4E pass@10, distill
HARD_RLVR = {"forward": (0.30, 0.30, 0.30, 0.32, 0.33), "reverse": (0.25, 0.25, 0.25, 0.30, 0.35)}


def base_cells() -> dict[tuple, dict[str, float]]:
    """(policy, λ, KL, LR) → the cell's values (before the per-seed offsets)."""
    cells = {}
    for i, lr in enumerate(LRS):
        for (p, k), acc in ACC.items():
            cells[p, None, k, lr] = dict(acc=acc[i], f=FORGET[i] - (0.01 if p == "onpd" else 0.0),
                                         S=SPARSE[i] + (0.02 if p == "offpd" else 0.0), cover=COVER[k], hard=0.0)
    for j, lam in enumerate(LAMBDAS):
        for k in ("forward", "reverse"):
            cells["spectrum", lam, k, LR_SPEC] = dict(acc=SPEC_ACC[k][j], f=-0.2, S=0.7, cover=COVER[k],
                                                      hard=HARD[k][j], hard_rlvr=HARD_RLVR[k][j])
    return cells


def _evals(tid: str, v: dict[str, float], d: float) -> list[dict]:
    rows = [("pre", "ood", "ood_mean", PRE_OOD), ("distill", "ood", "ood_mean", PRE_OOD + v["f"] + d),
            ("distill", "countdown3", "accuracy", v["acc"] + d), ("distill", "countdown3", "pass@1", v["acc"]),
            ("distill", "countdown3", "pass@10", v["acc"] + v["cover"] + d),
            ("distill", "params", "sparsity@1e-06", v["S"] + d), ("distill", "countdown4e", "pass@10", v["hard"] + d)]
    if "hard_rlvr" in v:
        rows.append(("rlvr", "countdown4e", "pass@10", v["hard_rlvr"] + d))
    return [dict(trial_id=tid, stage=s, step=0 if s == "pre" else 10, task=t, metric=m, value=float(x), n=10)
            for s, t, m, x in rows]


def study(cells=None, seeds=(42, 43, 44), status=None, config=None, drop=()) -> Results:
    """Results frames of ``cells`` × ``seeds``: trials rows (``status[(cell, seed)]``, default
    completed; ``config[cell]`` extra config columns) and evals (none for a trial that is not
    completed); ``drop``: (cell, seed) pairs left out."""
    cells = base_cells() if cells is None else cells
    trials, evals = [], []
    for cell, v in cells.items():
        p, lam, k, lr = cell
        for s in seeds:
            if (cell, s) in drop:
                continue
            tid = f"{p}{'' if lam is None else lam}-{k}-lr{lr:g}-s{s}"
            st = (status or {}).get((cell, s), "completed")
            trials.append({"trial_id": tid, "status": st, "error": None, "start_time": 0.0, "end_time": 1.0,
                           "checkpoint": None, "seed": s, "rollout.policy": p, "rollout.lambda": lam,
                           "loss.kind": k, "optimizer.lr": lr, "loss.estimator": "full",
                           "rlvr.task": "countdown4" if "hard_rlvr" in v else None, **(config or {}).get(cell, {})})
            if st == "completed":
                evals += _evals(tid, v, DELTA[s])
    empty = {t: pl.LazyFrame(schema={c.name: {"str": pl.String, "int": pl.Int64, "float": pl.Float64}[c.kind]
                                     for c in SCHEMAS[t]}) for t in ("metrics", "samples")}
    return Results(pl.DataFrame(trials).lazy(), empty["metrics"],
                   pl.DataFrame(evals, schema_overrides={"step": pl.Int64, "n": pl.Int64}).lazy(), empty["samples"])


def _clause(verdict, name):
    return next(c for c in verdict.clauses if c.name == name)


# --------------------------------------------------------------------------- SEM rules


def test_sem_rules_on_numbers() -> None:
    d = Stat(0.5, 0.03) - Stat(0.2, 0.04)  # difference of two cells: √(0.03² + 0.04²)
    assert (d.mean, d.sem) == tol.approx64((0.3, 0.05), ROUNDINGS)
    m = mean_of([Stat(1.0, 0.3), Stat(2.0, 0.4)])  # mean over 2 cells: √(0.09 + 0.16) / 2
    assert (m.mean, m.sem) == tol.approx64((1.5, 0.25), ROUNDINGS)
    m3 = mean_of([Stat(0.1, 0.02), Stat(0.2, 0.02), Stat(0.6, 0.04)])  # √(0.0004 + 0.0004 + 0.0016) / 3
    assert (m3.mean, m3.sem) == tol.approx64((0.3, math.sqrt(0.0024) / 3), ROUNDINGS)
    r = value_range([Stat(0.3, 0.01), Stat(0.1, 0.02), Stat(0.2, 0.5)])  # max − min by mean, difference SEM
    assert (r.mean, r.sem) == tol.approx64((0.2, math.sqrt(0.0005)), ROUNDINGS)
    a = abs(Stat(-0.4, 0.1))
    assert (a.mean, a.sem) == (0.4, 0.1)


def test_cell_mean_and_sem_over_seeds_and_duplicate_seeds() -> None:
    cell = ("offpd", None, "forward", 1e-4)
    res = study({cell: dict(acc=0.2, f=-0.1, S=0.9, cover=0.3, hard=0.0)})
    row = cell_table(trial_values(res)).row(0, named=True)
    assert row["acc_mean"] == tol.approx64(0.2, ROUNDINGS) and row["acc_sem"] == tol.approx64(S0, ROUNDINGS) and row["acc_n"] == 3
    assert row["f_mean"] == tol.approx64(-0.1, ROUNDINGS) and row["gap_mean"] == tol.approx64(0.3, ROUNDINGS)
    assert row["gap_sem"] == tol.approx64(S0, ROUNDINGS) and row["n_failed"] == 0 and row["mixed"] == []
    # the seeds 0.21, 0.20, 0.19 of that cell and one more trial of seed 42 (0.25, e.g. from a second sweep
    # directory): seed 42 is their mean 0.23, so the seeds are 0.23, 0.20, 0.19
    tv = trial_values(res)
    extra = tv.filter(pl.col("seed") == 42).with_columns(pl.lit("dup").alias("trial_id"), pl.lit(0.25).alias("acc"))
    row = cell_table(pl.concat([tv, extra])).row(0, named=True)
    seeds = [0.23, 0.20, 0.19]
    sd = math.sqrt(sum((x - sum(seeds) / 3) ** 2 for x in seeds) / 2)
    assert row["acc_n"] == 3 and row["acc_mean"] == tol.approx64(sum(seeds) / 3, ROUNDINGS)
    assert row["acc_sem"] == tol.approx64(sd / math.sqrt(3), ROUNDINGS)


# --------------------------------------------------------------------------- reproduced


def test_every_finding_reproduced_with_hand_computed_statistics() -> None:
    t = trial_values(study())
    v1 = f1(t)
    assert v1.verdict == REPRODUCED, format_verdicts({"all": [v1]})
    d = _clause(v1, "(a) η=0.0003").stats["difference"]  # acc(onpd) − acc(offpd) = 0.23 − 0.22
    assert (d.mean, d.sem) == tol.approx64((0.01, math.sqrt(2) * S0), ROUNDINGS)
    b = _clause(v1, "(b)").stats  # ranges: forward 0.04 for both ρ; reverse 0.18 (offpd), 0.14 (onpd)
    assert (b["forward"].mean, b["reverse"].mean) == tol.approx64((0.04, 0.16), ROUNDINGS)
    assert b["forward"].sem == tol.approx64(S0, ROUNDINGS)  # √(2 · (√2 S0)²) / 2

    v2 = f2(t)
    assert v2.verdict == REPRODUCED, format_verdicts({"all": [v2]})
    a = _clause(v2, "(a) onpd, reverse").stats["difference"]  # f(1e-4) − f(1e-3) = −0.06 − (−0.51)
    assert (a.mean, a.sem) == tol.approx64((0.45, math.sqrt(2) * S0), ROUNDINGS)
    eff = _clause(v2, "(b)").stats
    assert eff["lr_effect"].mean == tol.approx64(0.45, ROUNDINGS) and eff["policy_effect"].mean == tol.approx64(0.01, ROUNDINGS)
    assert eff["lr_effect"].sem == tol.approx64(math.sqrt(4 * 2 * S0 ** 2) / 4, ROUNDINGS)
    assert eff["policy_effect"].sem == tol.approx64(math.sqrt(6 * 2 * S0 ** 2) / 6, ROUNDINGS)
    assert _clause(v2, "(c) offpd, forward").stats["difference"].mean == tol.approx64(0.40, ROUNDINGS)  # 0.92 − 0.52
    ours = v2.ours  # beside the paper's ΔOOD and S at its two LRs: ours at η1 and ηm, mean over (ρ, k)
    assert ours["f at η1=0.0001 (mean over ρ, k)"].mean == tol.approx64(-0.055, ROUNDINGS)  # (−0.05 − 0.05 − 0.06 − 0.06) / 4
    assert ours["S at ηm=0.001 (mean over ρ, k)"].mean == tol.approx64(0.51, ROUNDINGS)  # (0.52 + 0.52 + 0.50 + 0.50) / 4
    assert ours["S at ηm=0.001 (mean over ρ, k)"].sem == tol.approx64(S0 / 2, ROUNDINGS)  # √(4 S0²) / 4
    sp = v2.reported["mean over (k, η) of S(offpd) − S(onpd)"]
    assert (sp.mean, sp.sem) == tol.approx64((0.02, S0 / math.sqrt(3)), ROUNDINGS)

    v3 = f3(t)
    assert v3.verdict == REPRODUCED, format_verdicts({"all": [v3]})
    r = _clause(v3, "(a)").stats
    assert (r["forward"].mean, r["reverse"].mean) == tol.approx64((0.02, 0.16), ROUNDINGS)
    d = _clause(v3, "(b)").stats["difference"]  # mean(0.15, 0.18) − mean(0.02, 0.05); SEM √(S0²/2 + S0²/2)
    assert (d.mean, d.sem) == tol.approx64((0.13, S0), ROUNDINGS)

    v4 = f4(t)
    assert v4.verdict == REPRODUCED, format_verdicts({"all": [v4]})
    g = v4.clauses[0].stats  # 6 grid (ρ, η) + 5 spectrum (λ, η) matched cells
    assert (g["forward"].mean, g["reverse"].mean) == tol.approx64((0.30, 0.10), ROUNDINGS)
    assert g["forward"].sem == tol.approx64(math.sqrt(11) * S0 / 11, ROUNDINGS)
    assert g["difference"].sem == tol.approx64(math.sqrt(2 / 11) * S0, ROUNDINGS)

    v5 = f5(t)
    assert v5.verdict == REPRODUCED, format_verdicts({"all": [v5]})
    dist = _clause(v5, "(a) forward").stats["distill"]  # mean(0.30, 0.35) − mean(0.05, 0.05)
    assert (dist.mean, dist.sem) == tol.approx64((0.275, S0), ROUNDINGS)
    assert _clause(v5, "(a) reverse").stats["distill"].mean == tol.approx64(0.22, ROUNDINGS)
    rl = _clause(v5, "(b)").stats  # forward: 0.325 − 0.30 = 0.025 < 0.275 → (b) holds
    assert rl["rlvr forward"].mean == tol.approx64(0.025, ROUNDINGS) and rl["rlvr reverse"].mean == tol.approx64(0.075, ROUNDINGS)
    assert [v.verdict for v in decide(study())["all"]] == [REPRODUCED] * 5


# --------------------------------------------------------------------------- not reproduced


def _with(cells: dict, match, **values) -> dict:
    return {c: ({**v, **values} if match(c) else v) for c, v in cells.items()}


def test_f1_not_reproduced_when_policy_matters_for_forward_kl() -> None:
    cells = _with(base_cells(), lambda c: c == ("onpd", None, "forward", 3e-4), acc=0.40)
    v = f1(trial_values(study(cells)))
    assert v.verdict == NOT_REPRODUCED and not v.problems
    a = _clause(v, "(a) η=0.0003")
    assert a.holds is False and a.stats["difference"].mean == tol.approx64(0.18, ROUNDINGS)  # 0.40 − 0.22 > max(0.05, 2 SEM)
    assert _clause(v, "(a) η=0.0001").holds is True


def test_f2_not_reproduced_when_policy_not_lr_governs_forgetting() -> None:
    cells = _with(base_cells(), lambda c: c[0] == "offpd", f=-0.1)
    cells = _with(cells, lambda c: c[0] == "onpd", f=-0.7)
    v = f2(trial_values(study(cells)))
    assert v.verdict == NOT_REPRODUCED
    assert _clause(v, "(a) offpd, forward").holds is False  # f(η1) − f(ηm) = 0 ± √2 S0
    b = _clause(v, "(b)")
    assert b.holds is False and b.stats["lr_effect"].mean == tol.approx64(0.0, ROUNDINGS)
    assert b.stats["policy_effect"].mean == tol.approx64(0.6, ROUNDINGS)
    assert _clause(v, "(c) onpd, reverse").holds is True  # sparsity still falls with LR


def test_f3_f4_f5_not_reproduced() -> None:
    flat = _with(base_cells(), lambda c: c[0] == "spectrum" and c[2] == "reverse", acc=0.1)
    v3 = f3(trial_values(study(flat)))
    assert v3.verdict == NOT_REPRODUCED
    assert _clause(v3, "(a)").stats["reverse"].mean == tol.approx64(0.0, ROUNDINGS) and _clause(v3, "(b)").holds is False

    same = _with(base_cells(), lambda c: c[2] == "reverse", cover=0.30)
    v4 = f4(trial_values(study(same)))
    assert v4.verdict == NOT_REPRODUCED and v4.clauses[0].stats["difference"].mean == tol.approx64(0.0, ROUNDINGS)

    no_gain = _with(base_cells(), lambda c: c[0] == "spectrum" and c[2] == "forward", hard=0.1)
    v5 = f5(trial_values(study(no_gain)))
    assert v5.verdict == NOT_REPRODUCED
    assert _clause(v5, "(a) forward").holds is False and _clause(v5, "(a) reverse").holds is True
    # (b) fails when the λ > 0 advantage survives RLVR clearly and grows in both directions
    survive = _with(base_cells(), lambda c: c[0] == "spectrum", hard_rlvr=0.0)
    survive = _with(survive, lambda c: c[0] == "spectrum" and c[1] > 0, hard_rlvr=0.6)
    v5b = f5(trial_values(study(survive)))
    assert v5b.verdict == NOT_REPRODUCED and _clause(v5b, "(b)").holds is False
    assert _clause(v5b, "(b)").stats["rlvr forward"].mean == tol.approx64(0.6, ROUNDINGS)


def test_power_and_ratio_notes_by_hand() -> None:
    """The evidence notes of failed clauses: a non-positive difference is not a matter of power;
    a positive one within 2 SEM needs ceil(n · (2 SEM / d)²) seeds; a ratio is a / b."""
    from distillab.analysis.findings import Stat, power_note, ratio_note

    assert power_note(Stat(0.05, 0.01), 3) == ""  # clear: 0.05 > 0.02
    # F5 forward of the study: z = -0.04 / 0.036 = -1.1: the other way, not clearly; 2 SEM = 0.072
    assert power_note(Stat(-0.04, 0.036), 3) == (
        "the estimate points the other way (-0.04 ± 0.036), but not clearly (z = -1.1: within 2 SEM of zero, so "
        "these seeds tell neither direction apart); an effect in the finding's direction would need to exceed "
        "2 SEM = 0.072 to show with these seeds")
    assert "clearly so (z < −2)" in power_note(Stat(-0.05, 0.01), 3)
    assert "zero" in power_note(Stat(0.0, 0.01), 3) and "zero" in power_note(Stat(1.39e-17, 0.0058), 3)
    assert "more than 1,000 seeds" in power_note(Stat(1e-4, 0.01), 3)  # 3 · 200² = 120,000
    # d = 0.01, SEM = 0.008: 2 SEM / d = 1.6, 3 · 2.56 = 7.68 -> 8 seeds; z = 1.25
    assert "z = 1.2" in power_note(Stat(0.01, 0.008), 3) and "about 8 seeds" in power_note(Stat(0.01, 0.008), 3)
    assert power_note(Stat(float("nan"), 0.01), 3) == ""
    # F3 (a) of the study: 0.0367 / 0.0233 = 1.575...
    assert ratio_note(Stat(0.0367, 0.0073), Stat(0.0233, 0.0078), "forward KL's range over reverse KL's",
                      "≤ 0.5×") == "forward KL's range over reverse KL's is 1.58× (the rule needs ≤ 0.5×)"
    assert ratio_note(Stat(1.0, 0.1), Stat(0.0, 0.1), "x", "y") == ""


def test_not_reproduced_section_names_the_failed_clauses() -> None:
    """findings.md's "Not reproduced" section: F3 with a flat reverse KL (its (b) difference is 0:
    not a matter of power; its (a) ratio), nothing for the reproduced findings."""
    from distillab.analysis.findings import not_reproduced_lines

    flat = _with(base_cells(), lambda c: c[0] == "spectrum" and c[2] == "reverse", acc=0.1)
    result = decide(study(flat))
    lines = "\n".join(not_reproduced_lines(result))
    assert [v.finding for v in result["all"] if v.verdict == NOT_REPRODUCED] == ["F3"]
    assert "### F3:" in lines and "### F1" not in lines and "### F2" not in lines
    b = _clause(result["all"][2], "(b)")
    assert b.note and "zero" in b.note and f"(b): {b.note}" in lines
    assert not_reproduced_lines(decide(study())) == []


# --------------------------------------------------------------------------- inconclusive


def test_missing_cell_makes_findings_inconclusive_and_names_it() -> None:
    cell = ("onpd", None, "reverse", 1e-3)
    res = study(drop={(cell, s) for s in (42, 43, 44)})
    verdicts = {v.finding: v for v in decide(res)["all"]}
    for name in ("F1", "F2", "F4"):
        assert verdicts[name].verdict == INCONCLUSIVE
        assert any("(onpd, reverse, η=0.001)" in p and "missing" in p for p in verdicts[name].problems), name
    assert verdicts["F3"].verdict == REPRODUCED and verdicts["F5"].verdict == REPRODUCED
    # the other statistics are still computed and printed
    assert _clause(verdicts["F1"], "(a) η=0.0001").holds is True


def test_fewer_than_three_seeds_or_a_failed_trial_is_inconclusive() -> None:
    lam2 = ("spectrum", 2.0, "reverse", LR_SPEC)
    v = {x.finding: x for x in decide(study(drop={(lam2, 44)}))["all"]}
    for name in ("F3", "F4", "F5"):
        assert v[name].verdict == INCONCLUSIVE
        assert any("(λ=2, reverse, η=0.0003)" in p and "2 seed(s)" in p for p in v[name].problems), name
    assert v["F1"].verdict == REPRODUCED
    two = study(seeds=(42, 43))  # every cell with 2 seeds
    assert {x.verdict for x in decide(two)["all"]} == {INCONCLUSIVE}

    cell = ("offpd", None, "forward", 1e-4)
    failed = study(status={(cell, 43): "failed"})
    v1 = f1(trial_values(failed))
    assert v1.verdict == INCONCLUSIVE
    assert any("1 of 3 trials not completed (seed 43: failed)" in p for p in v1.problems)
    assert f3(trial_values(failed)).verdict == REPRODUCED
    # three completed seeds do not rescue a cell with a failed 4th trial: the failure may be the outcome
    four = study({cell: base_cells()[cell]}, seeds=(42, 43, 44, 45), status={(cell, 45): "failed"})
    row = cell_table(trial_values(four)).row(0, named=True)
    assert (row["acc_n"], row["n_failed"], row["failed"]) == (3, 1, ["seed 45: failed"])
    assert any("seed 45: failed" in p for p in f1(trial_values(four)).problems)


def test_lrs_spectrum_lr_and_rlvr_requirements() -> None:
    two_lrs = {c: v for c, v in base_cells().items() if c[3] != 3e-4 or c[0] == "spectrum"}
    v1 = f1(trial_values(study(two_lrs)))
    assert v1.verdict == INCONCLUSIVE and any("2 LR(s)" in p and "m ≥ 3" in p for p in v1.problems)
    cells = base_cells()
    cells.update({("spectrum", lam, k, 1e-3): v for (p, lam, k, lr), v in base_cells().items() if p == "spectrum"})
    v3 = f3(trial_values(study(cells)))
    assert v3.verdict == INCONCLUSIVE and any("several LRs" in p for p in v3.problems)
    assert [[x.verdict for x in vs] for vs in decide(study(cells), by="optimizer.lr", only=["F3"]).values()] == [
        [INCONCLUSIVE], [REPRODUCED], [REPRODUCED]]  # 1e-4: no spectrum trials; 3e-4 and 1e-3: decided
    no_rlvr = {c: {k: x for k, x in v.items() if k != "hard_rlvr"} for c, v in base_cells().items()}
    v5 = f5(trial_values(study(no_rlvr)))
    assert v5.verdict == INCONCLUSIVE and any("with RLVR" in p and "missing" in p for p in v5.problems)


# --------------------------------------------------------------------------- ablations


def test_mixed_configurations_inconclusive_and_by_groups() -> None:
    """An ablation loaded together with the study (sampled estimator, and reverse KL there
    insensitive to LR): pooled, its cells mix two estimators; grouped by loss.estimator, F1
    holds for the full estimator and not for the sampled one."""
    base = base_cells()
    sampled = {(p, lam, k, lr): (dict(v, acc=0.1) if k == "reverse" else v) for (p, lam, k, lr), v in base.items()
               if p != "spectrum"}
    a, b = study(base), study(sampled, config={c: {"loss.estimator": "sampled"} for c in sampled})
    both = Results(*(pl.concat([getattr(a, t), getattr(b, t).with_columns(
        pl.col("trial_id") + "-sampled")], how="diagonal_relaxed") for t in ("trials", "metrics", "evals", "samples")))
    pooled = f1(trial_values(both))
    assert pooled.verdict == INCONCLUSIVE
    assert any("differ in loss.estimator" in p and "--by" in p for p in pooled.problems)
    by = decide(both, by="loss.estimator", only=["F1", "F4"])
    assert list(by) == ["loss.estimator=full", "loss.estimator=sampled"]
    assert [v.verdict for v in by["loss.estimator=full"]] == [REPRODUCED, REPRODUCED]
    f1_sampled, f4_sampled = by["loss.estimator=sampled"]
    assert f1_sampled.verdict == NOT_REPRODUCED and _clause(f1_sampled, "(b)").stats["reverse"].mean == tol.approx64(0, ROUNDINGS)
    assert f4_sampled.verdict == REPRODUCED  # the coverage gap is unchanged
    with pytest.raises(ValueError, match="--by 'nope' is not a trials column"):
        decide(both, by="nope")
    with pytest.raises(ValueError, match=r"unknown finding\(s\) \['F6'\]"):
        decide(both, only=["F6"])


def test_write_findings_markdown_and_figures(tmp_path) -> None:
    res = study(drop={(("onpd", None, "reverse", 1e-3), s) for s in (42, 43, 44)})
    result = decide(res)
    paths = write_findings(res, tmp_path, result, ["runs/x"])
    md = paths["findings"].read_text()
    assert "| F1 " in md and "inconclusive" in md and "reproduced" in md
    assert "(onpd, reverse, η=0.001)" in md and "missing" in md
    assert "0.22 ± 0.0058 (n=3)" in md  # grid cell (offpd, forward, 3e-4): acc 0.22 ± S0 over 3 seeds
    assert "−11 to −14 points at LR 5e-5" in md  # the paper's value beside ours
    for stem in ("findings_f1_accuracy_lr", "findings_f2_forgetting_sparsity_lr", "findings_f3_lambda",
                 "findings_f4_coverage_gap", "findings_f5_countdown4e_lambda"):
        assert paths[stem].stat().st_size > 1000 and f"]({stem}.png)" in md
    text = format_verdicts(result)
    assert "F1  INCONCLUSIVE" in text and "F3  REPRODUCED" in text and "paper:" in text


def _with_math_task(base: Results) -> Results:
    """``base`` plus a task ``math`` whose accuracy and pass@1 are Countdown-3's and whose
    pass@10 is 0.2 lower for forward KL trials and 0.2 higher for reverse KL trials: its coverage
    gap is forward 0.30 − 0.2 = 0.10 and reverse 0.10 + 0.2 = 0.30 in every cell (F4 reversed)."""
    ev = base.evals.collect()
    shift = pl.when(pl.col("loss.kind") == "forward").then(-0.2).otherwise(0.2)
    math_ev = (ev.filter(pl.col("task") == "countdown3").join(base.trials.select("trial_id", "loss.kind").collect(),
                                                               on="trial_id")
               .with_columns(pl.lit("math").alias("task"),
                             pl.when(pl.col("metric") == "pass@10").then(pl.col("value") + shift)
                             .otherwise(pl.col("value")).alias("value"))
               .drop("loss.kind"))
    return Results(base.trials, base.metrics, pl.concat([ev, math_ev]).lazy(), base.samples)


def test_task_reads_accuracy_and_coverage_on_another_task(tmp_path) -> None:
    res = _with_math_task(study())
    assert [v.verdict for v in decide(res, only=["F1", "F4"])["all"]] == [REPRODUCED, REPRODUCED]
    f1m, f4m = decide(res, only=["F1", "F4"], task="math")["all"]
    assert f1m.verdict == REPRODUCED  # math accuracy = Countdown-3's
    assert f4m.verdict == NOT_REPRODUCED
    d = f4m.clauses[0].stats["difference"]  # mean over 6 matched grid cells + 5 λ cells of (0.10 − 0.30)
    assert d.mean == tol.approx64(-0.2, ROUNDINGS) and d.sem == tol.approx64(math.sqrt(2 * 11 * S0**2) / 11, ROUNDINGS)
    assert trial_values(res, "math")["on_task"].unique().to_list() == ["math"]
    paths = write_findings(res, tmp_path, {"all": [f1m, f4m]}, ["runs/micro_math"], task="math")
    md = paths["findings"].read_text()
    assert "`distillab findings runs/micro_math --only F1,F4 --task math`" in md
    assert "read on task `math` in place of Countdown-3" in md and "pass@10 − pass@1 on math" in md
    assert "math accuracy" in md and "0.1 ± 0.0058 (n=3)" in md  # a cell's math gap: 0.10 ± S0
    # only the decided findings' figures and paper values (`--only F1,F4`: no empty F2, F3, F5 panels)
    assert sorted(k for k in paths if k != "findings") == ["findings_f1_accuracy_lr", "findings_f4_coverage_gap"]
    assert "findings_f3_lambda" not in md and "−11 to −14 points at LR 5e-5" not in md  # F2's paper value
    assert [figure_finding(stem) for stem in FINDINGS_FIGURES] == ["F1", "F2", "F3", "F4", "F5"]
    with pytest.raises(ValueError, match=r"--task 'nosuch' is not a task these sweeps score for accuracy; "
                                         r"allowed: \['countdown3', 'math'\]"):
        decide(res, task="nosuch")
    # a cell without the math evals is inconclusive, and says which quantity it lacks
    drop_one = Results(res.trials, res.metrics, res.evals.filter(
        ~((pl.col("task") == "math") & (pl.col("trial_id") == "offpd-forward-lr0.0001-s42"))), res.samples)
    v = decide(drop_one, only=["F4"], task="math")["all"][0]
    assert v.verdict == INCONCLUSIVE
    assert any("(offpd, forward, η=0.0001) pass@10 − pass@1 on math" in p and "2 seed(s)" in p for p in v.problems)


def _write_micro_findings(root) -> None:
    """The trials rows `sweep.run_trial` writes for search_spaces/micro_findings.yaml (every config
    column), with the evals of the base study, as Parquet under ``root``."""
    from distillab.config import load_sweep
    from distillab.tables import write_rows

    sweep = load_sweep(REPO / "search_spaces" / "micro_findings.yaml")
    grid_lrs = sorted({t.optimizer.lr for t in sweep.trials if t.rollout.policy != "spectrum"})
    cells = base_cells()
    for t in sweep.trials:
        r = t.rollout
        lr = LR_SPEC if r.policy == "spectrum" else LRS[grid_lrs.index(t.optimizer.lr)]
        row = {"trial_id": t.trial_id, "status": "completed", "start_time": 0.0, "end_time": 1.0,
               **{k: (str(v) if isinstance(v, (list, dict)) else v) for k, v in t.flat().items()}}
        write_rows(root, "trials", [row], key=t.trial_id)
        write_rows(root, "evals", _evals(t.trial_id, cells[r.policy, r.lambda_, t.loss.kind, lr], DELTA[t.seed]),
                   key=t.trial_id)


def test_real_trial_rows_of_micro_findings_from_disk(tmp_path) -> None:
    """Read back with `analysis.results.load`, no config column of the real trials rows tells two seeds of
    a cell apart, and every finding is decided (reproduced) as on the frames above."""
    from distillab.analysis.results import load

    _write_micro_findings(tmp_path)
    verdicts = decide(load(tmp_path))["all"]
    assert [v.verdict for v in verdicts] == [REPRODUCED] * 5, format_verdicts({"all": verdicts})
    assert all(not row["mixed"] for row in cell_table(trial_values(load(tmp_path))).iter_rows(named=True))


def test_cli_findings(tmp_path, capsys) -> None:
    from distillab.driver.cli import main

    root, out = tmp_path / "micro_findings", tmp_path / "out"
    _write_micro_findings(root)
    assert main(["findings", str(root), "--out", str(out), "--only", "F1,F4"]) == 0
    text = capsys.readouterr().out
    assert "F1  REPRODUCED" in text and "F4  REPRODUCED" in text and "F2 " not in text and "[time] findings:" in text
    assert (out / "findings.md").exists() and (out / "findings_f4_coverage_gap.png").exists()
    assert main(["findings", str(root), "--by", "nope"]) == 2
    assert "--by 'nope' is not a trials column" in capsys.readouterr().err
    assert main(["findings", str(tmp_path / "absent")]) == 2
    assert "distillab: findings: no such sweep directory: " in capsys.readouterr().err
    (tmp_path / "notes").mkdir()  # a directory that is no sweep: refused, for report too, and nothing written
    for cmd in ("findings", "report"):
        assert main([cmd, str(tmp_path / "notes")]) == 2
        assert f"distillab: {cmd}: not a sweep directory (no sweep.json, no trials table): " in capsys.readouterr().err
    assert not any((tmp_path / "notes").iterdir())
    yaml_file = REPO / "search_spaces" / "smoke.yaml"  # the sweep's config where its results belong
    assert main(["report", str(yaml_file)]) == 2
    assert f"distillab: report: {yaml_file}: a file, not a sweep directory; report reads" in capsys.readouterr().err
    assert main(["sweep", str(REPO / "search_spaces" / "smoke.yaml"), "--dry-run", "--set", "trial.loss.kind"]) == 2
    assert "distillab: --set expects KEY=VALUE (e.g. --set trial.loss.kind=reverse), got 'trial.loss.kind'" in (
        capsys.readouterr().err)
    assert main(["findings", str(root), "--task", "math"]) == 2
    assert "--task 'math' is not a task these sweeps score for accuracy; allowed: ['countdown3']" in capsys.readouterr().err


def test_findings_md_names_the_run_that_produced_the_results(tmp_path) -> None:
    """A sweep directory's run records (`tables.record_run`, one per invocation, a resume adds one)
    reach findings.md: the command, the commit, the CPUs and each stage's wall seconds."""
    from distillab.driver.cli import main
    from distillab.tables import record_run, run_records

    root = tmp_path / "micro_findings"
    _write_micro_findings(root)
    first = {"command": "distillab sweep search_spaces/micro_findings.yaml --no-dashboard", "started": "2026-12-02T13:00:00+00:00",
             "commit": "0123abcd" * 5, "dirty": False, "cpus": 2, "trials_completed": 40,
             "seconds": {"prepare": 612.4, "OffPD sets": 151.0, "trials": 3000.2, "total": 3811.9}}
    second = {**first, "command": "distillab sweep --resume runs/micro_findings", "dirty": True, "trials_completed": 66,
              "seconds": {"prepare": 0.1, "trials": 1204.6}}
    record_run(root, first)
    record_run(root, second)
    assert run_records(root) == [first, second]
    assert main(["findings", str(root), "--only", "F4"]) == 0
    md = (root / "findings.md").read_text()
    assert (f"- `{root}`: `distillab sweep search_spaces/micro_findings.yaml --no-dashboard` at commit `{'0123abcd' * 5}`, "
            "started 2026-12-02T13:00:00+00:00 on 2 CPUs (not recorded; bf16 products: not recorded), 40 trials "
            "completed; wall time: prepare 612 s, "
            "OffPD sets 151 s, trials 3000 s, total 3812 s") in md
    assert f"`distillab sweep --resume runs/micro_findings` at commit `{'0123abcd' * 5}`, with modified tracked files" in md
    assert md.index("Produced by:") < md.index("## Verdicts")


def test_the_deciding_code_is_recorded_before_findings_writes_anything(tmp_path, monkeypatch) -> None:
    """findings.md's "these verdicts" line takes the code version before the figures are drawn:
    written into a tracked folder (docs/), they would otherwise mark the checkout modified.
    Stand-in: a code version that is dirty once the output folder holds a file."""
    import distillab.analysis.findings as fnd

    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setattr(fnd, "code_version", lambda: {"commit": "c0ffee", "dirty": any(out.iterdir())})
    res = study()
    md = write_findings(res, out, decide(res, only=["F4"]), ["runs/x"])["findings"].read_text()
    assert "- these verdicts: `distillab.analysis.findings` at commit `c0ffee`\n" in md


def test_code_version_of_a_git_checkout(tmp_path, monkeypatch) -> None:
    """`tables.code_version`: HEAD of the checkout and whether a tracked file is modified
    (untracked files do not count); None outside a git checkout."""
    import subprocess

    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))  # tmp_path may lie inside this clone

    from distillab.tables import code_version

    def git(*args):
        return subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True, text=True).stdout

    assert code_version(tmp_path) == {"commit": None, "dirty": None}
    git("init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    git("add", "a.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    head = git("rev-parse", "HEAD").strip()
    (tmp_path / "untracked.py").write_text("")
    assert code_version(tmp_path) == {"commit": head, "dirty": False}
    (tmp_path / "a.py").write_text("x = 2\n")
    assert code_version(tmp_path) == {"commit": head, "dirty": True}


# --------------------------------------------------------------------------- confidence (PROTOCOL.md §9.1)


def _t_cdf(x: float, df: int, steps: int = 4000) -> float:
    """Student t CDF with ``df`` degrees of freedom at ``x``: 1/2 + ∫_0^x pdf (Simpson's rule)."""
    c = math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2))
    h = x / steps
    pdf = [c * (1 + (i * h) ** 2 / df) ** (-(df + 1) / 2) for i in range(steps + 1)]
    return 0.5 + h / 3 * (pdf[0] + pdf[-1] + 4 * sum(pdf[1:-1:2]) + 2 * sum(pdf[2:-1:2]))


def _t2_cdf_err(x: float, steps: int = 4000) -> float:
    """A bound on `_t_cdf`'s error at 2 degrees of freedom: Simpson's rule errs by at most (x/180) h⁴ max|f⁗|
    (f⁗ of the t(2) density f = c (1 + t²/2)^(-3/2) is largest at 0: 24 · (15/32) · c, c = 1/(2√2)), and its
    float64 sum of steps + 1 terms of size at most c, times x/3 · 4, by γ_(steps + 8) (tests/_tolerance.py)."""
    c, h = 1 / (2 * math.sqrt(2)), x / steps
    return x / 180 * h**4 * 24 * 15 / 32 * c + tol.gamma(steps + 8) * 4 * x * c


def _gap_trials(spread: float, constant: dict[tuple[str, str], float]) -> pl.DataFrame:
    """`trial_values` rows of F4's four grid cells (ρ, k) at one LR, seeds 42-44: the coverage gap of
    (offpd, forward) is ``spread`` + 0.01, +0, −0.01 (mean ``spread``, SEM S0); the other three cells
    hold ``constant[(ρ, k)]`` in every seed (SEM 0)."""
    from distillab.analysis.findings import QUANTITIES

    rows = []
    for p in ("offpd", "onpd"):
        for k in ("forward", "reverse"):
            for s, d in DELTA.items():
                gap = spread + d if (p, k) == ("offpd", "forward") else constant[p, k]
                rows.append({"trial_id": f"{p}-{k}-{s}", "status": "completed", "seed": s, "policy": p, "lambda": None,
                             "kind": k, "lr": 1e-4, "has_rlvr": False, "on_task": "countdown3",
                             **{q: None for q in QUANTITIES}, "gap": gap})
    return pl.DataFrame(rows, schema_overrides={"lambda": pl.Float64, **{q: pl.Float64 for q in QUANTITIES}})


def _f4_at(z: float) -> pl.DataFrame:
    """F4's cells where d = G_forward − G_reverse = ``z`` · S0: G_k is the mean over the two matched
    cells, so d = (spread + 0.3)/2 − 0.1 and SEM_d = √(S0² + 0 + 0 + 0) / 2 = S0 / 2."""
    return _gap_trials(2 * (0.1 + z * S0) - 0.3, {("onpd", "forward"): 0.3, ("offpd", "reverse"): 0.1,
                                                  ("onpd", "reverse"): 0.1})


def test_confidence_of_a_single_difference_in_closed_form() -> None:
    """F4 holds iff d > 2 SEM_d = S0. A redraw gives d' = d + (S0 / 2)·t, t ~ Student t with 2 degrees of
    freedom (3 seeds), so the share in which it holds is P(t > 2 − 2d/S0) = F(2d/S0 − 2), F the t CDF
    (for 2 df F(x) = 1/2 + x / (2√(2 + x²))). Tolerance: 4 binomial SEs of 2,000 redraws."""
    from distillab.analysis.findings import assess, confidence_text

    def expected(z: float) -> float:
        x = 2 * z - 2
        return 0.5 + x / (2 * math.sqrt(2 + x * x))

    assert _t_cdf(1.0, 2) == pytest.approx(expected(1.5), abs=_t2_cdf_err(1.0))  # the integrator against the closed form
    for z, firm in ((1.5, False), (1 + 1e-6, False), (20.0, True)):  # between, exactly at the threshold, far
        v = assess("F4", _f4_at(z))
        p = expected(z)
        assert v.verdict == REPRODUCED and v.clauses[0].holds is True
        assert v.clauses[0].confidence == pytest.approx(p, abs=4 * math.sqrt(p * (1 - p) / 2000) + 1e-3), z
        assert v.confidence == v.clauses[0].confidence  # one clause: the finding's share is the clause's
        assert confidence_text(v.confidence).endswith("firm" if firm else "fragile")
    # 0.7887: 0.788675 to four decimals (half a unit of the last); at the threshold x = 2e-6: 0 < x/(2√(2 + x²)) < 1e-6
    assert expected(1.5) == pytest.approx(0.7887, abs=0.5e-4) and 0 < expected(1 + 1e-6) - 0.5 < 1e-6
    assert assess("F4", _f4_at(20.0)).confidence >= 0.995
    # the same frames and seed give the same shares; a not-reproduced verdict is redrawn against its own outcome
    assert assess("F4", _f4_at(1.5)).confidence == assess("F4", _f4_at(1.5)).confidence
    below = assess("F4", _f4_at(0.5))  # fails; agreement P(t ≤ 2 − 1) = F(1)
    assert below.verdict == NOT_REPRODUCED and below.confidence == pytest.approx(_t_cdf(1.0, 2), abs=0.04)


def test_replication_of_a_single_difference_in_closed_form() -> None:
    """The replication redraw spreads d by √2: d' = d + √2 (S0 / 2)·t while the rule's SEM_d stays S0 / 2,
    so F4 holds in the share P(t > (2 − 2z)/√2) = F((2z − 2)/√2) (2 df): 0.724 at z = 1.5 (confidence 0.789),
    0.5 at the threshold, ≈ 1 far away; a failing z = 0.5 agrees in F((2 − 1)/√2) = F(0.707) = 0.724."""
    from distillab.analysis.findings import assess, format_verdicts, replication_text, verdict_table_lines

    def f2(x: float) -> float:  # the t CDF with 2 degrees of freedom, closed form
        return 0.5 + x / (2 * math.sqrt(2 + x * x))

    assert f2(1 / math.sqrt(2)) == pytest.approx(_t_cdf(1 / math.sqrt(2), 2), abs=_t2_cdf_err(1 / math.sqrt(2)))
    for z, verdict in ((1.5, REPRODUCED), (1 + 1e-6, REPRODUCED), (20.0, REPRODUCED), (0.5, NOT_REPRODUCED)):
        v = assess("F4", _f4_at(z))
        p = f2((2 * z - 2) / math.sqrt(2)) if verdict == REPRODUCED else f2((2 - 2 * z) / math.sqrt(2))
        assert v.verdict == verdict
        assert v.replication == pytest.approx(p, abs=4 * math.sqrt(p * (1 - p) / 2000) + 1e-3), z
    v = assess("F4", _f4_at(1.5))
    assert v.replication < v.confidence  # a rerun agrees less often than this run's own redraw
    assert f"replication {replication_text(v.replication)})" in format_verdicts({"all": [v]})
    assert replication_text(v.replication) in verdict_table_lines({"all": [v]})[0].splitlines()[2]
    assert replication_text(None) == "–"


def test_seeds_needed_for_a_fragile_clause() -> None:
    """d = 1.5 S0 with sd = 0.01 per cell: at n' seeds SEM' = 0.01/√n', the clause holds iff d > SEM' and
    a redraw agrees with probability F_{n'−1}(2d/SEM' − 2) = F_{n'−1}(√3·√n' − 2): 0.789 at 3 seeds,
    0.880 at 4 (fragile), 0.93 at 5 (firm). So the clause is firm at 5 seeds, still holding."""
    from distillab.analysis.findings import assess, format_verdicts

    share = {n: _t_cdf(math.sqrt(3 * n) - 2, n - 1) for n in (3, 4, 5)}
    assert share[3] == pytest.approx(0.7887, abs=0.5e-4) and share[4] < 0.885 and share[5] > 0.925  # 0.788675
    v = assess("F4", _f4_at(1.5))
    assert (v.clauses[0].needed, v.clauses[0].needed_text) == (5, "5")
    assert "[confidence 0.7" in format_verdicts({"all": [v]}) and "fragile; firm at 5 seeds]" in format_verdicts({"all": [v]})
    never = assess("F4", _f4_at(1 + 1e-6), cap=4)  # at the threshold: not firm by 4 seeds
    assert (never.clauses[0].needed, never.clauses[0].needed_text) == (None, "> 4")
    assert assess("F4", _f4_at(20.0)).clauses[0].needed_text == ""  # firm: nothing needed


def test_inconclusive_verdicts_are_not_redrawn() -> None:
    from distillab.analysis.findings import assess, confidence_text

    cells = base_cells()
    del cells["onpd", None, "forward", 1e-4]
    v = assess("F1", trial_values(study(cells)))
    assert v.verdict == INCONCLUSIVE and v.confidence is None and all(c.confidence is None for c in v.clauses)
    assert confidence_text(v.confidence) == "–"
    md = findings_markdown(study(cells), decide(study(cells), only=["F1"]), {}, ["runs/x"])
    assert "| F1      | inconclusive | –          | –            |" in md


# --------------------------------------------------------------------------- retention or transfer


def _staged_cells(after: float) -> pl.DataFrame:
    """A `cell_table` of two cells: Countdown-4E pass@10 0.40 ± 0.01 before and ``after`` ± 0.01 after
    distillation in the first, 0.40 → 0.10 in the second (3 seeds each)."""
    rows = [dict(policy="offpd", kind="forward", hard10_mean=after), dict(policy="onpd", kind="forward", hard10_mean=0.10)]
    return pl.DataFrame([{**r, "lambda": None, "lr": 1e-4, "hard10_pre_mean": 0.40, "hard10_pre_sem": 0.01,
                          "hard10_pre_n": 3, "hard10_sem": 0.01, "hard10_n": 3} for r in rows],
                        schema_overrides={"lambda": pl.Float64})


def test_regime_transfer_or_retention_by_hand() -> None:
    """Difference after − before, SEM √(0.01² + 0.01²) = 0.01414, 2 SEM = 0.0283: a gain of 0.05 is
    transfer, 0.02 is not (retention)."""
    from distillab.analysis.findings import RETENTION, TRANSFER, regime

    name, why = regime(_staged_cells(0.45))
    assert name == TRANSFER and "(offpd, forward, η=0.0001), after − before = 0.05 ± 0.014 (2 SEM = 0.0283)" in why
    assert regime(_staged_cells(0.42))[0] == RETENTION
    assert regime(_staged_cells(0.42).with_columns(pl.lit(0).alias("hard10_pre_n")))[0] == ""


def test_retention_table_and_regime_line_in_findings_md() -> None:
    """The base study with Countdown-4E pass@10 before distillation 0.5 in every trial: every cell
    loses (retention), and the spectrum cells show before → distill → rlvr."""
    base = study()
    extra = base.trials.select("trial_id").collect().with_columns(
        pl.lit("pre").alias("stage"), pl.lit(0).cast(pl.Int64).alias("step"), pl.lit("countdown4e").alias("task"),
        pl.lit("pass@10").alias("metric"), pl.lit(0.5).alias("value"), pl.lit(10).cast(pl.Int64).alias("n"))
    res = Results(base.trials, base.metrics, pl.concat([base.evals, extra.lazy()], how="diagonal_relaxed"), base.samples)
    md = findings_markdown(res, decide(res, only=["F4"]), {}, ["runs/x"])
    assert "| (λ=2, forward, η=0.0003)   | 0.5 ± 0 → 0.35 ± 0.0058 → 0.33 ± 0.0058 |" in md
    assert "| (offpd, forward, η=0.0001) | 0.5 ± 0 → 0 ± 0.0058 → –  " in md
    assert ("- Countdown-4E: **retention** (the largest gain over its SEM: (λ=2, forward, η=0.0003), after − before "
            "= -0.15 ± 0.0058 (2 SEM = 0.0115)") in md
    assert "F5's λ comparison asks which rollouts make the student forget its prior Countdown-4E skill least" in md
    assert "Countdown-4 pass@10" not in md  # Countdown-4 not evaluated: no column


# --------------------------------------------------------------------------- runs side by side


def test_run_records_with_and_without_cpu_and_arithmetic_side_by_side(tmp_path) -> None:
    from distillab.analysis.findings import NOT_RECORDED, run_arithmetic
    from distillab.analysis.results import load
    from distillab.tables import record_run

    old, new = tmp_path / "native", tmp_path / "float32"
    for root in (old, new):
        _write_micro_findings(root)
    record_run(old, {"command": "distillab sweep a.yaml", "cpus": 2})
    record_run(new, {"command": "distillab sweep b.yaml", "cpus": 2, "cpu": "AMD EPYC 7B13",
                     "bf16_products": "float32 (no native bf16)"})
    assert run_arithmetic([str(old)]) == {"cpu": NOT_RECORDED, "bf16_products": NOT_RECORDED}
    assert run_arithmetic([str(new)]) == {"cpu": "AMD EPYC 7B13", "bf16_products": "float32 (no native bf16)"}
    sources = [str(old), str(new)]
    res = load(sources)
    md = findings_markdown(res, decide(res, by="sweep", only=["F4"]), {}, sources, by="sweep")
    table = md[md.index("## Verdicts"):md.index("Confidence (PROTOCOL.md §9.1")]
    assert table.splitlines()[2:7] == [
        "| finding       | sweep=float32                             | sweep=native                  "
        "            | paper                                                                        |",
        "|---------------|-------------------------------------------|-------------------------------"
        "------------|------------------------------------------------------------------------------|",
        "| CPU           | AMD EPYC 7B13                             | not recorded                  "
        "            |                                                                              |",
        "| bf16 products | float32 (no native bf16)                  | not recorded                  "
        "            |                                                                              |",
        "| F4            | reproduced (1.000 firm; replication 1.00) | reproduced (1.000 firm; replic"
        "ation 1.00) | coverage pass@k at similar pass@1: higher for forward KL than for reverse KL |"]
    assert "(AMD EPYC 7B13; bf16 products: float32 (no native bf16))" in md
    assert "on 2 CPUs (not recorded; bf16 products: not recorded)" in md


# --------------------------------------------------------------------------- the rule text, from one place


def test_printed_rule_text_comes_from_the_rules_mapping(monkeypatch) -> None:
    """Every claim and rule `distillab findings` prints (its text, findings.md and the verdict table's
    reason) is `analysis.rules.RULES`' string: replaced there, it changes everywhere. F1 here fails
    (b) only: reverse KL's accuracy equals forward KL's, so its range over η is not twice forward's."""
    from distillab.analysis import rules
    from distillab.analysis.findings import reason

    cells = base_cells()
    for (p, lam, k, lr), v in cells.items():
        if p != "spectrum" and k == "reverse":
            v["acc"] = cells[p, lam, "forward", lr]["acc"]
    monkeypatch.setitem(rules.RULES, "F1", rules.Rule("CLAIM-1", {"(a)": "CLAUSE-1A", "(b)": "CLAUSE-1B"}))
    monkeypatch.setitem(rules.RULES, "F4", rules.Rule("CLAIM-4", {"": "CLAUSE-4"}, reported="REPORTED-4"))
    result = decide(study(cells), only=["F1", "F4"])
    f1_, f4_ = result["all"]
    assert (f1_.verdict, f4_.verdict) == (NOT_REPRODUCED, REPRODUCED)
    assert (f1_.claim, f1_.rule) == ("CLAIM-1", "(a) CLAUSE-1A, and (b) CLAUSE-1B")
    assert f4_.rule == "CLAUSE-4; reported: REPORTED-4"
    text = format_verdicts(result)
    assert "F1  NOT REPRODUCED  (confidence" in text and ")  — CLAIM-1\n    rule (§9): (a) CLAUSE-1A, and (b) CLAUSE-1B\n" in text
    assert reason(f1_) == "fails (b): CLAUSE-1B" and reason(f4_) == "the rule holds"
    md = findings_markdown(study(cells), result, {}, ["runs/x"])
    assert "Finding (PROTOCOL.md §7): CLAIM-1\n\nRule (§9): (a) CLAUSE-1A, and (b) CLAUSE-1B." in md
    assert "| fails (b): CLAUSE-1B |" in md and "Rule (§9): CLAUSE-4; reported: REPORTED-4." in md


def test_findings_md_opens_with_a_compact_verdict_table_and_a_title_naming_the_study() -> None:
    """One group: a table of finding, verdict, confidence, firm/fragile, replication and a one-line reason
    (all reproduced here; the least confident clause named), then our values one per row, not in a
    column of the verdict table; the title names the sweep directories (unique per study page)."""
    from distillab.analysis.findings import confidence_text, findings_title, verdict_table_lines

    res = study()
    result = decide(res, only=["F2", "F4"])
    md = findings_markdown(res, result, {}, ["runs/micro_findings"])
    assert md.startswith("# Findings: micro_findings\n\nThe verdicts of PROTOCOL.md §9 on findings F2, F4, generated "
                         "by `distillab findings runs/micro_findings --only F2,F4` from 66 trials")
    lines = verdict_table_lines(result)
    table, values, ours = lines[0], lines[2], lines[4].splitlines()
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()]
    assert rows[0] == ["finding", "verdict", "confidence", "firm/fragile", "replication", "reason"]
    f2_, f4_ = result["all"]
    weakest = min(f2_.clauses, key=lambda c: c.confidence)
    assert rows[2][:2] == ["F2", "reproduced"] and rows[2][5] == (
        f"every clause holds; least confident: {weakest.name} ({confidence_text(weakest.confidence)})")
    assert rows[3][:2] == ["F4", "reproduced"] and rows[3][5] == "the rule holds"
    assert values.startswith("Our values of the quantities the paper reports")
    assert [c.strip() for c in ours[0].strip("|").split("|")] == ["finding", "quantity", "ours (mean ± SEM)"]
    assert sum(line.startswith("| F2 ") for line in ours) == len(f2_.ours) == 4
    assert findings_title(["docs/data/micro_replicates_s42", "docs/data/micro_replicates_s43"]) == (
        "Findings: micro_replicates_s42, micro_replicates_s43")
    assert findings_title(["runs/a", "runs/b"], by="sweep", task="math") == "Findings: a, b by sweep, read on math"


def test_regime_skips_cells_of_one_seed() -> None:
    """A cell with one seed has no SEM (null in `cell_table`): `regime` skips it, as its docstring says,
    instead of failing on it (``distillab findings`` on one replicate directory, or ``--by sweep`` over
    directories of one seed each)."""
    from distillab.analysis.findings import regime

    one_seed = _staged_cells(0.45).with_columns(pl.lit(None, pl.Float64).alias("hard10_sem"),
                                                pl.lit(1).alias("hard10_n"))
    assert regime(one_seed) == ("", "no cell has the value before and after distillation with an SEM")


def test_a_cell_mean_is_the_same_bits_whatever_order_its_trials_come_in() -> None:
    """`cell_table` sums a cell's seeds in seed order, so the same trials give the same bits in any row
    order (a group_by's output order varies from run to run; a last-bit difference flipped a printed
    "about 433 seeds" to 432 between two runs on docs/data/micro_findings). 0.1, 0.2, 0.3 sum to
    0.6000000000000001 in that order and to 0.6 as 0.3 + 0.2 + 0.1."""
    cell = ("offpd", None, "forward", 1e-4)
    tv = trial_values(study({cell: dict(acc=0.2, f=-0.1, S=0.9, cover=0.3, hard=0.0)}))
    tv = tv.with_columns(pl.col("seed").replace_strict({42: 0.1, 43: 0.2, 44: 0.3}, return_dtype=pl.Float64).alias("acc"))
    rows = [cell_table(tv.sample(fraction=1.0, shuffle=True, seed=s)).row(0, named=True)["acc_mean"] for s in range(8)]
    assert rows == [(0.1 + 0.2 + 0.3) / 3] * 8
