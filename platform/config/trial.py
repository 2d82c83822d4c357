"""One trial: every section it needs, its cross-field rules, and its id.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import field_validator, model_validator

from distillab.config.base import _Strict, flatten
from distillab.config.evaluation import EvaluationConfig
from distillab.config.identity import config_hash
from distillab.config.seeds import SeedsConfig
from distillab.config.tasks import TasksConfig, domain_entry, task_entries
from distillab.config.training import LossConfig, OptimizerConfig, RLVRConfig, RolloutConfig, TeacherConfig
from distillab.registry import ROLLOUT_ESTIMATORS


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
    #: numeric precision of training (issue 16): ``fp32``, or ``bf16`` (DeepSpeed bf16, teacher held in
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
    def _check_domain(self) -> "TrialConfig":
        task = domain_entry(self.domain)
        if task.items(self.evaluation) == 0:
            raise ValueError(f"domain {self.domain!r} needs {task.scored_when} so that the task it distils is scored")
        for e in task_entries():  # the settings of every task the trial uses
            if e is task or e.items(self.evaluation) > 0:
                e.check(self.tasks[e.name])
        if self.tasks.teacher_conditioned and not task.teacher_prompts:
            raise ValueError("tasks.teacher_system_prompt / teacher_user_template condition the Countdown prompts; "
                             f"they do not apply to domain {self.domain!r}")
        return self

    @model_validator(mode="after")
    def _check_precision(self) -> "TrialConfig":
        if self.master_weights == "bf16" and self.precision != "bf16":
            raise ValueError("master_weights 'bf16' needs precision 'bf16' (allowed with precision 'fp32': "
                             f"master_weights 'fp32'; got precision {self.precision!r})")
        return self

    @model_validator(mode="after")
    def _check_zero3(self) -> "TrialConfig":
        if self.optimizer.zero_stage == 3 and self.rlvr is not None:
            raise ValueError("optimizer.zero_stage 3 does not run an rlvr stage (its engine would wrap the "
                             "partitioned student again): use zero_stage 0-2 or rlvr: null")
        return self

    @model_validator(mode="after")
    def _check_rlvr_task_evaluated(self) -> "TrialConfig":
        if self.rlvr is not None and self.rlvr.task not in self.evaluation.countdown_tasks:
            raise ValueError(
                f"rlvr.task {self.rlvr.task!r} must be in evaluation.countdown_tasks "
                f"{list(self.evaluation.countdown_tasks)} so that it is scored at pre, distill and rlvr"
            )
        return self

    @model_validator(mode="after")
    def _check_teacher_conditioning(self) -> "TrialConfig":
        if self.tasks.teacher_conditioned and self.rollout.policy == "spectrum":
            raise ValueError("tasks.teacher_system_prompt / teacher_user_template (teacher conditioning) do not work "
                             "with rollout.policy 'spectrum' (its pair sampler needs one prompt); use offpd or onpd")
        return self

    @model_validator(mode="after")
    def _check_rollout_token_estimator(self) -> "TrialConfig":
        est = self.loss.estimator
        if est in ROLLOUT_ESTIMATORS and self.rollout.policy != "onpd":
            raise ValueError(
                f"loss.estimator {est!r} scores the rollout token, an estimate of KL(π_S‖π_T) only on the student's "
                f"own samples: it needs rollout.policy 'onpd' (got {self.rollout.policy!r}; with OffPD rollouts "
                "E[k1] = -KL(π_T‖π_S)); use estimator 'full', 'sampled' or 'topk' for other policies"
            )
        return self

    @model_validator(mode="after")
    def _check_teacher_payload(self) -> "TrialConfig":
        if self.teacher.payload != "topk":
            return self
        if self.loss.importance_weight and self.rollout.policy == "offpd":
            raise ValueError("loss.importance_weight with rollout.policy 'offpd' needs the teacher's log-probability "
                             "of every sampled token, which teacher.payload 'topk' does not send: use payload 'hidden'")
        if self.loss.impl == "triton":
            raise ValueError("teacher.payload 'topk' runs the loss on the rebuilt teacher logits (loss.impl "
                             "'reference' or 'chunked'), not the Triton kernels; got loss.impl 'triton'")
        return self

    @model_validator(mode="after")
    def _check_importance_weight(self) -> "TrialConfig":
        if self.loss.importance_weight and self.rollout.policy == "spectrum":
            raise ValueError(
                "loss.importance_weight needs rollout.policy 'offpd' or 'onpd' (π_λ has no trainer-side "
                "distribution to compare with), got 'spectrum'"
            )
        return self

    @property
    def trial_id(self) -> str:
        """Readable and deterministic: policy, divergence (``jsd<β>`` for JSD), the estimator
        unless ``full`` (`LossConfig.label`), the shared teacher's payload (`TeacherConfig.label`),
        LR, seed and a config hash."""
        r, L = self.rollout, self.loss
        policy = f"spectrum{r.lambda_:g}" if r.policy == "spectrum" else r.policy
        kind = f"jsd{L.beta:g}" if L.kind == "jsd" else L.kind
        est = f"-{L.label}" if L.label else ""
        est += f"-{self.teacher.label}" if self.teacher.label else ""
        return (
            f"{policy}-{kind}{est}-lr{self.optimizer.lr:g}-s{self.seed}-"
            f"{config_hash(self.model_dump(mode='json', exclude=self._unhashed()))[:8]}"
        )

    def _unhashed(self) -> set[str] | None:
        """Sections left out of the id's hash: ``teacher`` at its default (``serve: worker``), so that a
        trial without it keeps the id it had before the section existed (results and ``--resume``
        of earlier sweeps find their trials)."""
        return {"teacher"} if self.teacher == TeacherConfig() else None

    def flat(self) -> dict[str, Any]:
        """Every field as a dotted-key column (lists and dicts as JSON text)."""
        return flatten(self.model_dump(mode="json"))
