"""Your own data as a task: prompts and reference answers read from local files, scored by a
named verifier. Registered as task ``files`` (``trial.domain: files``, section ``trial.tasks.files``,
evaluation rows ``files/accuracy`` and ``files/pass@k``).

The files (``train_path``, ``test_path``): JSONL (``.jsonl``/``.json``), Parquet, or a directory
written by ``datasets``' ``save_to_disk`` (a ``DatasetDict``'s ``train`` / ``test`` split); one row
per item with

- ``prompt``: the user turn, as the model sees it (``instruction``, if set, is a last line after it);
- ``answer``: the reference answer (text; a number for ``numeric``; the target for ``countdown``);
- ``operands`` (``countdown`` only): the numbers, a list of integers;
- ``demonstration`` (optional): a micro model's SFT target, the whole answer text (default: the
  reference in the verifier's format, below);

``field_map`` maps these names onto other column names. Nothing in a file is executed.

The verifiers (``verifier``), each reading model output as untrusted text (parsed, never run):

- ``exact``: the content of the first ``<answer>…</answer>`` equals the reference (both stripped);
- ``numeric``: that content and the reference are numbers (``1,024``, ``-3.5``, ``7/2``) equal to
  a relative 1e-6 (absolute 1e-9 near zero);
- ``countdown``: that content is a valid Countdown solution (`countdown.verify_countdown`) of the
  row's ``operands`` and target ``answer``;
- ``math``: the last ``\\boxed{…}`` is mathematically equal to the reference (math-verify,
  `math_task.math_equivalent`).

A test item's identity is its prompt: training rows with a test prompt are dropped. The test split
is the first ``evaluation.task_items.files`` (or ``pass_items``) rows of ``test_path``; the training
items are every row of ``train_path`` (a micro teacher's ``task_examples.files`` demonstrations
are the first rows). A second file task is one more ``register(FileTask(...))`` with its own name,
domain and SFT stream.

    trial:
      domain: files
      tasks: {files: {train_path: data/train.jsonl, test_path: data/test.jsonl, verifier: numeric}}
      evaluation: {task_items: {files: 100}}
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal

from pydantic import model_validator

from distillab.config import TaskEntry, TaskSettings, TasksConfig
from distillab.tasks.base import Task, register
from distillab.tasks.countdown import extract_answer, render_solution, solve, verify_countdown
from distillab.tasks.math_task import extract_boxed, math_equivalent
from distillab.tasks.taskio import read_local_split

__all__ = ["FileTaskConfig", "FileItem", "load_items", "parse_number", "numbers_equal", "VERIFIER_NAMES", "VERIFIERS",
           "score_with", "FileTask", "needs_test_file", "FILES_TASK"]

#: The verifiers' names (`VERIFIERS` maps each to its function).
VERIFIER_NAMES = ("exact", "numeric", "countdown", "math")


class FileTaskConfig(TaskSettings):
    """Your own data (`distillab.tasks.files`): prompts and reference answers in local JSONL,
    Parquet or ``datasets`` directories, scored by the verifier ``verifier``."""

    #: the training rows (JSONL, Parquet, or a datasets directory; a relative path is read from the directory
    #: the sweep is started in); null: none (a task only scored)
    train_path: str | None = None
    #: the test rows (same formats); needed to score the task or distil on it; at least as many rows as the
    #: evaluation reads (``evaluation.task_items.files``, ``pass_items``), checked before anything starts
    test_path: str | None = None
    #: the files' column names for the schema's (``prompt``, ``answer``, ``operands``, ``demonstration``)
    field_map: dict[str, str] = {}
    #: how a completion is scored, from the first ``<answer>…</answer>`` of the completion: ``exact`` (equal to the
    #: reference, both stripped), ``numeric`` (equal numbers, ``1,024``, ``7/2``, to a relative 1e-6), ``countdown`` (a
    #: valid solution of the row's ``operands`` reaching ``answer``); or ``math``: the last ``\boxed{…}`` equal to the
    #: reference by math-verify
    verifier: Literal[VERIFIER_NAMES] = "exact"
    #: the system prompt ("" for none)
    system_prompt: str = ""
    #: a last line after each prompt, e.g. the answer format ("" for none)
    instruction: str = ""

    @model_validator(mode="after")
    def _fields(self) -> "FileTaskConfig":
        unknown = sorted(set(self.field_map) - {"prompt", "answer", "operands", "demonstration"})
        if unknown:
            raise ValueError(f"field_map keys {unknown} are no schema fields; allowed: prompt, answer, operands, "
                             "demonstration")
        return self


@dataclass(frozen=True)
class FileItem:
    """One row: the prompt, the reference answer, the Countdown operands (``countdown``), the
    verifier that scores it (the task's ``verifier``) and an optional SFT demonstration."""

    prompt: str
    answer: str
    operands: tuple[int, ...] = ()
    verifier: str = "exact"
    demonstration: str | None = field(default=None, compare=False)


def _operands(value: Any, where: str) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)) or len(value) < 2 or not all(
            isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value):
        raise ValueError(f"{where}: operands must be a list of at least two positive integers, got {value!r}")
    return tuple(value)


def load_items(path: str | Path, split: str, cfg: FileTaskConfig) -> list[FileItem]:
    """The rows of ``path`` (`taskio.read_local_split`: a file, or a datasets directory's split
    ``split``) as `FileItem` s, every row checked before anything uses it.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a missing column (names it, the file's columns and ``field_map``); an empty
            prompt or answer; for ``countdown`` bad operands or a target that is no positive integer."""
    ds = read_local_split(path, split, f"tasks.files.{split}_path")
    f = {k: cfg.field_map.get(k, k) for k in ("prompt", "answer", "operands", "demonstration")}
    need = ["prompt", "answer"] + (["operands"] if cfg.verifier == "countdown" else [])
    missing = [k for k in need if f[k] not in ds.column_names]
    if missing:
        raise ValueError(f"{path}: missing column(s) {[f[k] for k in missing]} (schema {missing}); the file has "
                         f"{sorted(ds.column_names)}: map them with tasks.files.field_map")
    items = []
    for i, row in enumerate(ds):
        where, prompt, answer = f"{path} row {i}", str(row[f["prompt"]] or ""), str(row[f["answer"]] or "").strip()
        if not prompt.strip() or not answer:
            raise ValueError(f"{where}: empty prompt or answer")
        ops = ()
        if cfg.verifier == "countdown":
            ops = _operands(row[f["operands"]], where)
            if not answer.isdigit() or int(answer) < 1:
                raise ValueError(f"{where}: the countdown target (answer) must be a positive integer, got {answer!r}")
        demo = row.get(f["demonstration"]) if f["demonstration"] in ds.column_names else None
        items.append(FileItem(prompt, answer, ops, cfg.verifier, demo or None))
    return items


def parse_number(text: str | None) -> Fraction | float | None:
    """``text`` as a number: ``1,024`` → 1024, ``-3.5``, ``7/2`` (a `Fraction`), ``1e-3`` (a float); None when it is none."""
    if text is None:
        return None
    t = text.strip().replace(",", "")
    try:
        return Fraction(t)
    except (ValueError, ZeroDivisionError):
        try:
            return float(t)
        except ValueError:
            return None


def numbers_equal(pred: str | None, ref: str) -> bool:
    """Whether ``pred`` and ``ref`` are numbers equal to a relative 1e-6 (absolute 1e-9 near zero)."""
    a, b = parse_number(pred), parse_number(ref)
    if a is None or b is None or not math.isfinite(float(a)) or not math.isfinite(float(b)):
        return False
    return math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=1e-9)


class FileTask(Task):
    """The file-backed task (module docstring): settings `FileTaskConfig`, items `FileItem`."""

    sft_order = 4

    def test_items(self, tasks: TasksConfig, n: int) -> list[FileItem]:
        """The first ``n`` rows of ``test_path``.

        Raises:
            ValueError: no ``test_path``, or fewer rows than ``n`` (names the field to lower)."""
        cfg = self.settings(tasks)
        if cfg.test_path is None:
            raise ValueError(f"trial.tasks.{self.entry.key}.test_path is not set")
        items = load_items(cfg.test_path, "test", cfg)
        if len(items) < n:
            raise ValueError(f"{cfg.test_path}: {len(items)} test rows, evaluation needs {n} "
                             f"(lower {self.entry.items_field} or evaluation.pass_items)")
        return items[:n]

    def train_items(self, tasks: TasksConfig, n: int, seed: int, exclude: Iterable[Hashable] = ()) -> list[FileItem]:
        """Every row of ``train_path`` (``n`` and ``seed`` unused: the file's order) whose prompt is not in ``exclude``.

        Raises:
            ValueError: no ``train_path``, or no row left."""
        cfg, exclude = self.settings(tasks), set(exclude)
        if cfg.train_path is None:
            raise ValueError(f"trial.tasks.{self.entry.key}.train_path is not set (the task is trained on)")
        out = [it for it in load_items(cfg.train_path, "train", cfg) if it.prompt not in exclude]
        if not out:
            raise ValueError(f"{cfg.train_path}: no training row is left once the test prompts are excluded")
        return out

    def pooled(self, tasks: TasksConfig) -> bool:
        """True: the training file is the pool."""
        return True

    def item_key(self, item: FileItem) -> Hashable:
        """The prompt."""
        return item.prompt

    def user_text(self, tasks: TasksConfig, item: FileItem, role: str = "student") -> str:
        """The prompt, then ``instruction`` on a last line when set."""
        instruction = self.settings(tasks).instruction
        return f"{item.prompt}\n{instruction}" if instruction else item.prompt

    def score(self, completion: str, item: FileItem) -> bool:
        """`score_with` the item's verifier."""
        return score_with(item.verifier, completion, item)

    def demonstration(self, tasks: TasksConfig, item: FileItem) -> str:
        """The row's ``demonstration``, else the reference in the verifier's format: ``\\boxed{answer}``
        (``math``), the solver's steps in ``<answer>`` (``countdown``), ``<answer>answer</answer>`` (others).

        Raises:
            ValueError: a ``countdown`` row whose operands cannot reach the target."""
        if item.demonstration:
            return item.demonstration
        if item.verifier == "math":
            return f"\\boxed{{{item.answer}}}"
        if item.verifier == "countdown":
            steps = solve(item.operands, int(item.answer))
            if steps is None:
                raise ValueError(f"countdown row {item.prompt!r}: no solution reaches {item.answer}; give a "
                                 "demonstration column or drop the row")
            return f"<answer>{render_solution(steps)}</answer>"
        return f"<answer>{item.answer}</answer>"


def _exact(completion: str, item: FileItem) -> bool:
    got = extract_answer(completion)
    return got is not None and got.strip() == item.answer.strip()


def _math(completion: str, item: FileItem) -> bool:
    pred = extract_boxed(completion)
    return pred is not None and math_equivalent(pred, item.answer)


#: The verifiers a file task can name (module docstring): ``(completion, item) -> correct``.
VERIFIERS: dict[str, Callable[[str, FileItem], bool]] = {
    "exact": _exact,
    "numeric": lambda completion, item: numbers_equal(extract_answer(completion), item.answer),
    "countdown": lambda completion, item: verify_countdown(extract_answer(completion), item.operands,
                                                           int(item.answer)),
    "math": _math,
}


def score_with(verifier: str, completion: str, item: FileItem) -> bool:
    """Whether ``completion`` answers ``item`` under ``verifier`` (`VERIFIERS`; module docstring).

    Raises:
        ValueError: an unknown verifier (names the allowed ones)."""
    if verifier not in VERIFIERS:
        raise ValueError(f"unknown verifier {verifier!r}; allowed: {', '.join(VERIFIERS)}")
    return VERIFIERS[verifier](completion, item)


def needs_test_file(key: str) -> Callable[[FileTaskConfig], None]:
    """The entry's ``check`` of a file task under ``trial.tasks.<key>``: a test file to score it or distil on it."""
    def check(cfg: FileTaskConfig) -> None:
        if cfg.test_path is None:
            raise ValueError(f"tasks.{key}.test_path is needed to score task {key!r} or distil on it")
    return check


#: The file-backed task, registered as ``files``.
FILES_TASK = register(FileTask(TaskEntry("files", FileTaskConfig, domain="files", sft_streams={"files": 37},
                                         check=needs_test_file("files"))))
