"""The tasks' settings (PROTOCOL.md §5) and what the config knows of each task: its registry entry.

A task is a name in the task registry (`TaskEntry`, one per task; `distillab.tasks.base.Task`
is its implementation). The entry holds what the config needs before any task data exists:
the type and default of the task's section of ``trial.tasks`` (`TasksConfig` maps each task
name to that typed settings object), the ``trial.domain`` value that distils on it, how many
of its test items a trial scores (and the field that says so), how many SFT demonstrations
a micro model asks of it, and the offsets of its random streams (`config.SeedsConfig` reads
them). The built-in tasks' entries are here, because the default trial is validated when this
package is imported; a task added later registers its entry with
`distillab.tasks.base.register`, from its own module.

`TasksConfig` is built from the entries: one field per built-in task (the Countdown variants
of `registry.COUNTDOWN_VARIANTS`, the prior skills' ``ood_skills``, ``mcq``, ``math``), the
Countdown prompt fields they share and ``test_seed``, in the order and under the YAML keys
every recorded config spells (its dump, and so every trial id and cache key, is what it
was), and a ``trial.tasks.<name>`` section for each task registered later, validated by
its entry's settings type (present in the dump only when a config gives it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, TypeAdapter, ValidationInfo, create_model, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError, ValidationError

from distillab.config.base import _Strict
from distillab.registry import COUNTDOWN_VARIANTS, PAPER_POOL, SKILL_NAMES, SMALL_POOL

__all__ = ["PAPER_POOL", "SMALL_POOL", "MCQ_INSTRUCTION", "CountdownTaskConfig", "MCQTaskConfig", "MathTaskConfig",
           "TaskSettings", "TaskEntry", "TasksConfig", "task_entry", "task_entries", "domain_entry", "domains",
           "add_task_entry", "remove_task_entry", "sft_stream_offset", "check_module_task_counts"]

#: The multiple-choice prompt's last line (the answer format), ``tasks.mcq.instruction``'s default.
MCQ_INSTRUCTION = "Answer with the letter of the correct option inside <answer></answer>."


class TaskSettings(_Strict):
    """The base of a task's settings section (``trial.tasks.<name>``): strict (unknown keys
    are errors naming the field) and frozen. A task module subclasses it with its own
    fields, each with a ``#:`` comment or a ``description`` (the config reference's text)."""


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


# --------------------------------------------------------------------------------------------- the entries


def _pool_size(settings) -> int | None:
    """The synthetic training pool of an MCQ/math section (``train_items``), or None for files."""
    return settings.train_items if settings.source == "synthetic" else None


@dataclass(frozen=True)
class TaskEntry:
    """What the config knows of one task (module docstring).

    ``name``: the task's name (evaluation rows' ``task``, ``evaluation.pass_temperature`` keys);
    ``settings``: the type of its section (a pydantic model, or any type pydantic validates),
    under the key ``key`` of ``trial.tasks`` (default: ``name``), with ``default`` (default:
    ``settings()``) and ``doc`` (the config reference's line; default: the first line of the
    settings' docstring); ``domain``: the ``trial.domain`` value that distils on it (None: none);
    ``family``: tasks that share one exclusion-key entry and an evaluation seed stream (the
    Countdown variants: ``countdown``; default ``name``); ``test_split_offset``: its test split's
    seed is ``tasks.test_seed`` + it; ``sft_streams``: its SFT data's named seed streams
    (`config.SeedsConfig.sft_seed`); ``eval_seed_by_index``: its evaluation samples are seeded
    by its place in ``evaluation.countdown_tasks`` (the Countdown variants), else with the
    shared ``seeds.eval_mcq`` offset; ``in_every_key``: its settings are part of every cache
    key that reads task settings, used or not (the Countdown variants, the prior skills), else
    only of the jobs that use it (adding a task leaves every existing key as it was);
    ``teacher_prompts``: it renders the teacher conditioning of ``tasks.teacher_*``;
    ``items`` (``EvaluationConfig`` → int): the test items scored (accuracy) at every stage, 0
    for none, set by ``items_field`` (default: ``evaluation.task_items.<name>``; ``scored_when`` says
    how, for messages: default ``<items_field> > 0``);
    ``test_items``: the size of its test split, which no training list contains (default: the
    larger of ``items`` and ``evaluation.pass_items``); ``examples`` (``MicroModelConfig`` →
    int): the SFT demonstrations a micro model asks of it, set by ``examples_field`` (default:
    ``task_examples.<name>``); ``max_examples`` (its settings → int or None): how many training
    items its settings hold, when known before reading any file (None: unknown); ``check`` (its
    settings → None): raises ValueError when the settings cannot serve a trial that scores the task or
    distils on it (e.g. a file task without its test file), naming the field."""

    name: str
    settings: Any
    default: Any = None
    doc: str = ""
    key: str = ""
    domain: str | None = None
    family: str = ""
    test_split_offset: int | None = None
    sft_streams: Mapping[str, int] = field(default_factory=dict)
    eval_seed_by_index: bool = False
    in_every_key: bool = False
    teacher_prompts: bool = False
    items: Callable[[Any], int] | None = None
    items_field: str = ""
    scored_when: str = ""
    test_items: Callable[[Any], int] | None = None
    examples: Callable[[Any], int] | None = None
    examples_field: str = ""
    max_examples: Callable[[Any], int | None] = lambda settings: None
    check: Callable[[Any], None] = lambda settings: None

    def __post_init__(self) -> None:
        name = self.name
        fill = {
            "key": self.key or name,
            "family": self.family or name,
            "default": self.settings() if self.default is None else self.default,
            "doc": self.doc or ((getattr(self.settings, "__doc__", None) or "").strip().splitlines() or [""])[0],
            "items": self.items or (lambda ev: ev.task_items.get(name, 0)),
            "items_field": self.items_field or f"evaluation.task_items.{name}",
            "scored_when": self.scored_when or f"{self.items_field or f'evaluation.task_items.{name}'} > 0",
            "examples": self.examples or (lambda m: m.task_examples.get(name, 0)),
            "examples_field": self.examples_field or f"task_examples.{name}",
        }
        if self.test_items is None:
            items = fill["items"]
            fill["test_items"] = lambda ev: max(items(ev), ev.pass_items)
        for k, v in fill.items():
            object.__setattr__(self, k, v)


def _countdown_entry(name: str) -> TaskEntry:
    v = COUNTDOWN_VARIANTS[name]
    return TaskEntry(
        name, CountdownTaskConfig, CountdownTaskConfig(pool=v.pool, n_operands=v.n_operands, target_max=v.target_max),
        v.doc, family="countdown", domain=v.domain, test_split_offset=v.test_split_offset,
        sft_streams=dict(v.sft_streams),
        eval_seed_by_index=True, in_every_key=True, teacher_prompts=True,
        items=lambda ev: ev.id_items if name in ev.countdown_tasks else 0, items_field="evaluation.countdown_tasks",
        scored_when=f"{name!r} in evaluation.countdown_tasks",
        test_items=lambda ev: ev.countdown_test_items,
        examples=lambda m: m.countdown_examples.get(name, 0), examples_field="countdown_examples")


_BUILTIN: dict[str, TaskEntry] = {name: _countdown_entry(name) for name in COUNTDOWN_VARIANTS}
_BUILTIN["ood"] = TaskEntry(
    "ood", tuple[Literal[SKILL_NAMES], ...], SKILL_NAMES, "the prior skills forming the micro OOD suite",
    key="ood_skills", test_split_offset=None, sft_streams={"skills": 17}, in_every_key=True,
    items=lambda ev: ev.ood_items if ev.ood_backend != "lm_eval" else 0, items_field="evaluation.ood_items",
    test_items=lambda ev: ev.ood_items, examples=lambda m: m.skill_examples, examples_field="skill_examples")
_BUILTIN["mcq"] = TaskEntry(
    "mcq", MCQTaskConfig, doc="the multiple-choice task (``trial.domain: mcq``)", domain="mcq",
    test_split_offset=11, sft_streams={"mcq": 23}, items=lambda ev: ev.mcq_items, items_field="evaluation.mcq_items",
    test_items=lambda ev: ev.mcq_test_items, examples=lambda m: m.mcq_examples, examples_field="mcq_examples",
    max_examples=_pool_size)
_BUILTIN["math"] = TaskEntry(
    "math", MathTaskConfig, doc="the long-reasoning math task (``trial.domain: math``)", domain="math",
    test_split_offset=13, sft_streams={"math": 31}, items=lambda ev: ev.math_items,
    items_field="evaluation.math_items", test_items=lambda ev: ev.math_test_items,
    examples=lambda m: m.math_examples, examples_field="math_examples", max_examples=_pool_size)

#: Every registered task's entry, built-in ones first (registration order: the order of
#: ``trial.tasks``' keys, of the evaluation's tasks and of a micro model's SFT data).
_ENTRIES: dict[str, TaskEntry] = dict(_BUILTIN)


def task_entries() -> list[TaskEntry]:
    """Every registered task's entry, in registration order."""
    return list(_ENTRIES.values())


def task_entry(name: str) -> TaskEntry:
    """The entry of task ``name``.

    Raises:
        KeyError: no such task (names the registered ones)."""
    try:
        return _ENTRIES[name]
    except KeyError:
        raise KeyError(f"no task {name!r}; registered tasks: {', '.join(map(repr, _ENTRIES))}") from None


def domains() -> dict[str, TaskEntry]:
    """``{trial.domain value: the entry of the task it distils on}``."""
    return {e.domain: e for e in _ENTRIES.values() if e.domain is not None}


def domain_entry(domain: str) -> TaskEntry:
    """The entry of the task that ``trial.domain`` value ``domain`` distils on.

    Raises:
        ValueError: no task has that domain (names the allowed values)."""
    d = domains()
    if domain not in d:
        raise ValueError(f"domain {domain!r} is no task's; allowed: {', '.join(map(repr, d))} (a task module "
                         "registers its domain when imported: import distillab.tasks.registry first)")
    return d[domain]


def _taken_offsets() -> tuple[dict[int, str], dict[int, str], set[str]]:
    """``({test split offset: task}, {SFT stream offset: task}, SFT stream names)`` of the registered
    tasks; the Countdown demonstrations take the SFT offsets 0 … (variants − 1) (`config.SeedsConfig.sft_seed`)."""
    tests, sft = {}, {i: "the Countdown demonstrations" for i in range(len(COUNTDOWN_VARIANTS))}
    for e in _ENTRIES.values():
        if e.test_split_offset is not None:
            tests.setdefault(e.test_split_offset, e.name)
        sft.update({off: e.name for off in e.sft_streams.values()})
    return tests, sft, {s for e in _ENTRIES.values() for s in e.sft_streams}


def add_task_entry(entry: TaskEntry) -> None:
    """Register ``entry`` (`distillab.tasks.base.register` calls it for a task added by a module).

    Raises:
        ValueError: its name, key or domain is taken (the key also by any attribute of `TasksConfig`,
            whose sections read as attributes), or one of its seed offsets is another task's (a new
            task's random streams must be its own), naming both."""
    if entry.name in _ENTRIES:
        raise ValueError(f"task {entry.name!r} is registered already")
    taken = {e.key for e in _ENTRIES.values()} | set(_SHARED)
    if entry.key in taken or hasattr(TasksConfig, entry.key) or not entry.key.isidentifier():
        raise ValueError(f"task {entry.name!r}: trial.tasks key {entry.key!r} is taken (a task, a shared field, or "
                         "an attribute of TasksConfig such as 'copy'; a key is a Python identifier)")
    if entry.domain is not None and entry.domain in domains():
        raise ValueError(f"task {entry.name!r}: domain {entry.domain!r} is task {domains()[entry.domain].name!r}'s")
    tests, sft, names = _taken_offsets()
    if entry.test_split_offset in tests:
        raise ValueError(f"task {entry.name!r}: test_split_offset {entry.test_split_offset} is task "
                         f"{tests[entry.test_split_offset]!r}'s; taken: {sorted(tests)}")
    for stream, off in entry.sft_streams.items():
        if off in sft or stream in names:
            raise ValueError(f"task {entry.name!r}: SFT stream {stream!r} ({off}) is taken; taken offsets: "
                             f"{sorted(sft)}")
    _ENTRIES[entry.name] = entry


def remove_task_entry(name: str) -> None:
    """Unregister a task added with `add_task_entry` (a test's own task, at its end).

    Raises:
        ValueError: a built-in task."""
    if name in _BUILTIN:
        raise ValueError(f"task {name!r} is built in")
    _ENTRIES.pop(name, None)


def check_module_task_counts(counts: dict[str, int], field: str, own: Callable[[TaskEntry], str]) -> dict[str, int]:
    """``counts`` (task name → count: ``evaluation.task_items``, ``task_examples``) when every name is a
    task whose count lives there (``own(entry) == f"{field}.{name}"``: a task a module registered; a
    built-in task has a field of its own) and every count ≥ 0.

    Raises:
        ValueError: another name (names the allowed ones) or a negative count."""
    allowed = [e.name for e in _ENTRIES.values() if own(e) == f"{field}.{e.name}"]
    for name, n in counts.items():
        if name not in allowed:
            raise ValueError(f"{name!r} is no task registered by a module (a built-in task's count has a field of "
                             f"its own, e.g. mcq_items, mcq_examples); allowed: {allowed}")
        if n < 0:
            raise ValueError(f"{field.rsplit('.', 1)[-1]}.{name} must be >= 0, got {n}")
    return counts


def sft_stream_offset(stream: str) -> int:
    """The offset of the named SFT seed stream ``stream`` (`config.SeedsConfig.sft_seed`).

    Raises:
        KeyError: no task declares it (names the streams there are)."""
    for e in _ENTRIES.values():
        if stream in e.sft_streams:
            return e.sft_streams[stream]
    raise KeyError(f"no SFT stream {stream!r}; streams: {[s for e in _ENTRIES.values() for s in e.sft_streams]}")


# --------------------------------------------------------------------------------------------- TasksConfig


def _template(v: str | None, info: ValidationInfo) -> str | None:
    for key in ("{nums}", "{target}"):
        if v is not None and key not in v:
            raise ValueError(f"{info.field_name} must contain {key}")
    return v


#: The keys of ``trial.tasks`` that no single task owns: the seed of every test split and the
#: Countdown variants' shared prompt (the teacher-conditioning pair only in teacher jobs' keys).
_SHARED: dict[str, tuple[Any, Any, str]] = {
    "test_seed": (int, 1_000_003, "seed of the test splits (fixed across trials so every trial sees the same items)"),
    "system_prompt": (str, "Countdown.", "system prompt and task prompt (``{nums}``, ``{target}``) of Countdown"),
    "user_template": (Annotated[str, AfterValidator(_template)], "{nums} -> {target}",
                      "the Countdown task prompt (must contain ``{nums}`` and ``{target}``)"),
    "sort_operands": (bool, True, "show the operands largest-first in the prompt (the instance is a multiset)"),
    "teacher_system_prompt": (str | None, None, "teacher conditioning (the paper's style-transfer experiment): the "
                              "teacher sees this system prompt and/or task template instead of the student's, for "
                              "its rollouts and its scoring (None = the student's)"),
    "teacher_user_template": (Annotated[str | None, AfterValidator(_template)], None,
                              "the teacher's task prompt under teacher conditioning (null: the student's)"),
}
_TEACHER_KEYS = ("teacher_system_prompt", "teacher_user_template")


class _TasksBase(_Strict):
    """`TasksConfig`'s methods: a mapping from task name to the task's typed settings."""

    model_config = ConfigDict(extra="allow", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _later_tasks(cls, data: Any) -> Any:
        """The sections of tasks registered after the class was built, validated by their
        entries' types (an error's path runs through the section's key); any other unknown key
        is pydantic's unknown field (``config.errors`` names the closest allowed key)."""
        if not isinstance(data, dict):
            return data
        out, errors, by_key = dict(data), [], {e.key: e for e in _ENTRIES.values()}
        for key, value in data.items():
            if key in cls.model_fields:
                continue
            if key not in by_key:
                errors.append(InitErrorDetails(type="extra_forbidden", loc=(key,), input=value))
                continue
            try:
                out[key] = TypeAdapter(by_key[key].settings).validate_python(value)
            except ValidationError as e:
                errors += [InitErrorDetails(type=PydanticCustomError(err["type"], "{msg}", {"msg": err["msg"]}),
                                            loc=(key, *err["loc"]), input=err["input"]) for err in e.errors()]
        if errors:
            raise ValidationError.from_exception_data(cls.__name__, errors)
        return out

    def __getitem__(self, name: str) -> Any:
        """The settings of task ``name`` (its section, or its entry's default when the config
        gives none). Raises KeyError: no such task."""
        e = task_entry(name)
        return self._value(e.key, e.default)

    def _value(self, key: str, default: Any = None) -> Any:
        """The value at ``key`` of this section (a field, or a later task's section), else ``default``."""
        if key in type(self).model_fields:
            return getattr(self, key)
        return (self.__pydantic_extra__ or {}).get(key, default)

    @property
    def teacher_conditioned(self) -> bool:
        """True when the teacher's prompt differs from the student's."""
        return (self.teacher_system_prompt not in (None, self.system_prompt)
                or self.teacher_user_template not in (None, self.user_template))

    def inputs(self, *, teacher: bool, uses: Iterable[str] = ()) -> dict[str, Any]:
        """The settings a job reads, for its `cache_key`: the section as dumped, with the
        settings of each task that is not `TaskEntry.in_every_key` only when the job uses it
        (its name in ``uses``; its entry's default if the config gives none), and the teacher
        conditioning (``teacher_system_prompt``, ``teacher_user_template``) only for a job that
        renders teacher prompts (``teacher``).

        Raises:
            KeyError: a name in ``uses`` that is no task's."""
        used = {task_entry(n).key for n in uses}
        d = self.model_dump(mode="json")
        for e in task_entries():
            if e.in_every_key:
                continue
            if e.key in used:
                d.setdefault(e.key, TypeAdapter(e.settings).dump_python(e.default, mode="json"))
            else:
                d.pop(e.key, None)
        if not teacher:
            for k in _TEACHER_KEYS:
                del d[k]
        return d


def _fields() -> dict[str, Any]:
    """The built-in fields of `TasksConfig`, in the order recorded configs dump them: the Countdown
    variants, the prior skills, the shared keys, multiple choice, math."""
    fields: dict[str, Any] = {}
    entries = list(_BUILTIN.values())
    for e in entries[: len(COUNTDOWN_VARIANTS) + 1]:
        fields[e.key] = (e.settings, Field(default=e.default, description=e.doc))
    fields.update({k: (t, Field(default=d, description=doc)) for k, (t, d, doc) in _SHARED.items()})
    for e in entries[len(COUNTDOWN_VARIANTS) + 1:]:
        fields[e.key] = (e.settings, Field(default=e.default, description=e.doc))
    return fields


TasksConfig = create_model(
    "TasksConfig", __base__=_TasksBase, __module__=__name__, **_fields(),
    __doc__="""The task suite, a mapping from task name to that task's typed settings
    (``tasks[name]``): the Countdown variants, the prior skills of the micro OOD suite
    (``ood_skills``), multiple choice, math, and any task registered by a module (its
    section ``trial.tasks.<name>``); ``test_seed`` and the Countdown prompt are shared.""",
)
