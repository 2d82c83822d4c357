"""Where a distillation trial's worker takes each step's rollouts from (PROTOCOL.md §1):
the step schedule (`step_prompts`, `rollout_seed`), the policy ρ sampled in-process
(`sample_rollouts`), teacher conditioning (`TeacherPrompts`), the reusable OffPD sets
(`offpd_rollout_set`, cached as Parquet) and `RolloutSource`, which picks among them and
an engine actor (`rollout.actor`) by the trial's ``rollout`` section.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Sequence

import pyarrow as pa
import pyarrow.parquet as pq
import ray

from distillab.config import TrialConfig, cache_key, checkpoint_identity
from distillab.registry import OFFPD, ONPD, SPECTRUM
from distillab.rollout.actor import ActorSampler, resolve_engine, start_vllm_actor
from distillab.rollout.engine import TransformersEngine
from distillab.rollout.spectrum import SpectrumEngine
from distillab.rollout.types import Rollouts, SamplingParams
from distillab.tables import atomic_write_bytes
from distillab.tasks.data import TaskData
from distillab.tasks.registry import domain_task


def step_prompts(prompts: Sequence[list[int]], step: int, per_worker: int, rollouts_per_prompt: int) -> list[list[int]]:
    """The prompts of optimizer step ``step`` (0-based) on one rank: a window that
    walks through the rank's shuffled prompt list."""
    lo = (step * per_worker) % max(1, len(prompts) - per_worker)
    return prompts[lo : lo + per_worker // rollouts_per_prompt]


def rollout_seed(trial: TrialConfig, step: int, rank: int) -> int:
    """Sampling seed of step ``step`` (0-based) on ``rank`` (``trial.seeds``): rollouts
    depend on it and on the policy's weights only."""
    return trial.seeds.rollout_seed(trial.seed, step, rank)


def sample_rollouts(trial: TrialConfig, teacher, student, tokenizer, prompts: list[list[int]], seed: int) -> Rollouts:
    """The rollout policy ρ in-process: OffPD samples from the teacher at
    ``rollout.tau_t``, OnPD from the current student at ``rollout.tau_s``, ``spectrum``
    from π_λ between them (`SpectrumEngine`, which also records each rollout's mean
    student and teacher log-likelihood). No gradients."""
    r = trial.rollout
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    if r.policy == SPECTRUM:
        engine = SpectrumEngine(student, teacher, eos, pad, lam=r.lambda_, tau_s=r.tau_s, tau_t=r.tau_t,
                                alpha=r.alpha, c=r.clip_c)
        tau = 1.0  # unused by the spectrum (its τ_S, τ_T are the engine's)
    else:
        policy, tau = (teacher, r.tau_t) if r.policy == OFFPD else (student, r.tau_s)
        engine = TransformersEngine(policy, eos, pad)
    sp = SamplingParams(tau, r.top_p, r.max_tokens, trial.optimizer.rollouts_per_prompt, seed)
    return engine.generate(prompts, sp)


class TeacherPrompts:
    """Teacher conditioning (``tasks.teacher_system_prompt`` / ``teacher_user_template``):
    the map between a training problem's student prompt and its teacher prompt.

    The teacher samples OffPD rollouts from its own prompts, and scores every rollout
    given its own prompt; the student trains on the same completions given the
    student prompt. `condition` puts both prompts on a `Rollouts` (``prompt_ids`` =
    student's, ``teacher_prompt_ids`` = teacher's), which `loss.loss_step` packs to one
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
        return [self.to_teacher[tuple(p)] for p in batch] if trial.rollout.policy == OFFPD else batch

    def condition(self, trial: TrialConfig, rollouts: Rollouts) -> Rollouts:
        """``rollouts`` (sampled from the teacher's prompts for OffPD, the student's
        otherwise) with ``prompt_ids`` the student's and ``teacher_prompt_ids`` the teacher's."""
        if trial.rollout.policy == OFFPD:
            teacher = [list(p) for p in rollouts.prompt_ids]
            student = [self.to_student[tuple(p)] for p in teacher]
        else:
            student = [list(p) for p in rollouts.prompt_ids]
            teacher = [self.to_teacher[tuple(p)] for p in student]
        return dataclasses.replace(rollouts, prompt_ids=student, teacher_prompt_ids=teacher)


def offpd_rollout_path(cache_dir: str | Path, trial: TrialConfig, teacher_path: str | Path, rank: int,
                       world_size: int) -> Path:
    """Where the reusable OffPD rollouts of (teacher, prompts, sampling, seeds, step
    schedule, rank) live: ``<cache_dir>/offpd-<config.cache_key>-r<rank>.parquet``. The prompts are
    the domain task's (`tasks.registry.domain_task`): its settings, and what of the evaluation
    decides its training items (`tasks.base.Task.offpd_exclusion`)."""
    r, o, task = trial.rollout, trial.optimizer, domain_task(trial.domain)
    key = cache_key(
        "offpd_rollouts", 2, teacher=checkpoint_identity(teacher_path), engine=resolve_engine(r.engine, batched=True),
        sampling=[r.tau_t, r.top_p, r.max_tokens], seed=trial.seed, seeds=trial.seeds.model_dump(),
        schedule=[o.steps, o.prompts_per_step, o.rollouts_per_prompt, o.train_prompts], domain=trial.domain,
        tasks=trial.tasks.inputs(teacher=True, uses=[task.name]), exclude=task.offpd_exclusion(trial.evaluation),
        rank=[rank, world_size],
    )
    return Path(cache_dir) / f"offpd-{key}-r{rank}.parquet"


def _write_rollout_sets(path: Path, sets: list[Rollouts]) -> None:
    """One Parquet file (step, prompt_ids, completion_ids, logprobs, finish_reason), atomically."""
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


def _read_rollout_sets(path: Path, steps: int) -> list[Rollouts]:
    table = pq.read_table(path).to_pydict()
    out = [Rollouts([], [], [], []) for _ in range(steps)]
    for st, p, c, lp, fr in zip(table["step"], table["prompt_ids"], table["completion_ids"], table["logprobs"],
                                table["finish_reason"]):
        ro = out[st]
        ro.prompt_ids.append(p)
        ro.completion_ids.append(c)
        ro.logprobs.append(lp)
        ro.finish_reasons.append(fr)
    return out


def offpd_rollout_set(trial: TrialConfig, teacher_path: str | Path, tokenizer, rank: int, world_size: int,
                      cache_dir: str | Path, generate=None, generate_many=None) -> list[Rollouts]:
    """OffPD rollout reuse (``rollout.offpd_reuse``): the teacher rollouts of every
    step of the trial's schedule on ``rank``, one `Rollouts` per step, loaded from
    `offpd_rollout_path` or, when absent, generated with ``generate(prompts,
    sampling) -> Rollouts`` (the same prompts and per-step seeds as in-trial
    sampling) or, if given, ``generate_many([(prompts, sampling), ...]) ->
    [Rollouts, ...]`` (all steps in one call), and written there atomically (Parquet:
    step, prompt_ids, completion_ids, logprobs, finish_reason).

    Raises:
        ValueError: the trial's policy is not ``offpd``.
        FileNotFoundError: nothing cached and no ``generate`` given.
    """
    r, o = trial.rollout, trial.optimizer
    if r.policy != OFFPD:
        raise ValueError(f"offpd_rollout_set: rollout.policy must be {OFFPD!r}, got {r.policy!r}")
    path = offpd_rollout_path(cache_dir, trial, teacher_path, rank, world_size)
    if not path.exists():
        if generate is None and generate_many is None:
            raise FileNotFoundError(f"no cached OffPD rollouts at {path}")
        prompts = TaskData.of(trial).train_prompts(tokenizer, rank, role="teacher")  # the teacher's conditioning
        per_worker = o.per_worker(world_size)
        jobs = [
            (step_prompts(prompts, step, per_worker, o.rollouts_per_prompt),
             SamplingParams(r.tau_t, r.top_p, r.max_tokens, o.rollouts_per_prompt, rollout_seed(trial, step, rank)))
            for step in range(o.steps)
        ]
        sets = generate_many(jobs) if generate_many is not None else [generate(p, sp) for p, sp in jobs]
        _write_rollout_sets(path, sets)
    return _read_rollout_sets(path, o.steps)


class RolloutSource:
    """Where a worker's rollouts come from, step by step (PROTOCOL.md §1, DESIGN.md):

    - OffPD with ``rollout.offpd_reuse``: the cached set of `offpd_rollout_set`
      (generated here, with the engine `resolve_engine` picks for batched
      generation, if the sweep did not);
    - vLLM (``rollout.engine: vllm``, or ``auto`` on a GPU; OffPD, OnPD): a
      `RolloutActor` holding a `VLLMEngine` on the worker's node; OnPD syncs the
      student's weights into it at start and after every ``rollout.sync_every``
      optimizer steps;
    - otherwise (and for the λ-spectrum) in-process transformers sampling
      (`sample_rollouts`), which always uses the current weights.

    With teacher conditioning (``conditioning``, a `TeacherPrompts`) the rollouts of
    `get` carry both prompts. ``ctx`` is the trial's `config.RuntimeContext`.
    """

    def __init__(self, trial: TrialConfig, ctx, tokenizer, teacher, module, rank: int, world: int,
                 conditioning: TeacherPrompts | None = None):
        self.trial, self.ctx, self.tok, self.teacher, self.rank = trial, ctx, tokenizer, teacher, rank
        self.conditioning, self.actor, self.cached = conditioning, None, None
        r = trial.rollout
        if r.policy == OFFPD and r.offpd_reuse:
            self.cached = offpd_rollout_set(trial, ctx.teacher_path, tokenizer, rank, world, ctx.shared_cache,
                                            generate_many=lambda jobs: self._fresh().generate_many(jobs))
            self.close()
        elif resolve_engine(r.engine, batched=False) == "vllm" and r.policy in (OFFPD, ONPD):
            self._fresh()
            if r.policy == ONPD:  # the engine starts from the same weights as the trainer (also after a resume)
                self.sync(module, force=True)

    def _fresh(self):
        """The engine for this worker's policy, started on first use: a `RolloutActor`
        (vLLM) or an in-process `TransformersEngine` over the held model."""
        r = self.trial.rollout
        if resolve_engine(r.engine, batched=r.policy == OFFPD and r.offpd_reuse) != "vllm":
            return TransformersEngine(self.teacher, self.tok.eos_token_id, self.tok.pad_token_id)
        if self.actor is None:
            path = self.ctx.teacher_path if r.policy == OFFPD else self.ctx.student_path
            self.actor = start_vllm_actor(self.trial, path, self.tok, self.ctx.torch_threads)
            self._remote = ActorSampler(self.actor)
        return self._remote

    @property
    def fresh(self) -> bool:
        """True when rollouts are sampled during the trial (not read from a cached set)."""
        return self.cached is None

    def get(self, step: int, prompts: list[list[int]], module) -> Rollouts:
        """Rollouts of optimizer step ``step`` (0-based) for the student ``prompts``
        (sampled with `rollout_seed`; the current weights of ``module`` for OnPD)."""
        r, c = self.trial.rollout, self.conditioning
        if self.cached is not None:
            rollouts = self.cached[step]
        else:
            sampling_prompts = c.sampling_prompts(self.trial, prompts) if c is not None else prompts
            seed = rollout_seed(self.trial, step, self.rank)
            if self.actor is not None:
                tau = r.tau_t if r.policy == OFFPD else r.tau_s
                sp = SamplingParams(tau, r.top_p, r.max_tokens, self.trial.optimizer.rollouts_per_prompt, seed)
                rollouts = self._remote.generate(sampling_prompts, sp)
            else:
                rollouts = sample_rollouts(self.trial, self.teacher, module, self.tok, sampling_prompts, seed=seed)
        return c.condition(self.trial, rollouts) if c is not None else rollouts

    def sync(self, module, step: int = 0, force: bool = False) -> float:
        """Weight sync into the vLLM engine (OnPD) after optimizer step ``step`` (1-based)
        when due. Full parameters are read from ``module`` (ZeRO 0-2 keep them whole on
        every rank). Returns seconds spent (0.0 when none was due)."""
        if self.actor is None or self.trial.rollout.policy != ONPD:
            return 0.0
        if not force and step % self.trial.rollout.sync_every:
            return 0.0
        return self._remote.sync(module)

    @property
    def syncs(self) -> bool:
        """True when `sync` moves weights (OnPD with an engine actor)."""
        return self.actor is not None and self.trial.rollout.policy == ONPD

    def close(self) -> None:
        """End the engine actor, if one was started."""
        if self.actor is not None:
            ray.kill(self.actor)
            self.actor = None
