"""The tasks' settings (PROTOCOL.md §5): the Countdown variants, multiple choice, math, and the
prompts that render them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from distillab.config.base import _Strict
from distillab.registry import SKILL_NAMES

#: The paper's large operand pool for Countdown-3 and Countdown-4 (PROTOCOL.md §5).
PAPER_POOL: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 15, 20, 25, 50, 75)
#: Countdown-4E operands: 1..10 (PROTOCOL.md §5).
SMALL_POOL: tuple[int, ...] = tuple(range(1, 11))
#: The multiple-choice prompt's last line (the answer format), ``tasks.mcq.instruction``'s default.
MCQ_INSTRUCTION = "Answer with the letter of the correct option inside <answer></answer>."


class CountdownTaskConfig(_Strict):
    """A Countdown variant (PROTOCOL.md §5): operands drawn with replacement from
    ``pool``, ``n_operands`` of them, targets in ``[target_min, target_max]``."""

    #: the operand pool (drawn with replacement)
    pool: tuple[int, ...]
    #: operands per problem
    n_operands: int = Field(ge=2, le=6)
    #: smallest target
    target_min: int = Field(default=1, ge=1)
    #: largest target
    target_max: int = Field(ge=1)

    @model_validator(mode="after")
    def _check(self) -> "CountdownTaskConfig":
        if not self.pool or min(self.pool) < 1:
            raise ValueError("pool must be a non-empty list of positive integers")
        if self.target_min > self.target_max:
            raise ValueError(f"target_min {self.target_min} > target_max {self.target_max}")
        return self


def _check_task_files(task, formats: str):
    """``task`` (a task config with ``source``, ``train_path``, ``test_path``) when its paths fit
    its source. Raises ValueError: ``source: files`` without both paths (``formats``: what the
    files must be), or a path given with ``source: synthetic``."""
    if task.source == "files" and (task.train_path is None or task.test_path is None):
        raise ValueError(f"source 'files' needs train_path and test_path ({formats})")
    if task.source == "synthetic" and (task.train_path or task.test_path):
        raise ValueError("train_path / test_path are read only with source: files")
    return task


class MCQTaskConfig(_Strict):
    """The multiple-choice task (PROTOCOL.md §5, `distillab.tasks.mcq`), the study's second
    domain (``trial.domain: mcq``). ``source: synthetic``: the synthetic "which number
    is the largest?" task that micro models learn (``train_items`` training questions);
    ``source: files``: local ``train_path`` / ``test_path`` (JSONL or Parquet in the
    schema of `distillab.tasks.mcq`, ``field_map`` for other column names), e.g. Science or
    MedReason. The option letter goes inside ``<answer></answer>``."""

    #: ``synthetic`` (the micro task) or ``files`` (``train_path`` / ``test_path``)
    source: Literal["synthetic", "files"] = "synthetic"
    #: ``source: files``: the training items (JSONL or Parquet)
    train_path: str | None = None
    #: ``source: files``: the test items (JSONL or Parquet)
    test_path: str | None = None
    #: ``source: files``: the files' column names for the schema's (schema name → column)
    field_map: dict[str, str] = {}
    #: the system prompt of the multiple-choice task
    system_prompt: str = "Multiple choice."
    #: the prompt's last line (the answer format); "" for none (micro models learn the format from SFT)
    instruction: str = MCQ_INSTRUCTION
    #: ``source: synthetic``: training questions generated
    train_items: int = Field(default=20_000, ge=1)

    @model_validator(mode="after")
    def _paths(self) -> "MCQTaskConfig":
        return _check_task_files(self, "local JSONL or Parquet")


class MathTaskConfig(_Strict):
    """The long-reasoning math task (PROTOCOL.md §5, `distillab.tasks.math_task`): the domain
    ``trial.domain: math``, scored by the last ``\\boxed{}`` of the answer with
    ``tasks.math_task.score_math`` (math-verify). ``source: synthetic``: multi-step arithmetic
    that micro models learn (`tasks.math_task.generate_arithmetic_chains`: ``chain_length``
    additions/subtractions of two-digit operands, worked out one step per line, then
    ``\\boxed{result}``; with the default 6 steps every worked answer is ≥ 60 characters,
    i.e. ≥ 60 tokens of the micro tokenizer; ``train_items`` training problems);
    ``source: files``: local MATH-style ``train_path`` / ``test_path`` (JSONL or Parquet,
    `tasks.math_task.load_math`; ``field_map`` for other column names), e.g. Numina-MATH. The
    worked ``solution`` of a row is the teacher's SFT demonstration."""

    #: ``synthetic`` (arithmetic chains) or ``files`` (``train_path`` / ``test_path``)
    source: Literal["synthetic", "files"] = "synthetic"
    #: ``source: files``: the training problems (JSONL or Parquet, MATH schema)
    train_path: str | None = None
    #: ``source: files``: the test problems (JSONL or Parquet, MATH schema)
    test_path: str | None = None
    #: ``source: files``: the files' column names for the schema's (schema name → column)
    field_map: dict[str, str] = {}
    #: the system prompt of the math task
    system_prompt: str = "Math."
    #: ``source: synthetic``: additions/subtractions per problem
    chain_length: int = Field(default=6, ge=2, le=12)
    #: ``source: synthetic``: training problems generated
    train_items: int = Field(default=20_000, ge=1)

    @model_validator(mode="after")
    def _paths(self) -> "MathTaskConfig":
        return _check_task_files(self, "local JSONL or Parquet, MATH schema")


class TasksConfig(_Strict):
    """The task suite: the in-distribution task, the harder generalisation task,
    and the prior-skill tasks that form the micro OOD suite."""

    #: one-step Countdown: a prior skill of the micro student (knows format and arithmetic, not the search)
    countdown2: CountdownTaskConfig = CountdownTaskConfig(pool=PAPER_POOL, n_operands=2, target_max=1000)
    #: Countdown-3: the in-distribution task
    countdown3: CountdownTaskConfig = CountdownTaskConfig(pool=PAPER_POOL, n_operands=3, target_max=1000)
    #: Countdown-4E: four small operands, the generalisation task
    countdown4e: CountdownTaskConfig = CountdownTaskConfig(pool=SMALL_POOL, n_operands=4, target_max=1000)
    #: Countdown-4: four operands from the paper's pool (RLVR's task)
    countdown4: CountdownTaskConfig = CountdownTaskConfig(pool=PAPER_POOL, n_operands=4, target_max=10_000)
    #: the prior skills forming the micro OOD suite
    ood_skills: tuple[Literal[SKILL_NAMES], ...] = SKILL_NAMES
    #: seed of the test splits (fixed across trials so every trial sees the same items)
    test_seed: int = 1_000_003
    #: system prompt and task prompt (``{nums}``, ``{target}``) of Countdown
    system_prompt: str = "Countdown."
    #: the Countdown task prompt (must contain ``{nums}`` and ``{target}``)
    user_template: str = "{nums} -> {target}"
    #: show the operands largest-first in the prompt (the instance is a multiset)
    sort_operands: bool = True
    #: teacher conditioning (the paper's style-transfer experiment): the teacher sees this system prompt
    #: and/or task template instead of the student's, for its rollouts and its scoring (None = the student's)
    teacher_system_prompt: str | None = None
    #: the teacher's task prompt under teacher conditioning (null: the student's)
    teacher_user_template: str | None = None
    #: the multiple-choice task (``trial.domain: mcq``)
    mcq: MCQTaskConfig = MCQTaskConfig()
    #: the long-reasoning math task (``trial.domain: math``)
    math: MathTaskConfig = MathTaskConfig()

    @field_validator("user_template", "teacher_user_template")
    @classmethod
    def _template(cls, v: str | None, info) -> str | None:
        for key in ("{nums}", "{target}"):
            if v is not None and key not in v:
                raise ValueError(f"{info.field_name} must contain {key}")
        return v

    @property
    def teacher_conditioned(self) -> bool:
        """True when the teacher's prompt differs from the student's."""
        return (self.teacher_system_prompt not in (None, self.system_prompt)
                or self.teacher_user_template not in (None, self.user_template))

    def inputs(self, *, teacher: bool, mcq: bool, math: bool = False) -> dict[str, Any]:
        """The fields a job reads, for its `cache_key`: every field, but the teacher
        conditioning only for a job that renders teacher prompts (``teacher``), the
        multiple-choice task only for one that uses it (``mcq``) and the math task only
        for one that uses it (``math``)."""
        d = self.model_dump(mode="json")
        if not teacher:
            del d["teacher_system_prompt"], d["teacher_user_template"]
        if not mcq:
            del d["mcq"]
        if not math:
            del d["math"]
        return d
