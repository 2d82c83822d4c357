"""The Task protocol: one interface for every task of the study (PROTOCOL.md §5), and the
task registry that finds each implementation by name.

A task is a `Task` subclass instance registered under its name (`register`; `get` finds it).
Its registry entry (`config.tasks.TaskEntry`, ``task.entry``) is what the config knows of it:
its typed settings (``trial.tasks[name]``), its ``trial.domain`` value, its evaluation item
counts, its SFT counts, the offsets of its random streams. The implementation answers the rest:

=====================  ===================================================================
``test_items``         the first n items of its fixed test split (seeded by ``tasks.test_seed``
                       + its ``test_split_offset``: `Task.test_seed`), the same for every trial
``train_items``        training items drawn with a seed, none of them in an exclusion set of
                       `item_key` s (test items of scored tasks never reach training)
``item_key``           an item's identity for that exclusion (default: the item itself)
``pooled``             whether training items are a fixed pool (a file, a generated set of
                       settings-given size) whose SFT cut must not run short
``user_text``          the user turn of an item's prompt, for the student or the teacher
``system_prompt``      the system prompt (default: the settings' ``system_prompt``, else none)
``prompt``             both, as a `Prompt`: rendering into token ids is
                       `tasks.taskio.render`'s alone (the tokenizer's chat template, or
                       the micro tokenizer's plain format), so no task knows the tokenizer
``score``              the verifier: is a completion (decoded text, untrusted: parsed, never
                       run) correct for an item
``demonstration``      the SFT target text of an item (without the end-of-sequence token)
``sft_data``           a micro model's SFT demonstrations of this task (`Demonstrations`
                       blocks, placed by ``order`` among the other tasks')
``metrics``            the report keys its evaluation emits, each declared in
                       `distillab.registry` (`register` declares a new task's)
``evaluation``         its evaluation defaults for a trial's ``evaluation`` section: an
                       `EvalPlan` (items, test split size, temperatures, top-p, max tokens,
                       pass@k items, samples and k)
``eval_index``         its place among its family's scored tasks (a Countdown variant's in
                       ``evaluation.countdown_tasks``; picks its sampling seed)
``exclusion``          the `item_key` s its training items must avoid (default: its own test
                       split), and ``exclusion_key`` / ``offpd_exclusion``: what of the
                       evaluation decides them, for cache keys
=====================  ===================================================================

An item is whatever the task's methods pass around (a `tasks.countdown.CountdownProblem`, a
`tasks.mcq.MCQItem`, a word): it carries what its verifier needs, since ``score`` sees the
completion and the item alone.

Every method takes the trial's ``tasks`` section (`config.TasksConfig`) and reads its own typed
settings from it (`Task.settings`: ``tasks[self.name]``). Consumers never branch on a task's
name: the evaluation suite (`evals.suite`) scores `scored` tasks, `prepare` collects every
task's `sft_data`, `tasks.data.TaskData` draws the domain task's training prompts, `plan`
costs every scored task, and the cache keys take each task's settings and exclusion key.

Adding a task is one module (a settings class, a `Task` subclass with its `config.tasks.TaskEntry`,
and ``register(MyTask())`` at its end), its line in `distillab.tasks.registry`, and its tests:
docs/layout.md, "Adding a task", shows a worked example.
"""

from __future__ import annotations

import abc
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Any

from distillab.config import EvaluationConfig, MicroModelConfig, SeedsConfig, TasksConfig, TaskEntry
from distillab.config.tasks import add_task_entry, remove_task_entry, task_entries, task_entry
from distillab.registry import METRICS, eval_key, find
from distillab.registry import register as register_metric
from distillab.registry import unregister as unregister_metric

__all__ = ["Prompt", "EvalPlan", "Demonstrations", "Task", "register", "unregister", "get", "registered",
           "domain_task", "scored", "pool_head", "recorded_offpd_exclusion"]


@dataclass(frozen=True)
class Prompt:
    """What a model is asked: the system prompt ("" for none) and the user turn, as text."""

    system: str
    user: str


@dataclass(frozen=True)
class EvalPlan:
    """How a task is evaluated at every stage (PROTOCOL.md §4): ``items`` test items sampled once
    each at ``temperature`` for the accuracy (0: not scored), ``pass_n`` samples of each of the first
    ``pass_items`` at ``pass_temperature`` for pass@k at each k of ``pass_k`` (``pass_items`` 0:
    none), every completion at most ``max_tokens`` tokens under nucleus ``top_p``; ``test_items``: the
    size of its test split (both requests read from it, no training list contains it)."""

    items: int
    test_items: int
    temperature: float
    top_p: float
    max_tokens: int
    pass_items: int
    pass_n: int
    pass_k: tuple[int, ...]
    pass_temperature: float


@dataclass(frozen=True)
class Demonstrations:
    """One block of a micro model's SFT data: ``prompts[i]`` answered by ``targets[i]`` (the end-of-
    sequence token is the renderer's). ``order`` places the block among every task's (sorted, ties
    keep registration order)."""

    order: tuple
    prompts: list[Prompt]
    targets: list[str]


class Task(abc.ABC):
    """One task of the study (module docstring). Subclasses set ``entry`` (their
    `config.tasks.TaskEntry`, or pass it to ``__init__``) and implement the abstract methods;
    ``sft_order`` places their demonstrations in a micro model's SFT data."""

    entry: TaskEntry
    #: where this task's demonstrations go in a micro model's SFT data (`Demonstrations.order`)
    sft_order: int = 50
    #: scored by the evaluation suite's own requests (`scored`); False: by another backend (the prior
    #: skills: the micro OOD suite, `evals.ood`)
    in_suite: bool = True

    def __init__(self, entry: TaskEntry | None = None):
        if entry is not None:
            self.entry = entry

    @property
    def name(self) -> str:
        """The task's name: its evaluation rows' ``task``, its registry key."""
        return self.entry.name

    def settings(self, tasks: TasksConfig) -> Any:
        """This task's typed settings in ``tasks`` (``tasks[self.name]``)."""
        return tasks[self.name]

    def test_seed(self, tasks: TasksConfig) -> int:
        """The seed of its test split: `config.SeedsConfig.test_split_seed` (``tasks.test_seed`` + its offset)."""
        return SeedsConfig.test_split_seed(tasks.test_seed, self.name)

    # ------------------------------------------------------------------ items

    @abc.abstractmethod
    def test_items(self, tasks: TasksConfig, n: int) -> list:
        """The first ``n`` items of the fixed test split.

        Raises:
            ValueError: the source holds fewer than ``n`` (a file), naming the field to lower."""

    @abc.abstractmethod
    def train_items(self, tasks: TasksConfig, n: int, seed: int, exclude: Iterable[Hashable] = ()) -> list:
        """Training items drawn with ``seed`` whose `item_key` is not in ``exclude``: a task that
        generates items draws ``n`` and drops the excluded ones (a few fewer may come back); a task
        with a pool of its own (a file, or its settings' ``train_items``: `pooled`) returns that pool
        without the excluded, whatever ``n``.

        Raises:
            ValueError: nothing is left once the excluded items are dropped."""

    def item_key(self, item: Any) -> Hashable:
        """The identity of an item, to keep test items out of training (default: the item)."""
        return item

    def pooled(self, tasks: TasksConfig) -> bool:
        """Whether `train_items` returns a fixed pool (so asking more of it than it holds is an error)."""
        return False

    # ------------------------------------------------------------------ prompts

    def system_prompt(self, tasks: TasksConfig, role: str = "student") -> str:
        """The system prompt for ``role`` (``student`` or ``teacher``): the settings' ``system_prompt``, else ""."""
        return getattr(self.settings(tasks), "system_prompt", "")

    @abc.abstractmethod
    def user_text(self, tasks: TasksConfig, item: Any, role: str = "student") -> str:
        """The user turn of ``item``'s prompt for ``role`` (``student`` or ``teacher``)."""

    def prompt(self, tasks: TasksConfig, item: Any, role: str = "student") -> Prompt:
        """``item``'s `Prompt` for ``role``.

        Raises:
            ValueError: ``role`` not "student" or "teacher"."""
        if role not in ("student", "teacher"):
            raise ValueError(f"role must be 'student' or 'teacher', got {role!r}")
        return Prompt(self.system_prompt(tasks, role), self.user_text(tasks, item, role))

    # ------------------------------------------------------------------ verifier and demonstrations

    @abc.abstractmethod
    def score(self, completion: str, item: Any) -> bool:
        """The verifier: whether ``completion`` (decoded text, special tokens kept) answers ``item``."""

    @abc.abstractmethod
    def demonstration(self, tasks: TasksConfig, item: Any) -> str:
        """The SFT target of ``item`` (what a correct answer looks like; no end-of-sequence token)."""

    def sft_data(self, tasks: TasksConfig, ev: EvaluationConfig, mcfg: MicroModelConfig, prepare_seed: int,
                 role: str) -> list[Demonstrations]:
        """A micro model's SFT data of this task (``mcfg``: its `config.MicroModelConfig`; ``role``:
        ``teacher`` or ``student``, for messages): the `train_items` for ``entry.examples(mcfg)`` (the
        first that many of a `pooled` task's) drawn with the task's SFT seed stream
        (`config.SeedsConfig.sft_seed` of its first ``sft_streams`` name),
        without its `exclusion` under ``ev`` (every test item a trial scores), each with its
        `demonstration`.

        Raises:
            ValueError: a `pooled` task holds fewer training items than asked (names the field)."""
        n = self.entry.examples(mcfg)
        if n == 0:
            return []
        stream = next(iter(self.entry.sft_streams), None)
        if stream is None:
            raise ValueError(f"task {self.name!r} declares no SFT seed stream (TaskEntry.sft_streams)")
        items = self.train_items(tasks, n, SeedsConfig.sft_seed(prepare_seed, stream), self.exclusion(tasks, ev))
        if self.pooled(tasks):
            items = pool_head(items, n, self.entry, role)
        return [Demonstrations((self.sft_order, self.name), [self.prompt(tasks, it) for it in items],
                               [self.demonstration(tasks, it) for it in items])]

    # ------------------------------------------------------------------ evaluation

    def metrics(self) -> list[tuple[str, str]]:
        """``(report key, what it is)`` of every key its evaluation emits (placeholders as in
        `distillab.registry`): accuracy and pass@k."""
        return [(eval_key("<stage>", self.name, "accuracy"), f"{self.name}: one sample per test item, correct share"),
                (eval_key("<stage>", self.name, "pass@<k>"), f"{self.name}: unbiased pass@k")]

    def eval_index(self, ev: EvaluationConfig) -> int:
        """Its place among its family's scored tasks (`scored`; default 0)."""
        return 0

    def evaluation(self, tasks: TasksConfig, ev: EvaluationConfig) -> EvalPlan:
        """Its `EvalPlan` under ``ev``: ``entry.items(ev)`` items at ``id_temperature``, pass@k on the
        first ``pass_items`` with ``pass_n`` samples at ``pass_temperature[name]`` (1.0 if absent),
        ``max_tokens`` and ``top_p`` of ``ev``."""
        return EvalPlan(self.entry.items(ev), self.entry.test_items(ev), ev.id_temperature, ev.top_p, ev.max_tokens,
                        ev.pass_items, ev.pass_n, tuple(ev.pass_k), ev.pass_temperature.get(self.name, 1.0))

    # ------------------------------------------------------------------ exclusion (and its cache keys)

    def exclusion(self, tasks: TasksConfig, ev: EvaluationConfig) -> set:
        """The `item_key` s its training items avoid: its own test split's (``entry.test_items(ev)`` items)."""
        n = self.entry.test_items(ev)
        return {self.item_key(it) for it in self.test_items(tasks, n)} if n else set()

    def exclusion_key(self, ev: EvaluationConfig) -> Any:
        """What of ``ev`` decides `exclusion` (a JSON value for cache keys; None: nothing)."""
        return self.entry.test_items(ev)

    def offpd_exclusion(self, ev: EvaluationConfig) -> list:
        """What of ``ev`` decides this domain's training prompts, as an OffPD rollout set's cache key
        records it (`rollout.source.offpd_rollout_path`)."""
        return [self.name, self.exclusion_key(ev)]


def pool_head(items: list, n: int, entry: TaskEntry, role: str) -> list:
    """The first ``n`` of a task's training pool ``items`` for the micro ``role`` (teacher or student).

    Raises:
        ValueError: fewer than ``n`` items (a ``files`` source's training file shorter than the
            ``models.micro_<role>.<task>_examples`` asked; the config checks the synthetic pools),
            naming the field and both counts: never a silent cut."""
    if len(items) < n:
        raise ValueError(f"models.micro_{role}.{entry.examples_field} asks for {n} demonstrations; the {entry.name} "
                         f"task has {len(items)} training items (trial.tasks.{entry.key}, test items excluded)")
    return items[:n]


def recorded_offpd_exclusion(ev: EvaluationConfig) -> list:
    """The exclusion part every built-in domain's OffPD cache key recorded: the Countdown test
    split size and scored variants, and the multiple-choice test split size (kept so that the
    recorded OffPD sets keep their keys)."""
    return [ev.countdown_test_items, list(ev.countdown_tasks), ev.mcq_test_items]


# --------------------------------------------------------------------------------------------- the registry

_TASKS: dict[str, Task] = {}
_METRICS: dict[str, list[str]] = {}


def register(task: Task) -> Task:
    """Register ``task`` under its name: its entry into the config's registry (unless built in),
    its metric keys into `distillab.registry` (those not declared there yet), the task into
    this registry. Returns ``task``.

    Raises:
        ValueError: a task of that name is registered already (`unregister` first), or its entry's
            name, key, domain or seed offsets are taken (`config.tasks.add_task_entry`)."""
    name = task.name
    if name in _TASKS:
        raise ValueError(f"task {name!r} is registered already")
    if name not in {e.name for e in task_entries()}:
        add_task_entry(task.entry)
    elif task_entry(name) is not task.entry:
        raise ValueError(f"task {name!r}: its entry is not the registered one (config.tasks.task_entry({name!r}))")
    added = []
    for key, doc in task.metrics():
        if key not in METRICS and find(key.replace("<stage>", "pre").replace("<k>", "1")) is None:
            register_metric(key, "evals.suite.Evaluator", doc, scope="final")
            added.append(key)
    _METRICS[name], _TASKS[name] = added, task
    return task


def unregister(name: str) -> None:
    """Remove a task added by `register` with its entry and metric keys (a test's own task, at its end).

    Raises:
        ValueError: a built-in task."""
    remove_task_entry(name)
    for key in _METRICS.pop(name, []):
        unregister_metric(key)
    _TASKS.pop(name, None)


def get(name: str) -> Task:
    """The registered task ``name``.

    Raises:
        KeyError: no such task (names the registered ones), or a built-in task whose module is not
            imported yet (import `distillab.tasks.registry`)."""
    if name not in _TASKS:
        task_entry(name)  # no entry either: the KeyError names the registered tasks
        raise KeyError(f"task {name!r} is not implemented yet in this process: import distillab.tasks.registry")
    return _TASKS[name]


def registered() -> list[Task]:
    """Every registered task, in the order of their entries (`config.tasks.task_entries`)."""
    return [_TASKS[e.name] for e in task_entries() if e.name in _TASKS]


def domain_task(domain: str) -> Task:
    """The task that ``trial.domain`` value ``domain`` distils on.

    Raises:
        KeyError: no task has that domain."""
    for t in registered():
        if t.entry.domain == domain:
            return t
    raise KeyError(f"no task has domain {domain!r}")


def scored(tasks: TasksConfig, ev: EvaluationConfig) -> list[tuple[Task, int]]:
    """The tasks the evaluation suite scores under ``ev`` (`Task.in_suite`, ``entry.items(ev) > 0``),
    each with its `Task.eval_index`, in the suite's order: by family in registration order (the
    Countdown variants first), within a family by index (the Countdown variants in
    ``evaluation.countdown_tasks``' order; the index also picks their sampling seeds,
    `config.SeedsConfig.eval_task_seed`)."""
    tasks_ = [t for t in registered() if t.in_suite and t.entry.items(ev) > 0]
    families = list(dict.fromkeys(t.entry.family for t in tasks_))
    return sorted(((t, t.eval_index(ev)) for t in tasks_), key=lambda ti: (families.index(ti[0].entry.family), ti[1]))
