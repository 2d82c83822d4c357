"""The optimizer of a trial's stages: learning-rate schedules, the DeepSpeed engine
around the student (distillation and the RLVR stage) in the trial's precision
(`deepspeed_bf16`), the plain-AdamW stepper used where DeepSpeed does not fit
(``prepare``'s teacher refinement, QLoRA), one optimizer step with the unclipped
gradient norm, the student whole for generation under ZeRO 3 (`gathered_for_generation`),
the masks of parameters that ever had a gradient (`TouchedParameters`), and the
checkpoint: the student's weights (safetensors) and each rank's training state (AdamW
moments, master weights, LR schedule, random streams) for an exact resume.

Schedules (PROTOCOL.md §6): distillation warms up linearly over
``optimizer.warmup_steps`` then stays constant; SFT and RLVR warm up, then decay
with a cosine to 10 % of the peak (RLVR: to ``rlvr.min_lr_ratio`` of it; the paper
files set 0, the usual cosine).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import math
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import deepspeed
import torch
from deepspeed.comm.torch import build_shm_op
from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer
from torch import Tensor
from torch.utils.cpp_extension import _get_build_directory
from transformers import AutoModelForCausalLM, PreTrainedModel

from distillab.config import OptimizerConfig, RLVRConfig
from distillab.models import load_model

log = logging.getLogger(__name__)

__all__ = ["lr_lambda", "rlvr_schedule", "deepspeed_bf16", "load_shm_comm_op", "setup_engine",
           "gathered_for_generation", "TorchStepper", "clip_grad_norm", "optimizer_step", "TouchedParameters",
           "TRAINING_STATE", "engine_state",
           "load_engine_state", "rng_state", "set_rng_state", "save_checkpoint", "Resume", "load_checkpoint"]


def lr_lambda(warmup: int, total: int, schedule: str, floor: float = 0.1) -> Callable[[int], float]:
    """Multiplier of the base LR at optimizer step s (0-based): linear warm-up over
    ``warmup`` steps, then ``constant`` (1.0) or ``cosine`` (to ``floor`` at ``total``:
    0.1 keeps 10 % of the peak, 0.0 is the usual cosine to zero).

    Raises:
        ValueError: unknown schedule (allowed: constant, cosine).
    """
    if schedule not in ("constant", "cosine"):
        raise ValueError(f"schedule must be 'constant' or 'cosine', got {schedule!r}")

    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return f


def rlvr_schedule(cfg: RLVRConfig) -> Callable[[int], float]:
    """LR multiplier per step of an RLVR stage: linear warm-up over ``warmup_ratio`` of
    the steps, then cosine to ``min_lr_ratio`` of the peak (`lr_lambda`)."""
    return lr_lambda(max(1, round(cfg.warmup_ratio * cfg.steps)), cfg.steps, "cosine", cfg.min_lr_ratio)


def deepspeed_bf16(precision: str, master_weights: str, zero_stage: int) -> dict | None:
    """DeepSpeed's ``bf16`` config block for ``trial.precision`` / ``trial.master_weights``
    (`config.TrialConfig`), or None where DeepSpeed's mixed precision is off:

    - ``fp32``: None (float32 parameters and optimizer).
    - ``bf16`` with ``fp32`` master weights: ``{"enabled": true}``: DeepSpeed holds the
      parameters in bf16 and float32 master copies in the optimizer, updated by AdamW
      and rounded into the bf16 parameters after each step.
    - ``bf16`` with ``bf16`` master weights: under ZeRO 0 None (the parameters are bf16
      and torch AdamW updates them in place, its moments bf16 too: ``zeros_like`` of
      the parameter); under ZeRO ≥ 1 DeepSpeed's ``bf16_master_weights_and_grads`` and
      ``bf16_optimizer_states`` (the same arithmetic on the partitions).
    In both bf16 modes an update below half a bf16 step of a bf16 weight is lost at the
    rounding; with fp32 masters it accumulates in the master until it shows."""
    if precision != "bf16":
        return None
    if master_weights == "fp32":
        return {"enabled": True}
    if zero_stage == 0:
        return None
    return {"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}


def _undo_init_step(ds_opt: FP16_UnfusedOptimizer) -> None:
    """DeepSpeed's ZeRO-0 bf16 wrapper (``FP16_UnfusedOptimizer``) takes one AdamW step on
    zero gradients when it is built, to create the state. That advances AdamW's step
    count (the first real update would be 0.74× Adam's: the bias correction of step 2)
    and applies weight decay once. Undone here: the state emptied, the float32 masters
    reset to the bf16 parameters they were copied from."""
    ds_opt.optimizer.state.clear()
    for masters, params in zip(ds_opt.fp32_groups, ds_opt.fp16_groups):
        for m, p in zip(masters, params):
            m.data.copy_(p.data)


#: DeepSpeed's CPU shared-memory collective (``ShareMemCommBuilder``): the op its torch backend loads
SHM_COMM_OP = "deepspeed_shm_comm"


def load_shm_comm_op(name: str = SHM_COMM_OP, load: Callable[[], object] = build_shm_op) -> object:
    """Load DeepSpeed's shared-memory collective op once per process, safely under kills.

    DeepSpeed's torch backend loads it with ``torch.utils.cpp_extension.load``, which takes a
    lock *file* (``<build dir>/lock``, created with ``O_EXCL``) even when the op is built, for
    the milliseconds of its version check. A process killed in those milliseconds (a sweep's
    worker SIGKILLed by a fault or the chaos test) leaves the file, and every later load in any
    process waits for its removal for ever (``FileBaton.wait``): a trial's workers stop in
    `setup_engine` with their resources held (issue 48, seen once in five whole-suite runs).
    Here each load holds an OS lock (``fcntl.flock`` on ``<build dir>.flock``), which the kernel
    releases when its holder dies: inside it no other distillab process is loading, so a lock
    file found there was left by a dead one and is removed (logged) before ``load`` runs.
    DeepSpeed keeps the loaded op (``OpBuilder._loaded_ops``), so its own load later in
    ``deepspeed.initialize`` returns at once without the lock file. A process outside distillab
    that loads the same op from the same ``TORCH_EXTENSIONS_DIR`` does not take the OS lock;
    the sweep's default directory (``.cache/torch_extensions``, `driver.environ.env_defaults`)
    is its own.

    ``name``: the op's build directory name; ``load``: what loads it (DeepSpeed's
    ``build_shm_op``; None where the accelerator has no such op). Returns what ``load``
    returns. Raises what ``load`` raises (a failed build), and ``OSError`` where the build
    directory cannot be created."""
    build_dir = Path(_get_build_directory(name, verbose=False))  # torch's: TORCH_EXTENSIONS_DIR or its default
    with open(build_dir.parent / f"{name}.flock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            stale = build_dir / "lock"
            if stale.exists():
                log.warning("removing %s, left by a process that died while loading the op", stale)
                stale.unlink(missing_ok=True)
            return load()
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def init_single_process_group() -> None:
    """The default ``torch.distributed`` group of a one-process trial (``resources.local_mode``),
    once per process: world size 1 on an in-process store, with Ray Train's backend (NCCL
    on a GPU, else gloo), and the rank variables Ray Train sets for its workers (``RANK``,
    ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``), which DeepSpeed reads. A reused
    trial actor keeps the group of its first trial."""
    for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}.items():
        os.environ.setdefault(k, v)
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl" if torch.cuda.is_available() else "gloo",
                                             store=torch.distributed.HashStore(), rank=0, world_size=1)


def setup_engine(module, o: OptimizerConfig, world_size: int, *, lr: float | None = None, schedule=None,
                 batch: int | None = None, clip: float | None | str = "optimizer", precision: str = "fp32",
                 master_weights: str = "fp32"):
    """DeepSpeed engine around ``module``: torch AdamW (``o``'s betas, eps, weight decay)
    as client optimizer, LR linear warm-up then constant, ZeRO stage ``o.zero_stage``,
    mixed precision from ``precision`` / ``master_weights`` (`deepspeed_bf16`; with bf16
    master weights under ZeRO 0 AdamW trains ``module``'s parameters in their own dtype,
    so they must already be bf16, as `distill.setup_models` loads them; LoRA adapters,
    which peft keeps in float32, stay float32). Under ZeRO 0 without DeepSpeed's bf16
    the clipping is done by `optimizer_step` (so the unclipped norm is known); otherwise
    by DeepSpeed, whose global norm is read back. The RLVR stage passes its own ``lr``,
    ``schedule`` (a step → multiplier function), per-worker ``batch`` and ``clip``.
    Returns ``(engine, optimizer, per-worker batch)``."""
    per_worker = batch if batch is not None else o.per_worker(world_size)
    clip = o.clip if clip == "optimizer" else clip
    load_shm_comm_op()  # before deepspeed.initialize loads it without a lock that survives a kill
    bf16 = deepspeed_bf16(precision, master_weights, o.zero_stage)
    opt = torch.optim.AdamW(module.parameters(), lr=lr if lr is not None else o.lr, betas=o.betas, eps=o.eps,
                            weight_decay=o.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, schedule if schedule is not None else lr_lambda(max(1, o.warmup_steps), o.steps, "constant"))
    ds_config = {
        "train_micro_batch_size_per_gpu": per_worker,
        "gradient_accumulation_steps": 1,
        "train_batch_size": per_worker * world_size,
        "gradient_clipping": (clip or 0.0) if o.zero_stage > 0 or bf16 is not None else 0.0,
        "zero_optimization": {"stage": o.zero_stage, "stage3_gather_16bit_weights_on_model_save": True,
                              **({"stage3_param_persistence_threshold": o.zero3_persistence_threshold}
                                 if o.zero_stage == 3 else {})},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
        **({"bf16": bf16} if bf16 is not None else {}),
    }
    engine, _, _, _ = deepspeed.initialize(model=module, optimizer=opt, lr_scheduler=sched, config=ds_config)
    if isinstance(engine.optimizer, FP16_UnfusedOptimizer):
        _undo_init_step(engine.optimizer)
    if o.zero_stage == 3:
        _persist_lm_head(engine)
    return engine, opt, per_worker


def _persist_lm_head(engine) -> None:
    """ZeRO 3 gathers a partitioned parameter only inside its own module's forward and
    backward, but the fused loss (`loss.forward`, ``ops.chunked``) reads the student's
    lm_head weight outside the lm_head's forward. So the weight is made persistent, as
    DeepSpeed makes its small parameters: gathered once and re-gathered after every
    step (``ds_persist``, ``persistent_parameters``), and never released by the module
    hooks (``is_external_param``; ``ds_persist`` alone still lets the first, tracing
    step release it). One full lm_head per rank; its gradient and optimizer state stay
    partitioned."""
    weight = engine.module.get_output_embeddings().weight
    if not getattr(weight, "ds_persist", False):
        weight.ds_persist = weight.is_external_param = True
        engine.optimizer.persistent_parameters.append(weight)  # the list its parameter offload also holds
        weight.all_gather([weight])


@contextlib.contextmanager
def gathered_for_generation(engine, enabled: bool = True):
    """A context giving the student of ``engine`` whole, for generation. Under ZeRO 3
    (and ``enabled``) that is a plain copy of it (built once from its config and kept on
    the engine), into which every parameter is gathered (``deepspeed.zero.GatheredParameters``:
    collective, every rank must enter) and copied. Generating with the ZeRO 3 module itself
    would run DeepSpeed's per-submodule all-gathers, which do not match across ranks
    that generate sequences of different lengths (and one rank evaluating alone would
    wait forever). It costs one full copy of the student per rank. Otherwise
    ``engine.module`` itself."""
    if not enabled or engine.zero_optimization_stage() != 3:
        yield engine.module
        return
    module = engine.module
    replica = getattr(engine, "distillab_replica", None)
    if replica is None:
        replica = AutoModelForCausalLM.from_config(module.config, dtype=module.dtype).eval().requires_grad_(False)
        replica.to(engine.device)  # where the engine placed this rank's partitions
        engine.distillab_replica = replica
    params = dict(module.named_parameters())
    with deepspeed.zero.GatheredParameters(list(params.values())), torch.no_grad():
        for name, p in replica.named_parameters():
            p.copy_(params[name])
    yield replica


class TorchStepper:
    """The optimizer side of `rlvr.run_rlvr` without DeepSpeed (``distillab prepare``'s teacher
    refinement runs outside Ray Train; QLoRA's 4-bit parameters): AdamW with the stage's LR
    schedule, the same ``__call__`` / ``backward`` / ``step`` / ``get_lr`` calls as a DeepSpeed engine."""

    def __init__(self, module, lr: float, schedule, betas=(0.9, 0.999), eps: float = 1e-8):
        self.module = module
        self.opt = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=lr, betas=betas, eps=eps,
                                     weight_decay=0.0)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, schedule)

    def __call__(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def backward(self, loss: Tensor) -> None:
        loss.backward()

    def step(self) -> None:
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)

    def get_lr(self) -> list[float]:
        return self.sched.get_last_lr()


def _deepspeed_clips(engine) -> bool:
    """DeepSpeed clips (and knows the global norm) under ZeRO ≥ 1 and under its bf16."""
    return bool(engine.zero_optimization() or engine.bfloat16_enabled())


def clip_grad_norm(params: list, max_norm: float | None) -> float:
    """Global L2 norm of the gradients of ``params`` before clipping, the gradients then
    scaled in place to norm ≤ ``max_norm`` (None: not clipped). float32 gradients go
    through ``torch.nn.utils.clip_grad_norm_`` (bitwise as before); bf16 ones (bf16 master
    weights) have their norm computed in float32 (``vector_norm(dtype=float32)``), not
    rounded to bf16, then ``clip_grads_with_norm_``."""
    max_norm = max_norm if max_norm is not None else float("inf")
    grads = [p.grad for p in params]
    if all(g.dtype == torch.float32 for g in grads):
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    norms = torch.stack([torch.linalg.vector_norm(g, dtype=torch.float32) for g in grads])
    total = torch.linalg.vector_norm(norms)
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return float(total)


def optimizer_step(engine, loss: Tensor, o: OptimizerConfig) -> tuple[float, float]:
    """One update of the DeepSpeed ``engine`` from ``loss``: backward, the global
    gradient norm before clipping (clipped here to ``o.clip`` under ZeRO 0 without
    DeepSpeed's bf16, `clip_grad_norm`; DeepSpeed's own norm otherwise), step.
    Returns ``(grad_norm, lr of the step)``."""
    engine.backward(loss)
    grad_norm = float("nan")
    ds_clips = _deepspeed_clips(engine)
    if not ds_clips:
        grad_norm = clip_grad_norm([p for p in engine.module.parameters() if p.grad is not None], o.clip)
    lr = engine.get_lr()[0]
    engine.step()
    if ds_clips:
        gn = engine.get_global_grad_norm()
        grad_norm = float(gn) if gn is not None else float("nan")
    return grad_norm, lr


class TouchedParameters:
    """Which entries of each trainable parameter of ``module`` had a nonzero gradient in
    some step: the diagnostic of update sparsity that leaves out what training could not
    move (issue 17: the micro student's embedding rows of characters Countdown never
    uses). A tensor hook per parameter ORs ``grad != 0`` into a bool mask of the
    parameter's full shape (one byte per entry, allocated at its first gradient), on this
    rank's local gradient, before clipping, reduction or the optimizer; `gathered` is the
    union over ranks. ``masks``: the masks of a resumed run."""

    def __init__(self, module, masks: dict[str, Tensor] | None = None):
        params = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self.shapes = {n: tuple(getattr(p, "ds_shape", p.shape)) for n, p in params}  # ZeRO 3: the full shape
        self.device = params[0][1].device if params else torch.device("cpu")
        self.masks: dict[str, Tensor] = {n: m.to(self.device) for n, m in (masks or {}).items()}
        self._handles = [p.register_hook(self._hook(n)) for n, p in params]

    def _hook(self, name: str):
        def hook(grad: Tensor) -> None:
            nonzero = grad.detach() != 0
            if name in self.masks:
                self.masks[name] |= nonzero
            else:
                self.masks[name] = nonzero
        return hook

    def gathered(self) -> dict[str, Tensor]:
        """name → bool mask (CPU) of the entries with a nonzero gradient on any rank
        (an all-reduce MAX on the parameters' device when ``torch.distributed`` has
        several ranks: call it on every rank)."""
        dist = torch.distributed
        several = dist.is_initialized() and dist.get_world_size() > 1
        out = {}
        for n in sorted(self.shapes):
            m = self.masks.get(n)
            m = torch.zeros(self.shapes[n], dtype=torch.bool, device=self.device) if m is None else m
            if several:
                m = m.to(torch.uint8)
                dist.all_reduce(m, op=dist.ReduceOp.MAX)
            out[n] = m.bool().cpu()
        return out

    def remove(self) -> None:
        """Remove the hooks (the masks stay)."""
        for h in self._handles:
            h.remove()
        self._handles = []


#: A checkpoint's per-rank training state (`save_checkpoint`), beside the safetensors weights.
TRAINING_STATE = "training_state-rank{rank}.pt"


def _inner_optimizer(engine):
    """The torch optimizer holding the AdamW state: DeepSpeed's client optimizer itself,
    or the one its bf16 / ZeRO wrapper drives (``wrapper.optimizer``)."""
    return getattr(engine.optimizer, "optimizer", engine.optimizer)


def _zero3(engine) -> bool:
    """ZeRO 3's optimizer: its inner optimizer holds the flat partitions only during a step."""
    return hasattr(engine.optimizer, "fp32_partitioned_groups_flat")


def _masters(engine) -> list[Tensor]:
    """The tensors the inner optimizer updates where they are not the module's own
    parameters: DeepSpeed's float32 (or bf16) master weights and ZeRO partitions; []
    where AdamW updates the module's parameters directly (ZeRO 0 without DeepSpeed's bf16)."""
    if _zero3(engine):
        return list(engine.optimizer.fp32_partitioned_groups_flat)
    inner = _inner_optimizer(engine)
    return [] if inner is engine.optimizer else [p for g in inner.param_groups for p in g["params"]]


def engine_state(engine) -> dict:
    """What `load_engine_state` needs to continue ``engine`` exactly: the AdamW
    ``state_dict`` (moments, step counts, hyperparameters; under ZeRO 3 the same, keyed
    by partition), the LR scheduler's ``state_dict`` and this rank's master weights
    (`_masters`). Tensors and plain values only, so ``torch.load(..., weights_only=True)``
    reads it."""
    inner, masters = _inner_optimizer(engine), _masters(engine)
    if _zero3(engine):
        optimizer = {"state": {i: inner.state[m] for i, m in enumerate(masters) if m in inner.state},
                     "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in inner.param_groups]}
    else:
        optimizer = inner.state_dict()
    return {"optimizer": optimizer, "masters": [m.detach() for m in masters],
            "scheduler": engine.lr_scheduler.state_dict()}


def load_engine_state(engine, state: dict) -> None:
    """Continue ``engine`` (built as the saved one: the same model, ZeRO stage, precision
    and world size) from `engine_state`: master weights copied in, then the AdamW and LR
    scheduler states loaded.

    Raises:
        ValueError: the saved master weights do not match this engine's in number or
            shape (another ZeRO stage, precision or world size).
    """
    masters, inner = _masters(engine), _inner_optimizer(engine)
    saved = state["masters"]
    if len(saved) != len(masters) or any(a.shape != b.shape for a, b in zip(saved, masters)):
        raise ValueError(f"the checkpoint's optimizer holds {len(saved)} master tensors "
                         f"{[tuple(t.shape) for t in saved][:4]}, this engine {len(masters)} "
                         f"{[tuple(t.shape) for t in masters][:4]}: resume with the ZeRO stage, precision and "
                         "number of workers that wrote it")
    with torch.no_grad():
        for m, t in zip(masters, saved):
            m.copy_(t)
    if _zero3(engine):
        for i, st in state["optimizer"]["state"].items():
            inner.state[masters[i]] = {k: v.to(masters[i].device) for k, v in st.items()}
        for g, hyper in zip(inner.param_groups, state["optimizer"]["param_groups"]):
            g.update(hyper)
    else:
        inner.load_state_dict(state["optimizer"])
    engine.lr_scheduler.load_state_dict(state["scheduler"])


def save_checkpoint(engine, o: OptimizerConfig, tokenizer, step: int, directory: Path, *, rank: int = 0,
                    state: dict | None = None) -> None:
    """A checkpoint in ``directory``: on rank 0 the student of ``engine`` (safetensors;
    under ZeRO 3 gathered from every rank, so every rank must call this), its tokenizer
    and ``trainer_state.json`` (``{"step": step}``); with ``state`` (tensors and plain
    values: `engine_state` and the caller's RNG states) this rank's
    ``training_state-rank<r>.pt`` (``torch.save``; `load_checkpoint` reads it back with
    ``weights_only=True``, which unpickles no code)."""
    weights = engine._zero3_consolidated_16bit_state_dict() if o.zero_stage == 3 else None  # collective
    directory = Path(directory)
    if rank == 0:
        engine.module.save_pretrained(directory, state_dict=weights, safe_serialization=True)
        tokenizer.save_pretrained(directory)
        (directory / "trainer_state.json").write_text(json.dumps({"step": step}))
    if state is not None:
        torch.save(state, directory / TRAINING_STATE.format(rank=rank))


def rng_state(gen: torch.Generator) -> dict:
    """The random streams a step reads, to save in a checkpoint: torch's CPU (and CUDA)
    generators, the loss generator ``gen`` (sampled estimator) and Python's ``random``
    (numpy's is not used in the loop). Tensors and plain values (``weights_only``-safe)."""
    return {"torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "loss": gen.get_state(), "python": random.getstate()}


def set_rng_state(state: dict, gen: torch.Generator) -> None:
    """Restore `rng_state`'s streams (``gen``: the loss generator)."""
    torch.set_rng_state(state["torch"])
    if state["cuda"]:
        torch.cuda.set_rng_state_all(state["cuda"])
    gen.set_state(state["loss"])
    random.setstate(state["python"])


@dataclass
class Resume:
    """A checkpoint to continue from (`load_checkpoint`): its ``step``, the ``student``
    and this rank's training ``state`` (the dict given to `save_checkpoint`)."""

    step: int
    student: PreTrainedModel
    state: dict


def load_checkpoint(directory: str | Path, rank: int, dtype: torch.dtype = torch.float32,
                    attn_implementation: str | None = None) -> Resume:
    """The `Resume` of a checkpoint written by `save_checkpoint`: the student loaded in
    ``dtype`` with ``attn_implementation`` (`models.load_model`) and rank ``rank``'s
    training state (``torch.load(weights_only=True)``: tensors and plain values only).

    Raises:
        FileNotFoundError: the checkpoint has no training state for ``rank`` (written
            before exact resume, or by fewer workers); the message names the file.
    """
    directory = Path(directory)
    path = directory / TRAINING_STATE.format(rank=rank)
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: this checkpoint has no training state (optimizer, LR schedule, "
                                f"RNG) for rank {rank}, so it cannot be resumed exactly")
    step = json.loads((directory / "trainer_state.json").read_text())["step"]
    return Resume(step, load_model(directory, dtype, attn_implementation), torch.load(path, weights_only=True))
