"""The distillation trial: a Ray Train ``TorchTrainer`` whose workers wrap the
student in a DeepSpeed engine and run, per optimizer step,

    prompts ─▶ rollouts (OffPD: teacher at τ_T; OnPD: student at τ_S; spectrum: π_λ;
               from `RolloutSource`: a shared OffPD set, a vLLM actor, or in-process)
            ─▶ teacher + student forward on prompt+rollout
            ─▶ token-level KL over completion tokens (ops.kl, both loss τ)
            ─▶ backward, unclipped grad norm logged, clip (or not), step
            ─▶ OnPD with a vLLM engine: weight sync into the engine
            ─▶ metrics (ray.train.report)

with the evaluation suite before (stage ``pre``) and after (stage ``distill``)
on rank 0, update sparsity against the initial weights, and the final student
saved as a safetensors checkpoint. PROTOCOL.md §1–§4. With
``optimizer.checkpoint_every`` a restarted worker group resumes from the latest
checkpoint (weights, step, LR schedule; not the AdamW moments).

Stages are functions, read top to bottom: `setup_models`, `setup_engine`,
`sample_rollouts`, `loss_step`, `train_loop_per_worker`, `run_trial`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from distillab.config import TrialConfig
from distillab.evals.metrics import update_sparsity
from distillab.evals.suite import Evaluator, countdown_prompt_ids, countdown_spec, problem_key, test_keys
from distillab.models import check_same_vocab, load_model, load_tokenizer
from distillab.ops.kl import distill_loss, entropy_and_cross_entropy, sampled_token_loss, token_divergence
from distillab.results import atomic_write_bytes, report_metrics, write_rows
from distillab.rollout import (
    Rollouts,
    SamplingParams,
    SpectrumEngine,
    TransformersEngine,
    engine_logprobs,
    pack_rollouts,
    position_ids,
    resolve_engine,
)
from distillab.sft import lr_lambda
from distillab.tasks import generate_problems

log = logging.getLogger(__name__)

WORKER_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


def train_prompts(trial: TrialConfig, tokenizer, rank: int, role: str = "student") -> list[list[int]]:
    """Training prompts of ``trial.domain`` (Countdown-3, or the multiple-choice task
    ``tasks.mcq``), test items excluded; each rank its own draw.
    ``role="teacher"``: the same problems in the same order, rendered with the
    teacher's conditioning (``tasks.teacher_*``), so entry i of both lists is one problem."""
    tasks, ev = trial.tasks, trial.evaluation
    if trial.domain == "mcq":
        from distillab.mcq import mcq_prompt_ids, mcq_train_items

        items = mcq_train_items(tasks.mcq, ev.mcq_test_items, tasks.test_seed, 7919 + trial.seed)
        random.Random(trial.seed * 1000 + rank).shuffle(items)
        return [mcq_prompt_ids(tokenizer, tasks.mcq, it) for it in items]
    exclude = test_keys(tasks, max(ev.id_items, ev.pass_items))
    problems = generate_problems(countdown_spec(tasks, "countdown3"), trial.optimizer.train_prompts, 7919 + trial.seed)
    problems = [p for p in problems if problem_key(p) not in exclude]
    rng = random.Random(trial.seed * 1000 + rank)
    rng.shuffle(problems)
    return [countdown_prompt_ids(tokenizer, tasks, p, role) for p in problems]


class TeacherPrompts:
    """Teacher conditioning (``tasks.teacher_system_prompt`` / ``teacher_user_template``):
    the map between a training problem's student prompt and its teacher prompt.

    The teacher samples OffPD rollouts from its own prompts, and scores every rollout
    given its own prompt; the student trains on the same completions given the
    student prompt. `condition` puts both prompts on a `Rollouts` (``prompt_ids`` =
    student's, ``teacher_prompt_ids`` = teacher's), which `loss_step` packs to one
    width so that the completion positions coincide.

    Raises (at construction): ValueError when two problems render to one student or
    one teacher prompt (the map would be ambiguous).
    """

    def __init__(self, student: list[list[int]], teacher: list[list[int]]):
        self.to_teacher = {tuple(s): list(t) for s, t in zip(student, teacher)}
        self.to_student = {tuple(t): list(s) for s, t in zip(student, teacher)}
        if len(self.to_teacher) != len(self.to_student):
            raise ValueError("teacher conditioning: two training problems share a prompt under one template")

    def sampling_prompts(self, trial: TrialConfig, batch: list[list[int]]) -> list[list[int]]:
        """The prompts the rollout policy samples from: the teacher's for OffPD."""
        return [self.to_teacher[tuple(p)] for p in batch] if trial.rollout.policy == "offpd" else batch

    def condition(self, trial: TrialConfig, rollouts: Rollouts) -> Rollouts:
        """``rollouts`` (sampled from the teacher's prompts for OffPD, the student's
        otherwise) with ``prompt_ids`` the student's and ``teacher_prompt_ids`` the teacher's."""
        if trial.rollout.policy == "offpd":
            teacher = [list(p) for p in rollouts.prompt_ids]
            student = [self.to_student[tuple(p)] for p in teacher]
        else:
            student = [list(p) for p in rollouts.prompt_ids]
            teacher = [self.to_teacher[tuple(p)] for p in student]
        return dataclasses.replace(rollouts, prompt_ids=student, teacher_prompt_ids=teacher)


def step_prompts(prompts: list[list[int]], step: int, per_worker: int, rollouts_per_prompt: int) -> list[list[int]]:
    """The prompts of optimizer step ``step`` (0-based) on one rank: a window that
    walks through the rank's shuffled prompt list."""
    lo = (step * per_worker) % max(1, len(prompts) - per_worker)
    return prompts[lo : lo + per_worker // rollouts_per_prompt]


def rollout_seed(trial: TrialConfig, step: int, rank: int) -> int:
    """Sampling seed of step ``step`` (0-based) on ``rank``: rollouts depend on it and
    on the policy's weights only."""
    return trial.seed * 100003 + step * 97 + rank


def _per_worker(trial: TrialConfig, world_size: int) -> int:
    o = trial.optimizer
    return max(1, o.prompts_per_step // world_size) * o.rollouts_per_prompt


def _checkpoint_identity(path: str | Path) -> list:
    """Name, size and mtime of each file of a checkpoint directory (cheap even for 8B
    checkpoints, unlike hashing the weights)."""
    path = Path(path).resolve()
    files = sorted(f for f in path.iterdir() if f.is_file()) if path.is_dir() else []
    return [str(path)] + [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in files]


def offpd_rollout_path(cache_dir: str | Path, trial: TrialConfig, teacher_path: str | Path, rank: int,
                       world_size: int) -> Path:
    """Where the reusable OffPD rollouts of (teacher, prompts, sampling, seed, step
    schedule, rank) live: ``<cache_dir>/offpd-<hash>-r<rank>.parquet``."""
    from distillab.config import config_hash

    r, o = trial.rollout, trial.optimizer
    key = config_hash({
        "teacher": _checkpoint_identity(teacher_path), "engine": resolve_engine(r.engine, batched=True),
        "sampling": [r.tau_t, r.top_p, r.max_tokens],
        "schedule": [o.steps, o.prompts_per_step, o.rollouts_per_prompt, o.train_prompts, trial.seed],
        "tasks": trial.tasks.key_dump(teacher=True, mcq=trial.domain == "mcq"),
        **({"domain": "mcq", "mcq_exclude": trial.evaluation.mcq_test_items} if trial.domain == "mcq" else {}),
        "exclude": max(trial.evaluation.id_items, trial.evaluation.pass_items),
        "rank": [rank, world_size], "version": 1,
    })[:16]
    return Path(cache_dir) / f"offpd-{key}-r{rank}.parquet"


def offpd_rollout_set(trial: TrialConfig, teacher_path: str | Path, tokenizer, rank: int, world_size: int,
                      cache_dir: str | Path, generate=None, generate_many=None) -> list[Rollouts]:
    """OffPD rollout reuse (``rollout.offpd_reuse``): the teacher rollouts of every
    step of the trial's schedule on ``rank``, one `Rollouts` per step, loaded from
    `offpd_rollout_path` or, when absent, generated with ``generate(prompts,
    sampling) -> Rollouts`` (the same prompts and per-step seeds as in-trial
    sampling) or, if given, ``generate_many([(prompts, sampling), ...]) ->
    [Rollouts, ...]`` (all steps in one call), and written there atomically (Parquet: step, prompt_ids,
    completion_ids, logprobs, finish_reason).

    Raises:
        ValueError: the trial's policy is not ``offpd``.
        FileNotFoundError: nothing cached and no ``generate`` given.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    r, o = trial.rollout, trial.optimizer
    if r.policy != "offpd":
        raise ValueError(f"offpd_rollout_set: rollout.policy must be 'offpd', got {r.policy!r}")
    path = offpd_rollout_path(cache_dir, trial, teacher_path, rank, world_size)
    if not path.exists():
        if generate is None and generate_many is None:
            raise FileNotFoundError(f"no cached OffPD rollouts at {path}")
        prompts = train_prompts(trial, tokenizer, rank, role="teacher")  # the teacher's conditioning, if any
        per_worker = _per_worker(trial, world_size)
        jobs = [
            (step_prompts(prompts, step, per_worker, o.rollouts_per_prompt),
             SamplingParams(r.tau_t, r.top_p, r.max_tokens, o.rollouts_per_prompt, rollout_seed(trial, step, rank)))
            for step in range(o.steps)
        ]
        sets = generate_many(jobs) if generate_many is not None else [generate(p, sp) for p, sp in jobs]
        cols: dict[str, list] = {"step": [], "prompt_ids": [], "completion_ids": [], "logprobs": [], "finish_reason": []}
        for step, ro in enumerate(sets):
            cols["step"] += [step] * len(ro.completion_ids)
            cols["prompt_ids"] += ro.prompt_ids
            cols["completion_ids"] += ro.completion_ids
            cols["logprobs"] += ro.logprobs
            cols["finish_reason"] += ro.finish_reasons
        buf = pa.BufferOutputStream()
        pq.write_table(pa.table(cols), buf)
        atomic_write_bytes(path, buf.getvalue().to_pybytes())
    table = pq.read_table(path).to_pydict()
    out = [Rollouts([], [], [], []) for _ in range(o.steps)]
    for st, p, c, lp, fr in zip(table["step"], table["prompt_ids"], table["completion_ids"], table["logprobs"],
                                table["finish_reason"]):
        ro = out[st]
        ro.prompt_ids.append(p)
        ro.completion_ids.append(c)
        ro.logprobs.append(lp)
        ro.finish_reasons.append(fr)
    return out


def setup_models(ctx: dict) -> tuple[Any, Any, Any]:
    """Tokenizer (shared, checked), frozen teacher, trainable student."""
    tok_t, tok_s = load_tokenizer(ctx["teacher_path"]), load_tokenizer(ctx["student_path"])
    check_same_vocab(tok_t, tok_s)
    teacher = load_model(ctx["teacher_path"]).eval()
    teacher.requires_grad_(False)
    student = load_model(ctx["student_path"])
    return tok_s, teacher, student


def setup_engine(student, trial: TrialConfig, world_size: int, *, lr: float | None = None, schedule=None,
                 batch: int | None = None, clip: float | None | str = "optimizer"):
    """DeepSpeed engine around the student: torch AdamW as client optimizer, LR
    linear warm-up then constant, ZeRO stage from the config. With ZeRO 0 the
    clipping is done here (so the unclipped norm is known); with ZeRO ≥ 1 by
    DeepSpeed, whose global norm is read back. The RLVR stage passes its own ``lr``,
    ``schedule`` (a step → multiplier function), per-worker ``batch`` and ``clip``."""
    import deepspeed

    o = trial.optimizer
    per_worker = batch if batch is not None else _per_worker(trial, world_size)
    clip = o.clip if clip == "optimizer" else clip
    opt = torch.optim.AdamW(student.parameters(), lr=lr if lr is not None else o.lr, betas=o.betas, eps=o.eps,
                            weight_decay=o.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, schedule if schedule is not None else lr_lambda(max(1, o.warmup_steps), o.steps, "constant"))
    ds_config = {
        "train_micro_batch_size_per_gpu": per_worker,
        "gradient_accumulation_steps": 1,
        "train_batch_size": per_worker * world_size,
        "gradient_clipping": (clip or 0.0) if o.zero_stage > 0 else 0.0,
        "zero_optimization": {"stage": o.zero_stage, "stage3_gather_16bit_weights_on_model_save": True},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }
    engine, _, _, _ = deepspeed.initialize(model=student, optimizer=opt, lr_scheduler=sched, config=ds_config)
    return engine, opt, per_worker


def sample_rollouts(
    trial: TrialConfig, teacher, student, tokenizer, prompts: list[list[int]], seed: int
) -> Rollouts:
    """The rollout policy ρ: OffPD samples from the teacher at ``rollout.tau_t``,
    OnPD from the current student at ``rollout.tau_s``, ``spectrum`` from π_λ between
    them (`SpectrumEngine`, which also records each rollout's mean student and
    teacher log-likelihood). No gradients."""
    r = trial.rollout
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    if r.policy == "spectrum":
        engine = SpectrumEngine(student, teacher, eos, pad, lam=r.lambda_, tau_s=r.tau_s, tau_t=r.tau_t,
                                alpha=r.alpha, c=r.clip_c)
        tau = 1.0  # unused by the spectrum (its τ_S, τ_T are the engine's)
    else:
        policy, tau = (teacher, r.tau_t) if r.policy == "offpd" else (student, r.tau_s)
        engine = TransformersEngine(policy, eos, pad)
    sp = SamplingParams(tau, r.top_p, r.max_tokens, trial.optimizer.rollouts_per_prompt, seed)
    return engine.generate(prompts, sp)


@torch.no_grad()
def _rows_token_logprobs(hidden: torch.Tensor, weight: torch.Tensor, bias, targets: torch.Tensor, tau: float,
                         chunk: int = 1024) -> torch.Tensor:
    """log softmax((h Wᵀ + b)/τ)[target] for ``(N, H)`` rows, ``chunk`` rows at a time
    (never N × V logits at once): float32 ``(N,)``."""
    out = []
    for lo in range(0, hidden.shape[0], chunk):
        z = hidden[lo : lo + chunk].float() @ weight.float().T
        if bias is not None:
            z = z + bias.float()
        out.append(torch.log_softmax(z / tau, dim=-1).gather(-1, targets[lo : lo + chunk, None])[:, 0])
    return torch.cat(out) if out else hidden.new_zeros(0, dtype=torch.float32)


def importance_weights(trial: TrialConfig, rollouts: Rollouts, cmask: torch.Tensor,
                       policy_logp: torch.Tensor) -> torch.Tensor:
    """Engine-mismatch importance weights w(y) = mean_t min(2, exp(log p_θ − log q))
    (PROTOCOL.md §2; ``ops.kl.engine_mismatch_weights``): ``policy_logp`` (B, T) is
    the trainer's log p_θ of each sampled token under the rollout policy at its
    sampling τ, q the engine's logprobs carried by ``rollouts``. Returns (B,) float32."""
    from distillab.ops.kl import engine_mismatch_weights

    return engine_mismatch_weights(policy_logp, engine_logprobs(rollouts, cmask), cmask)


def loss_step(trial: TrialConfig, engine, teacher, rollouts: Rollouts, pad_id: int, gen: torch.Generator):
    """Teacher and student forward on the rollouts and the configured divergence
    over completion tokens. Returns ``(loss, diagnostics)``.

    ``loss.impl`` ``chunked``/``triton`` (full-vocabulary estimator): the models return
    their final hidden states (``hidden_states[-1]``, after the final norm for
    Llama/Qwen) and only the last position's logits (``logits_to_keep=1``); the lm_head
    and the divergence are fused over row chunks (``ops.chunked``), and the
    diagnostics come from the same pass. ``reference`` (and the sampled estimator):
    full (B, T, V) logits and ``ops.kl``.

    With teacher conditioning (``rollouts.teacher_prompt_ids``) the teacher's forward
    pass sees its own prompts before the same completions; both packs are
    left-padded to one width, so the completion positions (and ``cmask``) coincide.

    With ``loss.importance_weight`` each sequence's loss is multiplied by
    `importance_weights` (the rollout policy's log p_θ at its sampling τ against the
    engine's logprobs in ``rollouts.logprobs``), and ``is/weight_mean`` is added to
    the diagnostics.

    Raises:
        ValueError: rollouts whose logprobs do not cover every completion token
            (with ``loss.importance_weight``).
    """
    import inspect

    import torch.nn.functional as F

    from distillab.ops.chunked import chunked_distill_loss, pad_vocab

    L, r = trial.loss, trial.rollout
    t_prompts = rollouts.teacher_prompt_ids
    width = None
    if t_prompts is not None:  # teacher conditioning: one width, so both packs have the same completion mask
        width = max(len(p) + len(c) for ps in (rollouts.prompt_ids, t_prompts)
                    for p, c in zip(ps, rollouts.completion_ids))
    ids, attn, cmask = pack_rollouts(rollouts.prompt_ids, rollouts.completion_ids, pad_id, width=width)  # (B, T)
    targets = torch.roll(ids, shifts=-1, dims=1)  # (B, T): the token each position's logits predict
    pos = position_ids(attn)
    inputs = dict(input_ids=ids, attention_mask=attn, position_ids=pos)
    t_inputs = inputs  # the teacher's view of the same completions
    if t_prompts is not None:
        t_ids, t_attn, t_cmask = pack_rollouts(t_prompts, rollouts.completion_ids, pad_id, width=width)
        if not torch.equal(t_cmask, cmask):
            raise AssertionError("teacher and student completion masks differ")  # pack_rollouts right-aligns
        t_inputs = dict(input_ids=t_ids, attention_mask=t_attn, position_ids=position_ids(t_attn))

    if L.estimator == "sampled" or L.impl == "reference":
        with torch.no_grad():
            t_logits = teacher(**t_inputs).logits  # (B, T, V_T)
        s_logits = engine(**inputs).logits  # (B, T, V_S)
        if L.pad_vocab and s_logits.shape[-1] != t_logits.shape[-1]:  # -inf columns for the missing rows
            V = max(s_logits.shape[-1], t_logits.shape[-1])
            s_logits = F.pad(s_logits, (0, V - s_logits.shape[-1]), value=float("-inf"))
            t_logits = F.pad(t_logits, (0, V - t_logits.shape[-1]), value=float("-inf"))
        weights = None
        if L.importance_weight:
            z, tau = (t_logits, r.tau_t) if r.policy == "offpd" else (s_logits.detach(), r.tau_s)
            with torch.no_grad():
                logp = torch.log_softmax(z.float() / tau, dim=-1).gather(-1, targets[..., None])[..., 0]
            weights = importance_weights(trial, rollouts, cmask, torch.where(cmask, logp, 0.0))
        if L.estimator == "full":
            loss = distill_loss(
                s_logits, t_logits, cmask, kind=L.kind, tau_s=L.tau_s, tau_t=L.tau_t, reduction=L.reduction,
                weights=weights,
            )
        else:
            loss = sampled_token_loss(
                s_logits, t_logits, cmask, kind=L.kind, tau_s=L.tau_s, tau_t=L.tau_t, generator=gen,
                reduction=L.reduction, weights=weights,
            )
        with torch.no_grad():
            s_d, t_d = s_logits.detach()[cmask], t_logits[cmask]  # (N, V); N = 0: every diagnostic is 0
            fkl = token_divergence(s_d, t_d, kind="forward", tau_s=L.tau_s, tau_t=L.tau_t).sum() / max(1, len(s_d))
            rkl = token_divergence(s_d, t_d, kind="reverse", tau_s=L.tau_s, tau_t=L.tau_t).sum() / max(1, len(s_d))
            h_t, ce = entropy_and_cross_entropy(s_logits.detach(), t_logits, cmask, L.tau_s, L.tau_t)
        diag = {"kl/forward": float(fkl), "kl/reverse": float(rkl), "teacher/entropy": float(h_t),
                "teacher/cross_entropy": float(ce)}
        if weights is not None:
            diag["is/weight_mean"] = float(weights.mean())
        return loss, diag

    # chunked / triton: hidden states + lm_head weights; no (B, T, V) logits
    def lm_head(model):
        head = model.get_output_embeddings()
        return head.weight, getattr(head, "bias", None)

    def forward_kwargs(model, model_inputs):
        keep = "logits_to_keep" in inspect.signature(model.forward).parameters
        return {**model_inputs, "output_hidden_states": True, **({"logits_to_keep": 1} if keep else {})}

    with torch.no_grad():
        h_t = teacher(**forward_kwargs(teacher, t_inputs)).hidden_states[-1]  # (B, T, H_T), final norm applied
    h_s = engine(**forward_kwargs(engine.module, inputs)).hidden_states[-1]  # (B, T, H_S); engine() runs DeepSpeed's hooks
    w_s, b_s = lm_head(engine.module)  # (V_S, H_S)
    w_t, b_t = lm_head(teacher)  # (V_T, H_T)
    if L.pad_vocab and w_s.shape[0] < w_t.shape[0]:
        w_s, b_s = pad_vocab(w_s, w_t.shape[0], b_s)
    elif L.pad_vocab and w_t.shape[0] < w_s.shape[0]:
        w_t, b_t = pad_vocab(w_t, w_s.shape[0], b_t)
    weights = None
    if L.importance_weight:  # the rollout policy's log p_θ of the sampled tokens, from its hidden states
        h, w, b, tau = (h_t, w_t, b_t, r.tau_t) if r.policy == "offpd" else (h_s.detach(), w_s.detach(),
                                                                             b_s, r.tau_s)
        logp = torch.zeros(cmask.shape, dtype=torch.float32)
        logp[cmask] = _rows_token_logprobs(h[cmask], w, None if b is None else b.detach(), targets[cmask], tau)
        weights = importance_weights(trial, rollouts, cmask, logp)
    loss, stats = chunked_distill_loss(
        h_s, w_s, h_t, w_t, cmask, student_bias=b_s, teacher_bias=b_t, kind=L.kind, tau_s=L.tau_s,
        tau_t=L.tau_t, reduction=L.reduction, weights=weights, backend="triton" if L.impl == "triton" else "auto",
        return_stats=True,
    )  # stats: (N, 4) forward KL, reverse KL, H(π_T), H(π_T, π_S) per completion token
    means = stats.double().mean(0).tolist() if stats.shape[0] else [0.0] * 4
    diag = dict(zip(("kl/forward", "kl/reverse", "teacher/entropy", "teacher/cross_entropy"), means))
    if weights is not None:
        diag["is/weight_mean"] = float(weights.mean())
    return loss, diag


def start_vllm_actor(trial: TrialConfig, model_path, tokenizer, threads: int):
    """A `rollout.RolloutActor` (vLLM) on this worker's node for ``model_path``, with
    the trial's seed and ``rollout.vllm_*`` settings (`rollout.start_rollout_actor`)."""
    from distillab.rollout import start_rollout_actor

    r = trial.rollout
    return start_rollout_actor(
        "vllm", model_path, tokenizer.eos_token_id, tokenizer.pad_token_id, threads=threads,
        num_gpus=0.0, seed=trial.seed, max_model_len=r.vllm_max_model_len,
        kv_cache_gib=r.vllm_kv_cache_gib, gpu_memory_utilization=r.vllm_gpu_memory_utilization,
    )


class RolloutSource:
    """Where a worker's rollouts come from, step by step (PROTOCOL.md §1, DESIGN.md):

    - OffPD with ``rollout.offpd_reuse``: the cached set of `offpd_rollout_set`
      (generated here, with the engine `rollout.resolve_engine` picks for batched
      generation, if the sweep did not);
    - vLLM (``rollout.engine: vllm``, or ``auto`` on a GPU; OffPD, OnPD): a
      `rollout.RolloutActor` holding a `rollout.VLLMEngine` on the worker's node;
      OnPD syncs the student's weights into it at start and after every
      ``rollout.sync_every`` optimizer steps;
    - otherwise (and for the λ-spectrum) in-process transformers sampling
      (`sample_rollouts`), which always uses the current weights.

    ``sync(module)`` returns the seconds the weight sync took (0.0 when none was due).
    """

    def __init__(self, trial: TrialConfig, config: dict, tokenizer, teacher, module, rank: int, world: int):
        self.trial, self.tok, self.teacher, self.actor, self.cached = trial, tokenizer, teacher, None, None
        r = trial.rollout
        threads = int(config.get("torch_threads", 1))
        if r.policy == "offpd" and r.offpd_reuse:
            cache = config.get("shared_cache") or str(Path(config["results_root"]) / "shared")
            self.cached = offpd_rollout_set(
                trial, config["teacher_path"], tokenizer, rank, world, cache,
                generate_many=lambda jobs: self._fresh(config, threads).generate_many(jobs),
            )
            self.close()
        elif resolve_engine(r.engine, batched=False) == "vllm" and r.policy in ("offpd", "onpd"):
            self._fresh(config, threads)
            if r.policy == "onpd":  # the engine starts from the same weights as the trainer (also after a resume)
                self.sync(module, force=True)

    def _fresh(self, config: dict, threads: int):
        """The engine for this worker's policy, started on first use: a `RolloutActor`
        (vLLM) or an in-process `TransformersEngine` over the held model."""
        r = self.trial.rollout
        if resolve_engine(r.engine, batched=r.policy == "offpd" and r.offpd_reuse) != "vllm":
            return TransformersEngine(self.teacher, self.tok.eos_token_id, self.tok.pad_token_id)
        if self.actor is None:
            from distillab.rlvr import ActorSampler

            path = config["teacher_path"] if r.policy == "offpd" else config["student_path"]
            self.actor = start_vllm_actor(self.trial, path, self.tok, threads)
            self._remote = ActorSampler(self.actor)
        return self._remote

    def get(self, step: int, prompts: list[list[int]], seed: int, module) -> Rollouts:
        """Rollouts of optimizer step ``step`` (0-based) for ``prompts``."""
        r = self.trial.rollout
        if self.cached is not None:
            return self.cached[step]
        if self.actor is not None:
            tau = r.tau_t if r.policy == "offpd" else r.tau_s
            sp = SamplingParams(tau, r.top_p, r.max_tokens, self.trial.optimizer.rollouts_per_prompt, seed)
            return self._remote.generate(prompts, sp)
        return sample_rollouts(self.trial, self.teacher, module, self.tok, prompts, seed=seed)

    def sync(self, module, step: int = 0, force: bool = False) -> float:
        """Weight sync into the vLLM engine (OnPD) after optimizer step ``step`` (1-based)
        when due. Full parameters are read from ``module`` (ZeRO 0-2 keep them whole on
        every rank). Returns seconds spent."""
        if self.actor is None or self.trial.rollout.policy != "onpd":
            return 0.0
        if not force and step % self.trial.rollout.sync_every:
            return 0.0
        return self._remote.sync(module)

    def close(self) -> None:
        """End the engine actor, if one was started."""
        if self.actor is not None:
            import ray

            ray.kill(self.actor)
            self.actor = None


def _grad_norm_and_clip(engine, trial: TrialConfig) -> float:
    if trial.optimizer.zero_stage == 0:
        clip = trial.optimizer.clip
        params = [p for p in engine.module.parameters() if p.grad is not None]
        return float(torch.nn.utils.clip_grad_norm_(params, clip if clip is not None else float("inf")))
    return float("nan")  # read after step from DeepSpeed


def _save_checkpoint(engine, trial: TrialConfig, tokenizer, step: int, directory: Path) -> None:
    if trial.optimizer.zero_stage == 3:
        state = engine._zero3_consolidated_16bit_state_dict()
        engine.module.save_pretrained(directory, state_dict=state, safe_serialization=True)
    else:
        engine.module.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    (directory / "trainer_state.json").write_text(json.dumps({"step": step}))


def pre_eval_path(cache_dir: str | Path, trial: TrialConfig, student_path: str | Path) -> Path:
    """Where the evaluation of the untrained student is kept: it depends only on the
    student checkpoint, the evaluation and task settings and the seed, so every trial
    of a sweep that shares those reuses it (``<cache_dir>/pre-eval-<hash>.json``)."""
    from distillab.config import config_hash

    key = config_hash({
        "student": _checkpoint_identity(student_path), "evaluation": trial.evaluation.model_dump(mode="json"),
        "tasks": trial.tasks.key_dump(teacher=False, mcq=trial.evaluation.mcq_items > 0), "seed": trial.seed,
        "version": 1,
    })[:16]
    return Path(cache_dir) / f"pre-eval-{key}.json"


def _evaluate(evaluator: Evaluator, model, trial: TrialConfig, trial_id: str, stage: str, step: int, root: Path,
              init_state: dict | None = None, cache: Path | None = None) -> dict[str, float]:
    t0 = time.perf_counter()
    if cache is not None and cache.exists():  # the same model, settings and seed were evaluated already
        rows = json.loads(cache.read_text())
    else:
        rows = evaluator.evaluate(model, seed=trial.seed)
        if cache is not None:
            atomic_write_bytes(cache, json.dumps(rows).encode())
    if init_state is not None:
        final = {k: v.detach().float() for k, v in model.state_dict().items()}
        for tau in trial.evaluation.sparsity_taus:
            overall, _ = update_sparsity(init_state, final, tau)
            rows.append({"task": "params", "metric": f"sparsity@{tau:g}", "value": overall, "n": len(final)})
    for r in rows:
        r.update(trial_id=trial_id, stage=stage, step=step)
    write_rows(root, "evals", rows, key=f"{trial_id}__{stage}__{step}")
    log.info("%s eval %s step %d in %.1f s", trial_id, stage, step, time.perf_counter() - t0)
    return {f"eval/{stage}/{r['task']}/{r['metric']}": r["value"] for r in rows}


def train_loop_per_worker(config: dict) -> None:
    """Ray Train worker function. ``config``: ``trial`` (TrialConfig as JSON dict),
    ``trial_id``, ``teacher_path``, ``student_path``, ``results_root``, ``torch_threads``."""
    import ray.train

    for k, v in WORKER_ENV.items():
        os.environ.setdefault(k, v)
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    torch.set_num_threads(int(config.get("torch_threads", 1)))
    _quiet_report_log()
    trial = TrialConfig.model_validate(config["trial"])
    trial_id, root = config["trial_id"], Path(config["results_root"])
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    o = trial.optimizer
    torch.manual_seed(trial.seed)

    # --- setup: models, resume, evaluation before training
    tok, teacher, student = setup_models(config)
    init_state = {k: v.detach().float().clone() for k, v in student.state_dict().items()}
    start_step = 0
    ckpt = ray.train.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d:
            start_step = json.loads((Path(d) / "trainer_state.json").read_text())["step"]
            student = load_model(d)
    evaluator = Evaluator(tok, trial.tasks, trial.evaluation)
    if rank == 0 and start_step == 0:
        cache = config.get("shared_cache") or str(root / "shared")
        _evaluate(evaluator, student, trial, trial_id, "pre", 0, root, init_state,  # S_τ = 1 by definition
                  cache=pre_eval_path(cache, trial, config["student_path"]))

    engine, opt, per_worker = setup_engine(student, trial, world)
    for _ in range(start_step):  # LR schedule position after a resume
        engine.lr_scheduler.step()
    prompts = train_prompts(trial, tok, rank)
    conditioning = TeacherPrompts(prompts, train_prompts(trial, tok, rank, role="teacher")) \
        if trial.tasks.teacher_conditioned else None
    source = RolloutSource(trial, config, tok, teacher, engine.module, rank, world)
    gen = torch.Generator().manual_seed(trial.seed * 7 + rank)
    pending: list[dict] = []
    last_metrics: dict[str, float] = {}
    if start_step > 0:  # a restart from a checkpoint: say so in the metrics table
        log.info("%s resumed at step %d", trial_id, start_step)
        pending.append({"trial_id": trial_id, "stage": "distill", "step": start_step,
                        "name": "resume/start_step", "value": float(start_step)})
    gauges = RayGauges(trial_id) if rank == 0 else None
    t_train = time.perf_counter()
    log_every = 10

    # --- distillation steps
    for step in range(start_step, o.steps):
        t0 = time.perf_counter()
        batch = step_prompts(prompts, step, per_worker, o.rollouts_per_prompt)
        if conditioning is not None:  # OffPD: the teacher samples from its own prompts
            batch = conditioning.sampling_prompts(trial, batch)
        rollouts = source.get(step, batch, rollout_seed(trial, step, rank), engine.module)
        if conditioning is not None:
            rollouts = conditioning.condition(trial, rollouts)
        t_gen = time.perf_counter() - t0
        engine.module.train()
        loss, diag = loss_step(trial, engine, teacher, rollouts, tok.pad_token_id, gen)
        engine.backward(loss)
        grad_norm = _grad_norm_and_clip(engine, trial)
        lr = engine.get_lr()[0]
        engine.step()
        if o.zero_stage > 0:
            gn = engine.get_global_grad_norm()
            grad_norm = float(gn) if gn is not None else float("nan")
        t_sync = source.sync(engine.module, step + 1)
        n_tok = sum(rollouts.lengths)
        metrics = {
            "loss": float(loss.detach()),
            "grad_norm": grad_norm,
            "lr": lr,
            "rollout/length": n_tok / max(1, len(rollouts.lengths)),
            **({} if source.cached is not None else {"rollout/tokens_per_s": n_tok / max(1e-9, t_gen)}),
            "time/step_s": time.perf_counter() - t0,
            "time/rollout_s": t_gen,
            **({"time/sync_s": t_sync} if source.actor is not None and trial.rollout.policy == "onpd" else {}),
            **diag,
        }
        for name in ("student_loglik", "teacher_loglik"):  # λ-spectrum rollouts (PROTOCOL.md §3)
            vals = rollouts.extras.get(name)
            if vals:
                metrics[f"rollout/{name}"] = sum(vals) / len(vals)
        last_metrics = metrics
        if gauges is not None:
            gauges.set(metrics)
        pending += [
            {"trial_id": trial_id, "stage": "distill", "step": step + 1, "name": k, "value": float(v)}
            for k, v in metrics.items()
        ]
        last = step + 1 == o.steps
        checkpoint_due = bool(o.checkpoint_every) and (step + 1) % o.checkpoint_every == 0 and not last
        if (step + 1) % log_every == 0 or last or checkpoint_due:
            if rank == 0:  # one file per window, keyed by its last step: a rerun window replaces it
                write_rows(root, "metrics", pending, key=f"{trial_id}__distill__{step + 1:07d}")
            pending = []
            checkpoint = None
            if checkpoint_due:
                checkpoint = _make_checkpoint(engine, trial, tok, step + 1, rank)
            ray.train.report({"step": step + 1, **metrics}, checkpoint=checkpoint)
            if checkpoint is not None:
                shutil.rmtree(checkpoint.path, ignore_errors=True)

    # --- after: evaluation, sparsity, final checkpoint
    source.close()
    train_s = time.perf_counter() - t_train
    final = {**last_metrics, "step": o.steps, "time/train_s": train_s}  # last step's diagnostics stay in view
    if rank == 0:
        write_rows(root, "metrics", [{"trial_id": trial_id, "stage": "distill", "step": o.steps,
                                      "name": "time/train_s", "value": train_s}],
                   key=f"{trial_id}__distill__train_time")  # in-loop seconds (of this run, after a resume)
        _evaluate(evaluator, engine.module, trial, trial_id, "distill", o.steps, root, init_state)
    if trial.rlvr is not None:  # GRPO/DAPO on the distilled student, then the suite again (stage rlvr)
        engine = _rlvr_stage(trial, config, engine, tok, trial_id, root, rank, world, gauges)
        final.update(step=o.steps + trial.rlvr.steps)
        if rank == 0:
            _evaluate(evaluator, engine.module, trial, trial_id, "rlvr", trial.rlvr.steps, root, init_state)
    if rank == 0:
        final.update(report_metrics(root, trial_id))  # pre (also after a resume), distill, rlvr, eval/forgetting
    checkpoint = _make_checkpoint(engine, trial, tok, o.steps, rank)
    ray.train.report(final, checkpoint=checkpoint)
    if checkpoint is not None:  # Ray has copied it to the run's storage
        shutil.rmtree(checkpoint.path, ignore_errors=True)


def _rlvr_stage(trial: TrialConfig, config: dict, engine, tok, trial_id: str, root: Path, rank: int, world: int,
                gauges):
    """Run `rlvr.run_rlvr` on the distilled student, writing its per-step metrics
    (stage ``rlvr``, 10-step windows) and reporting to Ray Train as it goes. The
    stage gets its own DeepSpeed engine around the same module (AdamW rebuilt: the
    distillation optimizer's moments are not carried over), or around its LoRA
    wrapper (``rlvr.lora``), whose adapters are merged back afterwards; with
    ``rlvr.lora.load_in_4bit`` the adapters train on a 4-bit copy (`rlvr.quantized_lora`,
    plain AdamW) and the trained policy is written back into the module. With
    ``rlvr.engine`` resolving to vLLM the samples come from a `rollout.RolloutActor`
    started from the student's checkpoint and synced to the trained (merged) weights
    before every step (`rlvr.ActorSampler`), else from the module itself. Returns
    ``engine``, whose module now holds the trained student. With W workers each samples
    ``prompts_per_step / W`` prompts (the sweep checks divisibility) and DeepSpeed
    averages the gradients; QLoRA runs on one worker."""
    import ray
    import ray.train

    from distillab.rlvr import TorchStepper, lora_policy, rlvr_problems, rlvr_schedule, run_rlvr

    pending: list[dict] = []

    def report(step: int, metrics: dict[str, float]) -> None:
        nonlocal pending
        pending += [{"trial_id": trial_id, "stage": "rlvr", "step": step, "name": k, "value": float(v)}
                    for k, v in metrics.items()]
        if gauges is not None:
            gauges.set({"reward/mean": metrics["rlvr/reward_mean"]})
        if step % 10 == 0 or step == trial.rlvr.steps:
            if rank == 0:
                write_rows(root, "metrics", pending, key=f"{trial_id}__rlvr__{step:07d}")
            pending = []
            ray.train.report({"step": trial.optimizer.steps + step, **metrics})

    # data-parallel over the trial's workers: each samples prompts_per_step / world prompts of its own
    # (a disjoint stride of one shuffled problem list); run_rlvr normalises the loss over all ranks
    r = trial.rlvr.model_copy(update={"prompts_per_step": trial.rlvr.prompts_per_step // world})
    module, finish = lora_policy(engine.module, r.lora)
    if r.lora is not None and r.lora.load_in_4bit:  # plain AdamW over the adapters: DeepSpeed takes no 4-bit params
        stepper = TorchStepper(module, r.lr, rlvr_schedule(r))
    else:
        stepper, _, _ = setup_engine(module, trial, world, lr=r.lr, schedule=rlvr_schedule(r),
                                     batch=r.prompts_per_step * r.samples_per_prompt, clip=r.clip)
    problems = rlvr_problems(r, trial.tasks, trial.evaluation, trial.seed)[rank::world]
    sampler = None
    if resolve_engine(r.engine, batched=False) == "vllm":
        from distillab.rlvr import ActorSampler

        sampler = ActorSampler(start_vllm_actor(trial, config["student_path"], tok,
                                                int(config.get("torch_threads", 1))))
    try:
        run_rlvr(r, stepper, tok, trial.tasks, problems, trial.seed + rank, report, sampler=sampler)
    finally:
        if sampler is not None:
            ray.kill(sampler.actor)
    finish()  # LoRA merged, or the QLoRA policy written back, into engine.module
    return engine


class RayGauges:
    """Custom Ray metrics (``ray.util.metrics.Gauge``, tagged by ``trial_id``) for the
    dashboard's metrics endpoint (Prometheus names ``ray_distillab_*``): rollout
    tokens/s, forward and reverse KL, loss, and RLVR reward when reported."""

    NAMES = {
        "rollout/tokens_per_s": "distillab_rollout_tokens_per_s",
        "kl/forward": "distillab_kl_forward",
        "kl/reverse": "distillab_kl_reverse",
        "loss": "distillab_loss",
        "reward/mean": "distillab_reward_mean",
    }

    def __init__(self, trial_id: str):
        from ray.util.metrics import Gauge

        self.tags = {"trial_id": trial_id}
        self.gauges = {
            k: Gauge(name, description=f"distillab {k} (last step)", tag_keys=("trial_id",))
            for k, name in self.NAMES.items()
        }

    def set(self, metrics: dict[str, float]) -> None:
        """Set each known metric present in ``metrics`` (others are ignored)."""
        for k, g in self.gauges.items():
            if k in metrics and metrics[k] == metrics[k]:  # not NaN
                g.set(float(metrics[k]), tags=self.tags)


def _quiet_report_log() -> None:
    """Ray Train V2 logs every ``ray.train.report`` at INFO on the console (a line per
    report per worker); keep it to warnings. Its logger is named by file path."""
    try:
        from ray.train.v2._internal.execution import context

        logging.getLogger(context.__file__).setLevel(logging.WARNING)
    except Exception:  # internal module moved: keep Ray's default logging
        pass


def _make_checkpoint(engine, trial: TrialConfig, tok, step: int, rank: int):
    import ray.train

    d = Path(tempfile.mkdtemp(prefix="distillab-ckpt-"))
    if rank == 0 or trial.optimizer.zero_stage == 3:
        _save_checkpoint(engine, trial, tok, step, d)
    return ray.train.Checkpoint.from_directory(str(d)) if rank == 0 else None
