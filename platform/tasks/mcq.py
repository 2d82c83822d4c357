"""Multiple-choice tasks (PROTOCOL.md §5: Science, MedReason): loading local files,
rendering the prompt, extracting and scoring the option letter, a synthetic
multiple-choice task that micro models can learn, and `MCQTask` (the Task protocol's
implementation, registered as ``mcq``).

File schema (JSONL or Parquet, read with ``datasets``): one row per question with

- ``question``: the question text;
- the four options, either as ``options`` (a list of 4 strings) or as the columns
  ``A``, ``B``, ``C``, ``D``;
- ``answer``: the correct option letter, ``A``–``D`` (case-insensitive), or its
  0-based index 0–3;
- ``demonstration`` (optional): a worked solution, for teacher SFT.

``field_map`` renames other datasets' columns onto this schema, e.g. MedMCQA's
``{"question": "question", "A": "opa", "B": "opb", "C": "opc", "D": "opd",
"answer": "cop", "demonstration": "exp"}``. Nothing in a file is executed.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Hashable, Iterable
from typing import Mapping

from distillab.config import MCQ_INSTRUCTION, EvaluationConfig, SeedsConfig, TasksConfig
from distillab.config.tasks import task_entry
from distillab.tasks.base import Task, recorded_offpd_exclusion, register
from distillab.tasks.taskio import read_local_split, render_prompt

LETTERS = ("A", "B", "C", "D")


@dataclass(frozen=True)
class MCQItem:
    """One multiple-choice question: four options and the correct letter (A–D)."""

    question: str
    options: tuple[str, str, str, str]
    answer: str
    demonstration: str | None = None


def _letter(value, where: str) -> str:
    if isinstance(value, bool):
        value = None
    if isinstance(value, int) and 0 <= value <= 3:
        return LETTERS[value]
    if isinstance(value, str) and value.strip().upper() in LETTERS:
        return value.strip().upper()
    raise ValueError(f"{where}: answer {value!r} is not one of A, B, C, D (or 0-3)")


def load_mcq(path: str | Path, *, split: str = "train", field_map: Mapping[str, str] | None = None) -> list[MCQItem]:
    """Read a local multiple-choice file (``.jsonl``/``.json`` or ``.parquet``) with
    ``datasets`` and validate every row before anything uses it.

    Args:
        path: the file.
        split: the split name given to ``datasets`` (the file is that split).
        field_map: schema field → the file's column name, for the fields named
            differently (module docstring).

    Returns:
        The items in file order.

    Raises:
        FileNotFoundError: no such file.
        ValueError: unsupported extension; a missing column (names it, lists the
            file's columns and says to use ``field_map``); an answer outside A–D;
            an option that is empty or not 4 options; an empty split.
    """
    path = Path(path)
    ds = read_local_split(path, split, "multiple-choice file")
    fmap = {**{k: k for k in ("question", "options", "answer", "demonstration", *LETTERS)}, **(field_map or {})}
    cols = set(ds.column_names)
    uses_list = fmap["options"] in cols and not all(fmap[x] in cols for x in LETTERS)
    required = ["question", "answer"] + (["options"] if uses_list else list(LETTERS))
    missing = [f for f in required if fmap[f] not in cols]
    if missing:
        names = ", ".join(f"{f!r}" + (f" (mapped to {fmap[f]!r})" if fmap[f] != f else "") for f in missing)
        raise ValueError(
            f"{path}: missing column(s) {names}; the file has {sorted(cols)}. Give the options as 'options' "
            "(a list of 4) or as columns 'A'-'D', and map other names with field_map"
        )
    items = []
    for i, row in enumerate(ds):
        where = f"{path} row {i}"
        opts = row[fmap["options"]] if uses_list else [row[fmap[x]] for x in LETTERS]
        if not isinstance(opts, (list, tuple)) or len(opts) != 4:
            raise ValueError(f"{where}: needs exactly 4 options, got {opts!r}")
        if any(not isinstance(o, str) or not o.strip() for o in opts):
            raise ValueError(f"{where}: every option must be non-empty text, got {opts!r}")
        demo = row.get(fmap["demonstration"]) if fmap["demonstration"] in cols else None
        items.append(MCQItem(str(row[fmap["question"]]), tuple(str(o) for o in opts),  # type: ignore[arg-type]
                             _letter(row[fmap["answer"]], where), demo or None))
    return items


#: the answer-format line of the task prompt (PROTOCOL.md §5)


def mcq_user_text(item: MCQItem, instruction: str = MCQ_INSTRUCTION) -> str:
    """The task prompt: the question, the lettered options, and the answer-format
    ``instruction`` (a last line; none when empty)."""
    lines = [item.question] + [f"{k}. {o}" for k, o in zip(LETTERS, item.options)]
    return "\n".join(lines + ([instruction] if instruction else []))


_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_LETTER_RE = re.compile(r"^\(?([A-Da-d])\)?[.):]?(?:\s.*)?$", re.DOTALL)


def extract_option_letter(text: str) -> str | None:
    """The option letter of a completion, or None.

    Exactly one ``<answer>…</answer>`` block is required (none or several: None).
    Its stripped content must start with the letter, optionally in parentheses and
    followed by ``.``, ``)`` or ``:``, then nothing or whitespace and any text:
    ``B``, ``b``, ``(B)``, ``B.``, ``B) because …`` all give ``"B"``; ``E``,
    ``The answer is B`` and an empty block give None. Lowercase letters count.
    """
    blocks = _ANSWER_RE.findall(text[:8192])
    if len(blocks) != 1:
        return None
    m = _LETTER_RE.match(blocks[0].strip())
    return m.group(1).upper() if m else None


def score_mcq(completion: str, item: MCQItem) -> bool:
    """True iff the completion's option letter is the item's answer."""
    return extract_option_letter(completion) == item.answer


def generate_synthetic_mcq(n: int, seed: int) -> list[MCQItem]:
    """A multiple-choice task the micro models can learn (a second domain for the
    micro study): "Which number is the largest?" over four distinct integers 1..99,
    the correct letter uniform over A–D; seeded, so a split is reproducible.

    Raises:
        ValueError: ``n`` < 1.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    rng = random.Random(seed)
    items = []
    for _ in range(n):
        nums = rng.sample(range(1, 100), 4)
        items.append(MCQItem("Which number is the largest?", tuple(str(x) for x in nums),  # type: ignore[arg-type]
                             LETTERS[nums.index(max(nums))]))
    return items


def item_key(item: MCQItem) -> tuple[str, tuple[str, ...]]:
    """(question, options): the identity of a question, to keep test items out of training."""
    return item.question, tuple(item.options)


def mcq_test_split(cfg, n: int, test_seed: int) -> list[MCQItem]:
    """The first ``n`` test questions of the multiple-choice task ``cfg`` (a
    `config.MCQTaskConfig`): synthetic ones seeded by ``test_seed``, or the test file's.

    Raises:
        ValueError: the test file has fewer than ``n`` rows (or the file errors of `load_mcq`).
    """
    if cfg.source == "synthetic":
        return generate_synthetic_mcq(n, SeedsConfig.test_split_seed(test_seed, "mcq"))
    items = load_mcq(cfg.test_path, split="test", field_map=cfg.field_map)
    if len(items) < n:
        raise ValueError(f"{cfg.test_path}: {len(items)} test rows, evaluation needs {n} (lower mcq_items)")
    return items[:n]


def mcq_train_pool(cfg, seed: int) -> list[MCQItem]:
    """Every training question of ``cfg``: ``cfg.train_items`` synthetic ones seeded by ``seed``, or the
    train file's."""
    if cfg.source == "synthetic":
        return generate_synthetic_mcq(cfg.train_items, seed)
    return load_mcq(cfg.train_path, split="train", field_map=cfg.field_map)


def _without(items: list[MCQItem], exclude: set) -> list[MCQItem]:
    out = [it for it in items if item_key(it) not in exclude]
    if not out:
        raise ValueError("multiple-choice task: no training question is left once the test items are excluded")
    return out


def mcq_train_items(cfg, exclude_test: int, test_seed: int, seed: int) -> list[MCQItem]:
    """Training questions of ``cfg`` (`mcq_train_pool`), with the first ``exclude_test`` test questions removed.

    Raises:
        ValueError: nothing left after the exclusion (or the file errors of `load_mcq`).
    """
    test = {item_key(it) for it in mcq_test_split(cfg, exclude_test, test_seed)} if exclude_test else set()
    return _without(mcq_train_pool(cfg, seed), test)


def mcq_prompt_ids(tokenizer, cfg, item: MCQItem) -> list[int]:
    """Prompt token ids: ``cfg.system_prompt`` and `mcq_user_text` (with ``cfg.instruction``), rendered with the
    tokenizer's chat template (`tasks.taskio.render_prompt`)."""
    return render_prompt(tokenizer, cfg.system_prompt, mcq_user_text(item, cfg.instruction))


def mcq_target_text(item: MCQItem) -> str:
    """The SFT target of a question: ``<think>demonstration</think>`` when it has one
    (PROTOCOL.md §5), then ``<answer>LETTER</answer>``."""
    think = f"<think>{item.demonstration}</think>" if item.demonstration else ""
    return f"{think}<answer>{item.answer}</answer>"


class MCQTask(Task):
    """Multiple choice as a `Task` (``trial.domain: mcq``): settings ``tasks.mcq`` (a
    `config.MCQTaskConfig`), the prompt `mcq_user_text` under ``system_prompt``, the verifier
    `score_mcq`, the demonstration `mcq_target_text`; its training pool (`mcq_train_pool`)
    without its own test questions (`item_key`)."""

    sft_order = 2

    def __init__(self):
        super().__init__(task_entry("mcq"))

    def test_items(self, tasks: TasksConfig, n: int) -> list[MCQItem]:
        """`mcq_test_split`."""
        return mcq_test_split(self.settings(tasks), n, tasks.test_seed)

    def train_items(self, tasks: TasksConfig, n: int, seed: int, exclude: Iterable[Hashable] = ()) -> list[MCQItem]:
        """The whole pool (`mcq_train_pool`; ``n`` unused) without ``exclude``."""
        return _without(mcq_train_pool(self.settings(tasks), seed), set(exclude))

    def pooled(self, tasks: TasksConfig) -> bool:
        """True: a synthetic pool of ``train_items``, or a file."""
        return True

    def item_key(self, item: MCQItem) -> Hashable:
        """`item_key`: (question, options)."""
        return item_key(item)

    def user_text(self, tasks: TasksConfig, item: MCQItem, role: str = "student") -> str:
        """`mcq_user_text` with ``tasks.mcq.instruction``."""
        return mcq_user_text(item, self.settings(tasks).instruction)

    def score(self, completion: str, item: MCQItem) -> bool:
        """`score_mcq`."""
        return score_mcq(completion, item)

    def demonstration(self, tasks: TasksConfig, item: MCQItem) -> str:
        """`mcq_target_text`."""
        return mcq_target_text(item)

    def offpd_exclusion(self, ev: EvaluationConfig) -> list:
        """`base.recorded_offpd_exclusion` (the recorded key of the multiple-choice domain)."""
        return recorded_offpd_exclusion(ev)


#: The multiple-choice task, registered as ``mcq``.
MCQ_TASK = register(MCQTask())

__all__ = ["MCQItem", "LETTERS", "load_mcq", "mcq_user_text", "extract_option_letter", "score_mcq",
           "generate_synthetic_mcq", "item_key", "mcq_test_split", "mcq_train_pool", "mcq_train_items",
           "mcq_prompt_ids", "mcq_target_text", "MCQTask", "MCQ_TASK"]
