"""Multiple-choice tasks (platform/mcq.py): loading local files through `datasets`
with the documented schema and a field mapping, named errors before use, and
option-letter extraction on malformed answers."""

from __future__ import annotations

from pathlib import Path

import pytest

from distillab.tasks.mcq import (
    MCQItem,
    extract_option_letter,
    generate_synthetic_mcq,
    load_mcq,
    mcq_user_text,
    score_mcq,
)

FIX = Path(__file__).parents[1] / "fixtures"
MEDMCQA = {"A": "opa", "B": "opb", "C": "opc", "D": "opd", "answer": "cop", "demonstration": "exp"}


def test_load_options_list_schema() -> None:
    items = load_mcq(FIX / "science_mini.jsonl")
    assert [it.answer for it in items] == ["B", "C", "D"]  # letter, lowercase letter, 0-based index
    assert items[0].options == ("Oxygen", "Carbon dioxide", "Nitrogen", "Helium")
    assert items[0].demonstration == "Photosynthesis fixes CO2 into sugars." and items[1].demonstration is None


def test_load_with_field_map_and_parquet(tmp_path) -> None:
    items = load_mcq(FIX / "medmcqa_style_mini.jsonl", field_map=MEDMCQA)
    assert [it.answer for it in items] == ["C", "B"]
    assert items[0].options[2] == "Vitamin C" and items[1].demonstration is None  # empty text → None
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"question": ["q"], "A": ["1"], "B": ["2"], "C": ["3"], "D": ["4"], "answer": ["d"]}),
                   tmp_path / "x.parquet")
    assert load_mcq(tmp_path / "x.parquet") == [MCQItem("q", ("1", "2", "3", "4"), "D")]


def test_load_errors_name_the_problem(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"row 1: answer 'E' is not one of A, B, C, D"):
        load_mcq(FIX / "mcq_bad_letter.jsonl")
    with pytest.raises(ValueError, match=r"missing column\(s\) 'answer'.*field_map"):
        load_mcq(FIX / "mcq_missing_column.jsonl")
    with pytest.raises(ValueError, match=r"missing column\(s\) 'answer' \(mapped to 'cop'\)|'A' \(mapped to 'opa'\)"):
        load_mcq(FIX / "science_mini.jsonl", field_map={"A": "opa", "B": "opb", "C": "opc", "D": "opd",
                                                         "options": "none", "answer": "cop"})
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ValueError, match="split 'train' .*is empty|empty"):
        load_mcq(tmp_path / "empty.jsonl")
    (tmp_path / "three.jsonl").write_text('{"question": "q", "options": ["a", "b", "c"], "answer": "A"}\n')
    with pytest.raises(ValueError, match="exactly 4 options"):
        load_mcq(tmp_path / "three.jsonl")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_mcq(tmp_path / "nope.jsonl")
    (tmp_path / "x.csv").write_text("question\n")
    with pytest.raises(ValueError, match="unsupported file type '.csv'"):
        load_mcq(tmp_path / "x.csv")


@pytest.mark.parametrize("text, letter", [
    ("<answer>B</answer>", "B"),
    ("<answer> b </answer>", "B"),  # lowercase counts
    ("<answer>(C)</answer>", "C"),
    ("<answer>D.</answer>", "D"),
    ("<answer>A) because the gas is CO2</answer>", "A"),  # extra text after the letter
    ("thinking... <answer>B</answer> done", "B"),
    ("B", None),  # missing tag
    ("<answer>B</answer><answer>C</answer>", None),  # two tags: ambiguous
    ("<answer>The answer is B</answer>", None),  # text before the letter
    ("<answer>E</answer>", None),
    ("<answer></answer>", None),
    ("<answer>BC</answer>", None),
    ("<answer>B", None),  # unclosed
])
def test_extract_option_letter(text, letter) -> None:
    assert extract_option_letter(text) == letter


def test_score_prompt_and_synthetic_task() -> None:
    items = generate_synthetic_mcq(200, seed=3)
    assert items == generate_synthetic_mcq(200, seed=3) and items != generate_synthetic_mcq(200, seed=4)
    for it in items:
        assert int(it.options["ABCD".index(it.answer)]) == max(int(o) for o in it.options)
        assert len(set(it.options)) == 4
    assert {it.answer for it in items} == {"A", "B", "C", "D"}
    it = items[0]
    assert score_mcq(f"<answer>{it.answer.lower()}</answer>", it)
    assert not score_mcq("<answer>" + next(x for x in "ABCD" if x != it.answer) + "</answer>", it)
    text = mcq_user_text(it)
    assert text.startswith("Which number is the largest?\nA. ") and "<answer></answer>" in text
    with pytest.raises(ValueError, match="n must be >= 1"):
        generate_synthetic_mcq(0, seed=0)
