"""distillab's distillation step against TRL's ``GKDTrainer`` on the same models, prompts,
batch, new tokens, temperature and one torch thread: seconds per step, completion tokens
per second and their ratio, in-loop and for a whole 40-step run.

    python benchmarks/peer_trl.py                 # both parts (~15 min on 2 shared cores)
    python benchmarks/peer_trl.py --no-whole      # in-loop steps only
    python benchmarks/peer_trl.py --rounds 0      # the whole-run comparison only
    python benchmarks/peer_trl.py --compile       # both compiled (resources.compile; TRL's torch_compile)
    python benchmarks/peer_trl.py --plumbing      # the path on tiny random models, in this process (seconds)
    python benchmarks/peer_trl.py --config search_spaces/smol_smoke.yaml --batch 8 --max-tokens 64 \
        --steps 4 --rounds 2 --no-whole           # the real pair: SmolLM2-135M-Instruct and its 8-layer student

Setting (both frameworks): the prepared micro teacher and student of ``--config``
(``distillab prepare search_spaces/micro.yaml`` first; cached models are reused), the
trial's training prompts in step order, ``--batch`` (16) prompts per step, one rollout
each, up to ``--max-tokens`` (32) new tokens, τ = 1 for sampling and for the loss, the
forward KL(π_T ‖ π_S) over completion tokens (TRL: β = 0), no learning-rate warm-up (TRL's
``warmup_steps=0``; the config's own, micro.yaml's 10, would outlast the 8-step rounds),
``torch.set_num_threads(1)``.

- OnPD: distillab's trial loop with ``rollout.policy: onpd`` (the student samples in
  process each step) against ``GKDTrainer`` with ``lmbda = 1`` (the student generates
  each step with ``model.generate``).
- OffPD: distillab with ``rollout.offpd_reuse`` (the teacher's rollouts of every step
  sampled once, before the loop) against ``GKDTrainer`` with ``lmbda = 0`` on the same
  rollouts as its dataset, in the same order.

In-loop: each round runs ``--steps`` steps of each framework in its own fresh process
(so neither sees the other's threads, RNG or ``torch.distributed`` state), both from
the initial student; the order alternates between rounds. A step is one pass of the
training loop: distillab's `distill.run_worker` loop body (prompts, rollouts, loss,
update, log, under a `session.LocalSession`, so without Ray's report); TRL's time
between consecutive ``on_step_end`` callbacks (data, generation, loss, backward,
optimizer, logging hooks). The first ``--warmup`` steps (1) of each round are a warm-up and
not counted (with ``--compile``, 4: both frameworks compile at their first steps, TRL's
generate() recompiles at its second).
Tokens are the completion tokens of the step (eos included): distillab's rollout
lengths, TRL's labels ≠ −100. Step memory: the peak resident set of the counted steps minus
the resident set after the warm-up steps (models, optimizer state and allocator pools are
set up by then), from /proc/self/status, the peak reset at that point (Linux).

``--plumbing``: the same path (both frameworks, both policies, one round of 2 steps, batch 2, 4
new tokens; the whole run's configuration validated, not run) on `_plumbing.tiny_models`, with
the children called in this process; what a fast test runs so the benchmark cannot rot. Its
numbers mean nothing.

Whole run: wall time of ``distillab sweep`` (CLI, imports, ``prepare`` cached, Ray
start-up, Tune and Train start, evaluations before and after, 40 steps, checkpoint,
report) for a one-trial OnPD sweep, against a TRL process that loads both models,
builds the trainer and trains 40 steps (no evaluation).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MARK = "peer_trl-row "  # prefix of a child's result lines (trainers print their own dicts)
WHOLE_STEPS = 40


def overrides(args, policy: str, steps: int) -> dict:
    """The sweep overrides of the benchmark's trial (see the module docstring)."""
    return {
        "trial.rollout.policy": policy, "trial.rollout.offpd_reuse": policy == "offpd",
        "trial.rollout.engine": "transformers", "trial.rollout.max_tokens": args.max_tokens,
        "trial.rollout.tau_s": 1.0, "trial.rollout.tau_t": 1.0, "trial.loss.tau_s": 1.0, "trial.loss.tau_t": 1.0,
        "trial.loss.kind": "forward", "trial.optimizer.prompts_per_step": args.batch,
        "trial.optimizer.steps": steps, "trial.optimizer.warmup_steps": 0, "resources.torch_threads": 1,
        "resources.compile": bool(getattr(args, "compile", False)), **extra_sets(args),
    }


def extra_sets(args) -> dict:
    """``--set KEY=VALUE`` overrides (YAML values), e.g. the evaluation settings a cached ``prepare`` used."""
    import yaml

    out = {}
    for kv in getattr(args, "set", None) or []:
        k, v = kv.split("=", 1)
        out[k] = yaml.safe_load(v)
    return out


def _setup(args, policy: str, steps: int):
    """(sweep, teacher path, student path, trial) for the benchmark, models from ``prepare`` (cached)."""
    from distillab.config import load_sweep
    from distillab.recipe.prepare import prepare

    sweep = load_sweep(args.config, {**overrides(args, policy, steps), "models.cache_dir": str(Path(args.cache).resolve())})
    teacher, student = prepare(sweep, threads=1)
    return sweep, teacher, student, sweep.trial


def one_rank() -> None:
    """One gloo process group (DeepSpeed needs torch.distributed): the tests' own
    (``tests/fixtures/record_golden.init_one_rank``)."""
    sys.path.insert(0, str(REPO / "tests"))
    from fixtures.record_golden import init_one_rank

    init_one_rank()


def distillab_worker(args, policy: str, steps: int, results_root: str):
    """A `distill.WorkerState` of the benchmark's trial (`distill.setup_trial` under a
    `session.LocalSession`: models, evaluation before training (cached), DeepSpeed, rollout source)."""
    from distillab.config import RuntimeContext
    from distillab.recipe.distill import setup_trial
    from distillab.recipe.session import LocalSession

    sweep, teacher, student, trial = _setup(args, policy, steps)
    ctx = RuntimeContext(teacher_path=str(teacher), student_path=str(student), results_root=results_root,
                         shared_cache=str(sweep.shared_cache_dir()), resources=sweep.resources)
    return setup_trial(trial, ctx, "peer_trl", LocalSession())


def distillab_step(w, step: int):
    """One pass of `distill.run_worker`'s loop (prompts, rollouts, loss, update, sync, log):
    ``(seconds, rollouts, rollout seconds)``."""
    from distillab.recipe.distill import log_step, step_metrics
    from distillab.recipe.loss import loss_step
    from distillab.recipe.optim import optimizer_step
    from distillab.rollout.source import step_prompts

    o = w.trial.optimizer
    t0 = time.perf_counter()
    prompts = step_prompts(w.prompts, step, w.per_worker, o.rollouts_per_prompt)
    rollouts = w.source.get(step, prompts, w.engine.module)
    t_gen = time.perf_counter() - t0
    w.engine.module.train()
    loss, diag = loss_step(w.trial, w.engine, w.teacher, rollouts, w.tok.pad_token_id, w.gen)
    grad_norm, lr = optimizer_step(w.engine, loss, o)
    t_sync = w.source.sync(w.engine.module, step + 1)
    log_step(w, step + 1, step_metrics(w, rollouts, loss, diag, grad_norm, lr, t0, t_gen, t_sync))
    return time.perf_counter() - t0, rollouts, t_gen


def child_distillab(args) -> None:
    """``--steps`` steps of distillab's trial loop; one line per step."""
    import torch

    torch.set_num_threads(1)
    one_rank()
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as d:
        w = distillab_worker(args, args.policy, args.steps, d)
        prof = _profiler(args)
        for step in range(args.steps):
            if prof is not None and step == 1:
                prof.enable()
            secs, rollouts, t_gen = distillab_step(w, step)
            print(MARK + json.dumps({"step": step, "seconds": secs, "tokens": sum(rollouts.lengths),
                                     "rollout_s": t_gen}), flush=True)
            if step + 1 == _warm(args):
                base = step_memory_start()
        _print_profile(prof, args)
        print(MARK + json.dumps(step_memory_end(base)), flush=True)


def _warm(args) -> int:
    """The steps after which the step memory is measured: the round's uncounted ones (``--warmup``, its
    default set by `main`), at least 1."""
    return max(1, args.warmup)


def _status_mb(field: str) -> float:
    """``field`` of /proc/self/status (``VmRSS``: resident now; ``VmHWM``: its peak), in MiB (Linux)."""
    with open("/proc/self/status") as f:
        kb = next(line.split()[1] for line in f if line.startswith(field + ":"))
    return int(kb) / 1024


def step_memory_start() -> float:
    """The resident set after the warm-up steps (models, optimizer state, allocator pools: the set-up),
    in MiB; the peak is reset here (``/proc/self/clear_refs`` 5) so that `step_memory_end` reads the
    peak of the counted steps alone."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status_mb("VmRSS")


def step_memory_end(base: float) -> dict:
    """``{"memory": {"setup_mb", "peak_mb", "step_mb"}}``: the resident set after set-up (`step_memory_start`),
    the peak during the counted steps, and their difference: what a step needs above its set-up."""
    peak = _status_mb("VmHWM")
    return {"memory": {"setup_mb": base, "peak_mb": peak, "step_mb": peak - base}}


def _profiler(args):
    if not args.profile:
        return None
    import cProfile

    return cProfile.Profile(time.process_time)  # CPU time: steadier than wall time on a shared machine


def _print_profile(prof, args) -> None:
    if prof is None:
        return
    import pstats

    prof.disable()
    pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(args.profile)


def _trl_rows(args, trial, teacher_path, tok):
    """The rows TRL trains on, in step order: OnPD the prompts of each step, OffPD the
    same cached teacher rollouts distillab reads (`rollout.source.offpd_rollout_set`)."""
    from distillab.models import load_model
    from distillab.rollout.engine import TransformersEngine
    from distillab.rollout.source import offpd_rollout_set, step_prompts
    from distillab.tasks.data import TaskData

    o = trial.optimizer
    if trial.rollout.policy == "offpd":
        sets = offpd_rollout_set(trial, teacher_path, tok, 0, 1, args.shared, generate_many=lambda jobs: TransformersEngine(
            load_model(teacher_path).eval(), tok.eos_token_id, tok.pad_token_id).generate_many(jobs))
        return [{"prompt_ids": p, "completion_ids": c} for ro in sets for p, c in zip(ro.prompt_ids, ro.completion_ids)]
    prompts = TaskData.of(trial).train_prompts(tok, 0)
    return [{"prompt_ids": p, "completion_ids": []} for s in range(o.steps)
            for p in step_prompts(prompts, s, o.per_worker(1), o.rollouts_per_prompt)]


def _collator(pad_id: int):
    """GKDTrainer's batch from token ids: left-padded prompts and prompt + completion
    with labels on the completion tokens only."""
    import torch

    from distillab.rollout.types import left_pad, pack_rollouts

    def collate(rows):
        prompts = [r["prompt_ids"] for r in rows]
        p_ids, p_attn = left_pad(prompts, pad_id)
        ids, attn, cmask = pack_rollouts(prompts, [r["completion_ids"] for r in rows], pad_id)
        labels = torch.where(torch.roll(cmask, 1, dims=1), ids, torch.full_like(ids, -100))
        return {"prompts": p_ids, "prompt_attention_mask": p_attn, "input_ids": ids, "attention_mask": attn,
                "labels": labels}

    return collate


def trl_trainer(args, steps: int, records: list | None = None, memory: list | None = None):
    """A ``GKDTrainer`` on the benchmark's setting; ``records`` gets (time, tokens) per step, and
    ``memory`` the resident set after the warm-up steps (`step_memory_start`)."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl.experimental.gkd import GKDConfig, GKDTrainer

    from distillab.models import load_model, load_tokenizer

    torch.set_num_threads(1)
    sweep, teacher, student, trial = _setup(args, args.policy, steps)
    args.shared = str(sweep.shared_cache_dir())
    tok = load_tokenizer(student)
    cfg = GKDConfig(
        output_dir=tempfile.mkdtemp(dir=os.environ.get("TMPDIR")), lmbda=1.0 if args.policy == "onpd" else 0.0,
        beta=0.0, temperature=1.0, max_new_tokens=args.max_tokens, per_device_train_batch_size=args.batch,
        max_steps=steps, learning_rate=trial.optimizer.lr, warmup_steps=0, max_grad_norm=trial.optimizer.clip,
        use_cpu=True, report_to="none", save_strategy="no", logging_steps=10**6, disable_tqdm=True,
        train_sampling_strategy="sequential", dataloader_num_workers=0, seed=trial.seed,
        bf16=False, gradient_checkpointing=False,  # SFTConfig's defaults: float32 as distillab, and a KV cache in generate
        torch_compile=bool(getattr(args, "compile", False)),  # --compile: the Trainer's own torch.compile switch
    )
    tokens: list[int] = []

    class Trainer(GKDTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            tokens.append(int((inputs["labels"][:, 1:] != -100).sum()))
            # the Trainer counts num_items_in_batch from the dataset's labels, which an OnPD row does not have
            # (0: an infinite loss); None makes GKD average over the batch's completion tokens
            return super().compute_loss(model, inputs, return_outputs, None)

    class Timer(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            if records is not None and not records:
                records.append((time.perf_counter(), 0))

        def on_step_end(self, a, state, control, **kw):
            if records is not None:
                records.append((time.perf_counter(), tokens[-1]))
                if state.global_step == _warm(args):
                    memory.append(step_memory_start())

    model = load_model(student)
    return Trainer(model=model, teacher_model=load_model(teacher), args=cfg, processing_class=tok,
                   train_dataset=Dataset.from_list(_trl_rows(args, trial, teacher, tok)),
                   data_collator=_collator(tok.pad_token_id), callbacks=[Timer()])


def child_trl(args) -> None:
    """``--steps`` GKDTrainer steps; one JSON line per step."""
    records: list = []
    memory: list = []
    trainer = trl_trainer(args, args.steps, records, memory)
    prof = _profiler(args)
    if prof is not None:
        prof.enable()
    trainer.train()
    _print_profile(prof, args)
    for i in range(1, len(records)):
        print(MARK + json.dumps({"step": i - 1, "seconds": records[i][0] - records[i - 1][0], "tokens": records[i][1]}))
    print(MARK + json.dumps(step_memory_end(memory[0])))


def child_trl_whole(args) -> None:
    """A whole TRL run: load, build, train ``WHOLE_STEPS`` steps (the parent times the process)."""
    trl_trainer(args, WHOLE_STEPS).train()


def _passed_on(args) -> list[str]:
    """The options a child process gets from the parent's: ``--set`` and ``--compile``."""
    return [a for kv in args.set for a in ("--set", kv)] + (["--compile"] if args.compile else [])


CHILDREN = {"distillab": child_distillab, "trl": child_trl, "trl_whole": child_trl_whole}


def _run_here(args, kind: str, policy: str) -> list[dict]:
    """A child's rows computed in this process (``--plumbing``: no timing to keep apart)."""
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        CHILDREN[kind](argparse.Namespace(**{**vars(args), "child": kind, "policy": policy}))
    return [json.loads(line[len(MARK):]) for line in buf.getvalue().splitlines() if line.startswith(MARK)]


def _run_child(args, kind: str, policy: str) -> list[dict]:
    if args.plumbing:
        return _run_here(args, kind, policy)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", kind, "--policy", policy, "--steps", str(args.steps),
           "--config", args.config, "--cache", args.cache, "--batch", str(args.batch),
           "--max-tokens", str(args.max_tokens)] + _passed_on(args)
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{kind} {policy} failed:\n{out.stderr[-4000:]}")
    return [json.loads(line[len(MARK):]) for line in out.stdout.splitlines() if line.startswith(MARK)]


def in_loop(args, policy: str) -> dict:
    """Interleaved rounds of both frameworks; per framework, the per-step rows after warm-up."""
    rows: dict[str, list[dict]] = {"distillab": [], "trl": []}
    mems: dict[str, list[dict]] = {"distillab": [], "trl": []}
    for r in range(args.rounds):
        order = ("distillab", "trl") if r % 2 == 0 else ("trl", "distillab")
        for kind in order:
            got = _run_child(args, kind, policy)
            mems[kind] += [x["memory"] for x in got if "memory" in x]
            counted = [x for x in got if "memory" not in x][args.warmup:]
            rows[kind] += counted
            med = statistics.median(x["seconds"] for x in counted)
            print(f"  round {r} {policy} {kind:9s} median {med * 1e3:7.1f} ms/step over {len(counted)} steps", flush=True)
    out = {}
    for kind, rs in rows.items():
        secs, toks = sum(x["seconds"] for x in rs), sum(x["tokens"] for x in rs)
        out[kind] = {"s_per_step": statistics.median(x["seconds"] for x in rs), "tokens_per_s": toks / secs,
                     "tokens_per_step": toks / len(rs),
                     "setup_mb": statistics.median(m["setup_mb"] for m in mems[kind]),
                     "step_mb": statistics.median(m["step_mb"] for m in mems[kind])}
    return out


def _prepare_untimed(config: str, sets: dict) -> None:
    """``prepare`` the whole run's models before it is timed, so that its ``prepare`` finds them
    cached, as the docstring says. (Overrides can change the prepare key: on
    ``micro_findings.yaml`` the top-level trial's evaluation tasks differ from those its grids
    prepared with, so the timed run used to train a 2,400-step student first.)"""
    from distillab.config import load_sweep
    from distillab.recipe.prepare import prepare

    prepare(load_sweep(config, sets), threads=1)


def whole_sets(args, storage: str) -> dict:
    """The overrides of the whole run's one-trial OnPD sweep."""
    return {**overrides(args, "onpd", WHOLE_STEPS), "name": "peer_trl_whole", "storage_path": storage,
            "models.cache_dir": str(Path(args.cache).resolve()), "search.grids": None,  # one trial, also
            # where the config is a union of grids (micro_findings.yaml)
            "search.grid": {"rollout.policy": ["onpd"]}}


def whole(args) -> tuple[float, float]:
    """(distillab sweep wall s, TRL run wall s), one after the other."""
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as d:
        sets = whole_sets(args, d)
        cmd = ["distillab", "sweep", args.config, "--no-dashboard"]
        for k, v in sets.items():
            cmd += ["--set", f"{k}={json.dumps(v)}"]
        _prepare_untimed(args.config, sets)
        t0 = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True)
        t_ds = time.perf_counter() - t0
        if out.returncode != 0:
            raise SystemExit(f"distillab sweep failed:\n{out.stderr[-4000:]}")
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "trl_whole", "--policy", "onpd", "--config", args.config,
           "--cache", args.cache, "--batch", str(args.batch), "--max-tokens", str(args.max_tokens)] + _passed_on(args)
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True)
    t_trl = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"TRL run failed:\n{out.stderr[-4000:]}")
    return t_ds, t_trl


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=str(REPO / "search_spaces" / "micro.yaml"))
    p.add_argument("--cache", default=str(REPO / ".cache" / "models"), help="models.cache_dir (prepared models)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--max-tokens", dest="max_tokens", type=int, default=32)
    p.add_argument("--steps", type=int, default=8, help="steps per round and framework, warm-up included")
    p.add_argument("--warmup", type=int, default=None, help="uncounted first steps of each round (1; 4 with --compile)")
    p.add_argument("--rounds", type=int, default=4, help="interleaved in-loop rounds (0: whole run only)")
    p.add_argument("--policies", default="onpd,offpd")
    p.add_argument("--no-whole", action="store_true", help="skip the whole-run comparison")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="extra sweep override (as distillab --set), e.g. the settings the cached models were prepared with")
    p.add_argument("--compile", action="store_true",
                   help="both frameworks compiled: distillab's resources.compile, TRL's torch_compile")
    p.add_argument("--plumbing", action="store_true",
                   help="the whole path on tiny random models, 1 round of 2 steps, in this process (seconds; "
                        "the numbers mean nothing)")
    p.add_argument("--profile", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--policy", default="onpd", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.plumbing:
        return plumbing(args)
    args.warmup = args.warmup if args.warmup is not None else 4 if args.compile else 1
    if not 0 <= args.warmup < args.steps or _warm(args) >= args.steps:
        p.error(f"--warmup ({args.warmup}) must be >= 0 and less than --steps ({args.steps}), and --steps at least 2 "
                "(the step memory is measured after the first step)")
    if args.child:
        CHILDREN[args.child](args)
        return 0
    return compare(args)


def plumbing(args) -> int:
    """``--plumbing`` (module docstring): tiny models in a temporary cache, then `compare`; the whole
    run's sweep is loaded (validated), not run."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _plumbing
    from distillab.config import load_sweep

    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as d:
        sets = [f"{k}={v}" for k, v in _plumbing.plumbing_sets(d).items()]
        args = argparse.Namespace(**{**vars(args), "config": _plumbing.CONFIG, "cache": d, "batch": 2, "max_tokens": 4,
                                     "steps": 2, "warmup": 1, "rounds": 1, "no_whole": True, "set": args.set + sets})
        load_sweep(args.config, whole_sets(args, d))
        one_rank()
        return compare(args)


def _ratio(a: float, b: float) -> str:
    """``a / b`` as ``0.23x``, or ``nan`` where ``b`` is not above 0 (a step that allocated nothing beyond set-up)."""
    return f"{a / b:.2f}x" if b > 0 else "nan"


def compare(args) -> int:
    """The in-loop comparison (``--rounds``) and the whole run (unless ``--no-whole``), printed."""
    print(f"{args.config}: batch {args.batch}, <= {args.max_tokens} new tokens, tau 1, 1 torch thread, "
          f"{args.rounds} interleaved rounds x {args.steps} steps (first {args.warmup} of each round not counted)"
          f"{', both compiled' if args.compile else ''}", flush=True)
    results = {pol: in_loop(args, pol) for pol in args.policies.split(",")} if args.rounds else {}
    print("\npolicy  framework   s/step  completion tok/s  tok/step  set-up MiB  step MiB" if results
          else "(--rounds 0: no in-loop part)")
    for pol, res in results.items():
        for kind, r in res.items():
            print(f"{pol:6s}  {kind:9s} {r['s_per_step']:8.4f} {r['tokens_per_s']:17.1f} {r['tokens_per_step']:9.1f} "
                  f"{r['setup_mb']:11.0f} {r['step_mb']:9.0f}")
        ds, trl = res["distillab"], res["trl"]
        print(f"{pol:6s}  distillab/TRL completion tokens/s: {ds['tokens_per_s'] / trl['tokens_per_s']:.2f}x"
              f"   (TRL s/step / distillab s/step: {trl['s_per_step'] / ds['s_per_step']:.2f}x)"
              f"   step memory distillab/TRL: {_ratio(ds['step_mb'], trl['step_mb'])}")
    if not args.no_whole:
        t_ds, t_trl = whole(args)
        print(f"\nwhole {WHOLE_STEPS}-step OnPD run: distillab sweep {t_ds:.1f} s (Ray start-up, evaluations and "
              f"checkpoint included), TRL {t_trl:.1f} s; ratio {t_ds / t_trl:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
