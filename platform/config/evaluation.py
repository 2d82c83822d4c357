"""What every trial reports before and after each stage (PROTOCOL.md §4): the evaluation suite,
the lm-eval-harness OOD suite and the style metric.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from distillab.config.base import _Strict
from distillab.config.tasks import check_module_task_counts
from distillab.registry import COUNTDOWN_TASKS


class LMEvalTask(_Strict):
    """One lm-eval-harness task of the full-scale OOD suite: its registered name, the
    key of its standard metric in lm-eval's results (``"<metric>,<filter>"``) and a
    ``scale`` that maps that metric to [0, 1] (EQ-Bench reports 0–100)."""

    #: the task's registered lm-eval name
    task: str = Field(min_length=1)
    #: its metric key in lm-eval's results, ``<metric>,<filter>``
    metric: str = Field(pattern=r"^[^,]+,[^,]+$")
    #: divides the metric to map it to [0, 1]
    scale: float = Field(default=1.0, gt=0)


#: The paper's seven OOD benchmarks (PROTOCOL.md §4) with lm-eval-harness's standard metric of each.
PAPER_OOD_SUITE: tuple[LMEvalTask, ...] = (
    LMEvalTask(task="mmlu_pro", metric="exact_match,custom-extract"),
    LMEvalTask(task="truthfulqa_mc1", metric="acc,none"),
    LMEvalTask(task="ifeval", metric="prompt_level_strict_acc,none"),
    LMEvalTask(task="humaneval_instruct", metric="pass@1,create_test"),
    LMEvalTask(task="eq_bench", metric="eqbench,none", scale=100.0),
    LMEvalTask(task="bbq", metric="acc,none"),
    LMEvalTask(task="toxigen", metric="acc,none"),
)

#: lm-eval tasks that execute model-written code (need ``allow_code_execution``)
CODE_EXECUTING_TASKS = ("humaneval", "humaneval_instruct", "humaneval_64", "humaneval_64_instruct",
                        "humaneval_plus", "mbpp", "mbpp_plus")


class LMEvalConfig(_Strict):
    """The full-scale OOD backend (``evaluation.ood_backend: lm_eval``): lm-eval-harness
    tasks run on the checkpoint at every stage, each scored by its standard metric on
    at most ``limit`` items, and their unweighted mean (``ood_mean``).

    ``include_path`` adds a folder of task YAMLs (custom tasks on local files).
    HumanEval-style tasks run model-written code, so they need
    ``allow_code_execution: true`` (off by default; it also sets ``HF_ALLOW_CODE_EVAL=1``
    for the ``evaluate`` library's code_eval metric). The hub tasks download their
    datasets: run with ``HF_HUB_OFFLINE=0`` or with them already in ``HF_HOME``."""

    #: the lm-eval-harness tasks (default: the paper's seven OOD benchmarks)
    tasks: tuple[LMEvalTask, ...] = PAPER_OOD_SUITE
    #: items per task (null: all)
    limit: int | None = Field(default=500, ge=1)
    #: a folder of extra task YAMLs
    include_path: str | None = None
    #: lm-eval's batch size
    batch_size: int = Field(default=8, ge=1)
    #: lm-eval's longest sequence (null: the model's)
    max_length: int | None = Field(default=None, ge=1)
    #: allow tasks that execute model-written code (HumanEval-style)
    allow_code_execution: bool = False

    @model_validator(mode="after")
    def _tasks(self) -> "LMEvalConfig":
        if not self.tasks:
            raise ValueError("tasks must list at least one lm-eval task")
        names = [t.task for t in self.tasks]
        if len(set(names)) != len(names):
            raise ValueError(f"tasks must not repeat a task, got {names}")
        return self

    def code_tasks(self) -> list[str]:
        """The configured tasks that execute model-written code."""
        return [t.task for t in self.tasks if t.task in CODE_EXECUTING_TASKS]


class ProseConfig(_Strict):
    """The held-out prose of the pretrained OOD backend (``evaluation.ood_backend: pretrained``;
    `distillab.evals.prose`): the first ``documents`` topics of the held-out split of Python's
    ``pydoc_data.topics``, each cut to its first ``tokens_per_document`` tokens and into chunks
    of at most ``context`` tokens, scored teacher-forced (per-token loss and next-token
    accuracy) ``batch_size`` chunks per forward pass."""

    #: held-out documents scored, the first of the split in its fixed order (null: all of them)
    documents: int | None = Field(default=8, ge=1)
    #: tokens read per document at most, its first ones (null: the whole document)
    tokens_per_document: int | None = Field(default=512, ge=2)
    #: longest chunk the model reads (tokens); at most the model's ``max_position_embeddings``
    context: int = Field(default=256, ge=2)
    #: chunks per forward pass (the logits are batch_size × context × vocabulary floats)
    batch_size: int = Field(default=4, ge=1)


class StyleConfig(_Strict):
    """The style metric of the teacher-conditioning experiment (`distillab.evals.style`):
    the share of the student's in-distribution answers written in the teacher's style.
    ``kind: language``: the answer's language detected by ``langdetect`` is
    ``language`` (ISO 639-1, e.g. ``de``); ``kind: regex``: ``pattern`` (Python
    ``re``) is found in the answer."""

    #: ``language`` (detected language) or ``regex`` (a pattern found)
    kind: Literal["language", "regex"]
    #: ``kind: language``: the teacher's language (ISO 639-1)
    language: str | None = Field(default=None, pattern=r"^[a-z]{2}(-[a-z]{2})?$")
    #: ``kind: regex``: the Python regular expression of the teacher's style
    pattern: str | None = None

    @model_validator(mode="after")
    def _fields(self) -> "StyleConfig":
        if self.kind == "language" and self.language is None:
            raise ValueError("kind 'language' needs language (ISO 639-1 code, e.g. 'de')")
        if self.kind == "regex":
            if self.pattern is None:
                raise ValueError("kind 'regex' needs pattern")
            try:
                re.compile(self.pattern)
            except re.error as e:
                raise ValueError(f"pattern {self.pattern!r} is not a valid regular expression: {e}") from None
        return self


class EvaluationConfig(_Strict):
    """What every trial reports before and after (PROTOCOL.md §4)."""

    #: Countdown test items of the accuracy (one sample each)
    id_items: int = Field(default=200, ge=1)
    #: sampling temperature of the accuracy
    id_temperature: float = Field(default=0.5, gt=0)
    #: nucleus sampling of every evaluation
    top_p: float = Field(default=1.0, gt=0, le=1)
    #: test items of pass@k
    pass_items: int = Field(default=100, ge=1)
    #: samples per item for pass@k
    pass_n: int = Field(default=10, ge=1)
    #: the k of pass@k reported (each ≤ ``pass_n``)
    pass_k: tuple[int, ...] = (1, 10)
    #: sampling temperature of pass@k per task
    pass_temperature: dict[str, float] = {"countdown3": 1.0, "countdown4e": 0.5, "countdown4": 1.0}
    #: items per micro OOD task
    ood_items: int = Field(default=100, ge=1)
    #: sampling temperature of the OOD suite
    ood_temperature: float = Field(default=0.5, gt=0)
    #: thresholds τ of the update sparsity S_τ
    sparsity_taus: tuple[float, ...] = (1e-6, 1e-8)
    #: dtype both weights are rounded to before S_τ compares them: ``bf16`` (the paper's setting, whose
    #: checkpoints are bf16: a change below a bf16 step of the weight is no change) or ``fp32`` (float32
    #: and bf16 weights at their stored values, as before this field existed)
    sparsity_dtype: Literal["fp32", "bf16"] = "bf16"
    #: also report S_τ over only the parameter entries that had a nonzero gradient in some distillation
    #: step (``params/sparsity_touched@<τ>``) and their share (``params/touched_share``); costs one bool per
    #: parameter entry and a comparison per step (`optim.TouchedParameters`)
    sparsity_touched: bool = True
    #: longest completion in evaluation (tokens)
    max_tokens: int = Field(default=48, ge=1)
    #: Countdown tasks scored (accuracy, pass@k) at every stage; add ``countdown4`` for an RLVR stage
    countdown_tasks: tuple[Literal[COUNTDOWN_TASKS], ...] = ("countdown3", "countdown4e")
    #: OOD suite: ``micro`` = the prior-skill tasks (``tasks.ood_skills``), ``lm_eval`` = lm-eval-harness (``lm_eval``),
    #: ``pretrained`` = held-out prose (``prose``) and the prior-skill tasks (`distillab.evals.ood.PretrainedBackend`)
    ood_backend: Literal["micro", "lm_eval", "pretrained"] = "micro"
    #: the lm-eval-harness suite (``ood_backend: lm_eval``)
    lm_eval: LMEvalConfig = LMEvalConfig()
    #: the held-out prose (``ood_backend: pretrained``; filled with the defaults there when not given,
    #: absent from the dump with the other backends)
    prose: ProseConfig | None = Field(default=None, exclude_if=lambda v: v is None)
    #: the style metric (teacher conditioning): a ``style_share`` row on the first Countdown task's answers
    style: StyleConfig | None = None
    #: multiple-choice test items (``tasks.mcq``) scored at every stage, task ``mcq`` (0: none)
    mcq_items: int = Field(default=0, ge=0)
    #: math test items (``tasks.math``) scored at every stage, task ``math`` (0: none); answers need
    #: ``max_tokens`` long enough for the worked solution
    math_items: int = Field(default=0, ge=0)
    #: test items scored at every stage of each task registered by a module (task name → items; the
    #: built-in tasks have their own fields above); absent from the dump when empty
    task_items: dict[str, int] = Field(default={}, exclude_if=lambda v: not v)

    @property
    def countdown_test_items(self) -> int:
        """Size of each Countdown test split: the accuracy items and the pass@k items
        both come from it, and training never sees it."""
        return max(self.id_items, self.pass_items)

    @property
    def mcq_test_items(self) -> int:
        """Size of the multiple-choice test split, as `countdown_test_items`."""
        return max(self.mcq_items, self.pass_items)

    @property
    def math_test_items(self) -> int:
        """Size of the math test split, as `countdown_test_items`."""
        return max(self.math_items, self.pass_items)

    @model_validator(mode="before")
    @classmethod
    def _prose(cls, data):
        """``prose`` defaults to `ProseConfig` () under ``ood_backend: pretrained`` (so it is in the dump
        and the trial id there), and to None (absent from the dump) otherwise."""
        if isinstance(data, dict) and data.get("ood_backend") == "pretrained" and data.get("prose") is None:
            return {**data, "prose": {}}
        return data

    @field_validator("task_items")
    @classmethod
    def _task_items(cls, v: dict[str, int]) -> dict[str, int]:
        return check_module_task_counts(v, "evaluation.task_items", lambda e: e.items_field)

    @model_validator(mode="after")
    def _k(self) -> "EvaluationConfig":
        bad = [k for k in self.pass_k if not 1 <= k <= self.pass_n]
        if bad:
            raise ValueError(f"pass_k values must be in 1..pass_n={self.pass_n}, got {bad}")
        if any(t <= 0 for t in self.sparsity_taus):
            raise ValueError("sparsity_taus must be > 0")
        code = self.lm_eval.code_tasks()
        if self.ood_backend == "lm_eval" and code and not self.lm_eval.allow_code_execution:
            raise ValueError(f"lm_eval.tasks {code} execute model-written code: set lm_eval.allow_code_execution: "
                             "true to run them, or list lm_eval.tasks without them")
        return self
