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
from filelock import FileLock
from transformers import LlamaForCausalLM

from distillab.config import EvaluationConfig, MicroModelConfig, SeedsConfig, SweepConfig, cache_key
from distillab.evals.suite import Evaluator
from distillab.models import build_char_tokenizer, load_model, load_tokenizer, micro_llama_config
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
    each prompt rendered (`tasks.taskio.render`) and each target followed by the end of sequence."""
    mcfg, tasks, ev = sweep.models.micro(role), sweep.trial.tasks, scored_evaluation(sweep)
    blocks = [b for t in registered() for b in t.sft_data(tasks, ev, mcfg, seed, role)]
    eos = "</s>"
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
    directory ``base`` (the micro teacher's cache directory, or ``models.teacher_path``):
    ``<cache_dir>/teacher-grpo-<refine_key>``."""
    m = sweep.models
    base_id = str(Path(base).resolve()) if m.teacher_path is not None else Path(base).name
    return Path(m.cache_dir).expanduser().resolve() / f"teacher-grpo-{refine_key(sweep, base_id)}"


def prepare(sweep: SweepConfig, *, threads: int | None = None, force: bool = False) -> tuple[Path, Path]:
    """Return ``(teacher_dir, student_dir)``, training the micro models if they are
    not cached (or ``force``). Explicit ``models.teacher_path``/``student_path``
    are returned as they are (nothing is trained for them), except that with
    ``models.teacher_refine`` the teacher (micro or explicit) is GRPO-refined
    (`refine_teacher`, cached under ``teacher-grpo-<refine_key>``) and that refined
    directory is returned.

    Raises:
        FileNotFoundError: an explicit model path that does not exist.
    """
    m = sweep.models
    cache = Path(m.cache_dir).expanduser().resolve()
    threads = threads or max(1, os.cpu_count() or 1)
    paths = []
    for role, explicit, mcfg in (
        ("teacher", m.teacher_path, m.micro_teacher),
        ("student", m.student_path, m.micro_student),
    ):
        if explicit is not None:
            p = Path(explicit).expanduser()
            if not p.exists():
                raise FileNotFoundError(f"models.{role}_path: {p} does not exist")
            paths.append(p)
            continue
        out = cache / f"{role}-{prepare_key(sweep, role)}"
        with _building(out):
            if force or not (out / "prepare.json").exists():
                t0 = time.perf_counter()
                info = _train_one(role, sweep, mcfg, out, threads)
                summary = _summary(info["evals"])
                log.debug("prepared %s in %.0f s: %s", role, time.perf_counter() - t0, summary)  # the [prepare] line
                print(f"[prepare] {role}: {info['params']/1e6:.2f}M params, {info['train_seconds']:.0f} s SFT, "
                      f"{summary}", flush=True)
            else:  # the scores it was prepared with (prepare.json), so a calibration reads them here
                evals = json.loads((out / "prepare.json").read_text()).get("evals", [])
                print(f"[prepare] {role}: cached at {out}, {_summary(evals)}", flush=True)
        paths.append(out)
    if m.teacher_refine is not None:
        paths[0] = _refined(sweep, paths[0], threads, force)
    return paths[0], paths[1]


def _building(out_dir: Path) -> FileLock:
    """The lock held while ``out_dir`` is checked and, if missing, built: ``<out_dir>.lock``
    beside it (a `filelock.FileLock`, released when its process ends however it ends). Two
    sweeps or test workers that start at once on one machine train each model once; the
    second waits, then finds it cached. Creates the cache folder."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(out_dir.parent / f".{out_dir.name}.lock")


def _refined(sweep: SweepConfig, base: Path, threads: int, force: bool) -> Path:
    """``models.teacher_refine``: the GRPO-refined teacher of ``base`` (`refine_teacher`),
    trained unless cached (or ``force``), under the same lock as `prepare`'s models."""
    out = refined_teacher_dir(sweep, base)
    with _building(out):
        if force or not (out / "prepare.json").exists():
            info = refine_teacher(sweep, base, out, threads)
            print(f"[prepare] teacher GRPO: {info['steps']} steps in {info['train_seconds']:.0f} s, mean reward "
                  f"first 10 steps {info['reward_first10']:.3f} -> last 10 {info['reward_last10']:.3f}, "
                  f"{_summary(info['evals'])}", flush=True)
        else:
            print(f"[prepare] teacher GRPO: cached at {out}", flush=True)
    return out


__all__ = ["prepare", "prepare_key", "refine_key", "refine_teacher", "refined_teacher_dir", "scored_evaluation"]
