"""The long-reasoning math task (PROTOCOL.md §5): MATH-style problems read from local
files, the final answer taken from the last ``\\boxed{…}``, and equivalence decided
symbolically by ``math-verify`` (sympy underneath: 1/2 = 0.5 = 2/4, √8 = 2√2,
[1, 3) ≠ (1, 3]). Model output is parsed, never evaluated as code.

File schema (JSONL or Parquet, read with ``datasets``): ``problem``, and either
``answer`` (the final answer, LaTeX) or ``solution`` (a worked solution whose last
``\\boxed{}`` is the answer); ``field_map`` renames other columns onto these.

The micro scale has no such files, so `generate_arithmetic_chains` writes a synthetic
task that a micro teacher learns in ``prepare``: a chain of two-digit additions and
subtractions, worked out one step per line with the answer boxed:

    prompt  47+28-15+63-19+31+12
    answer  47+28=75
            75-15=60
            60+63=123
            123-19=104
            104+31=135
            135+12=147
            \\boxed{147}

Every running total stays in [10, 999], so each line has at least 9 characters and a
chain of 6 steps (the default) is at least 6·9 + 10 = 64 characters: ≥ 60 tokens of the
character tokenizer. The same scorer (`score_math`) checks synthetic and file answers;
`math_test_split` / `math_train_items` / `math_prompt_ids` / `math_target_text` serve
both sources (``config.MathTaskConfig``).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from distillab.config import EvaluationConfig, SeedsConfig, TasksConfig
from distillab.config.tasks import task_entry
from distillab.tasks.base import Task, recorded_offpd_exclusion, register
from distillab.tasks.taskio import read_local_split, render_prompt


@dataclass(frozen=True)
class MathItem:
    """One problem, its final answer (LaTeX) and, if given, a worked solution."""

    problem: str
    answer: str
    solution: str | None = None


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{…}`` (or ``\\fbox{…}``) in ``text``, braces
    balanced (nested ``{}`` kept), stripped; None when there is none or it never
    closes."""
    best = None
    for macro in ("\\boxed{", "\\fbox{"):
        start = text.rfind(macro)
        if start != -1 and (best is None or start > best[0]):
            best = (start, start + len(macro))
    if best is None:
        return None
    depth, i = 1, best[1]
    while i < len(text):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[best[1] : i].strip()
        i += 1
    return None


def math_equivalent(pred: str, gold: str, *, timeout_s: int = 5) -> bool:
    """True iff the LaTeX answers ``pred`` and ``gold`` are mathematically equal
    (``math_verify.parse`` of each as ``$…$``, then ``math_verify.verify(gold, pred)``:
    numbers to 6 decimals after rounding, symbolic simplification, sets and
    intervals with their open/closed ends). ``timeout_s`` bounds parsing and
    verification (signal-based, so only in the main thread; elsewhere no bound).
    """
    from math_verify import parse, verify  # sympy underneath: 2 s of imports, paid by the first math score only

    t = timeout_s if threading.current_thread() is threading.main_thread() else None
    g = parse(f"${gold}$", parsing_timeout=t)
    p = parse(f"${pred}$", parsing_timeout=t)
    if not g or not p:
        return False
    return bool(verify(g, p, timeout_seconds=t))


def score_math(completion: str, item: MathItem) -> bool:
    """True iff the completion's last ``\\boxed{}`` is equivalent to the item's answer."""
    pred = extract_boxed(completion)
    return pred is not None and math_equivalent(pred, item.answer)


def load_math(path: str | Path, *, split: str = "test", field_map: Mapping[str, str] | None = None) -> list[MathItem]:
    """Read a local MATH-style file (``.jsonl``/``.json``/``.parquet``) with ``datasets``.

    Raises:
        FileNotFoundError: no such file.
        ValueError: unsupported extension; a missing ``problem`` column or neither
            ``answer`` nor ``solution`` (names the columns the file has); a row whose
            solution has no ``\\boxed{}`` and no answer; an empty split.
    """
    path = Path(path)
    ds = read_local_split(path, split, "math file")
    f = {**{k: k for k in ("problem", "answer", "solution")}, **(field_map or {})}
    cols = set(ds.column_names)
    if f["problem"] not in cols or not (f["answer"] in cols or f["solution"] in cols):
        raise ValueError(f"{path}: needs columns {f['problem']!r} and {f['answer']!r} or {f['solution']!r}; "
                         f"the file has {sorted(cols)} (map other names with field_map)")
    items = []
    for i, row in enumerate(ds):
        sol = row.get(f["solution"]) if f["solution"] in cols else None
        ans = row.get(f["answer"]) if f["answer"] in cols else None
        ans = str(ans).strip() if ans not in (None, "") else (extract_boxed(sol) if sol else None)
        if not ans:
            raise ValueError(f"{path} row {i}: no answer and no \\boxed{{}} in the solution")
        items.append(MathItem(str(row[f["problem"]]), ans, sol or None))
    return items


def generate_arithmetic_chains(n: int, seed: int, chain_length: int = 6) -> list[MathItem]:
    """``n`` seeded synthetic problems (module docstring): ``chain_length`` + 1 operands in
    10..99 joined by + or −, the operator forced where the running total would leave
    [10, 999]; the solution has one ``a±b=c`` line per step, then ``\\boxed{result}``.

    Raises:
        ValueError: ``n`` < 1 or ``chain_length`` < 1.
    """
    if n < 1 or chain_length < 1:
        raise ValueError(f"need n >= 1 and chain_length >= 1, got n={n}, chain_length={chain_length}")
    rng = random.Random(f"arith-chain:{seed}")
    items = []
    for _ in range(n):
        total = rng.randint(10, 99)
        problem, lines = str(total), []
        for _ in range(chain_length):
            b = rng.randint(10, 99)
            op = rng.choice("+-")
            if op == "-" and total - b < 10:
                op = "+"
            if op == "+" and total + b > 999:
                op = "-"
            new = total + b if op == "+" else total - b
            problem += f"{op}{b}"
            lines.append(f"{total}{op}{b}={new}")
            total = new
        items.append(MathItem(problem, str(total), "\n".join(lines) + f"\n\\boxed{{{total}}}"))
    return items


def math_test_split(cfg, n: int, test_seed: int) -> list[MathItem]:
    """The first ``n`` test problems of the math task ``cfg`` (a `config.MathTaskConfig`):
    synthetic ones seeded by ``test_seed``, or the test file's.

    Raises:
        ValueError: the test file has fewer than ``n`` rows (or the file errors of `load_math`).
    """
    if cfg.source == "synthetic":
        return generate_arithmetic_chains(n, SeedsConfig.test_split_seed(test_seed, "math"), cfg.chain_length)
    items = load_math(cfg.test_path, split="test", field_map=cfg.field_map)
    if len(items) < n:
        raise ValueError(f"{cfg.test_path}: {len(items)} test rows, evaluation needs {n} (lower math_items)")
    return items[:n]


def math_train_pool(cfg, seed: int) -> list[MathItem]:
    """Every training problem of ``cfg``: ``cfg.train_items`` synthetic ones seeded by ``seed``, or the train file's."""
    if cfg.source == "synthetic":
        return generate_arithmetic_chains(cfg.train_items, seed, cfg.chain_length)
    return load_math(cfg.train_path, split="train", field_map=cfg.field_map)


def _without(items: list[MathItem], exclude: set) -> list[MathItem]:
    out = [it for it in items if it.problem not in exclude]
    if not out:
        raise ValueError("math task: no training problem is left once the test items are excluded")
    return out


def math_train_items(cfg, exclude_test: int, test_seed: int, seed: int) -> list[MathItem]:
    """Training problems of ``cfg`` (`math_train_pool`) without the first ``exclude_test`` test
    problems (by problem text).

    Raises:
        ValueError: nothing left after the exclusion (or the file errors of `load_math`).
    """
    test = {it.problem for it in math_test_split(cfg, exclude_test, test_seed)} if exclude_test else set()
    return _without(math_train_pool(cfg, seed), test)


def math_prompt_ids(tokenizer, cfg, item: MathItem) -> list[int]:
    """Prompt token ids: ``cfg.system_prompt`` and the problem, rendered with the tokenizer's
    chat template (`tasks.taskio.render_prompt`)."""
    return render_prompt(tokenizer, cfg.system_prompt, item.problem)


def math_target_text(item: MathItem) -> str:
    """The SFT target of a problem: its worked solution (which ends in ``\\boxed{answer}``),
    or ``\\boxed{answer}`` alone when it has none."""
    return item.solution if item.solution else f"\\boxed{{{item.answer}}}"


class MathTask(Task):
    """Long-reasoning math as a `Task` (``trial.domain: math``): settings ``tasks.math`` (a
    `config.MathTaskConfig`), the problem as the user text under ``system_prompt``, the verifier
    `score_math` (the last ``\\boxed{}``, math-verify), the demonstration `math_target_text`;
    its training pool (`math_train_pool`) without its own test problems (by text)."""

    sft_order = 3

    def __init__(self):
        super().__init__(task_entry("math"))

    def test_items(self, tasks: TasksConfig, n: int) -> list[MathItem]:
        """`math_test_split`."""
        return math_test_split(self.settings(tasks), n, tasks.test_seed)

    def train_items(self, tasks: TasksConfig, n: int, seed: int, exclude: Iterable[Hashable] = ()) -> list[MathItem]:
        """The whole pool (`math_train_pool`; ``n`` unused) without ``exclude``."""
        return _without(math_train_pool(self.settings(tasks), seed), set(exclude))

    def pooled(self, tasks: TasksConfig) -> bool:
        """True: a synthetic pool of ``train_items``, or a file."""
        return True

    def item_key(self, item: MathItem) -> Hashable:
        """The problem text."""
        return item.problem

    def user_text(self, tasks: TasksConfig, item: MathItem, role: str = "student") -> str:
        """The problem."""
        return item.problem

    def score(self, completion: str, item: MathItem) -> bool:
        """`score_math`."""
        return score_math(completion, item)

    def demonstration(self, tasks: TasksConfig, item: MathItem) -> str:
        """`math_target_text`."""
        return math_target_text(item)

    def offpd_exclusion(self, ev: EvaluationConfig) -> list:
        """`base.recorded_offpd_exclusion` and the math test split's size (the math domain's recorded key)."""
        return recorded_offpd_exclusion(ev) + [ev.math_test_items]


#: The math task, registered as ``math``.
MATH_TASK = register(MathTask())

__all__ = ["MathItem", "extract_boxed", "math_equivalent", "score_math", "load_math", "generate_arithmetic_chains",
           "math_test_split", "math_train_pool", "math_train_items", "math_prompt_ids", "math_target_text",
           "MathTask", "MATH_TASK"]
