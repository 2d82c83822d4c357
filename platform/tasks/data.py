"""Task data of a trial (PROTOCOL.md §5): what the models are trained and scored on.

`TaskData` is built from a trial's ``tasks`` and ``evaluation`` sections, its domain
and its seeds, and asks each task (`tasks.base.Task`, found in `tasks.registry`) for

- the fixed test split of every scored task (`TaskData.test_split`; seeded by
  ``tasks.test_seed``, the same for every trial);
- the exclusion set of a task: the test items its training items avoid
  (`TaskData.excluded`: for a Countdown variant every scored variant's), so that no
  training list contains a scored test item (distillation prompts, RLVR problems, the
  micro models' SFT data);
- the training prompts of the distillation domain's task per role (the student's prompt,
  or the teacher's conditioning) and rank (`TaskData.train_prompts`), and the RLVR
  problems per rank (`TaskData.rlvr_problems`).

The tasks live in their modules (`distillab.tasks.countdown`, `skills`, `mcq`, `math_task`);
`distillab.tasks.taskio` renders their prompts into token ids.

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
from distillab.tasks.base import Task
from distillab.tasks.countdown import (
    SKILLS,
    CountdownProblem,
    CountdownSpec,
    ProblemKey,
    SkillItem,
    apply_op,
    countdown_prompt_ids,
    countdown_spec,
    countdown_test_split,
    countdown_user_text,
    extract_answer,
    generate_problems,
    generate_skill_items,
    problem_key,
    render_solution,
    score_countdown,
    score_skill,
    skill_user_text,
    solve,
    test_keys,
    verify_countdown,
)
from distillab.tasks.mcq import item_key
from distillab.tasks.registry import domain_task, get
from distillab.tasks.taskio import read_local_split, render, render_prompt


@dataclass(frozen=True)
class TaskData:
    """The task data of one trial (module docstring).

    ``domain``: the ``trial.domain`` value (the task its training prompts come from:
    `tasks.registry.domain_task`); ``seed``: the trial's seed s; ``seeds``: the derived streams
    (`config.SeedsConfig`); ``train_items``: training problems drawn (``optimizer.train_prompts``)
    by a task that generates them."""

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

    def test_split(self, name: str) -> list:
        """The test split of task ``name``: its first ``entry.test_items(evaluation)`` items
        (``evaluation.countdown_test_items`` for a Countdown variant, ``mcq_test_items``, ...)."""
        task = get(name)
        return task.test_items(self.tasks, task.entry.test_items(self.evaluation))

    def excluded(self, name: str | None = None) -> set:
        """The keys (`Task.item_key`) that task ``name``'s (default: the domain's) training items avoid
        (`Task.exclusion`): for a Countdown variant, `problem_key` of every item of every scored
        Countdown test split."""
        task = get(name) if name is not None else domain_task(self.domain)
        return task.exclusion(self.tasks, self.evaluation)

    def train_problems(self, name: str, n: int, seed: int) -> list:
        """Task ``name``'s training items for ``n`` drawn with ``seed`` (`Task.train_items`), test items removed."""
        task = get(name)
        return task.train_items(self.tasks, n, seed, task.exclusion(self.tasks, self.evaluation))

    def train_prompts(self, tokenizer, rank: int, role: str = "student") -> "RenderedOnUse":
        """Training prompts of the domain's task (token ids), test items excluded, in rank
        ``rank``'s own shuffled order, each rendered when first read (`RenderedOnUse`).
        ``role="teacher"``: the same problems in the same order rendered with the teacher's
        conditioning, so entry i of both lists is one problem."""
        s, seeds, task = self.seed, self.seeds, domain_task(self.domain)
        items = self.train_problems(task.name, self.train_items, seeds.train_problems_seed(s))
        random.Random(seeds.shuffle_seed(s, rank)).shuffle(items)
        return RenderedOnUse(items, lambda it: render(tokenizer, task.prompt(self.tasks, it, role)))

    def rlvr_problems(self, cfg: RLVRConfig, rank: int = 0, world: int = 1) -> list:
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


__all__ = ["TaskData", "RenderedOnUse", "train_prompts", "Task", "countdown_spec", "countdown_test_split",
           "ProblemKey", "problem_key", "test_keys", "countdown_prompt_ids", "item_key", "COUNTDOWN_TASKS",
           "SKILL_NAMES", "PAPER_POOL", "SMALL_POOL", "CountdownSpec", "CountdownProblem", "generate_problems", "solve",
           "render_solution", "extract_answer", "verify_countdown", "score_countdown", "countdown_user_text",
           "render", "render_prompt", "skill_user_text", "SkillItem", "SKILLS", "generate_skill_items", "score_skill",
           "apply_op", "read_local_split"]
