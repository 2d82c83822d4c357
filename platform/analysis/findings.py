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

How §9 is read, and the text of every rule: `distillab.analysis.rules` (the docs page
``reference/rules.md`` renders it). By concern:

    analysis.rules          RULES, PAPER, the numbers of §9 and §9.1, how §9 is read
    analysis.cells          trial_values, cell_table, CellView, §9's statistics (Stat, mean_of, ...)
    analysis.verdicts       f1 … f5, Clause, Verdict
    analysis.confidence     §9.1: assess, Redraws, seeds_needed
    analysis.findings_page  format_verdicts, findings_markdown and its tables
    analysis.findings       decide and write_findings, and every name above that the CLI, docs and tests use
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import polars as pl

from distillab.analysis.cells import (
    DERIVED,
    EVALS,
    NAMES,
    ON_TASK,
    QUANTITIES,
    TASK,
    CellView,
    Stat,
    cell_table,
    clearly,
    evals_of,
    groups_of,
    mean_of,
    name_of,
    power_note,
    ratio_note,
    trial_values,
    value_range,
)
from distillab.analysis.confidence import (
    Redraws,
    agreement,
    assess,
    confidence_text,
    replication_text,
    seeds_needed,
)
from distillab.analysis.findings_page import (
    FINDINGS_FIGURES,
    NOT_RECORDED,
    RETENTION,
    STAGED,
    TRANSFER,
    figure_finding,
    findings_markdown,
    findings_title,
    format_verdicts,
    not_reproduced_lines,
    provenance_lines,
    reason,
    regime,
    retention_lines,
    run_arithmetic,
    verdict_table_lines,
)
from distillab.analysis.plots import POLICY, figure_notes, save_figure
from distillab.analysis.results import Results, filter_trials
from distillab.analysis.rules import (
    CONFIDENCE_NOTE,
    DRAW_SEED,
    DRAWS,
    FIRM,
    INCONCLUSIVE,
    KINDS,
    MIN_SEEDS,
    NOT_REPRODUCED,
    PAPER,
    POLICIES,
    REPLICATION_SPREAD,
    REPRODUCED,
    RULES,
    SEEDS_CAP,
    SPECTRUM,
)
from distillab.analysis.verdicts import FINDINGS, Clause, Verdict, f1, f2, f3, f4, f5
from distillab.tables import code_version

__all__ = [
    "Stat", "mean_of", "value_range", "Clause", "Verdict", "RULES", "PAPER", "FINDINGS", "MIN_SEEDS", "SPECTRUM",
    "REPRODUCED", "NOT_REPRODUCED", "INCONCLUSIVE", "POLICIES", "KINDS", "EVALS", "QUANTITIES", "DERIVED", "NAMES",
    "ON_TASK", "clearly", "trial_values", "cell_table", "CellView", "f1", "f2", "f3", "f4",
    "f5", "decide", "format_verdicts", "findings_markdown", "findings_title", "DRAWS", "DRAW_SEED", "FIRM",
    "SEEDS_CAP", "Redraws", "agreement", "seeds_needed", "assess", "confidence_text", "REPLICATION_SPREAD",
    "replication_text", "CONFIDENCE_NOTE", "verdict_table_lines", "reason", "NOT_RECORDED", "run_arithmetic",
    "STAGED", "TRANSFER", "RETENTION", "regime", "retention_lines", "TASK", "evals_of", "name_of",
    "provenance_lines", "not_reproduced_lines", "power_note", "ratio_note", "FINDINGS_FIGURES", "figure_finding",
    "write_findings",
]


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
    return {g: [assess(n, t) for n in names] for g, t in groups_of(trials, by).items()}


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
