"""The paper's sweep files (search_spaces/paper_*.yaml) against PROTOCOL.md, point by point
(issue 34, item 3), and what `distillab findings` can decide on them.

`SETTINGS` quotes, for each setting PROTOCOL.md fixes, the protocol's own words and parses the
paper's value out of the quote; where PROTOCOL.md is present (beside the clone as
``../shared/PROTOCOL.md``, as in CI) every quote must still be in it, so a changed protocol
fails here instead of drifting. Every trial of every paper file is then compared with those
values. A file may differ only where `ROLES` says it is that setting's robustness run (a value
PROTOCOL.md names as such) or where `DEVIATIONS` lists the difference with its reason, which
the file's header states too; an unlisted difference fails, and so does a listed one that is
no longer there.

The last tests write a synthetic result frame shaped like paper_lr_study.yaml (its 72 trials,
made-up evaluations) and check that §9 decides F1 and F2 on it, both ways.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _tolerance as tol
import pytest

from distillab.analysis.findings import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, decide, format_verdicts
from distillab.analysis.results import load
from distillab.driver.cli import main
from distillab.config import RLVRConfig, SweepConfig, TrialConfig, load_sweep
from distillab.tables import write_rows

#: float64 roundings (tests/_tolerance.py, approx64): a cosine learning-rate factor, or a findings
#: statistic (a mean over at most 11 cells of 3 seeds, as tests/analysis/test_findings.py)
ROUNDINGS = 128

REPO = Path(__file__).resolve().parents[1]
SPACES = REPO / "search_spaces"
#: where PROTOCOL.md may sit beside the clone: one level up (../shared), or two for a checkout one folder deeper
PROTOCOL_AT = (REPO.parent / "shared" / "PROTOCOL.md", REPO.parents[1] / "shared" / "PROTOCOL.md")


def _words(text: str) -> str:
    return " ".join(text.split())


def _num(pattern: str) -> Callable[[str], float]:
    return lambda q: float(re.search(pattern, q).group(1))


@dataclass(frozen=True)
class Setting:
    """A PROTOCOL.md setting: its words (``quote``), the value parsed from them (``parse``) and
    where a trial holds it (``get``; None where the setting does not apply to the trial)."""

    quote: str
    parse: Callable[[str], Any]
    get: Callable[[TrialConfig], Any]

    @property
    def value(self) -> Any:
        return self.parse(self.quote)


ADAMW = "AdamW (0.9, 0.999, eps 1e-8, no weight decay)"
MATCHED = "150 optimizer steps, 32 prompts per step, one rollout per prompt"
TAUS = "π_T = softmax(z_T / τ_T), π_S = softmax(z_S / τ_S) [τ_T = 0.5, τ_S = 1.0]"
ACC = "one sample per test prompt at T = 0.5, top-p 1.0, on the first 200 test items"
PASS = "pass@1 and pass@k from n samples per prompt [n = k = 10; T = 1.0 on Countdown-3, 0.5 on Countdown-4E]"
RLVR = ("no reference KL (β = 0), 8 samples per prompt at T = 1.0, top-p 0.95, reward 2 if correct else 0, "
        "300 steps, LR 2e-6 cosine with 10 % warm-up, on Countdown-4")
POOL3 = "three operands drawn with replacement from {1..10, 12, 15, 20, 25, 50, 75}"
LARGE_POOL = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 15, 20, 25, 50, 75)


def _rlvr(attr: str) -> Callable[[TrialConfig], Any]:
    return lambda t: None if t.rlvr is None else getattr(t.rlvr, attr)


#: PROTOCOL.md §1-§6's fixed settings: the name (a config field where there is one) → its Setting
SETTINGS: dict[str, Setting] = {
    "optimizer.steps": Setting(MATCHED, _num(r"(\d+) optimizer steps"), lambda t: t.optimizer.steps),
    "optimizer.prompts_per_step": Setting(MATCHED, _num(r"(\d+) prompts per step"),
                                          lambda t: t.optimizer.prompts_per_step),
    "optimizer.rollouts_per_prompt": Setting(MATCHED, lambda q: 1 if "one rollout per prompt" in q else None,
                                             lambda t: t.optimizer.rollouts_per_prompt),
    "optimizer.betas": Setting(ADAMW, lambda q: tuple(map(float, re.search(r"AdamW \(([\d.]+), ([\d.]+)", q)
                                                          .groups())), lambda t: t.optimizer.betas),
    "optimizer.eps": Setting(ADAMW, _num(r"eps ([\de.-]+)"), lambda t: t.optimizer.eps),
    "optimizer.weight_decay": Setting(ADAMW, lambda q: 0.0 if "no weight decay" in q else None,
                                      lambda t: t.optimizer.weight_decay),
    "optimizer.clip": Setting("| gradient clipping | global norm 1.0; off (robustness) |",
                              _num(r"global norm ([\d.]+)"), lambda t: t.optimizer.clip),
    "optimizer.warmup_steps": Setting("constant after 10 linear warm-up steps", _num(r"after (\d+) linear"),
                                      lambda t: t.optimizer.warmup_steps),
    "rollout.tau_t": Setting(TAUS, _num(r"\[τ_T = ([\d.]+)"), lambda t: t.rollout.tau_t),
    "rollout.tau_s": Setting(TAUS, _num(r"τ_S = ([\d.]+)\]"), lambda t: t.rollout.tau_s),
    "loss.tau_t": Setting(TAUS, _num(r"\[τ_T = ([\d.]+)"), lambda t: t.loss.tau_t),
    "loss.tau_s": Setting(TAUS, _num(r"τ_S = ([\d.]+)\]"), lambda t: t.loss.tau_s),
    "loss.estimator": Setting("| KL estimator | full vocabulary (main); single sampled token (robustness) |",
                              lambda q: "full" if "full vocabulary (main)" in q else None, lambda t: t.loss.estimator),
    # §2: the weight wherever a separate engine samples the rollout (vLLM; auto is vLLM on GPUs). The
    # λ-spectrum is sampled by the trainer's own models (and the weight is defined for offpd/onpd only)
    "loss.importance_weight": Setting(
        "engine mismatch correction (when a separate inference engine samples the rollout with distribution q)",
        lambda q: True, lambda t: t.loss.importance_weight == (t.rollout.engine in ("vllm", "auto")
                                                               and t.rollout.policy != "spectrum")),
    "rollout.alpha": Setting("[α = 0.2, c = 2·log 3]", _num(r"α = ([\d.]+)"), lambda t: t.rollout.alpha),
    "rollout.clip_c": Setting("[α = 0.2, c = 2·log 3]", lambda q: 2 * math.log(3) if "c = 2·log 3" in q else None,
                              lambda t: t.rollout.clip_c),
    "evaluation.id_temperature": Setting(ACC, _num(r"at T = ([\d.]+)"), lambda t: t.evaluation.id_temperature),
    "evaluation.top_p": Setting(ACC, _num(r"top-p ([\d.]+)"), lambda t: t.evaluation.top_p),
    "evaluation.id_items": Setting(ACC, _num(r"first (\d+) test items"), lambda t: t.evaluation.id_items),
    "evaluation.pass_n": Setting(PASS, _num(r"n = k = (\d+)"), lambda t: t.evaluation.pass_n),
    "evaluation.pass_k": Setting(PASS, _num(r"n = k = (\d+)"), lambda t: max(t.evaluation.pass_k)),
    "evaluation.pass_temperature.countdown3": Setting(PASS, _num(r"T = ([\d.]+) on Countdown-3"),
                                                      lambda t: t.evaluation.pass_temperature["countdown3"]),
    "evaluation.pass_temperature.countdown4e": Setting(PASS, _num(r"([\d.]+) on Countdown-4E"),
                                                       lambda t: t.evaluation.pass_temperature["countdown4e"]),
    "evaluation.sparsity_taus": Setting("[τ = 1e-6; also 1e-8]", lambda q: tuple(
        float(x) for x in re.search(r"τ = ([\de.-]+); also ([\de.-]+)", q).groups()),
        lambda t: t.evaluation.sparsity_taus),
    "evaluation.lm_eval.tasks": Setting("[7 via lm-eval-harness at full scale]", _num(r"\[(\d+) via lm-eval"),
                                        lambda t: len(t.evaluation.lm_eval.tasks)
                                        if t.evaluation.ood_backend == "lm_eval" else None),
    "tasks.countdown3": Setting(POOL3, lambda q: (3, LARGE_POOL) if "{1..10, 12, 15, 20, 25, 50, 75}" in q else None,
                                lambda t: (t.tasks.countdown3.n_operands, t.tasks.countdown3.pool)),
    "tasks.countdown4e": Setting("Countdown-4E: four operands from 1..10", lambda q: (4, tuple(range(1, 11))),
                                 lambda t: (t.tasks.countdown4e.n_operands, t.tasks.countdown4e.pool)),
    "tasks.countdown4": Setting("Countdown-4: four operands from the large pool, targets 1..10,000 (RLVR)",
                                lambda q: (4, LARGE_POOL, 1, int(re.search(r"1\.\.([\d,]+)", q).group(1)
                                                                  .replace(",", ""))),
                                lambda t: (t.tasks.countdown4.n_operands, t.tasks.countdown4.pool,
                                           t.tasks.countdown4.target_min, t.tasks.countdown4.target_max)),
    # §6 RLVR, on the trials that have the stage
    "rlvr.beta": Setting(RLVR, _num(r"β = ([\d.]+)"), _rlvr("beta")),
    "rlvr.samples_per_prompt": Setting(RLVR, _num(r"(\d+) samples per prompt"), _rlvr("samples_per_prompt")),
    "rlvr.temperature": Setting(RLVR, _num(r"at T = ([\d.]+)"), _rlvr("temperature")),
    "rlvr.top_p": Setting(RLVR, _num(r"top-p ([\d.]+)"), _rlvr("top_p")),
    "rlvr.correct_reward": Setting(RLVR, _num(r"reward ([\d.]+) if correct"), _rlvr("correct_reward")),
    "rlvr.steps": Setting(RLVR, _num(r"(\d+) steps"), _rlvr("steps")),
    "rlvr.lr": Setting(RLVR, _num(r"LR ([\de.-]+) cosine"), _rlvr("lr")),
    "rlvr.warmup_ratio": Setting(RLVR, lambda q: float(re.search(r"(\d+) % warm-up", q).group(1)) / 100,
                                 _rlvr("warmup_ratio")),
    # "cosine" with no floor named: the usual cosine, to zero
    "rlvr.min_lr_ratio": Setting(RLVR, lambda q: 0.0 if "cosine" in q else None, _rlvr("min_lr_ratio")),
    "rlvr.task": Setting(RLVR, lambda q: "countdown4" if q.endswith("on Countdown-4") else None, _rlvr("task")),
    "rlvr.lora": Setting("full fine-tuning of the student", lambda q: None, _rlvr("lora")),
}

#: §1's learning rates: the main grid's and the LR study's
LR_QUOTE = "| learning rate | {1e-5, 5e-5}; LR study {1..6}e-5 |"
MAIN_LRS = [float(x) for x in re.search(r"\{([\de.-]+), ([\de.-]+)\}", LR_QUOTE).groups()]
STUDY_LRS = [float(f"{i}e-5") for i in range(1, 1 + int(re.search(r"\{1\.\.(\d)\}e-5", LR_QUOTE).group(1)))]
SEED_QUOTE = "| seed | 42, 43, 44 |"
SEEDS = [int(x) for x in re.findall(r"\d+", SEED_QUOTE)]
LAMBDA_QUOTE = "F3** (spectrum λ ∈ {−2, −1, 0, 1, 2}, one LR)"
LAMBDAS = [float(x.replace("−", "-")) for x in re.search(r"\{(.*?)\}", LAMBDA_QUOTE).group(1).split(", ")]
#: §1: a robustness value PROTOCOL.md names, by setting
ROBUST_QUOTES = {"optimizer.clip": "global norm 1.0; off (robustness)",
                 "loss.estimator": "single sampled token (robustness)",
                 "temperatures": "Generation and loss temperatures must be settable separately (the paper ablates "
                                 "swapping them)"}
SWAPPED = {"rollout.tau_t": 1.0, "rollout.tau_s": 0.5, "loss.tau_t": 1.0, "loss.tau_s": 0.5}


@dataclass(frozen=True)
class Role:
    """What a paper file is: its LRs (by PROTOCOL.md §1), distillation domain (§1's tasks), the
    robustness values it sets (§1, §2) and whether it runs the spectrum with RLVR (§3, §6)."""

    lrs: str = "main"  # main | study | one (one of the main LRs, §9's F3)
    domain: str = "countdown"
    robust: dict[str, Any] = field(default_factory=dict)
    spectrum: bool = False


ROLES = {
    "paper_llama": Role(), "paper_qwen": Role(), "paper_lr_study": Role(lrs="study"),
    "paper_spectrum": Role(lrs="one", spectrum=True),
    "paper_noclip": Role(robust={"optimizer.clip": None}),
    "paper_sampled": Role(robust={"loss.estimator": "sampled"}),
    "paper_temps": Role(robust=SWAPPED),
    "paper_science": Role(domain="mcq"), "paper_medreason": Role(domain="mcq"), "paper_math": Role(domain="math"),
}

THIRD_LR = [1e-5, 3e-5, 5e-5]
WHY_THIRD_LR = ("§9's F1 and F2 need m >= 3 LRs and the main grid has two; 3e-5 (one of the LR study's) "
                "is added so that the file decides them")
#: (file, setting) → (its value, why): every difference from PROTOCOL.md's value that is not a robustness run
DEVIATIONS: dict[tuple[str, str], tuple[Any, str]] = {
    (name, "optimizer.lr"): (THIRD_LR, WHY_THIRD_LR)
    for name in ("paper_noclip", "paper_sampled", "paper_temps", "paper_science", "paper_medreason", "paper_math")
}


@pytest.fixture(scope="module")
def sweeps() -> dict[str, SweepConfig]:
    return {p.stem: load_sweep(p) for p in sorted(SPACES.glob("paper_*.yaml"))}


def _header(name: str) -> str:
    lines = (SPACES / f"{name}.yaml").read_text().splitlines()
    return _words(" ".join(line.lstrip("# ") for line in lines[:next(i for i, x in enumerate(lines)
                                                                    if not x.startswith("#"))]))


def test_the_quotes_are_protocol_md_s_words() -> None:
    """Each quoted line is in PROTOCOL.md as written (whitespace aside), so the values parsed from
    the quotes are the protocol's own."""
    path = next((p for p in PROTOCOL_AT if p.exists()), None)
    if path is None:
        pytest.skip(f"PROTOCOL.md not beside the clone ({', '.join(map(str, PROTOCOL_AT))})")
    text = _words(path.read_text())
    quotes = {s.quote for s in SETTINGS.values()} | {LR_QUOTE, SEED_QUOTE, LAMBDA_QUOTE, *ROBUST_QUOTES.values()}
    assert [q for q in quotes if _words(q) not in text] == []


def test_the_parsed_values() -> None:
    """The values parsed from the quotes, once by hand (a parser that goes wrong fails here)."""
    v = {k: s.value for k, s in SETTINGS.items()}
    assert (v["optimizer.steps"], v["optimizer.prompts_per_step"], v["optimizer.rollouts_per_prompt"]) == (150, 32, 1)
    assert (v["optimizer.betas"], v["optimizer.eps"], v["optimizer.weight_decay"]) == ((0.9, 0.999), 1e-8, 0.0)
    assert (v["optimizer.clip"], v["optimizer.warmup_steps"], v["rollout.tau_t"], v["rollout.tau_s"]) == (1, 10, .5, 1)
    assert (v["rlvr.samples_per_prompt"], v["rlvr.temperature"], v["rlvr.top_p"], v["rlvr.correct_reward"]) == (
        8, 1.0, 0.95, 2.0)
    assert (v["rlvr.steps"], v["rlvr.lr"], v["rlvr.warmup_ratio"], v["rlvr.beta"], v["rlvr.min_lr_ratio"]) == (
        300, 2e-6, 0.1, 0.0, 0.0)
    assert v["tasks.countdown4"] == (4, LARGE_POOL, 1, 10_000) and v["evaluation.sparsity_taus"] == (1e-6, 1e-8)
    assert MAIN_LRS == [1e-5, 5e-5] and STUDY_LRS == [1e-5, 2e-5, 3e-5, 4e-5, 5e-5, 6e-5]
    assert SEEDS == [42, 43, 44] and LAMBDAS == [-2, -1, 0, 1, 2]


def test_every_paper_file_has_a_role(sweeps) -> None:
    assert sorted(sweeps) == sorted(ROLES)


def _same(got: Any, want: Any) -> bool:
    if isinstance(got, float) and isinstance(want, float):
        return math.isclose(got, want, rel_tol=tol.gamma(2))  # a YAML decimal against a literal: two roundings
    return got == want


def _differences(name: str, sweep: SweepConfig) -> dict[str, Any]:
    """Setting → the file's values where they differ from PROTOCOL.md's and from the file's robustness role."""
    role, out = ROLES[name], {}
    for key, s in SETTINGS.items():
        if key.startswith("rlvr.") and not role.spectrum:  # no RLVR stage: checked below
            continue
        want = True if key == "loss.importance_weight" else role.robust.get(key, s.value)
        got = [s.get(t) for t in sweep.trials]
        if not all(_same(g, want) for g in got):
            out[key] = sorted({repr(g) for g in got})
    if not role.spectrum and any(t.rlvr is not None for t in sweep.trials):
        out["rlvr"] = "an RLVR stage"
    lrs = sorted({t.optimizer.lr for t in sweep.trials})
    want_lrs = {"main": MAIN_LRS, "study": STUDY_LRS}.get(role.lrs)
    if (want_lrs is not None and lrs != want_lrs) or (role.lrs == "one" and (len(lrs) != 1 or lrs[0] not in MAIN_LRS)):
        out["optimizer.lr"] = lrs
    if sorted({t.seed for t in sweep.trials}) != SEEDS:
        out["seed"] = sorted({t.seed for t in sweep.trials})
    if {t.domain for t in sweep.trials} != {role.domain}:
        out["domain"] = sorted({t.domain for t in sweep.trials})
    if role.spectrum and (sorted({t.rollout.lambda_ for t in sweep.trials}) != LAMBDAS
                          or any(t.rlvr is None for t in sweep.trials)):
        out["rollout.lambda"] = sorted({t.rollout.lambda_ for t in sweep.trials})
    return out


def test_every_paper_file_holds_protocol_md_s_settings_or_says_why(sweeps) -> None:
    """Point by point, every trial of every file; a difference must be listed in `DEVIATIONS` (with that
    value) and stated in the file's header; a listed deviation that is gone fails too."""
    found = {(name, k): v for name, sweep in sweeps.items() for k, v in _differences(name, sweep).items()}
    assert {k: v for k, v in found.items() if k not in DEVIATIONS} == {}, "unlisted deviations"
    assert [k for k in DEVIATIONS if k not in found] == [], "listed deviations that are not there"
    assert {k: v for k, v in found.items() if v != DEVIATIONS[k][0]} == {}
    for name in sweeps:
        header, mine = _header(name), [k for f, k in DEVIATIONS if f == name]
        assert "Deviations from PROTOCOL.md" in header, name
        assert all(k in header for k in mine) and ("Deviations from PROTOCOL.md: none" in header) == (not mine), name


def test_the_robustness_values_are_protocol_md_s(sweeps) -> None:
    """noclip: clip off; sampled: the sampled estimator; temps: τ_T and τ_S swapped in generation
    and loss (and nothing else of the Countdown grid changed: the test above)."""
    t = sweeps["paper_noclip"].trial
    assert t.optimizer.clip is None and "off (robustness)" in ROBUST_QUOTES["optimizer.clip"]
    assert sweeps["paper_sampled"].trial.loss.estimator == "sampled"
    base = SETTINGS["rollout.tau_t"].value, SETTINGS["rollout.tau_s"].value
    for side in ("rollout", "loss"):
        tt = getattr(sweeps["paper_temps"].trial, side)
        assert (tt.tau_t, tt.tau_s) == base[::-1] == (1.0, 0.5)


def test_files_say_what_they_decide(sweeps) -> None:
    """A file whose grid has fewer than 3 LRs says it does not decide F1 or F2 (§9: m >= 3)."""
    for name, sweep in sweeps.items():
        header, lrs = _header(name).lower(), {t.optimizer.lr for t in sweep.trials}
        assert "decide" in header, name
        assert ("not f1 or f2" in header) == (len(lrs) < 3), name
    assert len(sweeps["paper_lr_study"].trials) == 2 * 2 * 6 * 3


#: lines that PROTOCOL.md leaves open, sets otherwise, or names as robustness (a line holding the
#: paper's value needs no comment)
SAYS_WHY = ("max_tokens:", "engine:", "vllm_", "system_prompt:", "instruction:", "train_path:", "test_path:",
            "teacher_path:", "countdown_tasks: []", "min_lr_ratio:", "importance_weight:", "clip: null",
            "estimator: sampled", "tau_t: 1.0", "tau_s: 0.5", "mcq_items:", "math_items:",
            "optimizer.lr: [1.0e-5, 3.0e-5")


def test_each_set_line_says_why(sweeps) -> None:
    """torchtune style: such a line carries its reason as a comment, in every paper file."""
    for name in sweeps:
        for line in (SPACES / f"{name}.yaml").read_text().splitlines():
            if line.lstrip().startswith(SAYS_WHY) and not line.lstrip().startswith("#"):
                assert "#" in line, f"{name}.yaml: {line.strip()!r} has no comment"


def test_domain_files_read_local_files_given_with_set(sweeps, tmp_path) -> None:
    for name, domain in (("paper_science", "mcq"), ("paper_medreason", "mcq"), ("paper_math", "math")):
        task = getattr(sweeps[name].trial.tasks, domain)
        assert task.source == "files" and task.train_path.startswith("/path/to/"), name
        s = load_sweep(SPACES / f"{name}.yaml", {f"trial.tasks.{domain}.train_path": str(tmp_path / "a.jsonl")})
        assert getattr(s.trial.tasks, domain).train_path == str(tmp_path / "a.jsonl")
        assert getattr(sweeps[name].trial.evaluation, f"{domain}_items") == SETTINGS["evaluation.id_items"].value


def test_rlvr_cosine_to_min_lr_ratio() -> None:
    """rlvr.min_lr_ratio: the default keeps the micro schedule (cosine to 10 %, as before the
    field), 0.0 ends at zero; both warm up over 10 % of 300 steps."""
    from distillab.recipe.optim import rlvr_schedule

    micro, paper = rlvr_schedule(RLVRConfig()), rlvr_schedule(RLVRConfig(min_lr_ratio=0.0))
    for s in (0, 29, 30, 100, 165, 299, 300):
        old = (s + 1) / 30 if s < 30 else 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, (s - 30) / 270)))
        assert micro(s) == tol.approx64(old, 16)  # a cosine (two roundings) and a few products and sums, twice
    assert (paper(0), paper(29), paper(30), paper(165), paper(300)) == tol.approx64((1 / 30, 1.0, 1.0, 0.5, 0.0), ROUNDINGS)


# --------------------------------------------------------------------------- findings on the LR study's shape

#: made-up cell values at the LR study's 6 LRs, per (policy, KL): F1 and F2 reproduced
ACC_OK = {"forward": (0.20, 0.21, 0.22, 0.23, 0.24, 0.24), "reverse": (0.10, 0.16, 0.20, 0.12, 0.06, 0.02)}
FORGET_OK = (-0.05, -0.10, -0.20, -0.30, -0.40, -0.50)
SPARSE_OK = (0.90, 0.86, 0.80, 0.70, 0.60, 0.50)
DELTA = {42: 0.01, 43: 0.0, 44: -0.01}


def _write_lr_study(root: Path, acc: dict, forget: tuple, sparse: tuple, sweep: str = "paper_lr_study") -> None:
    """The trials of ``sweep`` (the file's own trial rows, every config column) with evals: acc, forgetting
    and sparsity per LR index from the tables (onpd 0.01 more accurate and forgetting 0.01 more, offpd
    0.02 sparser), seeds ± 0.01."""
    s = load_sweep(SPACES / f"{sweep}.yaml")
    lrs = sorted({t.optimizer.lr for t in s.trials})
    for t in s.trials:
        i, d, on = lrs.index(t.optimizer.lr), DELTA[t.seed], t.rollout.policy == "onpd"
        row = {"trial_id": t.trial_id, "status": "completed", "start_time": 0.0, "end_time": 1.0,
               **{k: (str(v) if isinstance(v, (list, dict)) else v) for k, v in t.flat().items()}}
        write_rows(root, "trials", [row], key=t.trial_id)
        a = acc[t.loss.kind][i] + (0.01 if on else 0.0)
        vals = [("pre", "ood", "ood_mean", 0.8), ("distill", "ood", "ood_mean", 0.8 + forget[i] - 0.01 * on + d),
                ("distill", "countdown3", "accuracy", a + d), ("distill", "countdown3", "pass@1", a),
                ("distill", "countdown3", "pass@10", a + 0.2 + d),
                ("distill", "params", "sparsity@1e-06", sparse[i] + 0.02 * (not on) + d)]
        rows = [{"trial_id": t.trial_id, "stage": st, "step": 0 if st == "pre" else 150, "task": tk, "metric": m,
                 "value": float(v), "n": 200} for st, tk, m, v in vals]
        write_rows(root, "evals", rows, key=t.trial_id)


def test_findings_decides_f1_and_f2_on_an_lr_study_shaped_frame(tmp_path, capsys) -> None:
    """72 trials as paper_lr_study.yaml writes them: F1 and F2 reproduced through `distillab findings`."""
    root = tmp_path / "paper_lr_study"
    _write_lr_study(root, ACC_OK, FORGET_OK, SPARSE_OK)
    verdicts = {v.finding: v for v in decide(load(root), only=["F1", "F2"])["all"]}
    assert {k: v.verdict for k, v in verdicts.items()} == {"F1": REPRODUCED, "F2": REPRODUCED}, \
        format_verdicts({"all": list(verdicts.values())})
    assert [c.name for c in verdicts["F1"].clauses] == [f"(a) η={lr:g}" for lr in STUDY_LRS] + ["(b)"]
    assert verdicts["F2"].ours["f at η1=1e-05 (mean over ρ, k)"].mean == tol.approx64(-0.055, ROUNDINGS)
    assert main(["findings", str(root), "--only", "F1,F2", "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "F1  REPRODUCED" in out and "F2  REPRODUCED" in out and "inconclusive" not in out.lower()


def test_findings_not_reproduced_on_an_lr_study_shaped_frame(tmp_path) -> None:
    """The same shape, reverse KL as flat over η as forward (F1 (b) fails) and forgetting that does
    not change with η (F2 (a), (b) fail): decided, not reproduced (never inconclusive)."""
    root = tmp_path / "paper_lr_study"
    _write_lr_study(root, {"forward": ACC_OK["forward"], "reverse": ACC_OK["forward"]}, (-0.2,) * 6, SPARSE_OK)
    verdicts = decide(load(root), only=["F1", "F2"])["all"]
    assert [v.verdict for v in verdicts] == [NOT_REPRODUCED, NOT_REPRODUCED], format_verdicts({"all": verdicts})
    f2 = {c.name: c.holds for c in verdicts[1].clauses}
    assert f2["(a) offpd, forward"] is False and f2["(b)"] is False and f2["(c) offpd, forward"] is True


def test_the_main_grid_cannot_decide_f1_or_f2(tmp_path) -> None:
    """paper_llama.yaml's two LRs: inconclusive for want of LRs, as its header says."""
    root = tmp_path / "paper_llama"
    _write_lr_study(root, ACC_OK, FORGET_OK, SPARSE_OK, sweep="paper_llama")
    verdicts = decide(load(root), only=["F1", "F2"])["all"]
    assert [v.verdict for v in verdicts] == [INCONCLUSIVE, INCONCLUSIVE]
    assert all(any("§9 needs m ≥ 3" in p for p in v.problems) for v in verdicts)
