"""One trial: every section it needs, its cross-field rules, and its id.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Literal

from pydantic import field_validator, model_validator

from distillab.config.base import _Strict, flatten
from distillab.config.evaluation import EvaluationConfig
from distillab.config.identity import config_hash
from distillab.config.rules import check
from distillab.config.seeds import SeedsConfig
from distillab.config.tasks import TasksConfig, domain_entry
from distillab.config.training import LossConfig, OptimizerConfig, RLVRConfig, RolloutConfig, TeacherConfig
from distillab.registry import trial_name


class TrialConfig(_Strict):
    """Everything one trial needs; the grid point is applied before validation."""

    #: the trial's seed s; every random stream derives from it (``seeds``)
    seed: int = 42
    #: derived seeds of the trial's random streams (defaults: the study's values)
    seeds: SeedsConfig = SeedsConfig()
    #: the rollout policy and its sampling
    rollout: RolloutConfig = RolloutConfig()
    #: the token-level divergence and its estimator
    loss: LossConfig = LossConfig()
    #: where the teacher scores the rollouts: in the worker, or a service shared by the sweep (``teacher.serve``)
    teacher: TeacherConfig = TeacherConfig()
    #: optimizer, LR schedule, steps and batch of distillation
    optimizer: OptimizerConfig = OptimizerConfig()
    #: what is scored before and after each stage
    evaluation: EvaluationConfig = EvaluationConfig()
    #: the tasks: Countdown variants, prior skills, multiple choice, math
    tasks: TasksConfig = TasksConfig()
    #: the distillation task: ``countdown`` (Countdown-3 prompts), ``mcq`` (``tasks.mcq``, the second domain),
    #: ``math`` (``tasks.math``, long reasoning with a ``\\boxed{}`` answer), or the domain of a task a module
    #: registers (`config.tasks.domains`)
    domain: str = "countdown"
    #: optional RLVR stage after distillation (``null``: none)
    rlvr: RLVRConfig | None = None
    #: numeric precision of training: ``fp32``, or ``bf16`` (DeepSpeed bf16, teacher held in
    #: bf16, the ops computing in float32 from bf16 inputs)
    precision: Literal["fp32", "bf16"] = "fp32"
    #: under ``precision: bf16``, the weights the optimizer updates: ``fp32`` master copies (DeepSpeed's
    #: default), or ``bf16``: the parameters themselves, so an update below half a bf16 step of its
    #: weight is lost (the regime in which the paper's update sparsity arises)
    master_weights: Literal["fp32", "bf16"] = "fp32"
    #: activation (gradient) checkpointing of the student (transformers' ``gradient_checkpointing_enable``)
    gradient_checkpointing: bool = False
    #: attention implementation passed to ``from_pretrained`` (None: the model's default)
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2"] | None = None

    @field_validator("domain")
    @classmethod
    def _known_domain(cls, v: str) -> str:
        domain_entry(v)  # ValueError naming the allowed values
        return v

    @model_validator(mode="after")
    def _rules(self) -> "TrialConfig":
        check("trial", self)  # every cross-field rule of a trial (config.rules)
        return self

    @property
    def trial_id(self) -> str:
        """Readable and deterministic: the name parts of the study axes (`registry.trial_name`:
        policy, divergence (``jsd<β>`` for JSD), the estimator unless ``full``, the shared teacher's
        payload, the staleness when not 0, LR, seed) and a config hash."""
        name = trial_name(self.flat(), _default_values())
        return f"{name}-{config_hash(self.model_dump(mode='json', exclude=self._unhashed()))[:8]}"

    def _unhashed(self) -> set[str] | None:
        """Sections left out of the id's hash: ``teacher`` at its default (``serve: worker``), so that a
        trial without it keeps the id it had before the section existed (results and ``--resume``
        of earlier sweeps find their trials)."""
        return {"teacher"} if self.teacher == TeacherConfig() else None

    def flat(self) -> dict[str, Any]:
        """Every field as a dotted-key column (lists and dicts as JSON text)."""
        return flatten(self.model_dump(mode="json"))


@cache
def _default_values() -> dict[str, Any]:
    """The default trial's `TrialConfig.flat` values: an axis named only away from its default
    (`registry.Axis.name_if_default`) is compared with these."""
    return TrialConfig().flat()
