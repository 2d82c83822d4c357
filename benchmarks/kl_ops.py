"""Forward+backward of the full-vocabulary distillation loss, from hidden states and lm_head
weights: peak memory and median time of each implementation, and ratios to the naive loss.

    python benchmarks/kl_ops.py                       # CPU: V=32,000, H=512, 4,096 tokens, fp32
    python benchmarks/kl_ops.py --device cuda --vocab 128256 --hidden 4096 --tokens 8192 \\
        --dtype bfloat16 --impls naive,reference,chunked,triton,triton_logits
    python benchmarks/kl_ops.py --impls naive,sampled,topk,topk_chunked,topk_tail_chunked,k3,k3_chunked
    python benchmarks/kl_ops.py --plumbing            # every implementation at V=101, 37 tokens, in this process

Every implementation computes the same thing: student logits h_S W_Sᵀ, teacher logits
h_T W_Tᵀ (no grad), the forward KL(π_T ‖ π_S) (``--kind``) token-mean over all N tokens,
and the gradients w.r.t. h_S and W_S.

    naive          full logits, ``F.kl_div(log_softmax(z_S/τ_S), log_softmax(z_T/τ_T), log_target=True)``
    trl            full logits, TRL's ``GKDTrainer.generalized_jsd_loss`` (β = 0 forward, 1 reverse;
                   one temperature, so τ_S = τ_T = 1 for it only)
    reference      full logits, ``distillab.ops.kl.distill_loss`` (float32 compute)
    chunked        ``distillab.ops.chunked.chunked_distill_loss``, torch row math
    triton         the same with the Triton row kernels (CUDA only)
    triton_logits  full logits, ``distillab.ops.triton_kl.triton_distill_loss`` (CUDA only)
    floor          the four matrix products every implementation must do, and nothing else:
                   z_S = h_S W_Sᵀ and z_T = h_T W_Tᵀ (N × H × V each), ∂L/∂h_S = G W_S and
                   ∂L/∂W_S = Gᵀ h_S (G an (N, V) stand-in for ∂L/∂z_S), each one full-size GEMM

The estimators of ``loss.estimator`` (``ops.kl``, whose docstring names each one's module), the same shapes:

    sampled            full logits, ``ops.kl.estimator_loss`` estimator sampled (one extra draw per token)
    topk               full logits, estimator topk (``--top-k``, ``--topk-source``; renormalised)
    topk_chunked       ``chunked_distill_loss(estimator="topk")``, renormalised
    topk_tail_chunked  the same with the tail bucket
    k3                 full logits, estimator k3 on random rollout tokens (reverse KL; k1, k2 cost the same)
    k3_chunked         ``chunked_distill_loss(estimator="k3")``

What "peak memory" measures
---------------------------
CPU: each implementation runs in a fresh subprocess. After the inputs exist and a small
warm-up call has loaded every kernel, the kernel's resident-set high-water mark is reset
(``/proc/self/clear_refs`` ← 5) and one forward+backward runs; peak = VmHWM after it −
VmRSS before it, i.e. the extra resident memory at the worst moment of the call: logits,
temporaries, autograd's saved tensors and the gradients, as the OS sees them (freed
memory that the allocator keeps counts too). Where clear_refs is refused it falls back to
the ``ru_maxrss`` delta (a lower bound). CUDA: ``torch.cuda.max_memory_allocated`` −
``memory_allocated`` before the call (tensor memory, not the caching allocator's reserve).

Time: median wall time (and CPU time of the process: steadier on a shared machine, where
other processes stretch wall time) of ``--repeats`` forward+backward calls after the
measured one;
each implementation's time is also printed as a multiple of ``floor``'s, measured in the
same run (``time/floor``: how much the divergence math, the chunking and autograd add).
Defaults to one torch thread (``--threads``) so that runs on a shared 2-core machine are
comparable; ratios are what the closing notes quote.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from types import SimpleNamespace

IMPLS = ("naive", "trl", "reference", "chunked", "triton", "triton_logits", "floor",
         "sampled", "topk", "topk_chunked", "topk_tail_chunked", "k3", "k3_chunked")
CUDA_ONLY = ("triton", "triton_logits")


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        return int(re.search(rf"{key}:\s+(\d+)", f.read()).group(1))


def _trl_jsd():
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    try:
        from trl.experimental.gkd.gkd_trainer import GKDTrainer
    except ImportError:
        from trl.trainer.gkd_trainer import GKDTrainer
    return GKDTrainer.generalized_jsd_loss


#: the implementations that take hidden states and lm_heads (`chunked_distill_loss`); the
#: others but ``floor`` take the full logits
CHUNKED = ("chunked", "triton", "topk_chunked", "topk_tail_chunked", "k3_chunked")


def _inputs(args) -> SimpleNamespace:
    """Fixed random inputs (seed 0) of ``args``' shapes: hidden states ``h_s`` (N, H, grad),
    ``h_t`` (N, H), lm_heads ``w_s`` (V, H, grad), ``w_t`` (V, H), all ``args.dtype``; the
    mask (1, N) and random rollout tokens ``targets`` (1, N) of k3."""
    import torch

    dev, dt = torch.device(args.device), getattr(torch, args.dtype)
    g = torch.Generator(device=dev).manual_seed(0)
    N, H, V = args.tokens, args.hidden, args.vocab
    h_s = torch.randn(N, H, device=dev, generator=g).to(dt).requires_grad_()
    h_t = torch.randn(N, H, device=dev, generator=g).to(dt)
    w_s = (torch.randn(V, H, device=dev, generator=g) * (2.0 / H**0.5)).to(dt).requires_grad_()
    w_t = (torch.randn(V, H, device=dev, generator=g) * (2.0 / H**0.5)).to(dt)
    return SimpleNamespace(dev=dev, h_s=h_s, h_t=h_t, w_s=w_s, w_t=w_t,
                           mask=torch.ones(1, N, dtype=torch.bool, device=dev),
                           targets=torch.randint(0, V, (1, N), device=dev, generator=g))


def _full_logits_loss(impl: str, x: SimpleNamespace, args):
    """The loss closure of an implementation that takes the full (N, V) logits."""
    import torch
    import torch.nn.functional as F

    from distillab.ops.kl import distill_loss, estimator_loss

    kind, tau_s, tau_t = args.kind, args.tau_s, args.tau_t

    def logits():
        zs = x.h_s @ x.w_s.T  # (N, V)
        with torch.no_grad():
            zt = x.h_t @ x.w_t.T  # (N, V)
        return zs, zt

    def naive(zs, zt):
        ls, lt = F.log_softmax(zs.float() / tau_s, dim=-1), F.log_softmax(zt.float() / tau_t, dim=-1)
        p, q = (ls, lt) if kind == "forward" else (lt, ls)
        return F.kl_div(p, q, reduction="batchmean", log_target=True)

    def trl(zs, zt):
        return jsd(zs.float(), zt.float(), beta=0.0 if kind == "forward" else 1.0, temperature=1.0)

    def reference(zs, zt):
        return distill_loss(zs[None], zt[None], x.mask, kind=kind, tau_s=tau_s, tau_t=tau_t)

    def triton_logits(zs, zt):
        return triton_distill_loss(zs[None], zt[None], x.mask, kind=kind, tau_s=tau_s, tau_t=tau_t)

    def estimator(zs, zt):  # sampled, topk, k3
        est_kw = {"sampled": dict(generator=sampler), "topk": dict(top_k=args.top_k, topk_source=args.topk_source),
                  "k3": dict(targets=x.targets)}[impl]
        return estimator_loss(zs[None], zt[None], x.mask, estimator=impl, kind="reverse" if impl == "k3" else kind,
                              tau_s=tau_s, tau_t=tau_t, **est_kw).loss

    jsd = _trl_jsd() if impl == "trl" else None  # imported here: TRL is the peer, not a dependency
    if impl == "triton_logits":
        from distillab.ops.triton_kl import triton_distill_loss  # optional: Triton
    sampler = torch.Generator(device=x.dev).manual_seed(1)  # the sampled estimator's draws
    loss = {"naive": naive, "trl": trl, "reference": reference, "triton_logits": triton_logits}.get(impl, estimator)

    def loss_fn():
        return loss(*logits())

    return loss_fn


def _chunked_loss(impl: str, x: SimpleNamespace, args):
    """The loss closure of a `chunked_distill_loss` implementation (from hidden states and lm_heads)."""
    from distillab.ops.chunked import chunked_distill_loss

    kw = dict(kind=args.kind, backend="triton" if impl == "triton" else "torch")
    if impl == "k3_chunked":
        kw.update(estimator="k3", kind="reverse", targets=x.targets[0])
    elif impl in ("topk_chunked", "topk_tail_chunked"):
        kw.update(estimator="topk", topk_tail=impl == "topk_tail_chunked", top_k=args.top_k,
                  topk_source=args.topk_source)

    def loss():
        return chunked_distill_loss(x.h_s, x.w_s, x.h_t, x.w_t, tau_s=args.tau_s, tau_t=args.tau_t,
                                    chunk_size=args.chunk_size, **kw)

    return loss


def _floor_step(x: SimpleNamespace):
    """``floor``: the four matrix products (module docstring), no loss."""
    import torch

    hs, ws = x.h_s.detach(), x.w_s.detach()

    def step():
        with torch.no_grad():
            zs = hs @ ws.T  # (N, V)
            zt = x.h_t @ x.w_t.T  # (N, V)
            grad_h = zs @ ws  # (N, H): the shape of G W_S
            grad_w = zs.T @ hs  # (V, H): the shape of Gᵀ h_S
        del zt, grad_h, grad_w
        return 0.0  # no loss: only the products

    return step


def make_step(impl: str, args):
    """A closure running one forward+backward of ``impl`` on fixed random inputs (`_inputs`,
    also its ``inputs`` attribute, where the gradients land); returns the loss as a float
    (0.0 for ``floor``). Raises ValueError for an unknown ``impl``."""
    if impl not in IMPLS:
        raise ValueError(f"unknown impl {impl!r}; choose from {', '.join(IMPLS)}")
    x = _inputs(args)
    if impl == "floor":
        step = _floor_step(x)
        step.inputs = x
        return step
    loss_fn = _chunked_loss(impl, x, args) if impl in CHUNKED else _full_logits_loss(impl, x, args)

    def step():
        x.h_s.grad = x.w_s.grad = None
        loss = loss_fn()
        loss.backward()
        return float(loss.detach())

    step.inputs = x
    return step


def measure(impl: str, args) -> dict:
    """Peak extra memory (bytes) and times (s) of ``impl`` in this process."""
    import torch

    torch.set_num_threads(args.threads)
    cuda = args.device.startswith("cuda")
    small = argparse.Namespace(**{**vars(args), "tokens": 64, "vocab": 1000, "hidden": 64, "chunk_size": None})
    make_step(impl, small)()  # warm-up: load kernels, thread pools, Triton compilation
    step = make_step(impl, args)
    if cuda:
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        loss = step()
        torch.cuda.synchronize()
        peak, how = torch.cuda.max_memory_allocated() - before, "cuda max_memory_allocated"
    else:
        before = _status_kib("VmRSS")
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            how = "VmHWM after reset"
        except OSError:
            how = "ru_maxrss delta (lower bound)"
        max0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        loss = step()
        if how.startswith("VmHWM"):
            peak = (_status_kib("VmHWM") - before) * 1024
        else:
            peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - max0) * 1024
    times, cpu = [], []
    for _ in range(args.repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        step()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return {"impl": impl, "loss": loss, "peak_bytes": peak, "times": times, "cpu_times": cpu, "memory": how}


def _child(impl: str, argv) -> dict | None:
    """``measure(impl)`` in a fresh subprocess (CPU peak memory needs its own process)."""
    argv_child = [sys.executable, os.path.abspath(__file__), "--child", impl] + list(
        argv if argv is not None else sys.argv[1:])
    out = subprocess.run(argv_child, capture_output=True, text=True)
    if out.returncode != 0:
        print(f"{impl:17s} failed:\n{out.stderr[-2000:]}")
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--kind", default="forward", choices=["forward", "reverse"])
    p.add_argument("--tau-s", dest="tau_s", type=float, default=1.0)
    p.add_argument("--tau-t", dest="tau_t", type=float, default=0.5)
    p.add_argument("--chunk-size", dest="chunk_size", type=int, default=None)
    p.add_argument("--impls", default="naive,trl,reference,chunked,triton,floor,sampled,topk,topk_chunked,"
                                      "topk_tail_chunked,k3,k3_chunked")
    p.add_argument("--top-k", dest="top_k", type=int, default=64)
    p.add_argument("--topk-source", dest="topk_source", default="teacher", choices=["teacher", "student", "union"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rounds", type=int, default=1, help="interleaved rounds over the impls (times pooled)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--plumbing", action="store_true",
                   help="V=101, H=24, 37 tokens, one repeat, in this process (seconds; the numbers mean nothing)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.plumbing:
        args.vocab, args.hidden, args.tokens, args.repeats, args.rounds, args.top_k = 101, 24, 37, 1, 1, 8

    if args.child:  # one implementation in this fresh process; JSON on the last line
        print(json.dumps(measure(args.child, args)))
        return

    impls = [i.strip() for i in args.impls.split(",") if i.strip()]
    for i in impls:
        if i not in IMPLS:
            p.error(f"unknown impl {i!r}; choose from {', '.join(IMPLS)}")
    cuda = args.device.startswith("cuda")
    print(
        f"forward+backward, {args.kind} KL, V={args.vocab:,} H={args.hidden:,} tokens={args.tokens:,} "
        f"{args.dtype} on {args.device}, {args.threads} thread(s), median of {args.repeats} x {args.rounds} round(s)"
    )
    runnable = []
    for impl in impls:
        if impl in CUDA_ONLY and not cuda:
            print(f"{impl:17s} skipped: Triton kernels are benchmarked on CUDA only (CPU runs them in the interpreter)")
        elif impl == "trl" and importlib.util.find_spec("trl") is None:
            print(f"{impl:17s} skipped: trl is not installed")
        else:
            runnable.append(impl)
    got: dict[str, dict] = {}
    for rnd in range(args.rounds):  # interleaved: every impl once per round, the order reversed every other round
        for impl in (runnable if rnd % 2 == 0 else runnable[::-1]):
            r = measure(impl, args) if cuda or args.plumbing else _child(impl, argv)
            if r is None:
                continue
            if impl in got:
                got[impl]["times"] += r["times"]
                got[impl]["cpu_times"] += r["cpu_times"]
            else:
                got[impl] = r  # peak memory: the first round's
            print(f"  round {rnd} {impl:17s} loss {r['loss']:.6f}  peak {r['peak_bytes'] / 2**20:9.1f} MiB  "
                  f"median {statistics.median(r['times']) * 1e3:9.1f} ms  ({r['memory']})", flush=True)
    rows = [got[i] for i in runnable if i in got]
    for r in rows:
        r["median"], r["cpu_median"] = statistics.median(r["times"]), statistics.median(r["cpu_times"])
    base = next((r for r in rows if r["impl"] == "naive"), None)
    floor = next((r for r in rows if r["impl"] == "floor"), None)
    if base is None and floor is None:
        return
    print("\nimpl               peak MiB   median ms  cpu median ms  peak/naive  time/naive  time/floor  cpu/floor")
    for r in rows:
        cols = [f"{_ratio(r['peak_bytes'], base['peak_bytes']):11.3f}" if base else f"{'':11s}",
                f"{r['median'] / base['median']:11.3f}" if base else f"{'':11s}",
                f"{r['median'] / floor['median']:11.3f}" if floor else f"{'':11s}",
                f"{r['cpu_median'] / floor['cpu_median']:10.3f}" if floor else ""]
        print(f"{r['impl']:17s} {r['peak_bytes'] / 2**20:9.1f} {r['median'] * 1e3:11.1f} {r['cpu_median'] * 1e3:14.1f} "
              + " ".join(cols))


def _ratio(a: float, b: float) -> float:
    """a / b, NaN where b is 0 (a peak too small for the resident-set counters: tiny --plumbing shapes)."""
    return a / b if b else float("nan")


if __name__ == "__main__":
    main()
