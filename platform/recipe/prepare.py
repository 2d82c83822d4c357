"""`distillab prepare`: build and train the micro teacher and student.

- teacher: SFT on solver-written Countdown demonstrations (PROTOCOL.md §6, micro);
- student: SFT on the prior-skill mix (the micro OOD suite) plus a little
  Countdown, so it knows the answer format but not the task;
- optionally (``models.teacher_refine``), the teacher is then refined with GRPO
  (`refine_teacher`: the same GRPO/DAPO code as the RLVR stage; PROTOCOL.md §6),
  the micro teacher after its SFT or an explicit ``models.teacher_path``.

Both are saved with ``save_pretrained`` (safetensors) together with the shared
character-level tokenizer under ``<models.cache_dir>/{teacher,student}-<hash>``,
where ``hash`` covers every setting that changes that model; trials then load them with
``from_pretrained`` exactly as they would a Llama/Qwen checkpoint directory.
A directory appears only once complete (trained in a temp dir, then renamed).

    distillab prepare search_spaces/micro.yaml
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch
from transformers import LlamaForCausalLM

from distillab.config import EvaluationConfig, MicroModelConfig, SeedsConfig, SweepConfig, cache_key
from distillab.evals.suite import Evaluator
from distillab.models import build_char_tokenizer, load_model, load_tokenizer, micro_llama_config
from distillab.models.sources import (
    PREPARED_FILE,
    build_lock,
    convert_gguf,
    derive_base_identity,
    derive_dir,
    derive_pruned,
    gguf_dir,
)
from distillab.recipe.optim import TorchStepper, rlvr_schedule
from distillab.recipe.rlvr import lora_policy, run_rlvr
from distillab.recipe.sft import Example, sft_train
from distillab.registry import require
from distillab.tasks.data import TaskData
from distillab.tasks.registry import registered
from distillab.tasks.taskio import render

log = logging.getLogger(__name__)

#: the RLVR report key the teacher refinement reads (its training reward)
REWARD = require("rlvr/reward_mean")


def scored_evaluation(sweep: SweepConfig) -> EvaluationConfig:
    """The base trial's evaluation widened to every test split a trial of the sweep scores:
    the Countdown tasks of all trials (base trial's first) and the largest item counts (of each
    task of ``task_items`` too). A
    union of grids (``search.grids``) may score more than the base trial (e.g. Countdown-4
    for the trials with an RLVR stage); a prepared model must not train on any of them. For
    a single grid (no grid key reaches ``evaluation``) it is the base trial's evaluation."""
    evs = [sweep.trial.evaluation, *(t.evaluation for t in sweep.trials)]
    tasks = tuple(dict.fromkeys(name for ev in evs for name in ev.countdown_tasks))
    most = {f: max(getattr(ev, f) for ev in evs) for f in ("id_items", "pass_items", "mcq_items", "math_items")}
    most["task_items"] = {k: max(ev.task_items.get(k, 0) for ev in evs) for ev0 in evs for k in ev0.task_items}
    return sweep.trial.evaluation.model_copy(update={"countdown_tasks": tasks, **most})


def _key_tasks(uses: set[str]) -> list:
    """The tasks whose settings and exclusion enter a prepare key: every `TaskEntry.in_every_key`
    task and those in ``uses``."""
    return [t for t in registered() if t.entry.in_every_key or t.name in uses]


def _exclusion(sweep: SweepConfig, uses: set[str] = frozenset()) -> dict:
    """The test splits a prepared model must not train on, for its key: `tasks.base.Task.exclusion_key`
    of `scored_evaluation` per task family (the Countdown variants share one), for every task in
    every key and the tasks in ``uses``."""
    ev = scored_evaluation(sweep)
    out = {}
    for t in _key_tasks(uses):
        key = t.exclusion_key(ev)
        if key is not None:
            out[t.entry.family] = key
    return out


def _uses(mcfg: MicroModelConfig) -> set[str]:
    """The tasks a micro model's SFT data draws from (`TaskEntry.examples` > 0)."""
    return {t.name for t in registered() if t.entry.examples(mcfg) > 0}


def prepare_key(sweep: SweepConfig, role: str) -> str:
    """`config.cache_key` of the micro ``role`` ("teacher" or "student"): its architecture
    and SFT settings, the seed, the task/prompt settings it reads and the test splits it
    must not train on."""
    mcfg = sweep.models.micro(role)
    uses = _uses(mcfg)
    model = mcfg.model_dump(mode="json")
    if not mcfg.math_examples:  # a field added after models were prepared: absent, it leaves their keys as they were
        del model["math_examples"]
    return cache_key("prepare", 2, role=role, model=model, seed=sweep.models.prepare_seed,
                     tasks=sweep.trial.tasks.inputs(teacher=mcfg.styled_examples > 0, uses=uses),
                     exclude=_exclusion(sweep, uses))


def _examples(tok, sweep: SweepConfig, role: str, seed: int) -> list[Example]:
    """A micro model's SFT examples: every task's demonstrations (`tasks.base.Task.sft_data`, its
    training items without any test item a trial of the sweep scores), in `Demonstrations.order`,
    each prompt rendered (`tasks.taskio.render`) and each target followed by the tokenizer's end of sequence."""
    mcfg, tasks, ev = sweep.models.micro(role), sweep.trial.tasks, scored_evaluation(sweep)
    blocks = [b for t in registered() for b in t.sft_data(tasks, ev, mcfg, seed, role)]
    eos = tok.eos_token
    return [Example(tuple(render(tok, prompt)), tuple(tok(target + eos, add_special_tokens=False)["input_ids"]))
            for b in sorted(blocks, key=lambda b: b.order) for prompt, target in zip(b.prompts, b.targets)]


def _train_one(role: str, sweep: SweepConfig, mcfg: MicroModelConfig, out_dir: Path, threads: int) -> dict:
    torch.set_num_threads(threads)
    tok = build_char_tokenizer()
    seed = SeedsConfig.prepare_seed(sweep.models.prepare_seed, role)
    examples = _examples(tok, sweep, role, seed)
    cfg = micro_llama_config(
        len(tok), mcfg.hidden_size, mcfg.num_layers, mcfg.num_heads, mcfg.intermediate_size,
        mcfg.max_position_embeddings, tok,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    t0 = time.perf_counter()
    losses = sft_train(
        model, examples, steps=mcfg.sft_steps, batch_size=mcfg.sft_batch_size, lr=mcfg.sft_lr,
        warmup=mcfg.sft_warmup, pad_id=tok.pad_token_id, seed=seed,
    )
    train_s = time.perf_counter() - t0
    rows = Evaluator(tok, sweep.trial.tasks, sweep.trial.evaluation, seeds=sweep.trial.seeds).evaluate(
        model, seed=sweep.trial.seed)
    info = {
        "role": role,
        "params": sum(p.numel() for p in model.parameters()),
        "examples": len(examples),
        "train_seconds": round(train_s, 1),
        "final_loss": sum(losses[-50:]) / min(50, len(losses)),
        "evals": rows,
    }
    return _save_model_dir(model, tok, info, out_dir)


def _save_model_dir(model, tok, info: dict, out_dir: Path) -> dict:
    """Save model (safetensors), tokenizer and ``prepare.json`` into a temp dir next to
    ``out_dir``, then rename it to ``out_dir`` (replacing an older one): a prepared
    directory exists only once complete. Returns ``info``."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    (tmp / "prepare.json").write_text(json.dumps(info, indent=1))
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)
    return info


def refine_key(sweep: SweepConfig, base: str) -> str:
    """`config.cache_key` of a GRPO-refined teacher: the teacher it starts from (``base``:
    its prepare key or path), ``models.teacher_refine``, the seed, the tasks and the
    evaluated test items it must not train on."""
    return cache_key("refine_teacher", 2, base=base, refine=sweep.models.teacher_refine.model_dump(mode="json"),
                     seed=sweep.models.prepare_seed, seeds=sweep.trial.seeds.model_dump(),
                     tasks=sweep.trial.tasks.inputs(teacher=False), exclude=_exclusion(sweep))


def refine_teacher(sweep: SweepConfig, teacher_dir: Path, out_dir: Path, threads: int) -> dict:
    """GRPO refinement of the teacher in ``teacher_dir`` (PROTOCOL.md §6: correctness
    reward ``correct_reward`` 2.0 plus a format reward ≤ 0.5), with `rlvr.run_rlvr` and
    the settings of ``models.teacher_refine`` (its own LR, warm-up and cosine; AdamW
    without DeepSpeed, since ``prepare`` runs outside Ray Train; LoRA adapters,
    merged afterwards, with ``teacher_refine.lora``; on a 4-bit copy with
    ``lora.load_in_4bit``). Training problems
    exclude every evaluated test item. The refined teacher is evaluated and saved
    (safetensors, with its tokenizer) to ``out_dir`` (written to a temp dir, then
    renamed); ``prepare.json`` records the reward curve and the evaluation rows.

    Returns:
        the ``prepare.json`` dict: ``reward_first10`` / ``reward_last10`` (mean
        training reward of the first and last 10 steps), ``evals`` rows, ``train_seconds``.
    """
    torch.set_num_threads(threads)
    cfg, seed = sweep.models.teacher_refine, sweep.models.prepare_seed
    tok, model = load_tokenizer(teacher_dir), load_model(teacher_dir)
    tasks, ev = sweep.trial.tasks, sweep.trial.evaluation
    scored = scored_evaluation(sweep)  # the training problems exclude every test item a trial scores
    t0 = time.perf_counter()
    trained, finish = lora_policy(model, cfg.lora)
    problems = TaskData(tasks, scored, seed=seed, seeds=sweep.trial.seeds).rlvr_problems(cfg)
    history = run_rlvr(cfg, TorchStepper(trained, cfg.lr, rlvr_schedule(cfg)), tok, tasks, problems, seed,
                       lambda step, metrics: None, seeds=sweep.trial.seeds)
    model = finish()
    train_s = time.perf_counter() - t0
    rewards = [h[REWARD] for h in history]
    rows = Evaluator(tok, tasks, ev, seeds=sweep.trial.seeds).evaluate(model, seed=sweep.trial.seed)
    info = {
        "role": "teacher",
        "refined_from": str(teacher_dir),
        "params": sum(p.numel() for p in model.parameters()),
        "steps": cfg.steps,
        "train_seconds": round(train_s, 1),
        "reward_first10": sum(rewards[:10]) / len(rewards[:10]),
        "reward_last10": sum(rewards[-10:]) / len(rewards[-10:]),
        "reward": rewards,
        "evals": rows,
    }
    return _save_model_dir(model, tok, info, out_dir)


def _summary(rows: list[dict]) -> dict[str, float]:
    return {r["task"] + ":" + r["metric"]: round(r["value"], 3) for r in rows}


def refined_teacher_dir(sweep: SweepConfig, base: Path) -> Path:
    """Where `prepare` caches the GRPO-refined teacher (``models.teacher_refine``) of teacher
    directory ``base`` (the teacher's resolved directory, `model_dir`):
    ``<cache_dir>/teacher-grpo-<refine_key>``, keyed by ``base``'s name where ``prepare`` wrote it
    (micro, gguf: named by their content keys) and by its absolute path for an ``hf`` directory."""
    m = sweep.models
    base_id = str(Path(base).resolve()) if m.source("teacher").kind == "hf" else Path(base).name
    return Path(m.cache_dir).expanduser().resolve() / f"teacher-grpo-{refine_key(sweep, base_id)}"


def model_dir(sweep: SweepConfig, role: str) -> Path:
    """The directory `prepare` resolves ``role``'s source into (``models.source(role)``; it may
    not exist yet): micro ``<cache_dir>/<role>-<prepare_key>``, hf the directory itself, gguf
    `models.sources.gguf_dir` (the file's sha256), derive `models.sources.derive_dir` (the
    teacher's identity and the kept layers; the teacher before ``models.teacher_refine``).

    Raises:
        ValueError: a gguf package not installed or a file not in it (the field named)."""
    m = sweep.models
    src, cache = m.source(role), Path(m.cache_dir).expanduser().resolve()
    if src.kind == "micro":
        return cache / f"{role}-{prepare_key(sweep, role)}"
    if src.kind == "hf":
        return Path(src.hf).expanduser()
    if src.kind == "gguf":
        return gguf_dir(cache, src.locate_gguf(m.source_field(role)))
    base = derive_base_identity(model_dir(sweep, "teacher"), m.source("teacher").kind)
    return derive_dir(cache, base, src.derive.keep_layers)


def prepare(sweep: SweepConfig, *, threads: int | None = None, force: bool = False) -> tuple[Path, Path]:
    """Return ``(teacher_dir, student_dir)``: each role's source resolved into its Hugging Face
    directory (`model_dir`), built unless cached (or ``force``): the micro models trained,
    a GGUF file converted (`models.sources.convert_gguf`), a derived student cut from the
    teacher (`models.sources.derive_pruned`); an ``hf`` directory (``models.teacher_path`` /
    ``student_path``) is returned as it is. With ``models.teacher_refine`` the teacher is then
    GRPO-refined (`refine_teacher`, cached under ``teacher-grpo-<refine_key>``) and that refined
    directory is returned (a derived student is cut from the teacher before refinement).

    Raises:
        FileNotFoundError: an ``hf`` directory that does not exist.
        ValueError: a gguf package or file that is not there, keep_layers out of range.
    """
    threads = threads or max(1, os.cpu_count() or 1)
    paths = [resolve_source(sweep, role, threads, force) for role in ("teacher", "student")]
    if sweep.models.teacher_refine is not None:
        paths[0] = _refined(sweep, paths[0], threads, force)
    return paths[0], paths[1]


def resolve_source(sweep: SweepConfig, role: str, threads: int | None = None, force: bool = False) -> Path:
    """``role``'s directory (`model_dir`), built under its lock unless cached (or ``force``), with its
    ``[prepare]`` line: `prepare` for one role (a derived student needs the teacher's directory
    there first).

    Raises:
        FileNotFoundError: an ``hf`` directory that does not exist.
        ValueError: a gguf package or file that is not there, keep_layers out of range."""
    threads = threads or max(1, os.cpu_count() or 1)
    m = sweep.models
    src, field, out = m.source(role), m.source_field(role), model_dir(sweep, role)
    if src.kind == "hf":
        if not out.exists():
            raise FileNotFoundError(f"{field}: {out} does not exist")
        return out
    with build_lock(out):
        if not force and (out / PREPARED_FILE).exists():
            info = json.loads((out / PREPARED_FILE).read_text())  # the scores it was prepared with, for a calibration
            said = f", {_summary(info['evals'])}" if "evals" in info else ""
            print(f"[prepare] {role}: cached at {out}{said}", flush=True)
            return out
        torch.set_num_threads(threads)
        if src.kind == "micro":
            info = _train_one(role, sweep, m.micro(role), out, threads)
            log.debug("prepared %s: %s", role, info)  # the [prepare] line below says it short
            print(f"[prepare] {role}: {info['params']/1e6:.2f}M params, {info['train_seconds']:.0f} s SFT, "
                  f"{_summary(info['evals'])}", flush=True)
        elif src.kind == "gguf":
            info = convert_gguf(src.locate_gguf(field), out)
            print(f"[prepare] {role}: {Path(info['file']).name} dequantised to float32 in {info['seconds']:.0f} s "
                  f"({info['params']/1e6:.1f}M params, {info['layers']} layers, vocabulary {info['vocab_size']:,}; "
                  f"logits equal to the GGUF load's) at {out}", flush=True)
        else:
            info = derive_pruned(model_dir(sweep, "teacher"), src.derive.keep_layers, out, field)
            print(f"[prepare] {role}: layers {info['keep_layers']} of the teacher's {info['teacher_layers']} "
                  f"({info['params']/1e6:.1f}M params) in {info['seconds']:.0f} s at {out}", flush=True)
    return out


def _refined(sweep: SweepConfig, base: Path, threads: int, force: bool) -> Path:
    """``models.teacher_refine``: the GRPO-refined teacher of ``base`` (`refine_teacher`),
    trained unless cached (or ``force``), under the same lock as `prepare`'s models."""
    out = refined_teacher_dir(sweep, base)
    with build_lock(out):
        if force or not (out / "prepare.json").exists():
            info = refine_teacher(sweep, base, out, threads)
            print(f"[prepare] teacher GRPO: {info['steps']} steps in {info['train_seconds']:.0f} s, mean reward "
                  f"first 10 steps {info['reward_first10']:.3f} -> last 10 {info['reward_last10']:.3f}, "
                  f"{_summary(info['evals'])}", flush=True)
        else:
            print(f"[prepare] teacher GRPO: cached at {out}", flush=True)
    return out


__all__ = ["prepare", "prepare_key", "model_dir", "resolve_source", "refine_key", "refine_teacher", "refined_teacher_dir", "scored_evaluation"]
