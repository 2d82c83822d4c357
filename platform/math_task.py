"""The long-reasoning math task (PROTOCOL.md §5): MATH-style problems read from local
files, the final answer taken from the last ``\\boxed{…}``, and equivalence decided
symbolically by ``math-verify`` (sympy underneath: 1/2 = 0.5 = 2/4, √8 = 2√2,
[1, 3) ≠ (1, 3]). Model output is parsed, never evaluated as code.

File schema (JSONL or Parquet, read with ``datasets``): ``problem``, and either
``answer`` (the final answer, LaTeX) or ``solution`` (a worked solution whose last
``\\boxed{}`` is the answer); ``field_map`` renames other columns onto these.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from math_verify import parse, verify

from distillab.taskio import read_local_split


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


__all__ = ["MathItem", "extract_boxed", "math_equivalent", "score_math", "load_math"]
