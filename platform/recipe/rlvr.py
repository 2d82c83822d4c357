"""RLVR after distillation (PROTOCOL.md §6): GRPO with the DAPO token-level loss.

The pieces (rewards, group-normalised advantages, the loss), `run_rlvr` (the GRPO
loop, also ``prepare``'s teacher refinement) and `run_rlvr_stage`, the stage a
trial runs after distillation when it has an ``rlvr`` section (`config.RLVRConfig`):
per step, ``samples_per_prompt`` rollouts of each prompt from the current student,
rewards from the verifier, advantages within each prompt's group, one DAPO step;
the metrics are logged per step (``rlvr/*``, `distillab.registry`) and the
evaluation suite runs afterwards (stage ``rlvr``). LoRA (peft) and QLoRA
(bitsandbytes) are optional dependencies, imported where used.

- GRPO: Shao et al. 2024, "DeepSeekMath", §4.1 (group-relative advantages).
- DAPO: Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at
  Scale", Eq. 8 (token-level loss, decoupled clip ε_low / ε_high).
"""

from __future__ import annotations

import copy
import tempfile

import ray
import torch
import torch.distributed as dist
from torch import Tensor
from transformers import AutoModelForCausalLM, BitsAndBytesConfig

from distillab.config import RuntimeContext, SeedsConfig, TrialConfig
from distillab.ops.kl import token_logprobs
from distillab.recipe.optim import TorchStepper, rlvr_schedule, setup_engine
from distillab.recipe.telemetry import MetricsLog
from distillab.rollout.actor import ActorSampler, policy_weights, resolve_engine, start_vllm_actor
from distillab.rollout.engine import TransformersEngine
from distillab.rollout.types import Rollouts, SamplingParams, engine_logprobs, model_device, pack_rollouts, position_ids
from distillab.tasks.countdown import CountdownProblem, extract_answer, score_countdown
from distillab.tasks.data import TaskData, countdown_prompt_ids


def countdown_reward(completion: str, problem: CountdownProblem, *, correct: float = 2.0,
                     format_reward: float = 0.0) -> float:
    """Reward of one completion (PROTOCOL.md §6): ``correct`` (2.0) when the verifier
    accepts its ``<answer>`` (`tasks.countdown.score_countdown`; model text is parsed, never
    evaluated), else 0, plus ``format_reward`` (≤ 0.5) when it has exactly one
    ``<answer>...</answer>`` block.

    Raises:
        ValueError: ``format_reward`` outside [0, 0.5] or ``correct`` < 0.
    """
    if not 0.0 <= format_reward <= 0.5:
        raise ValueError(f"format_reward must be in [0, 0.5], got {format_reward}")
    if correct < 0:
        raise ValueError(f"correct must be >= 0, got {correct}")
    r = correct if score_countdown(completion, problem) else 0.0
    if format_reward and completion.count("<answer>") == 1 and extract_answer(completion) is not None:
        r += format_reward
    return r


def group_advantages(rewards: Tensor, group_size: int, *, eps: float = 1e-4, scale: bool = True) -> Tensor:
    r"""GRPO group-normalised advantages (DeepSeekMath §4.1.2):
    Â_i = (R_i − mean_g R) / (std_g R + eps) over each group g of ``group_size``
    consecutive samples of the same prompt (``std`` with Bessel's correction, as in
    TRL's GRPOTrainer); ``scale=False`` gives R_i − mean_g R. A group whose rewards are
    all equal gets 0 for every sample (no NaN).

    Args:
        rewards: (B,) float tensor, B = prompts × ``group_size``, prompt-major.
        group_size: samples per prompt, ≥ 2.

    Returns:
        (B,) float tensor, dtype of ``rewards`` (float32 at least).

    Raises:
        ValueError: ``rewards`` not 1-D, ``group_size`` < 2, or B not a multiple of it.
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be (B,), got shape {tuple(rewards.shape)}")
    if group_size < 2:
        raise ValueError(f"group_size (samples per prompt) must be >= 2, got {group_size}")
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards are not a multiple of group_size {group_size}")
    r = rewards.to(torch.promote_types(rewards.dtype, torch.float32)).view(-1, group_size)
    centred = r - r.mean(dim=1, keepdim=True)
    if scale:
        centred = centred / (r.std(dim=1, keepdim=True) + eps)
    return centred.reshape(-1)


def dapo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    beta: float = 0.0,
    ref_logp: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    r"""DAPO token-level clipped policy-gradient loss (Yu et al. 2025, Eq. 8), to minimise:

        L = − (1 / Σ_i |o_i|) Σ_i Σ_t [ min(ρ_it Â_i, clip(ρ_it, 1 − ε_low, 1 + ε_high) Â_i)
                                        − β · KL_it ]

    with ρ_it = exp(log π_θ(o_it) − log π_old(o_it)), every completion token of the
    batch weighted equally (the token-level sum, not a mean per sequence), and, when
    β > 0, the k3 estimator KL_it = exp(r_it) − r_it − 1 with r_it = log π_ref − log π_θ
    (PROTOCOL.md §6 uses β = 0: no reference model).

    Args:
        logp: (B, T) float, log π_θ of the sampled tokens (with gradient).
        old_logp: (B, T) float, log π_old of the same tokens (the sampling policy;
            treated as constants).
        advantages: (B,) float, one per sequence (`group_advantages`).
        mask: (B, T) bool, True = completion token.
        eps_low, eps_high: clip range (DAPO: 0.2, 0.28), both ≥ 0.
        beta: reference-KL coefficient (≥ 0); needs ``ref_logp`` when > 0.
        ref_logp: (B, T) float log π_ref, constants.

    Returns:
        ``(loss, stats)``: 0-dim tensor (nats), and floats ``clip_frac`` (share of
        tokens whose ratio was clipped), ``ratio_mean`` and ``kl`` (0 when β = 0).

    Raises:
        ValueError: shape mismatches, negative ε or β, β > 0 without ``ref_logp``.
        TypeError: ``mask`` not bool.
    """
    if logp.dim() != 2 or old_logp.shape != logp.shape or mask.shape != logp.shape:
        raise ValueError(f"logp, old_logp and mask must share one (B, T) shape, got {tuple(logp.shape)}, "
                         f"{tuple(old_logp.shape)}, {tuple(mask.shape)}")
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be bool, got {mask.dtype}")
    if advantages.shape != (logp.shape[0],):
        raise ValueError(f"advantages must be (B,) = ({logp.shape[0]},), got {tuple(advantages.shape)}")
    if eps_low < 0 or eps_high < 0 or beta < 0:
        raise ValueError(f"eps_low, eps_high and beta must be >= 0, got {eps_low}, {eps_high}, {beta}")
    if beta > 0 and (ref_logp is None or ref_logp.shape != logp.shape):
        raise ValueError("beta > 0 needs ref_logp of the same (B, T) shape as logp")
    n = mask.sum().clamp_min(1)
    diff = torch.where(mask, logp - old_logp.detach(), 0.0)
    ratio = diff.exp()
    adv = advantages.detach().to(device=ratio.device, dtype=ratio.dtype)[:, None]
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    per_token = torch.minimum(ratio * adv, clipped * adv)
    kl = torch.zeros_like(per_token)
    if beta > 0:
        r = torch.where(mask, ref_logp.detach() - logp, 0.0)
        kl = r.exp() - r - 1.0
        per_token = per_token - beta * kl
    loss = -(torch.where(mask, per_token, 0.0).sum() / n)
    with torch.no_grad():
        was_clipped = mask & ((ratio < 1.0 - eps_low) | (ratio > 1.0 + eps_high))
        stats = {
            "clip_frac": float(was_clipped.sum() / n),
            "ratio_mean": float(torch.where(mask, ratio, 0.0).sum() / n),
            "kl": float(torch.where(mask, kl, 0.0).sum() / n),
        }
    return loss, stats


def _token_logprobs(model, rollouts, pad_id: int, tau: float):
    """log softmax(z/τ) of each rollout token under ``model`` (with gradient),
    at the completion positions: ``(logp (B, T), completion mask (B, T))``. Full
    (B, T, V) logits: fine at micro scale, O(B·T·V) memory at full scale."""
    ids, attn, cmask = pack_rollouts(rollouts.prompt_ids, rollouts.completion_ids, pad_id, device=model_device(model))
    logits = model(input_ids=ids, attention_mask=attn, position_ids=position_ids(attn)).logits
    logp = token_logprobs(logits, torch.roll(ids, shifts=-1, dims=1), tau)  # (B, T)
    return torch.where(cmask, logp, 0.0), cmask


def apply_lora(module, cfg):
    """Wrap ``module`` (a causal LM) with LoRA adapters (``peft.get_peft_model``) from
    ``cfg`` (a `config.LoRAConfig`); only the adapters are trainable. Returns the
    ``PeftModel``; `merge_lora` folds the adapters back into ``module``.

    Raises:
        ValueError: none of ``cfg.target_modules`` is a module of ``module`` (peft's
            message names them).
    """
    from peft import LoraConfig, get_peft_model  # optional dependency

    return get_peft_model(module, LoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                                             target_modules=list(cfg.target_modules), task_type="CAUSAL_LM"))


def merge_lora(peft_model):
    """Merge the adapters into the base weights (W + (α/r)·B·A) and return the base
    model, unwrapped (the same object `apply_lora` wrapped)."""
    return peft_model.merge_and_unload()


def quantized_lora(module, cfg):
    """QLoRA (``cfg.load_in_4bit``; Dettmers et al. 2023): a ``bitsandbytes`` 4-bit
    copy of ``module`` (a causal LM in full precision; saved as safetensors to a
    temporary directory and reloaded with ``BitsAndBytesConfig(load_in_4bit=True,
    bnb_4bit_quant_type=cfg.quant_type, bnb_4bit_use_double_quant=cfg.double_quant,
    bnb_4bit_compute_dtype=<module dtype>)`` on the module's device), prepared with
    ``peft.prepare_model_for_kbit_training`` and wrapped by `apply_lora`. ``module`` is
    not changed; `merge_into` writes the trained policy back into it.

    Raises:
        ImportError: bitsandbytes is not installed (`config.LoRAConfig` checks this first).
    """
    from peft import prepare_model_for_kbit_training  # optional dependency

    p = next(module.parameters())
    q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=cfg.quant_type,
                           bnb_4bit_use_double_quant=cfg.double_quant, bnb_4bit_compute_dtype=p.dtype)
    with tempfile.TemporaryDirectory(prefix="distillab-4bit-") as d:
        module.save_pretrained(d, safe_serialization=True)
        base = AutoModelForCausalLM.from_pretrained(d, quantization_config=q, dtype=p.dtype,
                                                    device_map={"": str(p.device)})
    base = prepare_model_for_kbit_training(base, use_gradient_checkpointing=False)
    return apply_lora(base, cfg)


def merge_into(module, peft_model):
    """Write `policy_weights` of ``peft_model`` (the trained LoRA policy, its 4-bit base
    dequantised) into ``module``, a plain model with the same parameter names
    (``load_state_dict``, strict). Returns ``module``."""
    module.load_state_dict(dict(policy_weights(peft_model)))
    return module


def lora_policy(module, lora):
    """What an RLVR stage trains for ``module`` under ``lora`` (a `config.LoRAConfig` or
    None), and how the result returns to it: ``(trainable, finish)``, where
    ``finish()`` leaves the trained policy in ``module`` and returns it.

    - None: ``module`` itself; ``finish`` does nothing.
    - LoRA: the `apply_lora` wrapper; ``finish`` is `merge_lora`.
    - QLoRA (``load_in_4bit``): the `quantized_lora` copy; ``finish`` is `merge_into`.
    """
    if lora is None:
        return module, lambda: module
    if lora.load_in_4bit:
        trainable = quantized_lora(module, lora)
        return trainable, lambda: merge_into(module, trainable)
    trainable = apply_lora(module, lora)
    return trainable, lambda: merge_lora(trainable)


def _global_sums(*values: float) -> list[float]:
    """``values`` summed over the ranks of the default ``torch.distributed`` group
    (float64 all-reduce); unchanged when it is not initialised or has one rank."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t)
    return t.tolist()


def _world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _rewards(cfg, texts: list[str], batch: list[CountdownProblem], reward_fn) -> torch.Tensor:
    """(B·G,) float32 rewards of the completions ``texts`` (sample k answers problem
    ``batch[k // samples_per_prompt]``): `countdown_reward` with ``cfg``'s correct and
    format rewards, or ``reward_fn(text, problem)``."""
    g = cfg.samples_per_prompt
    if reward_fn is None:
        return torch.tensor([countdown_reward(t, batch[k // g], correct=cfg.correct_reward,
                                              format_reward=cfg.format_reward) for k, t in enumerate(texts)])
    return torch.tensor([float(reward_fn(t, batch[k // g])) for k, t in enumerate(texts)])


def _grpo_update(cfg, stepper, ref, rollouts: Rollouts, rewards: torch.Tensor, pad_id: int) -> dict[str, float]:
    """One GRPO/DAPO optimizer step of `run_rlvr` on the sampled ``rollouts``: group
    advantages, the trainer's log π_θ (π_old its detached copy), `dapo_loss` scaled for
    data parallelism, clipped step. Returns the step's ``rlvr/*`` metrics."""
    module = stepper.module
    adv = group_advantages(rewards, cfg.samples_per_prompt)
    module.train()
    logp, cmask = _token_logprobs(stepper, rollouts, pad_id, cfg.temperature)
    old = logp.detach()  # π_old = the weights that sampled, at τ, without the top-p renormalisation
    gap = float(((old - engine_logprobs(rollouts, cmask)) * cmask).sum() / cmask.sum().clamp(min=1))
    ref_logp = None
    if ref is not None:
        with torch.no_grad():
            ref_logp, _ = _token_logprobs(ref, rollouts, pad_id, cfg.temperature)
    loss, stats = dapo_loss(logp, old, adv, cmask, eps_low=cfg.eps_low, eps_high=cfg.eps_high, beta=cfg.beta,
                            ref_logp=ref_logp)
    n_rank = float(cmask.sum())
    correct = float((rewards >= cfg.correct_reward).sum()) if cfg.correct_reward > 0 else 0.0
    n_all, loss_all, reward_all, correct_all, samples_all = _global_sums(
        n_rank, float(loss.detach()) * n_rank, float(rewards.sum()), correct, float(len(rewards)))
    stepper.backward(loss * (n_rank * _world_size() / max(n_all, 1.0)))  # × 1 on one rank
    params = [p for p in module.parameters() if p.grad is not None]
    gn = float(torch.nn.utils.clip_grad_norm_(params, cfg.clip if cfg.clip is not None else float("inf")))
    lr = stepper.get_lr()[0]
    stepper.step()
    return {
        "rlvr/reward_mean": reward_all / samples_all,
        "rlvr/accuracy": correct_all / samples_all,
        "rlvr/loss": loss_all / max(n_all, 1.0), "rlvr/clip_frac": stats["clip_frac"],
        "rlvr/ratio_mean": stats["ratio_mean"], "rlvr/kl": stats["kl"],
        "rlvr/grad_norm": gn, "rlvr/lr": lr, "rlvr/sampler_logp_gap": gap,
    }


def run_rlvr(cfg, stepper, tokenizer, tasks, problems: list[CountdownProblem], seed: int, report,
             reward_fn=None, sampler=None, seeds: SeedsConfig = SeedsConfig()) -> list[dict]:
    """GRPO with the DAPO loss (PROTOCOL.md §6): ``cfg.steps`` optimizer steps (``cfg`` an
    `RLVRConfig`) on ``stepper.module``, trained in place. Used by the RLVR stage of a
    trial (``stepper`` = the DeepSpeed engine) and by ``prepare``'s teacher refinement
    (`TorchStepper`).

    Per step: ``prompts_per_step`` problems in order from ``problems`` (wrapping
    around), ``samples_per_prompt`` samples each from the current weights at
    τ = ``temperature``, top-p, reward (`countdown_reward`), group advantages,
    `dapo_loss`, clipped step. log π_old is the trainer's own log softmax(z/τ) of the
    sampled tokens, detached: with one optimizer step per batch the ratio is exactly 1
    and its gradient ∇ log π_θ (the sampler's logprobs are renormalised over the top-p
    nucleus and would start the ratio below 1).
    ``report(step, metrics)`` gets, after every step (1-based), ``rlvr/reward_mean``,
    ``rlvr/accuracy`` (share of correct samples), ``rlvr/loss``, ``rlvr/clip_frac``,
    ``rlvr/ratio_mean``, ``rlvr/kl``, ``rlvr/grad_norm``, ``rlvr/lr`` and
    ``rlvr/sampler_logp_gap``: the mean over completion tokens of log π_old − the
    sampler's logprob: 0 when the sampler holds the trained weights and reports
    log softmax(z/τ) before top-p (`rollout.engine.TransformersEngine`; measured |gap| < 3e-7 on
    the micro RLVR sweep), or at ``top_p`` 1; vLLM reports logprobs after top-p, so there
    it is the log of the kept nucleus mass (≤ 0) below top-p 1. A stale engine shows here.
    Returns the per-step metrics.
    ``sampler`` (default: a `rollout.engine.TransformersEngine` over ``stepper.module``, which
    always samples with the current weights) is any object with
    ``generate(prompt_ids, SamplingParams) -> Rollouts`` and ``sync(module)``, called
    before each step's sampling (`ActorSampler`: the vLLM engine).
    Data-parallel (``torch.distributed`` initialised with W > 1 ranks, as in a Ray
    Train trial with W workers): each rank runs ``cfg`` on its own ``problems`` and
    seed, its loss is scaled by W·n_rank / n_all (n: completion tokens, all-reduced)
    so that the gradient the stepper averages over ranks (DeepSpeed does) is that of
    the token-level DAPO loss over the whole batch; reward, accuracy and loss are
    reported over all ranks, the other metrics on each rank's own batch.
    ``reward_fn(completion_text, problem) -> float`` replaces `countdown_reward` with
    ``cfg``'s rewards (then ``rlvr/accuracy`` is the share of rewards ≥ ``correct_reward``).

    Raises:
        ValueError: fewer ``problems`` than ``prompts_per_step``.
    """
    if len(problems) < cfg.prompts_per_step:
        raise ValueError(f"{len(problems)} RLVR training problems for prompts_per_step {cfg.prompts_per_step}: "
                         "raise train_prompts")
    module = stepper.module
    ref = copy.deepcopy(module).eval().requires_grad_(False) if cfg.beta > 0 else None
    if sampler is None:
        sampler = TransformersEngine(module, tokenizer.eos_token_id, tokenizer.pad_token_id)
    sync = getattr(sampler, "sync", None)
    history = []
    for step in range(cfg.steps):
        lo = (step * cfg.prompts_per_step) % max(1, len(problems) - cfg.prompts_per_step)
        batch = problems[lo : lo + cfg.prompts_per_step]
        prompts = [countdown_prompt_ids(tokenizer, tasks, p) for p in batch]
        sp = SamplingParams(cfg.temperature, cfg.top_p, cfg.max_tokens, cfg.samples_per_prompt,
                            seeds.rlvr_sampling_seed(seed, step))
        module.eval()
        if sync is not None:
            sync(module)
        rollouts = sampler.generate(prompts, sp)  # π_old = the current weights
        texts = tokenizer.batch_decode(rollouts.completion_ids, skip_special_tokens=False)
        rewards = _rewards(cfg, texts, batch, reward_fn)
        m = _grpo_update(cfg, stepper, ref, rollouts, rewards, tokenizer.pad_token_id)
        history.append(m)
        report(step + 1, m)
    module.eval()
    return history



def _rlvr_stepper(trial: TrialConfig, module, world: int, r):
    """The RLVR stage's optimizer: a DeepSpeed engine around ``module`` in the trial's
    precision (AdamW rebuilt: the distillation optimizer's moments, and under bf16 its
    float32 masters, are not carried over: the stage starts from the bf16 student), or plain AdamW over
    QLoRA's adapters (DeepSpeed takes no 4-bit parameters)."""
    if r.lora is not None and r.lora.load_in_4bit:
        return TorchStepper(module, r.lr, rlvr_schedule(r))
    stepper, _, _ = setup_engine(module, trial.optimizer, world, lr=r.lr, schedule=rlvr_schedule(r),
                                 batch=r.prompts_per_step * r.samples_per_prompt, clip=r.clip,
                                 precision=trial.precision, master_weights=trial.master_weights)
    return stepper


def run_rlvr_stage(trial: TrialConfig, ctx: RuntimeContext, engine, tok, trial_id: str, rank: int, world: int,
                   report, gauges=None):
    """The RLVR stage of a trial: `run_rlvr` on the distilled student in ``engine.module``,
    its per-step metrics written to the ``metrics`` table (stage ``rlvr``, 10-step
    windows, `telemetry.MetricsLog`) and passed to ``report(metrics)`` (Ray Train) as
    each window closes, with ``step`` continuing the distillation's count.

    The stage trains ``engine.module`` itself, its LoRA wrapper (``rlvr.lora``; merged
    back afterwards) or, with ``rlvr.lora.load_in_4bit``, adapters on a 4-bit copy
    whose trained policy is written back (`lora_policy`). With ``rlvr.engine`` resolving
    to vLLM the samples come from a `rollout.actor.RolloutActor` started from the student's
    checkpoint and synced to the trained weights before every step (`ActorSampler`),
    else from the module itself. With W workers each samples ``prompts_per_step / W``
    prompts of a disjoint stride (the sweep checks divisibility) and DeepSpeed averages
    the gradients (`run_rlvr` normalises the loss over all ranks' tokens); QLoRA runs on
    one worker. Returns ``engine``, whose module now holds the trained student."""
    r = trial.rlvr.model_copy(update={"prompts_per_step": trial.rlvr.prompts_per_step // world})
    log = MetricsLog(ctx.results_root, trial_id, "rlvr", rank)

    def on_step(step: int, metrics: dict[str, float]) -> None:
        log.add(step, metrics)
        if gauges is not None:
            gauges.set(metrics)
        if log.due(step, last=step == r.steps):
            log.flush(step)
            report({"step": trial.optimizer.steps + step, **metrics})

    module, finish = lora_policy(engine.module, r.lora)
    stepper = _rlvr_stepper(trial, module, world, r)
    problems = TaskData.of(trial).rlvr_problems(r, rank, world)
    sampler = None
    if resolve_engine(r.engine, batched=False) == "vllm":
        sampler = ActorSampler(start_vllm_actor(trial, ctx.student_path, tok, ctx.torch_threads))
    try:
        run_rlvr(r, stepper, tok, trial.tasks, problems, trial.seeds.rlvr_seed(trial.seed, rank), on_step,
                 sampler=sampler, seeds=trial.seeds)
    finally:
        if sampler is not None:
            ray.kill(sampler.actor)
    finish()  # LoRA merged, or the QLoRA policy written back, into engine.module
    return engine


__all__ = ["countdown_reward", "group_advantages", "dapo_loss", "rlvr_schedule", "run_rlvr", "run_rlvr_stage",
           "TorchStepper", "apply_lora", "merge_lora", "policy_weights", "ActorSampler",
           "quantized_lora", "merge_into", "lora_policy"]
