"""The text of PROTOCOL.md §9 and §9.1 as `distillab findings` applies it, in one place: each
finding's claim and the clauses of the rule that decides it (`RULES`), the paper's values
(`PAPER`), the numbers the rules name (`MIN_SEEDS`, `SPECTRUM`, the §9.1 redraws) and how the
confidence is stated (`CONFIDENCE_NOTE`). The verdicts (`analysis.verdicts`), the printed
verdicts and findings.md (`analysis.findings_page`) and the docs page ``reference/rules.md``
(``python docs/generate.py``) all read them from here.

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
  the same rule function (`verdicts.SPLIT`: each finding's cells, then its rule on a `CellView`) on
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
  by more than 2 SEM of the difference, else retention (reported, not a rule).
- **Ablations.** ``--by KEY`` partitions the trials by the value of a trials column (``sweep``
  when several directories are loaded, or a config column such as ``loss.estimator``,
  ``optimizer.clip``) and decides each group on its own; ``--only F1,F4`` restricts the
  findings (the robustness check asks whether F1 and F4 hold under each ablation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from distillab.registry import OFFPD, ONPD

__all__ = ["Rule", "RULES", "PAPER", "MIN_SEEDS", "SPECTRUM", "POLICIES", "KINDS", "REPRODUCED", "NOT_REPRODUCED",
           "INCONCLUSIVE", "DRAWS", "DRAW_SEED", "FIRM", "SEEDS_CAP", "REPLICATION_SPREAD", "CONFIDENCE_NOTE",
           "confidence_note"]

#: §9: fewer seeds than this make a cell inconclusive
MIN_SEEDS = 3
#: §9, F3: the spectrum's λ values
SPECTRUM = (-2.0, -1.0, 0.0, 1.0, 2.0)
#: §9's grid cells (ρ, k, η): the policies ρ with one sampler and the divergences k compared
POLICIES = (OFFPD, ONPD)
KINDS = ("forward", "reverse")
#: the verdicts of §9
REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"

#: PROTOCOL.md §9.1: redraws per confidence (B ≥ 2,000), their RNG seed, the share at which a verdict is firm,
#: and the largest seed count the seeds-needed search tries
DRAWS, DRAW_SEED, FIRM, SEEDS_CAP = 2000, 91, 0.9, 50
#: the replication redraw's spread in SEMs (module docstring, "Replication"): a rerun's mean differs from this
#: run's by its own sampling error and this run's, √(SEM² + SEM²) = √2 · SEM when both have the same design
REPLICATION_SPREAD = math.sqrt(2)


@dataclass(frozen=True)
class Rule:
    """A finding as PROTOCOL.md writes it: ``claim`` (§7), the ``clauses`` of the §9 rule that decides
    it (label → text; label "" for a rule of one clause), and what §9 reports beside the rule without
    requiring it (``reported``)."""

    claim: str
    clauses: dict[str, str]
    reported: str = ""

    @property
    def text(self) -> str:
        """The whole rule: "(a) …, (b) …, and (c) …; reported: …"."""
        parts = [f"{k} {v}" if k else v for k, v in self.clauses.items()]
        text = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + ", and " + parts[-1]
        return text + (f"; reported: {self.reported}" if self.reported else "")

    def clause(self, name: str) -> str:
        """The text of the clause a `analysis.verdicts.Clause` named ``name`` checks: its label is the
        name's first word (``(a) η=0.001`` → clause ``(a)``)."""
        return self.clauses[name.split(" ")[0] if name else ""]


#: Finding → its `Rule`: the claim of PROTOCOL.md §7 and the rule of §9 that decides it, as written there.
RULES: dict[str, Rule] = {
    "F1": Rule("Rollout policy gives no consistent advantage in final in-distribution accuracy; forward KL is stable "
               "across policies and LRs, reverse KL is sensitive to LR.",
               {"(a)": "for forward KL at every η, |acc(onpd) − acc(offpd)| ≤ max(0.05, 2 SEM)",
                "(b)": "the range of acc over η, averaged over ρ, is at least twice as large for reverse KL as for "
                       "forward KL"}),
    "F2": Rule("Learning rate, not rollout policy, governs forgetting and update sparsity.",
               {"(a)": "for every (ρ, k), f(η1) is clearly above f(ηm)",
                "(b)": "the LR effect, mean over (ρ, k) of |f(ηm) − f(η1)|, exceeds the policy effect, mean over "
                       "(k, η) of |f(onpd) − f(offpd)|",
                "(c)": "for every (ρ, k), S(η1) is clearly above S(ηm)"},
               reported="mean over (k, η) of S(offpd) − S(onpd)"),
    "F3": Rule("Along the spectrum, forward KL is robust; reverse KL needs λ > 0 and can collapse at high LR.",
               {"(a)": "the range of acc over λ for forward KL is at most half that for reverse KL",
                "(b)": "for reverse KL, mean acc over λ ∈ {1, 2} is clearly above mean acc over λ ∈ {−2, −1}"}),
    "F4": Rule("Forward KL gives higher pass@k at similar pass@1 (coverage).",
               {"": "the coverage gap pass@10 − pass@1 on Countdown-3, averaged over matched cells (same ρ or λ, "
                    "same η), is clearly larger for forward than for reverse KL"}),
    "F5": Rule("Student-favoured rollouts (λ > 0) generalise better to Countdown-4E under both directions; the "
               "advantage does not reliably survive later RLVR.",
               {"(a)": "for both KL directions, Countdown-4E pass@10 averaged over λ ∈ {1, 2} is clearly above that "
                       "over λ ∈ {−2, −1} at stage distill",
                "(b)": "for at least one direction, that gap at stage rlvr is not clearly positive or is smaller "
                       "than at distill"}),
}

#: The paper's values (Piskorz, Berthon, van der Schaar 2026, as our sources restate them), one row
#: each: (finding, quantity, value, source). Numbers only where a source gives one.
PAPER: tuple[tuple[str, str, str, str], ...] = (
    ("F1", "final in-distribution accuracy", "no consistent advantage of either rollout policy; forward KL "
     "stable across policies and LRs, reverse KL sensitive to LR", "PROTOCOL.md §7.1"),
    ("F2", "ΔOOD (forgetting)", "within ~1.3 points at LR 1e-5; −11 to −14 points at LR 5e-5", "the paper (arXiv 2609.35259), as docs/protocol.md quotes it"),
    ("F2", "update sparsity S_1e-6", "85–90 % at LR 1e-5; 52–60 % at LR 5e-5 (falls roughly linearly with LR; "
     "OffPD at least as sparse)", "the paper (arXiv 2609.35259), as docs/protocol.md quotes it; PROTOCOL.md §7.2"),
    ("F3", "accuracy along λ", "forward KL robust along the spectrum; reverse KL needs λ > 0 and can collapse "
     "at high LR", "PROTOCOL.md §7.3"),
    ("F4", "coverage pass@k at similar pass@1", "higher for forward KL than for reverse KL", "PROTOCOL.md §7.4"),
    ("F5", "Countdown-4E generalisation", "λ > 0 generalises better under both KL directions; the advantage "
     "does not reliably survive RLVR", "PROTOCOL.md §7.5"),
)



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


def confidence_note() -> str:
    """`CONFIDENCE_NOTE` with the §9.1 numbers filled in (`DRAWS`, `DRAW_SEED`, `FIRM`, `SEEDS_CAP`)."""
    return CONFIDENCE_NOTE.format(draws=DRAWS, seed=DRAW_SEED, firm=FIRM, cap=SEEDS_CAP)
