"""What `distillab findings` writes: the verdicts as text (`format_verdicts`) and findings.md
(`findings_markdown`: the verdict table, each finding's clauses and statistics, the cell tables,
the retention/transfer table, the figures and the paper's values, with how the results were
produced). The rule text it prints comes from `analysis.rules`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import polars as pl

from distillab.analysis.cells import (
    TASK,
    Stat,
    _grid,
    _label,
    _spectrum,
    cell_table,
    groups_of,
    name_of,
    trial_values,
)
from distillab.analysis.confidence import confidence_text, replication_text
from distillab.analysis.plots import fig_accuracy_lr, fig_coverage_gap, fig_hard_pass_lambda, fig_lambda, fig_lr
from distillab.analysis.results import Results, format_table, mean_sem_text
from distillab.analysis.rules import NOT_REPRODUCED, PAPER, POLICIES, RULES, confidence_note
from distillab.analysis.verdicts import FINDINGS, Clause, Verdict
from distillab.registry import SPECTRUM as SPECTRUM_POLICY
from distillab.tables import code_version, run_records

__all__ = ["format_verdicts", "not_reproduced_lines", "verdict_table_lines", "reason", "NOT_RECORDED", "run_arithmetic",
           "STAGED", "TRANSFER", "RETENTION", "regime", "retention_lines", "findings_markdown", "provenance_lines",
           "findings_title", "FINDINGS_FIGURES", "figure_finding"]


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


def verdict_table_lines(result: dict[str, list[Verdict]], sources: Sequence[str] | None = None) -> list[str]:
    """findings.md's verdict table. One group: a compact table (finding, verdict, confidence,
    firm/fragile, replication, and a one-line `reason`), then our values of the quantities the
    paper reports, one row each. Several groups: one column per group holding "verdict (confidence
    firm/fragile; replication)", side by side, and the paper's values; with ``sources`` (the sweep
    directories of ``--by sweep``) its first rows name each run's CPU and bf16-product arithmetic
    (`run_arithmetic`). Then the §9.1 note (`analysis.rules.confidence_note`)."""
    first = next(iter(result.values()))
    if len(result) == 1:
        table = {"finding": [v.finding for v in first], "verdict": [v.verdict for v in first],
                 "confidence": [confidence_text(v.confidence).split(" ")[0] for v in first],
                 "firm/fragile": [confidence_text(v.confidence).split(" ")[-1] for v in first],
                 "replication": [replication_text(v.replication) for v in first],
                 "reason": [reason(v).replace("|", "\\|") for v in first]}  # a | inside a Markdown cell
        ours = [{"finding": v.finding, "quantity": q, "ours (mean ± SEM)": s.text()} for v in first
                for q, s in v.ours.items()]
        values = ["Our values of the quantities the paper reports (its values: \"The paper's values\" below):", "",
                  format_table(pl.DataFrame(ours)), ""] if ours else []
        return [format_table(pl.DataFrame(table)), "", *values, confidence_note(), ""]
    runs = {g: run_arithmetic([s for s in sources if Path(s).name == g.split("=", 1)[1]])
            for g in result} if sources else {}
    head = ["CPU", "bf16 products"] if runs else []
    table = {"finding": [*head, *(v.finding for v in first)],
             **{g: [*([runs[g]["cpu"], runs[g]["bf16_products"]] if runs else []),
                    *(f"{v.verdict} ({confidence_text(v.confidence)}; replication {replication_text(v.replication)})"
                      for v in vs)] for g, vs in result.items()},
             "paper": [*[""] * len(head), *("; ".join(f"{q}: {val}" for q, val, _ in v.paper) for v in first)]}
    return [format_table(pl.DataFrame(table)), "", confidence_note(), ""]


def reason(v: Verdict) -> str:
    """A verdict's reason in one line, for the verdict table: an inconclusive verdict's first problem;
    for a reproduced one, that every clause holds (and the least confident clause); for one not
    reproduced, each failing clause of the rule with its text from `analysis.rules.RULES`."""
    if v.problems:
        return v.problems[0] + (f" (and {len(v.problems) - 1} more)" if len(v.problems) > 1 else "")
    if all(c.holds for c in v.clauses):
        sure = [c for c in v.clauses if c.confidence is not None]
        weakest = min(sure, key=lambda c: c.confidence) if len(sure) > 1 else None
        least = f"; least confident: {weakest.name} ({confidence_text(weakest.confidence)})" if weakest else ""
        return ("every clause holds" if len(v.clauses) > 1 else "the rule holds") + least
    failed: dict[str, list[str]] = {}
    for c in v.clauses:
        if c.holds is False:
            label, _, where = c.name.partition(" ")
            failed.setdefault(label, []).append(where)
    rule = RULES[v.finding]
    return "fails " + "; ".join(
        (f"{label} [{' and '.join(w for w in where if w)}]" if any(where) else label) + f": {rule.clause(label)}"
        if label else rule.clause(label) for label, where in failed.items())


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
        if not (r[f"{pre}_n"] and r[f"{after}_n"]) or r[f"{pre}_sem"] is None or r[f"{after}_sem"] is None:
            continue  # no value, or one seed (no SEM)
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
    groups = groups_of(trials, by)
    names = [v.finding for v in next(iter(result.values()))]
    cmd = " ".join(["distillab findings", *sources, *([f"--by {by}"] if by else []),
                    *([f"--only {','.join(names)}"] if names != list(FINDINGS) else []),
                    *([f"--task {task}"] if task != TASK else [])])
    on_task = ([f"Task: acc, pass@1 and pass@10 are read on task `{task}` in place of Countdown-3 (`--task "
                f"{task}`); every rule of §9 is otherwise as written, including where its text says Countdown-3.", ""]
               if task != TASK else [])
    lines = [f"# {findings_title(sources, by, task)}", "",
             f"The verdicts of PROTOCOL.md §9 on findings {', '.join(names)}, generated by `{cmd}` from "
             f"{_counts(trials)}. Every number below is computed by that command "
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


def findings_title(sources: Sequence[str], by: str | None = None, task: str = TASK) -> str:
    """findings.md's title: the sweep directories' names, and ``--by`` and ``--task`` where given,
    e.g. "Findings: micro_findings", "Findings: micro_grid0, micro_noclip by sweep"."""
    return ("Findings: " + ", ".join(Path(s).name for s in sources) + (f" by {by}" if by else "")
            + (f", read on {task}" if task != TASK else ""))


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
    "findings_f3_lambda": (fig_lambda, (SPECTRUM_POLICY,), False),
    "findings_f4_coverage_gap": (fig_coverage_gap, (*POLICIES, SPECTRUM_POLICY), True),
    "findings_f5_countdown4e_lambda": (fig_hard_pass_lambda, (SPECTRUM_POLICY,), False),
}


def figure_finding(stem: str) -> str:
    """The finding a `FINDINGS_FIGURES` stem draws: ``findings_f3_lambda`` → ``F3``."""
    return stem.split("_")[1].upper()
