"""`distillab sweep FILE --dry-run`: what a sweep would run, checked and costed, with
nothing started (no Ray, no `prepare`, no model weights read).

    distillab sweep search_spaces/paper_llama.yaml --dry-run \\
        --set models.teacher_path=/ckpt/llama-3.1-8b-sft --set models.student_path=/ckpt/llama-3.2-1b
    distillab sweep search_spaces/paper_llama.yaml --dry-run --nodes 2 --node-cpus 96 --node-gpus 8 ...

Three parts, each a function:

- `check_checkpoints`: each model's source (``models.teacher`` / ``student``, `config.ModelSource`)
  read as the directory the trials will load: an ``hf`` directory (``models.*_path``) must be a
  checkpoint directory (a ``config.json`` and a tokenizer ``from_pretrained`` reads); a ``gguf``
  or ``derive`` source is read from the directory ``prepare`` made (a run makes it first, once;
  the dry-run reads the GGUF file's metadata or the teacher's config instead); teacher and
  student share a tokenizer (`models.check_same_vocab`; a micro role stands for the character
  tokenizer it would be prepared with) and their lm_heads fit it (`models.check_lm_heads`, with
  ``trial.loss.pad_vocab``). `distillab sweep` and `distillab prepare` run it too, before
  anything trains; a failure is a `CheckpointError` naming the field and the path or the mismatch.
- `placement`: each trial's Ray resources (``resources``: Train workers × CPUs/GPUs per
  worker, the Tune trainable's CPUs, the vLLM engine sharing its worker's GPU) against a
  cluster of ``nodes`` equal nodes (default: this machine): how many trials run at a time,
  or why none ever can (a worker that fits on no node, a trial larger than the cluster).
  `unplaceable` asks the same of a real cluster's nodes (their kinds, as Ray reports them):
  `distillab sweep` calls it right after Ray connects, before any trial, and exits 2
  instead of waiting for ever.
- `estimate`: GPU-hours from token counts and parameter counts. Tokens per trial:
  distillation steps × prompts × rollouts × (mean prompt tokens + ``rollout.max_tokens``),
  the evaluation's samples × (prompt + ``evaluation.max_tokens``) at each stage, and the
  RLVR stage's steps × prompts × samples × (prompt + ``rlvr.max_tokens``); completion
  lengths are the configured maxima, so the counts are upper bounds. Work per token is the
  usual 2·N FLOPs per forward and 6·N per forward + backward (Kaplan et al. 2020, "Scaling
  Laws for Neural Language Models", §2.1): sampling 2·N_ρ (ρ the rollout policy, both
  models for π_λ), teacher scoring 2·N_T, student update 6·N_S (8·N_S with gradient
  checkpointing), evaluation 2·N_S, RLVR 8·N_S (+2·N_S for a reference KL). GPU-seconds =
  FLOPs / throughput; the throughput is `ASSUMED_TFLOPS` unless ``--throughput`` gives one.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoConfig

from distillab.config import ConfigError, SweepConfig, TrialConfig
from distillab.driver.checks import checkpoint_files_error
from distillab.driver.sweep import expected_trials
from distillab.evals.prose import prose_documents
from distillab.models import (
    DTYPES,
    bf16_in_float32,
    build_char_tokenizer,
    check_lm_heads,
    check_same_vocab,
    load_tokenizer,
    micro_llama_config,
)
from distillab.models.sources import PREPARED_FILE, check_keep_layers, count_params, pruned_config, source_header
from distillab.recipe.payload import payload_bytes_per_token
from distillab.recipe.prepare import model_dir, refined_teacher_dir, resolve_source
from distillab.registry import AXES, OFFPD, ONPD, SPECTRUM
from distillab.tasks.registry import Task, domain_task, get, registered
from distillab.tasks.taskio import render

__all__ = ["ASSUMED_TFLOPS", "LM_EVAL_TOKENS_PER_ITEM", "CheckpointError", "Role", "Cluster", "Placement",
           "Estimate", "check_checkpoints", "check_task_data", "placement", "unplaceable", "estimate", "bf16_cpu_note", "dry_run"]

#: Effective training-loop throughput per GPU assumed by `estimate`, TFLOP/s (bf16). ASSUMED, not
#: measured: one tenth of the dense bf16 peak of an H100 SXM or H200, 989 TFLOP/s (NVIDIA's H100 and
#: H200 datasheets; the device notes of this workplace measured 770-800 TFLOP/s on an H200 for one large
#: matrix product). A distillation step decodes short completions at a batch of a few dozen (memory-bound)
#: and trains on a few thousand tokens, far from the 38-43 % of peak that large-batch pre-training reaches
#: (Llama 3 on H100s, Dubey et al. 2024, "The Llama 3 Herd of Models", Table 4). Measure your own (the
#: trial's ``time/step_s``) and pass it as ``--throughput``.
ASSUMED_TFLOPS = 98.9
#: Tokens per lm-eval-harness item (prompt + answer) assumed for the full-scale OOD suite, whose prompts
#: are not rendered here (few-shot contexts vary by task). ASSUMED, not measured.
LM_EVAL_TOKENS_PER_ITEM = 1024
#: Test items rendered to measure the mean prompt length of a task
PROMPT_SAMPLE = 32


class CheckpointError(ConfigError):
    """A checkpoint path that is missing or not a checkpoint, or a teacher/student pair
    that does not share a tokenizer or whose lm_heads do not fit it."""


@dataclass
class Role:
    """One model of the sweep: its checkpoint ``path`` where it is read in place (an ``hf``
    source; None where ``prepare`` makes it, at ``path_if_prepared``), its ``source`` kind
    (``micro``, ``hf``, ``gguf``, ``derive``), tokenizer, lm_head rows, parameters and config."""

    role: str
    path: Path | None
    tokenizer: object
    vocab_rows: int
    params: int
    path_if_prepared: Path | None = None
    hidden_size: int = 0
    source: str = "hf"
    config: object = None

    @property
    def directory(self) -> Path:
        """The directory the sweep's trials read: ``path`` or ``path_if_prepared``."""
        return self.path or self.path_if_prepared


def _checkpoint_role(role: str, raw: str | Path, weights: bool = True, field_: str | None = None) -> Role:
    path = Path(raw).expanduser()
    field_ = field_ or f"models.{role}_path"
    why = checkpoint_files_error(path, field_, weights)  # the files, named (before transformers reads them)
    if why is not None:
        raise CheckpointError(why)
    try:
        tok = load_tokenizer(path)
        config = AutoConfig.from_pretrained(str(path), trust_remote_code=False)
    except (OSError, ValueError, ImportError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{field_}: {path}: cannot load its tokenizer or config: {first}") from None
    return Role(role, path.resolve(), tok, int(config.vocab_size), count_params(config),
                hidden_size=int(config.hidden_size), config=config)


def _micro_role(sweep: SweepConfig, role: str) -> Role:
    mcfg = sweep.models.micro(role)
    tok = build_char_tokenizer()
    config = micro_llama_config(len(tok), mcfg.hidden_size, mcfg.num_layers, mcfg.num_heads, mcfg.intermediate_size,
                                mcfg.max_position_embeddings, tok)
    return Role(role, None, tok, config.vocab_size, count_params(config), model_dir(sweep, role), config.hidden_size,
                "micro", config)


def _prepared_role(sweep: SweepConfig, role: str, teacher: Role | None, weights: bool) -> Role:
    """A ``gguf`` or ``derive`` role: read from its prepared directory where ``prepare`` has
    made it; else, for a run (``weights``), made now (`prepare.resolve_source`: the file is
    converted once, then the trials' directory is what the checks read), and for the dry-run
    read from the GGUF file's metadata (`models.sources.source_header`) or the teacher's config
    pruned to ``keep_layers`` (with the teacher's tokenizer). The kept layers are checked against
    the teacher's first, either way."""
    m = sweep.models
    src, field_ = m.source(role), m.source_field(role)
    try:
        where = model_dir(sweep, role)
        if src.kind == "derive":
            check_keep_layers(src.derive.keep_layers, int(teacher.config.num_hidden_layers), field_)
        if weights and not (where / PREPARED_FILE).exists():
            resolve_source(sweep, role)
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    if (where / PREPARED_FILE).exists():
        r = _checkpoint_role(role, where, True, field_)
    elif src.kind == "gguf":
        config, tok = source_header(src.locate_gguf(field_))
        r = Role(role, None, tok, int(config.vocab_size), count_params(config), hidden_size=int(config.hidden_size),
                 config=config)
    else:
        config = pruned_config(teacher.config, src.derive.keep_layers)
        r = Role(role, None, teacher.tokenizer, int(config.vocab_size), count_params(config),
                 hidden_size=int(config.hidden_size), config=config)
    r.path, r.path_if_prepared, r.source = None, where, src.kind
    return r


def check_checkpoints(sweep: SweepConfig, weights: bool = True) -> dict[str, Role]:
    """The sweep's teacher and student, checked (module docstring). Reads configs and
    tokenizers only; ``weights``: a checkpoint folder must hold weight files too (a run's
    check; the dry-run plans from configs alone, `checks.checkpoint_files_error`).

    Raises:
        CheckpointError: a missing path or one that is not a checkpoint directory (every
            such field and its path named, teacher and student), a gguf package or file that
            is not there, keep_layers outside the teacher's layers, tokenizers that differ, or lm_heads that do not
            fit the tokenizer or differ without ``trial.loss.pad_vocab`` (both sizes named).
    """
    m = sweep.models
    roles, errors = {}, []
    for r in ("teacher", "student"):
        src = m.source(r)
        if src.kind == "derive" and "teacher" not in roles:
            continue  # the teacher's own error is said; a student cut from it cannot be checked
        try:
            roles[r] = (_checkpoint_role(r, src.hf, weights, m.source_field(r)) if src.kind == "hf" else
                        _micro_role(sweep, r) if src.kind == "micro" else
                        _prepared_role(sweep, r, roles.get("teacher"), weights))
        except CheckpointError as e:  # check both, so that one run names every bad path
            errors.append(str(e))
    if errors:
        raise CheckpointError("; ".join(errors))
    t, s = roles["teacher"], roles["student"]
    where = ", ".join(f"{r.role} {r.path or r.source + ' (prepared)'}" for r in (t, s))
    try:
        check_same_vocab(t.tokenizer, s.tokenizer)
        check_lm_heads(t.vocab_rows, s.vocab_rows, len(s.tokenizer), sweep.trial.loss.pad_vocab,
                       spectrum=any(x.rollout.policy == SPECTRUM for x in sweep.trials))
    except ValueError as e:
        raise CheckpointError(f"models ({where}): {e}") from None
    return roles


@dataclass(frozen=True)
class Cluster:
    """``nodes`` equal nodes of ``cpus`` CPUs and ``gpus`` GPUs each."""

    nodes: int
    cpus: float
    gpus: float
    source: str = "this machine"

    @classmethod
    def this_machine(cls) -> "Cluster":
        """One node: this machine's cores and CUDA devices."""
        return cls(1, float(os.cpu_count() or 1), float(torch.cuda.device_count()))


@dataclass
class Placement:
    """Per trial: Ray resources; on ``cluster``: trials at a time (0: never placeable, ``why``)."""

    workers: int
    cpus_per_worker: float
    gpus_per_worker: float
    trial_cpus: float
    concurrent: int
    why: str = ""

    @property
    def cpus(self) -> float:
        """CPUs of one trial: its workers' and the Tune trainable's."""
        return self.workers * self.cpus_per_worker + self.trial_cpus

    @property
    def gpus(self) -> float:
        """GPUs of one trial."""
        return self.workers * self.gpus_per_worker


def placement(sweep: SweepConfig, cluster: Cluster) -> Placement:
    """How the sweep's trials fit ``cluster``: Ray Train places each worker's bundle (its
    CPUs and GPUs) on one node, a trial needs all its workers at once, and the Tune
    trainable's ``trial_cpus`` beside them; at most ``max_concurrent_trials`` run at a time.
    With ``resources.local_mode`` the one worker's resources and ``trial_cpus`` are one
    actor's, on one node. The vLLM engine actor reserves nothing (it shares its worker's
    CPUs and GPU)."""
    r = sweep.resources
    p = Placement(r.num_workers, r.cpus_per_worker, r.gpus_per_worker, r.trial_cpus, 0)
    bundle = r.cpus_per_worker + (r.trial_cpus if r.local_mode else 0.0)
    fit = [math.floor(cluster.cpus / bundle + 1e-9)]
    if r.gpus_per_worker:
        fit.append(math.floor(cluster.gpus / r.gpus_per_worker + 1e-9))
    per_node = min(fit)
    if per_node == 0:
        who = "a trial (resources.local_mode: its one actor)" if r.local_mode else "a worker"
        p.why = (f"{who} needs {bundle:g} CPU and {r.gpus_per_worker:g} GPU on one node "
                 f"(resources.cpus_per_worker, gpus_per_worker{', trial_cpus' if r.local_mode else ''}); "
                 f"a node of {cluster.source} has {cluster.cpus:g} CPU "
                 f"and {cluster.gpus:g} GPU")
        return p
    by_workers = per_node * cluster.nodes // r.num_workers
    by_cpus = math.floor(cluster.nodes * cluster.cpus / p.cpus + 1e-9)
    p.concurrent = min(by_workers, by_cpus, r.max_concurrent_trials, expected_trials(sweep))
    if p.concurrent == 0:
        p.why = (f"a trial needs {r.num_workers} workers of {r.cpus_per_worker:g} CPUs / {r.gpus_per_worker:g} GPUs "
                 f"(+{r.trial_cpus:g} CPUs); {cluster.source} ({cluster.nodes} node(s) of {cluster.cpus:g} CPUs, "
                 f"{cluster.gpus:g} GPUs) holds {per_node * cluster.nodes} such workers")
    return p


def unplaceable(sweep: SweepConfig, nodes: list[tuple[float, float]], source: str = "the Ray cluster") -> str | None:
    """Why no trial of ``sweep`` can ever be placed on a cluster of ``nodes`` (each node's
    total CPUs and GPUs, as Ray reports them: what a node has, not what is free now, so a
    trial that waits for a busy cluster is placeable), or None: `placement` on the nodes of
    each kind, then on all of them together (a trial's workers may spread over kinds)."""
    if not nodes:
        return None
    r, kinds = sweep.resources, sorted(set(nodes), key=lambda n: (n[1], n[0]))
    whys = []
    for cpus, gpus in kinds:
        p = placement(sweep, Cluster(nodes.count((cpus, gpus)), cpus, gpus, source))
        if p.concurrent > 0:
            return None
        whys.append(p.why)
    bundle = r.cpus_per_worker + (r.trial_cpus if r.local_mode else 0.0)
    workers = sum(min(math.floor(c / bundle + 1e-9), math.floor(g / r.gpus_per_worker + 1e-9) if r.gpus_per_worker
                      else r.num_workers) for c, g in nodes)
    if len(kinds) > 1 and workers >= r.num_workers and sum(c for c, _ in nodes) + 1e-9 >= p.cpus:
        return None
    listed = ", ".join(f"{nodes.count(k)} x ({k[0]:g} CPU, {k[1]:g} GPU)" for k in kinds)
    return f"resources: no trial can ever be placed on {source} ({listed} node(s)): {whys[-1]}"


@dataclass
class Estimate:
    """Per trial: tokens and FLOPs of each phase (``distill``, ``eval``, ``rlvr``), and the
    evaluation before training, which the sweep's trials share (``pre_eval``)."""

    prompt_tokens: dict[str, float] = field(default_factory=dict)
    tokens: dict[str, float] = field(default_factory=dict)
    flops: dict[str, float] = field(default_factory=dict)
    pre_eval_tokens: float = 0.0
    pre_eval_flops: float = 0.0


def _mean_prompt_tokens(trial: TrialConfig, tok, task: Task) -> float:
    """Mean prompt length (tokens, chat template included) of the first `PROMPT_SAMPLE` test items of
    ``task`` (fewer where its evaluation reads fewer: a small file of your own)."""
    try:
        items = task.test_items(trial.tasks, PROMPT_SAMPLE)
    except ValueError:  # a file of your own shorter than the sample: the rows the evaluation reads (check_task_data)
        items = task.test_items(trial.tasks, task.evaluation(trial.tasks, trial.evaluation).test_items)
    ids = [render(tok, task.prompt(trial.tasks, it)) for it in items]
    return sum(map(len, ids)) / len(ids)


def check_task_data(sweep: SweepConfig) -> None:
    """Each evaluated task's test split at the size its evaluation reads (`tasks.base.EvalPlan.test_items`),
    once per distinct task and evaluation settings of the sweep's trials: a task file that is missing,
    malformed or shorter than the evaluation needs is said before anything starts.

    Raises:
        ConfigError: every such task, with its message (the file, its rows, the field to lower)."""
    errors, seen = [], set()
    for trial in sweep.trials:
        for task in _evaluated(trial):
            key = (task.name, repr(trial.tasks.model_dump(mode="json")), repr(trial.evaluation.model_dump(mode="json")))
            if key in seen:
                continue
            seen.add(key)
            try:
                task.test_items(trial.tasks, task.evaluation(trial.tasks, trial.evaluation).test_items)
            except (ValueError, OSError) as e:
                errors.append(f"trial.tasks.{task.name}: {e}")
    if errors:
        raise ConfigError("; ".join(dict.fromkeys(errors)))


def _eval_tokens(trial: TrialConfig, prompt: dict[str, float]) -> float:
    """Tokens of one evaluation stage: every sample of every evaluated task (its `tasks.base.EvalPlan`'s
    accuracy and pass@k samples) × (prompt + ``evaluation.max_tokens``), the micro OOD suite's among
    them, the lm-eval suite's items × `LM_EVAL_TOKENS_PER_ITEM`, and the held-out prose's
    tokens (``ood_backend: pretrained``; bounded by its characters, `evals.prose.prose_documents`)."""
    ev = trial.evaluation
    n = 0.0
    for task in _evaluated(trial):
        p = task.evaluation(trial.tasks, ev)
        n += (p.items + p.pass_items * p.pass_n) * (prompt[task.name] + ev.max_tokens)
    if ev.ood_backend == "lm_eval":
        n += len(ev.lm_eval.tasks) * (ev.lm_eval.limit or 1000) * LM_EVAL_TOKENS_PER_ITEM
    if ev.prose is not None and ev.ood_backend == "pretrained":
        cap = ev.prose.tokens_per_document
        n += sum(len(t) if cap is None else min(len(t), cap) for t in prose_documents(ev.prose.documents))
    return n


def _evaluated(trial: TrialConfig) -> list[Task]:
    """Every task an evaluation stage of ``trial`` samples: the scored ones and the micro OOD suite's."""
    return [t for t in registered() if t.evaluation(trial.tasks, trial.evaluation).items > 0]


def estimate(trial: TrialConfig, tok, n_teacher: int, n_student: int) -> Estimate:
    """Tokens and FLOPs of one trial (module docstring); ``tok`` renders the prompts,
    ``n_teacher`` / ``n_student`` are parameter counts."""
    o, r = trial.optimizer, trial.rollout
    domain = domain_task(trial.domain)
    tasks = {t.name: t for t in _evaluated(trial) + [domain] + ([get(trial.rlvr.task)] if trial.rlvr else [])}
    est = Estimate(prompt_tokens={name: _mean_prompt_tokens(trial, tok, tasks[name]) for name in sorted(tasks)})
    p = est.prompt_tokens
    seq = p[domain.name] + r.max_tokens
    n_seq = o.steps * o.prompts_per_step * o.rollouts_per_prompt
    sampler = {OFFPD: n_teacher, ONPD: n_student, SPECTRUM: n_teacher + n_student}[r.policy]
    update = (8 if trial.gradient_checkpointing else 6) * n_student
    est.tokens["distill"] = n_seq * seq
    est.flops["distill"] = est.tokens["distill"] * (2 * sampler + 2 * n_teacher + update)
    stage = _eval_tokens(trial, p)
    est.tokens["eval"] = stage * (1 + (trial.rlvr is not None))  # after distillation, after RLVR
    est.flops["eval"] = est.tokens["eval"] * 2 * n_student
    est.pre_eval_tokens, est.pre_eval_flops = stage, stage * 2 * n_student
    if trial.rlvr is not None:
        g = trial.rlvr
        est.tokens["rlvr"] = g.steps * g.prompts_per_step * g.samples_per_prompt * (p[g.task] + g.max_tokens)
        est.flops["rlvr"] = est.tokens["rlvr"] * (8 + 2 * (g.beta > 0)) * n_student
    return est


def _fmt(n: float) -> str:
    """1234567 -> '1.23M' (k, M, G, T, P, E)."""
    for unit, scale in (("E", 1e18), ("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.3g}"


def _source_line(r: Role, sweep: SweepConfig) -> str:
    """Where ``r`` comes from and where its directory is (or would be, and whether it is cached)."""
    if r.path:
        return str(r.path)
    cached = " (cached)" if (r.path_if_prepared / PREPARED_FILE).exists() else ""
    src = sweep.models.source(r.role)
    if src.kind == "gguf":
        what = f"gguf {src.locate_gguf(sweep.models.source_field(r.role)).name}, dequantised to float32 by prepare"
    elif src.kind == "derive":
        what = (f"derived by prepare from the teacher: layers {list(src.derive.keep_layers)} "
                f"(depth pruning)")
    else:
        what = "micro, would be prepared"
    return f"{what} at {r.path_if_prepared}{cached}"


def _models_lines(roles: dict[str, Role], sweep: SweepConfig) -> list[str]:
    lines = ["models:"]
    for r in roles.values():
        where = _source_line(r, sweep)
        lines.append(f"  {r.role:8s} {_fmt(r.params).replace('G', 'B')} parameters, lm_head {r.vocab_rows:,} rows: {where}")
        refine = sweep.models.teacher_refine
        if r.role == "teacher" and refine is not None:
            out = refined_teacher_dir(sweep, r.directory)
            lines.append(f"           then GRPO-refined by prepare ({refine.steps} steps on {refine.task}; the sweep's "
                         f"teacher), at {out}" + (" (cached)" if (out / "prepare.json").exists() else ""))
    tok = roles["student"].tokenizer
    pad = " (lm_heads padded to one size: loss.pad_vocab)" if sweep.trial.loss.pad_vocab else ""
    lines.append(f"  tokenizer: shared, {len(tok):,} tokens, {'a chat template' if tok.chat_template else 'no chat template'}"
                 f"{pad}")
    return lines


def _trial_lines(sweep: SweepConfig) -> list[str]:
    """The trials, one line each: its id (whose name shows the study axes that have a name part,
    `registry.Axis.in_name`), then its steps, prompts, LR, precision and sampler, and the value of
    every other swept axis as `registry.Axis.text` prints it (e.g. ``sample τ_T=1``)."""
    keys = sweep.search.grid_keys
    if sweep.search.kind == "grid":
        lines = [f"trials: {len(sweep.trials)} (grid over {', '.join(keys)})"]
    else:  # Optuna: the trials are not known before the search; each sample changes the base trial's keys
        lines = [f"trials: {sweep.search.num_samples} (optuna: samples over {', '.join(sweep.search.space)}; "
                 "listed: the base trial each sample starts from)"]
    unnamed = [AXES[k] for k in keys if not AXES[k].in_name]
    for t in sweep.trials:
        r, o = t.rollout, t.optimizer
        rl = f", then RLVR {t.rlvr.steps} steps on {t.rlvr.task}" if t.rlvr is not None else ""
        values = t.flat()
        axes = "".join(f", {a.text(values[a.key])}" for a in unnamed)
        lines.append(f"  {t.trial_id}: {o.steps} steps x {o.prompts_per_step} prompts, lr {o.lr:g}, {t.precision}, "
                     f"rollouts {r.engine}{rl}{axes}")
    return lines


def _placement_lines(sweep: SweepConfig, p: Placement, cluster: Cluster) -> list[str]:
    r = sweep.resources
    engines = {t.rollout.engine for t in sweep.trials} | {t.rlvr.engine for t in sweep.trials if t.rlvr is not None}
    gpu = f", {p.gpus_per_worker:g} GPU" if p.gpus_per_worker else ", no GPU"  # resource amounts, not counts
    holder = "the trial actor's" if r.local_mode else "the worker's"  # where the trial's recipe runs
    vllm = ("; a vLLM engine (rollout.engine or rlvr.engine vllm, or auto on a GPU worker) runs in a Ray actor on "
            f"{holder} node, reserving nothing: it shares {holder} GPU (rollout.vllm_gpu_memory_utilization "
            f"{sweep.trial.rollout.vllm_gpu_memory_utilization:g} of its memory) or CPUs"
            if engines & {"vllm", "auto"} else "")
    if r.local_mode:
        lines = [f"resources per trial: one Tune trial actor running the trial (resources.local_mode; no Train "
                 f"worker group) of {p.cpus_per_worker:g} + {p.trial_cpus:g} CPU = {p.cpus:g} CPU, {p.gpus:g} GPU{vllm}"]
    else:
        lines = [f"resources per trial: {p.workers} Train worker(s) x ({p.cpus_per_worker:g} CPU{gpu}) + "
                 f"{p.trial_cpus:g} CPU (the Tune trainable) = {p.cpus:g} CPU, {p.gpus:g} GPU{vllm}"]
    if r.compile:
        lines.append("training passes compiled (resources.compile): each trial process compiles them at its first "
                     "steps, then reuses them (docs/running.md, \"Compiled training passes\")")
    where = f"{cluster.source}: {cluster.nodes} node(s) of {cluster.cpus:g} CPUs, {cluster.gpus:g} GPUs"
    if p.concurrent == 0:
        lines.append(f"placement on {where}: NEVER placeable: {p.why}")
    else:
        n = expected_trials(sweep)
        lines.append(f"placement on {where}: {p.concurrent} trial(s) at a time (resources.max_concurrent_trials "
                     f"{r.max_concurrent_trials}), {n} trials in {-(-n // p.concurrent)} wave(s)")
    return lines


def _estimate_lines(sweep: SweepConfig, roles: dict[str, Role], p: Placement, tflops: float | None) -> list[str]:
    ests = [estimate(t, roles["student"].tokenizer, roles["teacher"].params, roles["student"].params)
            for t in sweep.trials]
    e0 = ests[0]
    rate = (tflops or ASSUMED_TFLOPS) * 1e12
    source = "--throughput" if tflops else "ASSUMED (distillab.driver.plan.ASSUMED_TFLOPS; set --throughput)"
    lines = ["estimate (upper bounds: every completion at its max_tokens):",
             "  mean prompt tokens: " + ", ".join(f"{k} {v:.1f}" for k, v in e0.prompt_tokens.items())]
    for phase in e0.tokens:
        lo, hi = min(e.flops[phase] for e in ests), max(e.flops[phase] for e in ests)
        spread = f" (first trial; {_fmt(lo)}-{_fmt(hi)}FLOP over the trials)" if hi > lo else ""
        lines.append(f"  {phase:8s} {_fmt(e0.tokens[phase])} tokens, {_fmt(e0.flops[phase])}FLOP per trial{spread}")
    lines.append(f"  pre      {_fmt(e0.pre_eval_tokens)} tokens, {_fmt(e0.pre_eval_flops)}FLOP once "
                 "(the evaluation before training, shared by the sweep's trials)")
    n = expected_trials(sweep)  # an Optuna sweep: num_samples trials, each costed as the base trial
    total = sum(sum(e.flops.values()) for e in ests) * n / len(ests) + e0.pre_eval_flops
    hours = total / rate / 3600
    per_trial = sum(e0.flops.values()) / rate / 3600
    lines.append(f"  throughput: {rate / 1e12:g} TFLOP/s per GPU, {source}")
    lines.append(f"  GPU-hours: {per_trial:.3g} per trial (the first), {hours:.3g} for the sweep's {n} trials "
                 "with the shared evaluation before training")
    if p.gpus and p.concurrent:
        waves = -(-n // p.concurrent)
        lines.append(f"  wall-clock: ~{waves * per_trial / p.gpus:.3g} h ({waves} wave(s) of trials on "
                     f"{p.gpus:g} GPU(s) each, perfect scaling assumed)")
    elif not p.gpus:
        lines.append("  (this sweep asks for no GPUs: the GPU-hours give its size at the assumed GPU throughput; "
                     "on CPU it runs far slower)")
    if any(t.rollout.offpd_reuse and t.rollout.policy == OFFPD for t in sweep.trials):
        lines.append("  (OffPD trials with rollout.offpd_reuse share one rollout set; each is counted as sampling "
                     "its own)")
    return lines


def _teacher_lines(sweep: SweepConfig, teacher: Role, p: Placement, cluster: Cluster) -> list[str]:
    """The shared teacher (``teacher.serve: shared`` in some trial; nothing otherwise): parameter
    memory of one teacher per node against one per concurrent trial (+ the lm_head each trial
    holds), in the trials' precision, and each payload's bytes per token
    (`payload.payload_bytes_per_token`; hidden states in that precision, top-k log-probs float32
    with int32 ids)."""
    shared = [t for t in sweep.trials if t.teacher.serve == "shared"]
    if not shared:
        return []
    b = torch.tensor([], dtype=DTYPES[shared[0].precision]).element_size()
    one, head = teacher.params * b, teacher.vocab_rows * teacher.hidden_size * b
    per_node = -(-p.concurrent // cluster.nodes) if p.concurrent else 0
    lines = [(f"teacher service (teacher.serve shared, {len(shared)} of the trials): one teacher per node, "
              f"{cluster.nodes} x {_fmt(one)}B = {_fmt(cluster.nodes * one)}B of parameters ({shared[0].precision}), "
              f"+ its lm_head ({_fmt(head)}B) in each of the {p.concurrent} concurrent trial(s), against "
              f"{p.concurrent} x {_fmt(one)}B = {_fmt(p.concurrent * one)}B in the workers "
              f"(up to {per_node} per node); it reserves no Ray resources")]
    kw = {"vocab_size": teacher.vocab_rows, "hidden_size": teacher.hidden_size}
    sizes = {"logits (in-worker)": payload_bytes_per_token("logits", **kw, value_bytes=b),
             "hidden": payload_bytes_per_token("hidden", **kw, value_bytes=b)}
    for k in sorted({t.teacher.top_k for t in shared if t.teacher.payload == "topk"}):
        sizes[f"topk {k}"] = payload_bytes_per_token("topk", **kw, top_k=k)
    lines.append("  payload bytes per token: " + ", ".join(f"{n} {v:,}" for n, v in sizes.items()))
    return lines


def bf16_cpu_note(sweep: SweepConfig) -> str | None:
    """A note, or None: the sweep trains in bf16 (``trial.precision: bf16`` in some trial) on
    CPU workers (``resources.gpus_per_worker: 0``) and its trials will compute their bf16
    matrix products on float32 copies of the bf16 operands, rounded to bf16
    (`models.Bf16MatmulsInFloat32`): this CPU has no native bf16 products
    (`models.cpu_has_native_bf16`) or ``DISTILLAB_BF16_MATMULS=float32`` asks for it. That is
    the native kernels' arithmetic up to the order of the float32 sums, at float32 speed (the
    generic bf16 kernel is 8.2-9.8x slower: ``python benchmarks/bf16_matmul.py``), and not bitwise
    the numbers of a CPU with AVX-512/AMX. The note changes nothing in the run.

    Raises:
        ConfigError: a bad ``DISTILLAB_BF16_MATMULS`` (`models.bf16_matmuls_choice`), before anything starts."""
    try:
        choice = bf16_in_float32("bf16" if any(t.precision == "bf16" for t in sweep.trials) else "fp32",
                                 "cuda" if sweep.resources.gpus_per_worker else "cpu")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if choice is None:
        return None
    why = (f"this CPU ({torch.backends.cpu.get_cpu_capability()}) has no native bf16 matrix products (oneDNN's bf16 "
           "kernels need AVX-512 or AMX)") if choice == "auto" else "DISTILLAB_BF16_MATMULS=float32"
    return (f"note: trial.precision 'bf16' on CPU workers, and {why}: the trials compute them "
            "on float32 copies of the bf16 operands and round the results to bf16 (the native kernels' arithmetic; "
            "python benchmarks/bf16_matmul.py times the three), so they are not bitwise a native-bf16 CPU's numbers")


def dry_run(sweep: SweepConfig, cluster: Cluster | None = None, tflops: float | None = None) -> tuple[str, bool]:
    """The plan of ``sweep`` as text, and whether its trials can be placed on ``cluster``
    (default: this machine). ``tflops``: effective TFLOP/s per GPU (default `ASSUMED_TFLOPS`).

    Raises:
        CheckpointError: see `check_checkpoints`.
    """
    cluster = cluster or Cluster.this_machine()
    roles = check_checkpoints(sweep, weights=False)  # planned from configs: weights need not be there yet
    check_task_data(sweep)
    p = placement(sweep, cluster)
    lines = [f"[dry-run] {sweep.name}: nothing started (no Ray, no prepare); results would go to {sweep.sweep_dir()}"]
    lines += _models_lines(roles, sweep) + _trial_lines(sweep) + _placement_lines(sweep, p, cluster)
    lines += _teacher_lines(sweep, roles["teacher"], p, cluster)
    lines += _estimate_lines(sweep, roles, p, tflops)
    note = bf16_cpu_note(sweep)
    return "\n".join(lines + ([note] if note else [])), p.concurrent > 0
