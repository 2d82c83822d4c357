"""Countdown and the micro prior skills: the study's task primitives (PROTOCOL.md §5).
Countdown generation, solving, verification and prompt text; the micro
"prior-skill" items that form the micro OOD suite (`distillab.tasks.skills`); and
`CountdownTask`, the Task protocol's implementation of every Countdown variant
(`registry.COUNTDOWN_VARIANTS`), registered here under each variant's name.

PROTOCOL.md §5. Everything is seeded and pure Python; model output is parsed
with a regular expression and checked with integer arithmetic, never `eval`.

    >>> spec = CountdownSpec.countdown3()
    >>> p = generate_problems(spec, n=2, seed=0)[0]
    >>> verify_countdown(render_solution(solve(p.operands, p.target)), p.operands, p.target)
    True
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Callable, Sequence

from distillab.config import PAPER_POOL, SMALL_POOL, EvaluationConfig, MicroModelConfig, SeedsConfig, TasksConfig
from distillab.config.tasks import task_entry
from distillab.registry import COUNTDOWN_TASKS
from distillab.tasks.base import Demonstrations, Task, recorded_offpd_exclusion, register
from distillab.tasks.taskio import render

OPS = ("+", "-", "*", "/")


@dataclass(frozen=True)
class CountdownSpec:
    """One Countdown variant: operand pool (drawn with replacement), operand count
    and the inclusive target range.

    Raises:
        ValueError: empty pool, n_operands < 2, or target_min > target_max.
    """

    name: str
    pool: tuple[int, ...]
    n_operands: int
    target_min: int
    target_max: int

    def __post_init__(self) -> None:
        if not self.pool or any(v <= 0 for v in self.pool):
            raise ValueError(f"{self.name}: pool must be non-empty positive integers, got {self.pool}")
        if self.n_operands < 2:
            raise ValueError(f"{self.name}: n_operands must be >= 2, got {self.n_operands}")
        if not 1 <= self.target_min <= self.target_max:
            raise ValueError(
                f"{self.name}: need 1 <= target_min <= target_max, got {self.target_min}..{self.target_max}"
            )

    @classmethod
    def countdown3(cls, target_max: int = 1000) -> "CountdownSpec":
        """Countdown-3: three operands from the paper's pool."""
        return cls("countdown3", PAPER_POOL, 3, 1, target_max)

    @classmethod
    def countdown4e(cls, target_max: int = 1000) -> "CountdownSpec":
        """Countdown-4E: four operands from 1..10 (harder generalisation test)."""
        return cls("countdown4e", SMALL_POOL, 4, 1, target_max)

    @classmethod
    def countdown4(cls) -> "CountdownSpec":
        """Countdown-4: four operands from the paper's pool, targets 1..10,000 (RLVR)."""
        return cls("countdown4", PAPER_POOL, 4, 1, 10_000)


@dataclass(frozen=True)
class CountdownProblem:
    """A Countdown instance: operands (with repeats) and the target."""

    operands: tuple[int, ...]
    target: int


Step = tuple[int, str, int, int]  # (left, op, right, result)


def apply_op(a: int, op: str, b: int) -> int | None:
    """Exact integer result of ``a op b``, or None when the step is not allowed
    (negative result, division by zero or inexact division)."""
    if op == "+":
        return a + b
    if op == "-":
        return a - b if a >= b else None
    if op == "*":
        return a * b
    if op == "/":
        if b == 0 or a % b:
            return None
        return a // b
    raise ValueError(f"op must be one of {OPS}, got {op!r}")


def generate_problems(spec: CountdownSpec, n: int, seed: int) -> list[CountdownProblem]:
    """Draw ``n`` random problems of ``spec`` (repeats possible, rare).

    Operands are drawn with replacement from ``spec.pool``; the target is the value
    of a random expression that combines all operands with +, −, ×, exact ÷
    (every intermediate a positive integer), kept if within the target range.
    Deterministic in ``seed``.
    """
    rng = random.Random(seed)
    out: list[CountdownProblem] = []
    while len(out) < n:
        operands = tuple(rng.choice(spec.pool) for _ in range(spec.n_operands))
        pool = list(operands)
        ok = True
        while len(pool) > 1:
            i, j = rng.sample(range(len(pool)), 2)
            a, b = pool[i], pool[j]
            r = apply_op(a, rng.choice(OPS), b)
            if r is None or r <= 0:
                ok = False
                break
            pool = [v for k, v in enumerate(pool) if k not in (i, j)] + [r]
        if ok and spec.target_min <= pool[0] <= spec.target_max:
            out.append(CountdownProblem(operands, pool[0]))
    return out


def solve(operands: Sequence[int], target: int) -> list[Step] | None:
    """Exhaustive depth-first solver: the first step sequence (in a canonical
    order: larger operand on the left, ops in ``+ - * /`` order) that combines
    every operand exactly once into ``target``, or None when none exists."""
    pool = tuple(sorted(operands, reverse=True))
    memo: dict[tuple[int, ...], list[Step] | None] = {}

    def rec(pool: tuple[int, ...]) -> list[Step] | None:
        if len(pool) == 1:
            return [] if pool[0] == target else None
        if pool in memo:
            return memo[pool]
        result = None
        for i in range(len(pool)):
            for j in range(len(pool)):
                if i == j or (pool[i] < pool[j]):
                    continue
                if pool[i] == pool[j] and i > j:
                    continue
                rest = [v for k, v in enumerate(pool) if k not in (i, j)]
                for op in OPS:
                    r = apply_op(pool[i], op, pool[j])
                    if r is None or r <= 0:
                        continue
                    sub = rec(tuple(sorted(rest + [r], reverse=True)))
                    if sub is not None:
                        result = [(pool[i], op, pool[j], r)] + sub
                        break
                if result is not None:
                    break
            if result is not None:
                break
        memo[pool] = result
        return result

    return rec(pool)


def render_solution(steps: Sequence[Step], spaced: bool = False) -> str:
    """Steps as the answer format: ``2+3=5,5*4=20``; ``spaced``: ``2 + 3 = 5, 5 * 4 = 20``
    (the styled teacher's answers; the verifier accepts both)."""
    if spaced:
        return ", ".join(f"{a} {op} {b} = {r}" for a, op, b, r in steps)
    return ",".join(f"{a}{op}{b}={r}" for a, op, b, r in steps)


_STEP_RE = re.compile(r"^\s*(\d{1,7})\s*([+\-*/])\s*(\d{1,7})\s*=\s*(\d{1,9})\s*$")
_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def extract_answer(text: str) -> str | None:
    """Content of the first ``<answer>…</answer>`` block of ``text``, or None."""
    m = _ANSWER_RE.search(text[:4096])
    return m.group(1).strip() if m else None


def verify_countdown(answer: str | None, operands: Sequence[int], target: int) -> bool:
    """The step-equation verifier (PROTOCOL.md §5).

    ``answer`` is comma-separated steps ``a op b = c``. Accepted iff every step
    parses, both its numbers are still in the pool (each operand usable once,
    step results join the pool), its arithmetic is exact and correct, and the pool
    ends as exactly ``[target]``. Anything else, including text that is not a
    step, is rejected; nothing is evaluated as code.
    """
    if answer is None:
        return False
    pool = list(operands)
    parts = answer.split(",")
    if len(parts) != len(pool) - 1:
        return False
    for part in parts:
        m = _STEP_RE.match(part)
        if m is None:
            return False
        a, op, b, c = int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4))
        for v in (a, b):
            if v not in pool:
                return False
            pool.remove(v)
        r = apply_op(a, op, b)
        if r is None or r != c:
            return False
        pool.append(c)
    return pool == [target]


def score_countdown(completion: str, problem: CountdownProblem) -> bool:
    """True iff the completion's ``<answer>`` passes :func:`verify_countdown`."""
    return verify_countdown(extract_answer(completion), problem.operands, problem.target)


# --------------------------------------------------------------------------------------
# Prior-skill tasks: what the micro student knows before distillation (the micro OOD suite)
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SkillItem:
    """One prior-skill example: the prompt text and its exact expected answer."""

    task: str
    prompt: str
    answer: str


def _add(rng: random.Random) -> SkillItem:
    a, b = rng.randint(1, 99), rng.randint(1, 99)
    return SkillItem("add", f"add {a} {b}", str(a + b))


def _mul(rng: random.Random) -> SkillItem:
    a, b = rng.choice(PAPER_POOL), rng.randint(1, 12)
    return SkillItem("mul", f"mul {a} {b}", str(a * b))


def _reverse(rng: random.Random) -> SkillItem:
    s = "".join(rng.choice("abcdefghij") for _ in range(rng.randint(3, 6)))
    return SkillItem("reverse", f"rev {s}", s[::-1])


def _sort(rng: random.Random) -> SkillItem:
    s = [rng.randint(0, 9) for _ in range(rng.randint(3, 6))]
    return SkillItem("sort", "sort " + "".join(map(str, s)), "".join(map(str, sorted(s))))


SKILLS: dict[str, Callable[[random.Random], SkillItem]] = {
    "add": _add,
    "mul": _mul,
    "reverse": _reverse,
    "sort": _sort,
}


#: The prior-skill tasks of the micro OOD suite.


def generate_skill_items(task: str, n: int, seed: int) -> list[SkillItem]:
    """``n`` seeded items of a prior-skill task.

    Raises:
        ValueError: unknown task (allowed: the keys of :data:`SKILLS`).
    """
    if task not in SKILLS:
        raise ValueError(f"skill task must be one of {sorted(SKILLS)}, got {task!r}")
    rng = random.Random(f"{task}:{seed}")
    return [SKILLS[task](rng) for _ in range(n)]


def score_skill(completion: str, item: SkillItem) -> bool:
    """Exact match of the ``<answer>`` content with the expected answer."""
    return extract_answer(completion) == item.answer


def countdown_user_text(problem: CountdownProblem, template: str, sort_operands: bool) -> str:
    """The task prompt of a Countdown problem from ``template`` (``{nums}``, ``{target}``)."""
    ops = sorted(problem.operands, reverse=True) if sort_operands else problem.operands
    return template.format(nums=" ".join(map(str, ops)), target=problem.target)


def skill_user_text(item: SkillItem) -> str:
    """The task prompt of a prior-skill item (the item's own prompt text)."""
    return item.prompt


# --------------------------------------------------------------------------------------
# The Task protocol's Countdown variants
# --------------------------------------------------------------------------------------

ProblemKey = tuple[tuple[int, ...], int]


def problem_key(problem: CountdownProblem) -> ProblemKey:
    """(sorted operands, target): the identity of a Countdown instance (a multiset and a target)."""
    return tuple(sorted(problem.operands)), problem.target


def countdown_spec(tasks: TasksConfig, name: str) -> CountdownSpec:
    """The `CountdownSpec` of task ``name`` in ``tasks``."""
    c = tasks[name]
    return CountdownSpec(name, tuple(c.pool), c.n_operands, c.target_min, c.target_max)


def countdown_test_split(tasks: TasksConfig, name: str, n: int) -> list[CountdownProblem]:
    """The fixed test split of a Countdown task (seeded by ``tasks.test_seed``:
    `config.SeedsConfig.test_split_seed`)."""
    return generate_problems(countdown_spec(tasks, name), n, SeedsConfig.test_split_seed(tasks.test_seed, name))


def test_keys(tasks: TasksConfig, n: int, names: tuple[str, ...]) -> set[ProblemKey]:
    """`problem_key` of the first ``n`` test items of each task in ``names``."""
    return {problem_key(p) for name in names for p in countdown_test_split(tasks, name, n)}


class CountdownTask(Task):
    """A Countdown variant (PROTOCOL.md §5) as a `Task`: its settings are ``tasks.<name>`` (a
    `config.CountdownTaskConfig`) and the shared prompt fields of ``tasks`` (``system_prompt``,
    ``user_template``, ``sort_operands``; the teacher's conditioning ``teacher_*``); the verifier is
    `score_countdown`; a demonstration is the solver's steps (`solve`, `render_solution`).

    Every variant's training items avoid the test items of every scored variant
    (``evaluation.countdown_tasks``): their keys (`problem_key`) compare across variants. A micro
    model's SFT data holds ``countdown_examples[name]`` demonstrations drawn with the stream of the
    variant's place in the sorted ``countdown_examples`` (`config.SeedsConfig.sft_seed`), and,
    for a variant with the ``styled`` stream (Countdown-3), ``styled_examples`` demonstrations under
    the teacher's conditioning prompt in the spaced style (the style-transfer experiment)."""

    sft_order = 0

    def __init__(self, name: str):
        super().__init__(task_entry(name))

    def test_items(self, tasks: TasksConfig, n: int) -> list[CountdownProblem]:
        """The first ``n`` problems of the variant's test split (`countdown_test_split`)."""
        return countdown_test_split(tasks, self.name, n)

    def train_items(self, tasks: TasksConfig, n: int, seed: int, exclude=()) -> list[CountdownProblem]:
        """``n`` problems drawn with ``seed`` (`generate_problems`), those whose `problem_key` is in
        ``exclude`` dropped."""
        exclude = exclude if isinstance(exclude, (set, frozenset)) else set(exclude)
        drawn = generate_problems(countdown_spec(tasks, self.name), n, seed)
        return [p for p in drawn if problem_key(p) not in exclude]

    def item_key(self, item: CountdownProblem) -> ProblemKey:
        """`problem_key`."""
        return problem_key(item)

    def system_prompt(self, tasks: TasksConfig, role: str = "student") -> str:
        """``tasks.system_prompt``; for the teacher ``tasks.teacher_system_prompt`` where set."""
        if role == "teacher" and tasks.teacher_system_prompt is not None:
            return tasks.teacher_system_prompt
        return tasks.system_prompt

    def user_text(self, tasks: TasksConfig, item: CountdownProblem, role: str = "student") -> str:
        """`countdown_user_text` with ``tasks.user_template`` (the teacher's ``teacher_user_template`` where set)."""
        template = tasks.teacher_user_template if role == "teacher" and tasks.teacher_user_template is not None \
            else tasks.user_template
        return countdown_user_text(item, template, tasks.sort_operands)

    def score(self, completion: str, item: CountdownProblem) -> bool:
        """`score_countdown`."""
        return score_countdown(completion, item)

    def demonstration(self, tasks: TasksConfig, item: CountdownProblem, spaced: bool = False) -> str:
        """``<answer>`` + the solver's steps (`solve`; ``spaced``: the styled teacher's format) + ``</answer>``."""
        return f"<answer>{render_solution(solve(item.operands, item.target), spaced=spaced)}</answer>"

    def eval_index(self, ev: EvaluationConfig) -> int:
        """The variant's place in ``evaluation.countdown_tasks``."""
        return list(ev.countdown_tasks).index(self.name)

    def exclusion(self, tasks: TasksConfig, ev: EvaluationConfig) -> set[ProblemKey]:
        """The keys of the first ``countdown_test_items`` test problems of every scored variant."""
        return test_keys(tasks, ev.countdown_test_items, tuple(ev.countdown_tasks))

    def exclusion_key(self, ev: EvaluationConfig) -> list:
        """``[countdown_test_items, countdown_tasks]``."""
        return [ev.countdown_test_items, list(ev.countdown_tasks)]

    def offpd_exclusion(self, ev: EvaluationConfig) -> list:
        """`base.recorded_offpd_exclusion` (the Countdown-3 domain's recorded key)."""
        return recorded_offpd_exclusion(ev)

    def sft_data(self, tasks: TasksConfig, ev: EvaluationConfig, mcfg: MicroModelConfig, prepare_seed: int,
                 role: str) -> list[Demonstrations]:
        """The variant's demonstrations, and the styled ones of a variant with the ``styled`` stream (class
        docstring)."""
        out, exclude = [], self.exclusion(tasks, ev)
        n = mcfg.countdown_examples.get(self.name, 0)
        if n:
            i = sorted(mcfg.countdown_examples).index(self.name)
            items = self.train_items(tasks, n, SeedsConfig.sft_seed(prepare_seed, i), exclude)
            out.append(Demonstrations((self.sft_order, self.name), [self.prompt(tasks, p) for p in items],
                                      [self.demonstration(tasks, p) for p in items]))
        if "styled" in self.entry.sft_streams and mcfg.styled_examples:
            items = self.train_items(tasks, mcfg.styled_examples, SeedsConfig.sft_seed(prepare_seed, "styled"), exclude)
            out.append(Demonstrations((self.sft_order + 1, "styled"), [self.prompt(tasks, p, "teacher") for p in items],
                                      [self.demonstration(tasks, p, spaced=True) for p in items]))
        return out


def countdown_prompt_ids(tokenizer, tasks: TasksConfig, problem: CountdownProblem, role: str = "student") -> list[int]:
    """Prompt token ids of a Countdown problem: the task's system prompt and user
    template (the teacher's conditioning for ``role="teacher"``), rendered with the
    tokenizer's chat template (`tasks.taskio.render`); the same for every variant.

    Raises:
        ValueError: ``role`` not "student" or "teacher".
    """
    return render(tokenizer, COUNTDOWN["countdown3"].prompt(tasks, problem, role))


#: The Countdown variants' tasks, registered under their names.
COUNTDOWN: dict[str, CountdownTask] = {name: register(CountdownTask(name)) for name in COUNTDOWN_TASKS}

__all__ = [
    "CountdownSpec",
    "CountdownProblem",
    "generate_problems",
    "solve",
    "render_solution",
    "extract_answer",
    "verify_countdown",
    "score_countdown",
    "countdown_user_text",
    "skill_user_text",
    "SkillItem",
    "SKILLS",
    "generate_skill_items",
    "score_skill",
    "apply_op",
    "ProblemKey",
    "problem_key",
    "countdown_spec",
    "countdown_test_split",
    "test_keys",
    "CountdownTask",
    "countdown_prompt_ids",
    "COUNTDOWN",
]
