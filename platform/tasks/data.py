"""Task data of a trial (PROTOCOL.md §5): what the models are trained and scored on.

`TaskData` is built from a trial's ``tasks`` and ``evaluation`` sections, its domain
and its seeds, and gives

- the fixed test split of every scored task (`TaskData.test_split`; seeded by
  ``tasks.test_seed``, the same for every trial);
- the exclusion set: every item of every scored test split (`TaskData.excluded`),
  which no training list contains (distillation prompts, RLVR problems, the micro
  models' SFT data);
- the training prompts of the distillation domain per role (the student's prompt,
  or the teacher's conditioning) and rank (`TaskData.train_prompts`), and the RLVR
  problems per rank (`TaskData.rlvr_problems`).

The primitives live in `distillab.tasks.countdown` (Countdown, prior skills),
`distillab.tasks.mcq` (multiple choice), `distillab.tasks.math_task` (long-reasoning math) and
`distillab.tasks.taskio` (prompt rendering, local files); import them from there.

    >>> data = TaskData(TasksConfig(), EvaluationConfig(id_items=4, pass_items=2))
    >>> len(data.test_split("countdown3"))
    4
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from distillab.config import PAPER_POOL, SMALL_POOL, EvaluationConfig, RLVRConfig, SeedsConfig, TasksConfig, TrialConfig
from distillab.registry import COUNTDOWN_TASKS, SKILL_NAMES
from distillab.tasks.countdown import (
    SKILLS,
    CountdownProblem,
    CountdownSpec,
    SkillItem,
    apply_op,
    countdown_user_text,
    extract_answer,
    generate_problems,
    generate_skill_items,
    render_solution,
    score_countdown,
    score_skill,
    skill_user_text,
    solve,
    verify_countdown,
)
from distillab.tasks.math_task import MathItem, math_prompt_ids, math_test_split, math_train_items
from distillab.tasks.mcq import MCQItem, item_key, mcq_prompt_ids, mcq_test_split, mcq_train_items
from distillab.tasks.taskio import read_local_split, render_prompt

ProblemKey = tuple[tuple[int, ...], int]


def countdown_spec(tasks: TasksConfig, name: str) -> CountdownSpec:
    """The `CountdownSpec` of task ``name`` in ``tasks``."""
    c = getattr(tasks, name)
    return CountdownSpec(name, tuple(c.pool), c.n_operands, c.target_min, c.target_max)


def countdown_test_split(tasks: TasksConfig, name: str, n: int) -> list[CountdownProblem]:
    """The fixed test split of a Countdown task (seeded by ``tasks.test_seed``:
    `config.SeedsConfig.test_split_seed`)."""
    return generate_problems(countdown_spec(tasks, name), n, SeedsConfig.test_split_seed(tasks.test_seed, name))


def problem_key(problem: CountdownProblem) -> ProblemKey:
    """(sorted operands, target): the identity of a Countdown instance (a multiset and a target)."""
    return tuple(sorted(problem.operands)), problem.target


def test_keys(tasks: TasksConfig, n: int, names: tuple[str, ...]) -> set[ProblemKey]:
    """`problem_key` of the first ``n`` test items of each task in ``names``."""
    return {problem_key(p) for name in names for p in countdown_test_split(tasks, name, n)}


def countdown_prompt_ids(tokenizer, tasks: TasksConfig, problem: CountdownProblem, role: str = "student") -> list[int]:
    """Prompt token ids of a Countdown problem: the task's system prompt and user
    template, rendered with the tokenizer's chat template. ``role="teacher"`` uses
    the teacher's conditioning (``tasks.teacher_system_prompt`` /
    ``teacher_user_template``) where set.

    Raises:
        ValueError: ``role`` not "student" or "teacher".
    """
    if role not in ("student", "teacher"):
        raise ValueError(f"role must be 'student' or 'teacher', got {role!r}")
    system, template = tasks.system_prompt, tasks.user_template
    if role == "teacher":
        system = tasks.teacher_system_prompt if tasks.teacher_system_prompt is not None else system
        template = tasks.teacher_user_template if tasks.teacher_user_template is not None else template
    return render_prompt(tokenizer, system, countdown_user_text(problem, template, tasks.sort_operands))


@dataclass(frozen=True)
class TaskData:
    """The task data of one trial (module docstring).

    ``domain``: ``countdown`` (Countdown-3 training prompts), ``mcq`` (``tasks.mcq``) or
    ``math`` (``tasks.math``);
    ``seed``: the trial's seed s; ``seeds``: the derived streams (`config.SeedsConfig`);
    ``train_items``: training problems drawn (``optimizer.train_prompts``)."""

    tasks: TasksConfig
    evaluation: EvaluationConfig
    domain: str = "countdown"
    seed: int = 42
    seeds: SeedsConfig = SeedsConfig()
    train_items: int = 20_000

    @classmethod
    def of(cls, trial: TrialConfig) -> "TaskData":
        """The task data of ``trial``."""
        return cls(trial.tasks, trial.evaluation, trial.domain, trial.seed, trial.seeds,
                   trial.optimizer.train_prompts)

    def test_split(self, name: str) -> list[CountdownProblem] | list[MCQItem] | list[MathItem]:
        """The test split of task ``name`` (a Countdown task, ``mcq`` or ``math``): its first
        ``evaluation.countdown_test_items`` (``mcq_test_items``, ``math_test_items``) items."""
        if name == "mcq":
            return mcq_test_split(self.tasks.mcq, self.evaluation.mcq_test_items, self.tasks.test_seed)
        if name == "math":
            return math_test_split(self.tasks.math, self.evaluation.math_test_items, self.tasks.test_seed)
        return countdown_test_split(self.tasks, name, self.evaluation.countdown_test_items)

    def excluded(self) -> set[ProblemKey]:
        """`problem_key` of every item of every scored Countdown test split
        (``evaluation.countdown_tasks``): no training list contains one. (The
        multiple-choice test split is excluded by `tasks.mcq.mcq_train_items`.)"""
        return test_keys(self.tasks, self.evaluation.countdown_test_items, tuple(self.evaluation.countdown_tasks))

    def train_problems(self, name: str, n: int, seed: int) -> list[CountdownProblem]:
        """``n`` problems of Countdown task ``name`` drawn with ``seed``, test items removed."""
        exclude = self.excluded()
        return [p for p in generate_problems(countdown_spec(self.tasks, name), n, seed) if problem_key(p) not in exclude]

    def train_mcq_items(self, seed: int) -> list[MCQItem]:
        """The multiple-choice training items (``tasks.mcq``) drawn with ``seed``, test items removed."""
        return mcq_train_items(self.tasks.mcq, self.evaluation.mcq_test_items, self.tasks.test_seed, seed)

    def train_math_items(self, seed: int) -> list[MathItem]:
        """The math training problems (``tasks.math``) drawn with ``seed``, test items removed."""
        return math_train_items(self.tasks.math, self.evaluation.math_test_items, self.tasks.test_seed, seed)

    def train_prompts(self, tokenizer, rank: int, role: str = "student") -> "RenderedOnUse":
        """Training prompts of the domain (token ids), test items excluded, in rank
        ``rank``'s own shuffled order, each rendered when first read (`RenderedOnUse`).
        ``role="teacher"``: the same problems in the same order rendered with the teacher's
        conditioning, so entry i of both lists is one problem."""
        s, seeds = self.seed, self.seeds
        rng = random.Random(seeds.shuffle_seed(s, rank))
        if self.domain == "mcq":
            items = self.train_mcq_items(seeds.train_problems_seed(s))
            rng.shuffle(items)
            return RenderedOnUse(items, lambda it: mcq_prompt_ids(tokenizer, self.tasks.mcq, it))
        if self.domain == "math":
            items = self.train_math_items(seeds.train_problems_seed(s))
            rng.shuffle(items)
            return RenderedOnUse(items, lambda it: math_prompt_ids(tokenizer, self.tasks.math, it))
        problems = self.train_problems("countdown3", self.train_items, seeds.train_problems_seed(s))
        rng.shuffle(problems)
        return RenderedOnUse(problems, lambda p: countdown_prompt_ids(tokenizer, self.tasks, p, role))

    def rlvr_problems(self, cfg: RLVRConfig, rank: int = 0, world: int = 1) -> list[CountdownProblem]:
        """``cfg.train_prompts`` problems of ``cfg.task`` (test items removed), shuffled,
        and rank ``rank``'s stride of them (every ``world``-th)."""
        s, seeds = self.seed, self.seeds
        problems = self.train_problems(cfg.task, cfg.train_prompts, seeds.rlvr_problems_seed(s))
        random.Random(seeds.rlvr_shuffle_seed(s)).shuffle(problems)
        return problems[rank::world]


class RenderedOnUse(Sequence):
    """A list of prompts (token ids, ``list[int]`` each) whose entry i is rendered by
    ``render(items[i])`` when it is first read, then kept: a trial reads the prompts of its
    own steps only (`rollout.source.step_prompts`: 640 of the micro study's 19,499 in 40 steps),
    and rendering each through the chat template and the tokenizer took 0.9-1.0 s of every
    trial's set-up when all were rendered up front (``TaskData.train_prompts``, 2026-12-04).
    Indexing, slicing (a ``list``), ``len``, iteration and ``==`` (against any sequence of the
    same ids) behave as on the rendered list."""

    def __init__(self, items: Sequence[Any], render: Callable[[Any], list[int]]):
        self._items, self._render = list(items), render
        self._ids: list[list[int] | None] = [None] * len(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        ids = self._ids[i]
        if ids is None:
            ids = self._ids[i] = self._render(self._items[i])
        return ids

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and len(other) == len(self) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # mutable cache, list-like: unhashable as a list


def train_prompts(trial: TrialConfig, tokenizer, rank: int, role: str = "student") -> RenderedOnUse:
    """`TaskData.train_prompts` of ``trial``."""
    return TaskData.of(trial).train_prompts(tokenizer, rank, role)


__all__ = ["TaskData", "RenderedOnUse", "train_prompts", "countdown_spec", "countdown_test_split", "problem_key", "test_keys",
           "countdown_prompt_ids", "item_key", "COUNTDOWN_TASKS", "SKILL_NAMES",
           "PAPER_POOL", "SMALL_POOL", "CountdownSpec", "CountdownProblem", "generate_problems", "solve",
           "render_solution", "extract_answer", "verify_countdown", "score_countdown", "countdown_user_text",
           "render_prompt", "skill_user_text", "SkillItem", "SKILLS", "generate_skill_items", "score_skill",
           "apply_op", "read_local_split"]
