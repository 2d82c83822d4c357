"""The long-reasoning math task as a domain (``trial.domain: math``): the synthetic arithmetic
chains (worked answers >= 60 tokens, each one accepted by math_task's checker), splits without
overlap, Numina-style local files through the same loader, training prompts, prepare's worked
demonstrations and their key, and the evaluation rows against hand-counted answers."""

from __future__ import annotations

import re
from pathlib import Path

import _tolerance as tol
import pytest
from _helpers import AlwaysEngine
from pydantic import ValidationError

from distillab.config import EvaluationConfig, MathTaskConfig, TasksConfig, TrialConfig, load_sweep
from distillab.evals.sampling import sample_batched
from distillab.evals.suite import Evaluator
from distillab.models import build_char_tokenizer
from distillab.tasks.math_task import (
    generate_arithmetic_chains,
    math_prompt_ids,
    math_target_text,
    math_test_split,
    math_train_items,
    score_math,
)

#: float64 roundings (tests/_tolerance.py, approx64) of a share: one division each side
ROUNDINGS = 2

REPO = Path(__file__).resolve().parents[1]
FIX = REPO / "tests" / "fixtures"


def test_chains_are_worked_out_correctly_and_long() -> None:
    tok = build_char_tokenizer()
    items = generate_arithmetic_chains(500, seed=3)
    assert items == generate_arithmetic_chains(500, seed=3) and items != generate_arithmetic_chains(500, seed=4)
    for it in items:
        operands = [int(x) for x in re.findall(r"\d+", it.problem)]
        ops = re.findall(r"[+-]", it.problem)
        assert len(operands) == 7 and all(10 <= x <= 99 for x in operands)
        total, lines = operands[0], it.solution.split("\n")
        for op, b, line in zip(ops, operands[1:], lines):  # every step is right arithmetic on the running total
            new = total + b if op == "+" else total - b
            assert line == f"{total}{op}{b}={new}" and 10 <= new <= 999
            total = new
        assert lines[-1] == f"\\boxed{{{total}}}" and it.answer == str(total)
        assert len(tok(math_target_text(it), add_special_tokens=False)["input_ids"]) >= 60
        assert score_math(it.solution, it)  # math_task's checker accepts the worked answer
    assert not score_math(items[0].solution.replace(f"{{{items[0].answer}}}", "{1000}"), items[0])
    assert len(generate_arithmetic_chains(1, seed=0, chain_length=2)[0].solution.split("\n")) == 3
    with pytest.raises(ValueError, match="chain_length"):
        generate_arithmetic_chains(3, seed=0, chain_length=0)


def test_domain_config_and_splits() -> None:
    with pytest.raises(ValidationError, match=r"domain 'math' needs evaluation.math_items > 0"):
        TrialConfig(domain="math")
    with pytest.raises(ValidationError, match="source 'files' needs train_path and test_path"):
        MathTaskConfig(source="files", test_path="x.jsonl")
    with pytest.raises(ValidationError, match="chain_length"):
        MathTaskConfig(chain_length=1)
    cfg = MathTaskConfig(train_items=3000)
    test = math_test_split(cfg, 200, 1_000_003)
    assert len(test) == 200 and test == math_test_split(cfg, 200, 1_000_003)
    train = math_train_items(cfg, 200, 1_000_003, seed=5)
    assert not {t.problem for t in test} & {t.problem for t in train}
    files = MathTaskConfig(source="files", train_path=str(FIX / "math_mini.jsonl"), test_path=str(FIX / "math_mini.jsonl"))
    assert [it.answer for it in math_test_split(files, 2, 0)] == [r"\frac{1}{2}", "(-2, 2)"]
    assert [it.answer for it in math_train_items(files, 2, 0, seed=0)] == [r"2\sqrt{3}"]  # the test rows removed
    first = math_test_split(files, 1, 0)[0]
    assert math_target_text(first) == first.solution and math_target_text(math_test_split(files, 2, 0)[1]) == \
        r"\boxed{(-2, 2)}"
    with pytest.raises(ValueError, match="3 test rows, evaluation needs 5"):
        math_test_split(files, 5, 0)


def test_training_prompts_and_prepare_demonstrations() -> None:
    from distillab.recipe.prepare import _examples, prepare_key
    from distillab.tasks.data import train_prompts

    tok = build_char_tokenizer()
    trial = TrialConfig(domain="math", evaluation={"math_items": 40}, tasks={"math": {"train_items": 300}})
    prompts = train_prompts(trial, tok, rank=0)
    test = {tuple(math_prompt_ids(tok, trial.tasks.math, it))
            for it in math_test_split(trial.tasks.math, 40, trial.tasks.test_seed)}
    assert len(prompts) > 250 and not test & {tuple(p) for p in prompts}
    assert re.fullmatch(r"<\|system\|>Math\.<\|user\|>\d\d([+-]\d\d){6}<\|assistant\|>", tok.decode(prompts[0]))
    base = load_sweep(REPO / "search_spaces" / "smoke.yaml")
    math = load_sweep(REPO / "search_spaces" / "smoke.yaml", {"models.micro_teacher.math_examples": 30,
                                                               "trial.evaluation.math_items": 10})
    assert prepare_key(math, "teacher") != prepare_key(base, "teacher")
    assert prepare_key(math, "student") == prepare_key(base, "student")
    n_base = len(_examples(tok, base, "teacher", 0))
    ex = _examples(tok, math, "teacher", 0)
    assert len(ex) == n_base + 30
    target = tok.decode(ex[n_base].completion_ids)
    assert re.fullmatch(r"(\d+[+-]\d+=\d+\n){6}\\boxed\{\d+\}</s>", target)


def test_math_rows_against_hand_counted_answers() -> None:
    tok = build_char_tokenizer()
    cfg = EvaluationConfig(math_items=30, pass_items=10, pass_n=3, pass_k=(1, 3))
    ev = Evaluator(tok, TasksConfig(), cfg)
    items = math_test_split(TasksConfig().math, 30, TasksConfig().test_seed)
    prompts = [math_prompt_ids(tok, TasksConfig().math, it) for it in items]
    answer = items[0].answer
    done = sample_batched(AlwaysEngine(tok, f"steps\n\\boxed{{{answer}}}"), ev.requests("math", prompts, seed=0))
    rows = ev.rows("math", done, lambda t, j: score_math(t, items[j]))
    hits = [it.answer for it in items].count(answer)
    hits10 = [it.answer for it in items[:10]].count(answer)
    assert hits >= 1
    assert rows == [
        {"task": "math", "metric": "accuracy", "value": hits / 30, "n": 30},
        {"task": "math", "metric": "pass@1", "value": tol.approx64(hits10 / 10, ROUNDINGS), "n": 10},
        {"task": "math", "metric": "pass@3", "value": tol.approx64(hits10 / 10, ROUNDINGS), "n": 10},
    ]
