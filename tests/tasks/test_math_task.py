"""The long-reasoning math task (platform/math_task.py): boxed-answer extraction,
symbolic equivalence through math-verify on hand-chosen pairs, and the loader."""

from __future__ import annotations

from pathlib import Path

import pytest

from distillab.tasks.math_task import MathItem, extract_boxed, load_math, math_equivalent, score_math

FIX = Path(__file__).parents[1] / "fixtures"


@pytest.mark.parametrize("text, boxed", [
    (r"so the answer is $\boxed{\frac{1}{2}}$.", r"\frac{1}{2}"),
    (r"\boxed{1} then corrected: \boxed{ 2\sqrt{3} }", r"2\sqrt{3}"),  # the last one, stripped
    (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),
    (r"\fbox{7}", "7"),
    (r"\boxed{\frac{1}{2}", None),  # never closes
    ("no box here: 1/2", None),
])
def test_extract_boxed(text, boxed) -> None:
    assert extract_boxed(text) == boxed


@pytest.mark.parametrize("pred, gold, equal", [
    ("0.5", r"\frac{1}{2}", True),  # fraction = decimal
    (r"\frac{2}{4}", r"\frac{1}{2}", True),  # unreduced fraction
    (r"\tfrac34", r"\dfrac{3}{4}", True),
    ("0.33", r"\frac{1}{3}", False),  # a rounded decimal is not the fraction
    (r"2\sqrt{2}", r"\sqrt{8}", True),  # surds
    (r"\frac{1}{\sqrt{3}}", r"\frac{\sqrt{3}}{3}", True),  # rationalised denominator
    ("1.414", r"\sqrt{2}", False),
    ("[1,3)", "[1, 3)", True),  # intervals
    ("(1, 3]", "[1, 3)", False),  # open/closed ends matter
    (r"(-\infty,2]", r"(-\infty, 2]", True),
])
def test_math_equivalent_pairs(pred, gold, equal) -> None:
    assert math_equivalent(pred, gold) is equal


def test_score_and_load() -> None:
    items = load_math(FIX / "math_mini.jsonl")
    assert [it.answer for it in items] == [r"\frac{1}{2}", "(-2, 2)", r"2\sqrt{3}"]  # from \boxed{} where no answer
    assert items[1].solution is None
    assert score_math(r"... hence $\boxed{0.5}$", items[0])
    assert score_math(r"$\boxed{\sqrt{12}}$", items[2])
    assert not score_math(r"$\boxed{(-2, 2]}$", items[1])
    assert not score_math("the answer is 0.5", items[0])  # no box, no credit
    assert not score_math(r"\boxed{__import__('os').system('true')}", MathItem("p", "1"))


def test_load_errors(tmp_path) -> None:
    (tmp_path / "a.jsonl").write_text('{"question": "q", "answer": "1"}\n')
    with pytest.raises(ValueError, match="needs columns 'problem'.*the file has \\['answer', 'question'\\]"):
        load_math(tmp_path / "a.jsonl")
    assert load_math(tmp_path / "a.jsonl", field_map={"problem": "question"}) == [MathItem("q", "1")]
    (tmp_path / "b.jsonl").write_text('{"problem": "q", "solution": "no box"}\n')
    with pytest.raises(ValueError, match=r"row 0: no answer and no \\boxed"):
        load_math(tmp_path / "b.jsonl")
    (tmp_path / "c.jsonl").write_text("")
    with pytest.raises(ValueError, match="is empty"):
        load_math(tmp_path / "c.jsonl")
