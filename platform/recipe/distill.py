"""The distillation trial, read top to bottom (PROTOCOL.md §1–§4): a Ray Train
``TorchTrainer`` runs `train_loop_per_worker` on each worker, which runs the recipe
`run_worker`:

    setup     models, resume, evaluation before training (stage ``pre``), DeepSpeed
              engine, training prompts, rollout source          (`setup_trial`)
    per step  prompts   the rank's window of its prompt list    (`rollout.source.step_prompts`)
              rollouts  OffPD / OnPD / π_λ, cached or sampled   (`rollout.source.RolloutSource`)
              loss      teacher + student forward, divergence   (`loss.loss_step`)
              update    backward, unclipped grad norm, clip, step (`optim.optimizer_step`)
              sync      OnPD: new weights into the vLLM engine  (`RolloutSource.sync`)
              log       metrics table, gauges, Ray report, checkpoint (`log_step`)
    finish    the loop's end (`end_loop`), evaluation after training (stage ``distill``,
              update sparsity; `evaluate_distilled`), the optional RLVR stage and its
              evaluation (`rlvr_stage`), the final student checkpoint, the final
              report and the run's times (`record_times`)        (`finish`)

The loop talks to Ray only through a `session.Session` (rank, world size, checkpoint to resume from,
``report``): `session.RaySession` in a ``TorchTrainer`` or a Tune trial actor, `session.LocalSession` in
one process (tests/test_golden.py).
With ``optimizer.checkpoint_every`` a restarted worker group resumes from the latest
checkpoint exactly: weights, step, AdamW moments and master weights, LR schedule, the
random streams and the gradient masks (`optim.save_checkpoint`; tests/test_resume.py).
Metric keys: `distillab.registry`.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from distillab.config import RuntimeContext, TrialConfig, TrialLaunch
from distillab.evals.metrics import parameter_state
from distillab.evals.suite import Evaluator, evaluate_stage, pre_eval_path
from distillab.models import (
    DTYPES,
    bf16_matmuls,
    check_lm_heads,
    check_same_vocab,
    configure_passes,
    load_model,
    load_tokenizer,
)
from distillab.recipe.loss import loss_step
from distillab.recipe.optim import (
    Resume,
    TouchedParameters,
    engine_state,
    gathered_for_generation,
    load_checkpoint,
    load_engine_state,
    optimizer_step,
    rng_state,
    save_checkpoint,
    set_rng_state,
    setup_engine,
)
from distillab.recipe.rlvr import run_rlvr_stage
from distillab.recipe.session import RaySession, Session
from distillab.recipe.teacher import LocalTeacher, samples_with_teacher, shared_teacher
from distillab.recipe.telemetry import MetricsLog, RayGauges, TrialTimes, quiet_report_log
from distillab.registry import OFFPD, ONPD, SPECTRUM, with_forgetting
from distillab.rollout.source import RolloutSource, TeacherPrompts, step_prompts
from distillab.rollout.stale import StaleRollouts, stale_source
from distillab.rollout.types import Rollouts
from distillab.tables import report_metrics
from distillab.tasks.data import TaskData

__all__ = ["WorkerState", "setup_models", "setup_trial", "step_metrics", "log_step", "end_loop",
           "evaluate_distilled", "rlvr_stage", "record_times", "finish", "run_worker", "train_loop_per_worker",
           "loss_step"]



log = logging.getLogger(__name__)

WORKER_ENV = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def setup_models(ctx: RuntimeContext, trial: TrialConfig) -> tuple[Any, Any, Any]:
    """Tokenizer (shared, checked), frozen teacher, trainable student, both loaded in
    ``trial.precision`` (`models.DTYPES`: under bf16 the weights are rounded to bf16;
    DeepSpeed keeps float32 masters of the student's when ``master_weights`` is fp32)
    with ``trial.attn_implementation``. With ``teacher.serve: shared`` the teacher is None unless
    the worker samples from it (`teacher.samples_with_teacher`): the service scores."""
    tok_t, tok_s = load_tokenizer(ctx.teacher_path), load_tokenizer(ctx.student_path)
    check_same_vocab(tok_t, tok_s)
    dtype, attn = DTYPES[trial.precision], trial.attn_implementation
    teacher = None
    if trial.teacher.serve == "worker" or samples_with_teacher(trial):
        teacher = load_model(ctx.teacher_path, dtype, attn).eval()
        teacher.requires_grad_(False)
    return tok_s, teacher, load_model(ctx.student_path, dtype, attn)


@dataclass(kw_only=True)
class WorkerState:
    """One worker's trial once set up (`setup_trial`): what every stage reads. Built by keyword only."""

    trial: TrialConfig
    ctx: RuntimeContext
    trial_id: str
    session: Session
    tok: Any
    teacher: Any
    engine: Any
    evaluator: Evaluator
    init_state: dict
    start_step: int
    prompts: Sequence[list[int]]  # `tasks.data.RenderedOnUse`: each rendered when first read
    per_worker: int
    source: RolloutSource | StaleRollouts
    gen: torch.Generator
    log: MetricsLog
    gauges: RayGauges | None
    reports: dict[str, dict[str, float]]
    times: TrialTimes = field(default_factory=TrialTimes)
    touched: TouchedParameters | None = None
    last: dict[str, float] = field(default_factory=dict)
    t_start: float = field(default_factory=time.perf_counter)


def _worker_env(ctx: RuntimeContext) -> None:
    for k, v in WORKER_ENV.items():
        os.environ.setdefault(k, v)
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    torch.set_num_threads(ctx.torch_threads)
    quiet_report_log()


def setup_trial(trial: TrialConfig, ctx: RuntimeContext, trial_id: str, session: Session,
                times: TrialTimes | None = None) -> WorkerState:
    """Setup: models (in ``trial.precision``; gradient checkpointing and ``resources.compile``
    by `models.configure_passes`), the checkpoint to resume from, the evaluation before
    training (rank 0 of a fresh start; shared across the sweep's trials through
    `pre_eval_path`), the DeepSpeed engine, the rank's training prompts (`tasks.data.TaskData`),
    the rollout source, the loss generator and the gradient masks of ``sparsity_touched``.
    A resumed worker continues exactly (`optim.load_checkpoint`): its engine's AdamW,
    master weights and LR schedule, the masks and, last, every random stream
    (`set_rng_state`). ``times``: the run's `telemetry.TrialTimes` (its ``setup`` phase ends here)."""
    times = times if times is not None else TrialTimes()
    _worker_env(ctx)
    rank, world = session.rank, session.world
    torch.manual_seed(trial.seed)
    tok, teacher, student = setup_models(ctx, trial)
    scorer = LocalTeacher(teacher) if trial.teacher.serve == "worker" else shared_teacher(trial, ctx, trial_id)
    check_lm_heads(scorer.vocab_size, student.config.vocab_size, len(tok), trial.loss.pad_vocab,
                   spectrum=trial.rollout.policy == SPECTRUM)
    init_state = parameter_state(student)
    resume: Resume | None = session.restore(
        lambda d: load_checkpoint(d, rank, DTYPES[trial.precision], trial.attn_implementation))
    start_step = 0 if resume is None else resume.step
    student = student if resume is None else resume.student
    configure_passes(student, teacher, gradient_checkpointing=trial.gradient_checkpointing,
                     compile=ctx.resources.compile)
    evaluator = Evaluator(tok, trial.tasks, trial.evaluation, seeds=trial.seeds)
    reports = {}
    if rank == 0 and start_step == 0:  # S_τ = 1 by definition
        reports["pre"] = evaluate_stage(evaluator, student, trial, trial_id, "pre", 0, Path(ctx.results_root),
                                        init_state, cache=pre_eval_path(ctx.shared_cache, trial, ctx.student_path))
    engine, _, per_worker = setup_engine(student, trial.optimizer, world, precision=trial.precision,
                                         master_weights=trial.master_weights)  # the teacher follows the student:
    scorer.to(engine.device)  # DeepSpeed placed it on this rank's GPU, or the CPU
    if teacher is not None:
        teacher.to(engine.device)  # the sampler's (with teacher.serve: worker, the scorer's model: a no-op)
    touched = (TouchedParameters(engine.module, None if resume is None else resume.state["touched"])
               if trial.evaluation.sparsity_touched else None)
    data = TaskData.of(trial)
    prompts = data.train_prompts(tok, rank)
    conditioning = TeacherPrompts(prompts, data.train_prompts(tok, rank, role="teacher")) \
        if trial.tasks.teacher_conditioned else None
    with gathered_for_generation(engine, trial.rollout.policy == ONPD) as module:  # its first weight sync
        source = RolloutSource(trial, ctx, tok, teacher, module, rank, world, conditioning)
        source = stale_source(trial, source, module, prompts, per_worker, start_step)  # rollout.max_staleness
    gen = torch.Generator(device=engine.device).manual_seed(trial.seeds.loss_seed(trial.seed, rank))
    metrics_log = MetricsLog(ctx.results_root, trial_id, "distill", rank)
    if resume is not None:  # a restart from a checkpoint: continue its optimizer and random streams; say so
        load_engine_state(engine, resume.state)
        set_rng_state(resume.state["rng"], gen)
        log.info("%s resumed at step %d", trial_id, start_step)
        metrics_log.add(start_step, {"resume/start_step": float(start_step)})
    times.mark("setup")
    return WorkerState(trial=trial, ctx=ctx, trial_id=trial_id, session=session, tok=tok, teacher=scorer,
                       engine=engine, evaluator=evaluator, init_state=init_state, start_step=start_step,
                       prompts=prompts, per_worker=per_worker, source=source, gen=gen, log=metrics_log,
                       gauges=session.gauges(trial_id) if rank == 0 else None, reports=reports, times=times,
                       touched=touched)


def step_metrics(w: WorkerState, rollouts: Rollouts, loss: torch.Tensor, diag: dict[str, float], grad_norm: float,
                 lr: float, t0: float, t_gen: float, t_sync: float) -> dict[str, float]:
    """The step's report (`distillab.registry`): loss, grad norm, LR, rollout lengths and
    throughput (fresh rollouts only), times, the loss diagnostics and, for λ-spectrum
    rollouts, their mean student and teacher log-likelihood (PROTOCOL.md §3)."""
    n_tok = sum(rollouts.lengths)
    metrics = {
        "loss": float(loss.detach()), "grad_norm": grad_norm, "lr": lr,
        "rollout/length": n_tok / max(1, len(rollouts.lengths)), "rollout/staleness": float(rollouts.staleness),
        **({"rollout/tokens_per_s": n_tok / max(1e-9, t_gen)} if w.source.fresh else {}),
        "time/step_s": time.perf_counter() - t0, "time/rollout_s": t_gen,
        **({"time/sync_s": t_sync} if w.source.syncs else {}), **diag,
    }
    for name in ("student_loglik", "teacher_loglik"):
        vals = rollouts.extras.get(name)
        if vals:
            metrics[f"rollout/{name}"] = sum(vals) / len(vals)
    return metrics


def _checkpoint(w: WorkerState, step: int) -> Path:
    """A temporary directory holding the checkpoint after ``step`` (`optim.save_checkpoint`):
    the student (rank 0) and this rank's training state: the engine's AdamW, master
    weights and LR schedule, the random streams and the gradient masks."""
    d = Path(tempfile.mkdtemp(prefix="distillab-ckpt-"))
    state = {**engine_state(w.engine), "rng": rng_state(w.gen),
             "touched": {} if w.touched is None else dict(w.touched.masks)}
    save_checkpoint(w.engine, w.trial.optimizer, w.tok, step, d, rank=w.session.rank, state=state)
    return d


def log_step(w: WorkerState, step: int, metrics: dict[str, float]) -> None:
    """Log: keep the step's metrics, set the gauges; every 10 steps, at the last step and
    at a checkpoint write the window to the ``metrics`` table and report to Ray (with
    the checkpoint every ``optimizer.checkpoint_every`` steps)."""
    o = w.trial.optimizer
    w.log.add(step, metrics)
    w.last = metrics
    if w.gauges is not None:
        w.gauges.set(metrics)
    last = step == o.steps
    checkpoint_due = bool(o.checkpoint_every) and step % o.checkpoint_every == 0 and not last
    if w.log.due(step, last) or checkpoint_due:
        w.log.flush(step)
        w.session.report({"step": step, **metrics}, _checkpoint(w, step) if checkpoint_due else None)


def _final_report(w: WorkerState) -> dict[str, float]:
    """Every stage's evaluation as report keys, with ``eval/forgetting``: from what this
    worker evaluated, and for a resumed worker the ``pre`` stage from the ``evals`` table."""
    pre = w.reports.get("pre")
    if pre is None:
        pre = {k: v for k, v in report_metrics(w.ctx.results_root, w.trial_id).items() if k.startswith("eval/pre/")}
    return with_forgetting({**pre, **w.reports.get("distill", {}), **w.reports.get("rlvr", {})})


def end_loop(w: WorkerState) -> dict[str, float]:
    """The loop's end: the rollout source closed, the loop's seconds marked; returns the final report's
    start: the last step's metrics (the last diagnostics stay in view), ``step`` and ``time/train_s``
    (measured from the state's creation: the loop's number)."""
    w.source.close()
    train_s = time.perf_counter() - w.t_start
    w.times.mark("loop")
    return {**w.last, "step": w.trial.optimizer.steps, "time/train_s": train_s}


def evaluate_distilled(w: WorkerState) -> None:
    """The evaluation after distillation (stage ``distill``, rank 0; with update sparsity and, with
    ``evaluation.sparsity_touched``, the entries distillation's gradients touched: their hooks end here)."""
    touched = None
    if w.touched is not None:
        touched = w.touched.gathered()  # collective
        w.touched.remove()
    with gathered_for_generation(w.engine) as student:  # ZeRO 3: whole on every rank (collective)
        if w.session.rank == 0:
            w.reports["distill"] = evaluate_stage(w.evaluator, student, w.trial, w.trial_id, "distill",
                                                  w.trial.optimizer.steps, Path(w.ctx.results_root), w.init_state,
                                                  touched=touched)
            w.times.mark("eval_distill")


def rlvr_stage(w: WorkerState) -> int:
    """The optional RLVR stage (`rlvr.run_rlvr_stage`: GRPO/DAPO on the distilled student) and the suite
    again (stage ``rlvr``, rank 0). Returns the report's last ``step`` (distillation's, then RLVR's)."""
    trial, rank = w.trial, w.session.rank
    if trial.rlvr is None:
        return trial.optimizer.steps
    run_rlvr_stage(trial, w.ctx, w.engine, w.tok, w.trial_id, rank, w.session.world, w.session.report, w.gauges)
    if rank == 0:
        w.reports["rlvr"] = evaluate_stage(w.evaluator, w.engine.module, trial, w.trial_id, "rlvr",
                                           trial.rlvr.steps, Path(w.ctx.results_root), w.init_state)
    return trial.optimizer.steps + trial.rlvr.steps


def record_times(w: WorkerState, train_s: float) -> None:
    """Rank 0: the in-loop seconds ``train_s`` and the run's `telemetry.TrialTimes` (``finish``: from the
    last step on) into the metrics table."""
    w.times.mark("finish")
    times = {k: v for k, v in w.times.seconds.items() if k != "time/loop_s"}
    times["time/finish_s"] += times.get("time/eval_distill_s", 0.0)  # finish: from the last step on
    w.log.add(w.trial.optimizer.steps, {"time/train_s": train_s, **times})  # in-loop seconds (this run)
    w.log.flush(w.trial.optimizer.steps, key=f"{w.trial_id}__distill__train_time")


def finish(w: WorkerState) -> dict[str, float]:
    """Finish, in stages: `end_loop`, `evaluate_distilled`, `rlvr_stage`, the final student checkpoint,
    then (rank 0) every evaluation into the final report (`_final_report`) and `record_times`; the final
    report (the last step's metrics, the in-loop seconds and every evaluation) goes out with the checkpoint."""
    final = end_loop(w)
    evaluate_distilled(w)
    final["step"] = rlvr_stage(w)
    checkpoint = _checkpoint(w, w.trial.optimizer.steps)
    if w.session.rank == 0:
        final.update(_final_report(w))
        record_times(w, final["time/train_s"])
    w.session.report(final, checkpoint)
    return final


def run_worker(trial: TrialConfig, ctx: RuntimeContext, trial_id: str, session: Session,
               times: TrialTimes | None = None) -> dict[str, float]:
    """One worker's trial, the recipe of the module docstring (``times``: its `telemetry.TrialTimes`, started at
    the train function's first line; bf16 on a CPU: `models.bf16_matmuls`). Returns the final report."""
    with bf16_matmuls(trial.precision, "cuda" if torch.cuda.is_available() else "cpu"):
        w = setup_trial(trial, ctx, trial_id, session, times)
        o = trial.optimizer
        samples = trial.rollout.policy != OFFPD  # the student samples (ZeRO 3: gathered whole for it)
        for step in range(w.start_step, o.steps):
            t0 = time.perf_counter()
            prompts = step_prompts(w.prompts, step, w.per_worker, o.rollouts_per_prompt)
            with gathered_for_generation(w.engine, samples) as student:
                rollouts = w.source.get(step, prompts, student)
            t_gen = time.perf_counter() - t0
            w.engine.module.train()
            loss, diag = loss_step(trial, w.engine, w.teacher, rollouts, w.tok.pad_token_id, w.gen, step=step + 1)
            grad_norm, lr = optimizer_step(w.engine, loss, o)
            with gathered_for_generation(w.engine, samples and w.source.syncs) as student:
                t_sync = w.source.sync(student, step + 1)
            log_step(w, step + 1, step_metrics(w, rollouts, loss, diag, grad_norm, lr, t0, t_gen, t_sync))
        return finish(w)


def train_loop_per_worker(config: dict) -> None:
    """Ray Train worker function. ``config``: ``{"launch": config.TrialLaunch}`` (the trial, its context,
    its id and the trainable's `telemetry.TrialTimes.launch_info`), as `sweep.run_trial` built it."""
    launch: TrialLaunch = config["launch"]
    run_worker(launch.trial, launch.ctx, launch.trial_id, RaySession(), TrialTimes(launch.times))
