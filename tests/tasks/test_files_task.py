"""Your own data as a task (`distillab.tasks.files`, registered as ``files``): rows read from JSONL,
Parquet and ``datasets`` directories alike, the columns mapped and checked, each named verifier
against hand-worked answers, and the example sweep (search_spaces/micro_own_data.yaml with
search_spaces/data/sums/) through the config, the task data and a micro teacher's SFT data."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from distillab.config import TrialConfig, load_sweep
from distillab.models import build_char_tokenizer
from distillab.tasks.data import TaskData
from distillab.tasks.files import FileItem, FileTaskConfig, load_items, numbers_equal, score_with
from distillab.tasks.registry import get
from distillab.tasks.taskio import render

REPO = Path(__file__).resolve().parents[2]
SUMS = REPO / "search_spaces" / "data" / "sums"
ROWS = [{"question": "3 5 2 -> 16", "gold": 16, "nums": [3, 5, 2]},
        {"question": "4 4 -> 1", "gold": 1, "nums": [4, 4], "demonstration": "<answer>4/4=1</answer>"}]
MAP = {"prompt": "question", "answer": "gold", "operands": "nums"}


def _files(tmp_path: Path) -> dict[str, Path]:
    """``ROWS`` as a JSONL file, a Parquet file, a saved Dataset and a saved DatasetDict (split ``test``)."""
    from datasets import Dataset, DatasetDict

    out = {"jsonl": tmp_path / "rows.jsonl", "parquet": tmp_path / "rows.parquet", "dataset": tmp_path / "ds",
           "dict": tmp_path / "dd"}
    out["jsonl"].write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    table = pa.Table.from_pylist([{**r, "demonstration": r.get("demonstration")} for r in ROWS])
    pq.write_table(table, out["parquet"])
    Dataset.from_list([{**r, "demonstration": r.get("demonstration")} for r in ROWS]).save_to_disk(str(out["dataset"]))
    DatasetDict({"test": Dataset.from_list([{**r, "demonstration": r.get("demonstration")} for r in ROWS])}
                ).save_to_disk(str(out["dict"]))
    return out


def test_every_format_gives_the_same_items(tmp_path) -> None:
    cfg = FileTaskConfig(field_map=MAP, verifier="countdown")
    want = [FileItem("3 5 2 -> 16", "16", (3, 5, 2), "countdown"),
            FileItem("4 4 -> 1", "1", (4, 4), "countdown", "<answer>4/4=1</answer>")]
    for kind, path in _files(tmp_path).items():
        got = load_items(path, "test", cfg)
        assert got == want and [it.demonstration for it in got] == [None, "<answer>4/4=1</answer>"], kind
    with pytest.raises(ValueError, match=r"no split 'train'; it has \['test'\]"):
        load_items(tmp_path / "dd", "train", cfg)


def test_bad_files_are_errors_naming_the_column(tmp_path) -> None:
    path = _files(tmp_path)["jsonl"]
    with pytest.raises(ValueError, match=r"missing column\(s\) \['prompt', 'answer'\].*field_map"):
        load_items(path, "test", FileTaskConfig())
    with pytest.raises(ValueError, match=r"missing column\(s\) \['operands'\]"):
        load_items(path, "test", FileTaskConfig(field_map={"prompt": "question", "answer": "gold"},
                                                verifier="countdown"))
    with pytest.raises(ValidationError, match=r"field_map keys \['target'\] are no schema fields"):
        FileTaskConfig(field_map={"target": "gold"})
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "x", "gold": 3, "nums": [2, "a"]}) + "\n")
    with pytest.raises(ValueError, match=r"row 0: operands must be a list of at least two positive integers"):
        load_items(bad, "test", FileTaskConfig(field_map=MAP, verifier="countdown"))
    with pytest.raises(FileNotFoundError, match="tasks.files.test_path"):
        load_items(tmp_path / "none.jsonl", "test", FileTaskConfig())


def test_the_verifiers_against_hand_worked_answers() -> None:
    word, num, frac = FileItem("capital?", "Paris"), FileItem("2^10?", "1024"), FileItem("7/2?", "7/2")
    assert score_with("exact", "so <answer> Paris </answer>", word)
    assert not score_with("exact", "<answer>paris</answer>", word) and not score_with("exact", "Paris", word)
    assert score_with("numeric", "<answer>1,024</answer>", num) and score_with("numeric", "<answer>1024.0</answer>", num)
    assert score_with("numeric", "<answer>3.5</answer>", frac) and not score_with("numeric", "<answer>3.6</answer>", frac)
    assert numbers_equal("0.1", "0.1000001") and not numbers_equal("0.1", "0.1001")  # relative 1e-6
    assert numbers_equal("1e-12", "0") and not numbers_equal("nan", "nan") and not numbers_equal("abc", "1")
    cd = FileItem("3 5 2 -> 16", "16", (3, 5, 2))
    assert score_with("countdown", "<answer>3+5=8,8*2=16</answer>", cd)
    assert not score_with("countdown", "<answer>3*5=15,15+2=17</answer>", cd)
    assert score_with("math", "so \\boxed{\\frac{1}{2}}", FileItem("half?", "0.5"))
    assert not score_with("math", "\\boxed{2}", FileItem("half?", "0.5"))
    with pytest.raises(ValueError, match="unknown verifier 'fuzzy'; allowed: exact, numeric, countdown, math"):
        score_with("fuzzy", "", word)


def _trial(**tasks) -> TrialConfig:
    files = {"train_path": str(SUMS / "train.jsonl"), "test_path": str(SUMS / "test.jsonl"), "verifier": "numeric",
             **tasks}
    return TrialConfig(domain="files", tasks={"files": files}, evaluation={"task_items": {"files": 10}})


def test_the_example_data_through_the_protocol() -> None:
    trial, task, tok = _trial(), get("files"), build_char_tokenizer()
    data = TaskData.of(trial)
    test = data.test_split("files")
    assert len(test) == 100 and test[0] == FileItem("59 + 63 =", "122", (), "numeric")  # max(10, pass_items 100)
    train = data.train_problems("files", 0, 0)
    assert len(train) == 400 and not {t.prompt for t in train} & {t.prompt for t in test}
    prompts = data.train_prompts(tok, rank=0)
    assert len(prompts) == 400 and sorted(map(tuple, prompts)) == sorted(  # the training rows, shuffled
        tuple(render(tok, task.prompt(trial.tasks, t))) for t in train)
    for it in test[:5]:
        demo = task.demonstration(trial.tasks, it)
        assert demo == f"<answer>{it.answer}</answer>" and task.score(demo, it)
        assert int(it.answer) == sum(map(int, it.prompt.removesuffix(" =").split(" + ")))
    with_line = _trial(instruction="Answer inside <answer></answer>.")
    assert task.user_text(with_line.tasks, test[0]) == "59 + 63 =\nAnswer inside <answer></answer>."
    assert task.demonstration(_trial(verifier="math").tasks, FileItem("q", "122", (), "math")) == "\\boxed{122}"
    with pytest.raises(ValidationError, match="tasks.files.test_path is needed to score task 'files'"):
        TrialConfig(domain="files", evaluation={"task_items": {"files": 3}})


def test_the_example_sweep_validates_and_its_teacher_learns_the_rows() -> None:
    from distillab.recipe.prepare import _examples, prepare_key

    sweep = load_sweep(REPO / "search_spaces" / "micro_own_data.yaml")
    micro = load_sweep(REPO / "search_spaces" / "micro.yaml")
    assert sweep.trial.domain == "files" and len(sweep.trials) == 4
    assert prepare_key(sweep, "student") == prepare_key(micro, "student") != prepare_key(micro, "teacher")
    tok = build_char_tokenizer()
    ex = _examples(tok, sweep, "teacher", 0)
    train = [json.loads(line) for line in (SUMS / "train.jsonl").read_text().splitlines()]
    assert len(ex) == 400
    assert [tok.decode(e.completion_ids) for e in ex] == [f"<answer>{r['answer']}</answer></s>" for r in train]
    assert tok.decode(ex[0].prompt_ids).count(train[0]["prompt"]) == 1


def test_a_relative_file_path_is_read_from_where_the_sweep_started(tmp_path, monkeypatch) -> None:
    """A trial runs in Ray's working directory, not the sweep's: a relative ``test_path`` is read from
    the directory in `taskio.LAUNCH_DIR_ENV` (which `driver.raystart` gives every worker), else from
    the working directory; a missing one says where it looked."""
    from distillab.tasks.taskio import LAUNCH_DIR_ENV

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    cfg = FileTaskConfig(field_map=MAP, verifier="countdown")
    elsewhere = tmp_path / "ray_session"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setenv(LAUNCH_DIR_ENV, str(tmp_path))
    assert [it.answer for it in load_items("data/rows.jsonl", "test", cfg)] == ["16", "1"]
    monkeypatch.delenv(LAUNCH_DIR_ENV)
    with pytest.raises(FileNotFoundError, match=rf"tasks.files.test_path data/rows.jsonl does not exist \(a relative "
                                                rf"path is read from {elsewhere}/data\)"):
        load_items("data/rows.jsonl", "test", cfg)
    monkeypatch.chdir(tmp_path)
    assert len(load_items("data/rows.jsonl", "test", cfg)) == 2


def test_a_test_file_shorter_than_the_evaluation_is_refused_before_anything_starts(tmp_path) -> None:
    """The example sweep with a test file of 24 rows: its evaluation reads 100 (pass_items), so the
    checks every run and dry run make first (`plan.check_task_data`) refuse it, naming the file, its rows
    and the fields to lower; with ``evaluation.pass_items`` and ``task_items.files`` at 24 it passes, and the dry run
    plans from those 24 rows (fewer than its usual 32-prompt sample)."""
    from distillab.config import ConfigError
    from distillab.driver.plan import check_task_data, dry_run

    rows = (SUMS / "test.jsonl").read_text().splitlines()[:24]
    (tmp_path / "test.jsonl").write_text("\n".join(rows) + "\n")
    sets = {"trial.tasks.files.test_path": str(tmp_path / "test.jsonl"), "storage_path": str(tmp_path / "runs")}
    sweep = load_sweep(REPO / "search_spaces" / "micro_own_data.yaml", sets)
    with pytest.raises(ConfigError, match=rf"trial.tasks.files: {tmp_path}/test.jsonl: 24 test rows, evaluation "
                                          r"needs 100 \(lower evaluation.task_items.files or evaluation.pass_items\)"):
        check_task_data(sweep)
    with pytest.raises(ConfigError, match="24 test rows, evaluation needs 100"):
        dry_run(sweep)
    fits = load_sweep(REPO / "search_spaces" / "micro_own_data.yaml",
                      {**sets, "trial.evaluation.pass_items": 24, "trial.evaluation.task_items.files": 24})
    check_task_data(fits)
    text, _ = dry_run(fits)
    assert "trials: 4" in text
