"""The multiple-choice task as the study's second domain (``trial.domain: mcq``):
config errors, train/test splits without overlap, training prompts, SFT examples,
the evaluation rows against hand-counted answers, and (slow) a smoke trial."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import _tolerance as tol
import pytest
from _helpers import AlwaysEngine
from pydantic import ValidationError

from distillab.config import EvaluationConfig, MCQTaskConfig, TasksConfig, TrialConfig, load_sweep
from distillab.evals.sampling import sample_batched
from distillab.evals.suite import Evaluator
from distillab.models import build_char_tokenizer
from distillab.tasks.mcq import item_key, mcq_prompt_ids, mcq_target_text, mcq_test_split, mcq_train_items

#: float64 roundings (tests/_tolerance.py, approx64) of a share: one division each side
ROUNDINGS = 2

REPO = Path(__file__).resolve().parents[1]
FIX = REPO / "tests" / "fixtures"


def test_domain_config_errors_name_the_field() -> None:
    with pytest.raises(ValidationError, match=r"domain 'mcq' needs evaluation.mcq_items > 0"):
        TrialConfig(domain="mcq")
    with pytest.raises(ValidationError, match="domain"):
        TrialConfig(domain="science")
    with pytest.raises(ValidationError, match="source 'files' needs train_path and test_path"):
        MCQTaskConfig(source="files", train_path="x.jsonl")
    with pytest.raises(ValidationError, match="only with source: files"):
        MCQTaskConfig(test_path="x.jsonl")
    with pytest.raises(ValidationError, match="do not apply to domain 'mcq'"):
        TrialConfig(domain="mcq", evaluation={"mcq_items": 5}, tasks={"teacher_system_prompt": "Be brief."})
    assert TrialConfig(domain="mcq", evaluation={"mcq_items": 5}).domain == "mcq"


def test_synthetic_splits_do_not_overlap() -> None:
    cfg = MCQTaskConfig(train_items=3000)
    test = mcq_test_split(cfg, 200, 1_000_003)
    assert len(test) == 200 and test == mcq_test_split(cfg, 200, 1_000_003)  # fixed across trials
    train = mcq_train_items(cfg, 200, 1_000_003, seed=5)
    assert not {item_key(t) for t in test} & {item_key(t) for t in train}
    full = mcq_train_items(cfg, 0, 1_000_003, seed=5)
    assert len(train) == len(full) - len({item_key(t) for t in test} & {item_key(t) for t in full})


def test_file_splits_and_their_errors() -> None:
    cfg = MCQTaskConfig(source="files", train_path=str(FIX / "science_mini.jsonl"),
                        test_path=str(FIX / "science_mini.jsonl"))
    assert [it.answer for it in mcq_test_split(cfg, 2, 0)] == ["B", "C"]
    assert [it.answer for it in mcq_train_items(cfg, 2, 0, seed=0)] == ["D"]  # the two test rows removed
    with pytest.raises(ValueError, match="3 test rows, evaluation needs 5"):
        mcq_test_split(cfg, 5, 0)
    with pytest.raises(ValueError, match="no training question is left"):
        mcq_train_items(cfg, 3, 0, seed=0)


def test_training_prompts_and_sft_targets() -> None:
    from distillab.tasks.data import train_prompts

    tok = build_char_tokenizer()
    trial = TrialConfig(domain="mcq", evaluation={"mcq_items": 50}, tasks={"mcq": {"train_items": 300}})
    prompts = train_prompts(trial, tok, rank=0)
    test = {tuple(mcq_prompt_ids(tok, trial.tasks.mcq, it)) for it in mcq_test_split(trial.tasks.mcq, 50, trial.tasks.test_seed)}
    assert len(prompts) > 250 and not test & {tuple(p) for p in prompts}
    text = tok.decode(prompts[0])
    assert text.startswith("<|system|>Multiple choice.<|user|>Which number is the largest?\nA. ")
    assert train_prompts(trial, tok, rank=1) != prompts  # each rank its own order
    cfg = MCQTaskConfig(source="files", train_path=str(FIX / "science_mini.jsonl"),
                        test_path=str(FIX / "science_mini.jsonl"))
    first = mcq_train_items(cfg, 0, 0, seed=0)[0]
    assert mcq_target_text(first) == "<think>Photosynthesis fixes CO2 into sugars.</think><answer>B</answer>"


def test_prepare_adds_mcq_demonstrations_and_keys_them() -> None:
    from distillab.recipe.prepare import _examples, prepare_key

    tok = build_char_tokenizer()
    base = load_sweep(REPO / "search_spaces" / "smoke.yaml")
    mcq = load_sweep(REPO / "search_spaces" / "smoke.yaml", {"models.micro_teacher.mcq_examples": 40,
                                                              "trial.evaluation.mcq_items": 10})
    assert prepare_key(mcq, "teacher") != prepare_key(base, "teacher")
    assert prepare_key(mcq, "student") == prepare_key(base, "student")
    n_base = len(_examples(tok, base, "teacher", 0))
    ex = _examples(tok, mcq, "teacher", 0)
    assert len(ex) == n_base + 40
    first = ex[n_base]  # the first multiple-choice example follows the Countdown ones
    target = tok.decode(first.completion_ids)
    assert len(target) == len("<answer>B</answer></s>") and target.startswith("<answer>")
    assert target[8] in "ABCD" and target.endswith("</answer></s>")
    assert "Which number is the largest?" in tok.decode(first.prompt_ids)


def test_mcq_rows_against_hand_counted_answers() -> None:
    from distillab.tasks.mcq import score_mcq

    tok = build_char_tokenizer()
    cfg = EvaluationConfig(mcq_items=40, pass_items=20, pass_n=4, pass_k=(1, 4))
    ev = Evaluator(tok, TasksConfig(), cfg)
    items = mcq_test_split(TasksConfig().mcq, 40, TasksConfig().test_seed)
    prompts = [mcq_prompt_ids(tok, TasksConfig().mcq, it) for it in items]
    def rows(text: str) -> list[dict]:
        done = sample_batched(AlwaysEngine(tok, text), ev.requests("mcq", prompts, seed=0))
        return ev.rows("mcq", done, lambda t, j: score_mcq(t, items[j]))

    rows_c = rows("<answer>C</answer>")
    share_c = [it.answer for it in items].count("C")
    share_c20 = [it.answer for it in items[:20]].count("C")
    assert 0 < share_c < 40  # the synthetic answers are spread over A-D
    assert rows_c == [
        {"task": "mcq", "metric": "accuracy", "value": share_c / 40, "n": 40},
        {"task": "mcq", "metric": "pass@1", "value": tol.approx64(share_c20 / 20, ROUNDINGS), "n": 20},
        {"task": "mcq", "metric": "pass@4", "value": tol.approx64(share_c20 / 20, ROUNDINGS), "n": 20},
    ]
    assert rows("<answer>C</answer><answer>C</answer>")[0]["value"] == 0.0  # two answer blocks: no answer


@pytest.mark.slow
def test_smoke_trial_in_the_mcq_domain(run_locally, tmp_path) -> None:
    from distillab.analysis.results import load

    sweep = load_sweep(REPO / "search_spaces" / "smoke.yaml", {
        "storage_path": str(tmp_path), "models.cache_dir": str(REPO / ".cache" / "models"),
        "search.grid": {"rollout.policy": ["offpd", "onpd"]}, "trial.domain": "mcq",
        "trial.evaluation.mcq_items": 8, "models.micro_teacher.mcq_examples": 200,
        "resources.local_mode": True,  # one process per trial: lean for CI
    })
    res = load(run_locally(sweep))
    trials = res.trials.collect()
    assert trials["status"].to_list() == ["completed", "completed"], trials["error"].to_list()
    ev = res.evals.collect().filter(pl.col("task") == "mcq")
    got = {(r["stage"], r["metric"]) for r in ev.iter_rows(named=True)}
    assert got == {(s, m) for s in ("pre", "distill") for m in ("accuracy", "pass@1", "pass@2")}
    assert ev.filter(pl.col("metric") == "accuracy")["n"].to_list() == [8] * 4
    from distillab.analysis.plots import summary_table

    table = summary_table(res)
    assert "mcq acc" in table.columns and table.height == 2
