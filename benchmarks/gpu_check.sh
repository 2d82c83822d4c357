#!/usr/bin/env bash
# GPU check, run in one call where a GPU machine is lent (it has torch + transformers, no network):
#   bash benchmarks/gpu_check.sh
# Installs distillab without dependencies, then checks the KL ops on CUDA against the
# float64 reference (fp32 and bf16 logits) and times forward+backward of the reference op;
# then the compiled Triton kernels and the chunked fused-linear op against the float64 reference,
# and benchmarks/kl_ops.py at V=128,256, H=4,096, 8,192 tokens in bf16.
set -uo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-deps --no-build-isolation --no-index . 2>&1 | tail -2
export HF_HUB_OFFLINE=1
python3 - <<'PY'
import time, torch
from distillab.ops.kl import distill_loss
assert torch.cuda.is_available(), "no CUDA device"
print("device:", torch.cuda.get_device_name(0), "torch", torch.__version__)
for V, T, dtype in [(32000, 4096, torch.float32), (128256, 2048, torch.bfloat16)]:
    g = torch.Generator(device="cuda").manual_seed(0)
    s = (torch.randn(4, T // 4, V, device="cuda", generator=g) * 3).to(dtype).requires_grad_()
    t = (torch.randn(4, T // 4, V, device="cuda", generator=g) * 3).to(dtype)
    mask = torch.rand(4, T // 4, device="cuda", generator=g) > 0.2
    for kind in ("forward", "reverse"):
        ref_s = s.detach().double().requires_grad_()
        ref = distill_loss(ref_s, t.double(), mask, kind=kind, compute_dtype=torch.float64)
        ref.backward()
        s.grad = None
        torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats(); t0 = time.perf_counter()
        out = distill_loss(s, t, mask, kind=kind)
        out.backward()
        torch.cuda.synchronize(); dt = time.perf_counter() - t0
        rel = abs(out.item() - ref.item()) / abs(ref.item())
        grel = ((s.grad.double() - ref_s.grad).norm() / ref_s.grad.norm()).item()
        print(f"V={V} tokens={T} {str(dtype):15s} {kind:8s} loss rel err {rel:.2e} grad rel err {grel:.2e} "
              f"time {dt*1e3:.1f} ms peak {torch.cuda.max_memory_allocated()/2**30:.2f} GiB")
PY

# --- ops/: compiled Triton kernels and the chunked fused-linear op against the float64 reference
python3 - <<'PY'
import torch
from distillab.ops.kl import distill_loss
from distillab.ops.chunked import chunked_distill_loss
from distillab.ops.triton_kl import triton_distill_loss, triton_token_divergence_and_grad, check_triton_usable
check_triton_usable("cuda")

def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()

worst = {}
for V, N, H in [(128256, 96, 256), (32003, 200, 128), (41, 33, 16)]:
    g = torch.Generator(device="cuda").manual_seed(V)
    hs = torch.randn(N, H, device="cuda", generator=g)
    ht = torch.randn(N, H + 32, device="cuda", generator=g)
    ws = torch.randn(V, H, device="cuda", generator=g) * (2 / H**0.5)
    wt = torch.randn(V, H + 32, device="cuda", generator=g) * (2 / (H + 32)**0.5)
    seq = torch.sort(torch.randint(0, 4, (N,), device="cuda", generator=g)).values
    for dt in (torch.float32, torch.bfloat16):
        for kind, beta in (("forward", 0.5), ("reverse", 0.5), ("jsd", 0.3)):
            a, w = hs.to(dt).double().requires_grad_(), ws.to(dt).double().requires_grad_()
            zs, zt = a @ w.T, ht.to(dt).double() @ wt.to(dt).double().T
            # the (N, V) rows as (B, T) with B = 4 sequences of unequal length, for seq_mean
            mask = torch.zeros(4, N, dtype=torch.bool, device="cuda")
            mask[seq, torch.arange(N, device="cuda")] = True
            big = lambda z: torch.zeros(4, N, V, dtype=z.dtype, device="cuda").index_put((seq, torch.arange(N, device="cuda")), z)
            ref = distill_loss(big(zs), big(zt), mask, kind=kind, beta=beta, compute_dtype=torch.float64)
            ref_g = torch.autograd.grad(ref, (a, w))
            tol = 1e-5 if dt == torch.float32 else 1e-2
            for backend in ("torch", "triton"):
                a2, w2 = hs.to(dt).requires_grad_(), ws.to(dt).requires_grad_()
                out = chunked_distill_loss(a2, w2, ht.to(dt), wt.to(dt), seq_index=seq, num_seqs=4, kind=kind,
                                           beta=beta, backend=backend, chunk_size=64)
                grads = torch.autograd.grad(out, (a2, w2))
                errs = [abs(out.item() - ref.item()) / abs(ref.item())] + [rel(x, r) for x, r in zip(grads, ref_g)]
                key = f"chunked/{backend} {dt}"
                worst[key] = max(worst.get(key, 0.0), *errs)
                ok = "ok" if max(errs) <= tol else "FAIL"
                print(f"V={V:6d} N={N:3d} {str(dt):14s} {kind:8s} chunked/{backend:6s} loss {errs[0]:.1e} "
                      f"grad_h {errs[1]:.1e} grad_W {errs[2]:.1e} {ok}")
            # logits-level Triton op on the (rounded) logits
            zl = big(zs.to(dt)).detach().requires_grad_()
            out = triton_distill_loss(zl, big(zt.to(dt)), mask, kind=kind, beta=beta)
            (gl,) = torch.autograd.grad(out, zl)
            zr = zl.detach().double().requires_grad_()
            r2 = distill_loss(zr, big(zt.to(dt)).double(), mask, kind=kind, beta=beta, compute_dtype=torch.float64)
            (g2,) = torch.autograd.grad(r2, zr)
            e = max(abs(out.item() - r2.item()) / abs(r2.item()), rel(gl, g2))
            print(f"V={V:6d} N={N:3d} {str(dt):14s} {kind:8s} triton_logits  max rel err {e:.1e} {'ok' if e <= tol else 'FAIL'}")
print("worst:", {k: f"{v:.1e}" for k, v in worst.items()})
PY
if python3 -c "import pytest" 2>/dev/null; then
  python3 -m pytest -q -p no:cacheprovider tests/ops/test_triton_kl.py tests/ops/test_chunked.py 2>&1 | tail -3
fi

# --- ops/ benchmark at Llama-3 scale: forward+backward from hidden states, bf16
python3 benchmarks/kl_ops.py --device cuda --vocab 128256 --hidden 4096 --tokens 8192 --dtype bfloat16 \
  --impls naive,reference,chunked,triton,triton_logits --repeats 5 --threads 4
python3 benchmarks/kl_ops.py --device cuda --vocab 128256 --hidden 4096 --tokens 8192 --dtype bfloat16 \
  --impls naive,chunked,triton --repeats 5 --threads 4 --kind reverse

# --- the vLLM rollout engine on the GPU (only where vllm is installed): samples and
# logprobs against the trainer, weight sync after an optimizer step, and throughput of
# vLLM vs transformers on a 100M-parameter Llama built from config
if python3 -c "import vllm" 2>/dev/null; then
  python3 -m pytest -q -p no:cacheprovider -m slow tests/test_vllm.py -k "engine_samples or rlvr_samples" 2>&1 | tail -3
  python3 benchmarks/rollout.py --no-micro --threads 4
else
  echo "vllm is not installed on this machine: rollout-engine checks skipped"
fi

# --- QLoRA on CUDA (only where peft and bitsandbytes are installed): a micro Llama's
# adapters on an nf4 copy; the merged full-precision model against the 4-bit one
if python3 -c "import peft, bitsandbytes" 2>/dev/null; then
python3 - <<'PY'
import torch
from transformers import LlamaForCausalLM
from distillab.config import LoRAConfig
from distillab.models import build_char_tokenizer, micro_llama_config
from distillab.rlvr import merge_into, quantized_lora
tok = build_char_tokenizer()
torch.manual_seed(0)
for dtype in (torch.float32, torch.bfloat16):
    model = LlamaForCausalLM(micro_llama_config(len(tok), 256, 2, 4, 512, 256, tok)).to("cuda", dtype).eval()
    peft4 = quantized_lora(model, LoRAConfig(r=8, alpha=16.0, load_in_4bit=True))
    with torch.no_grad():
        for n, p in peft4.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.02)
        ids = torch.randint(4, len(tok), (2, 64), device="cuda")
        want = peft4(input_ids=ids).logits.float()
        got = merge_into(model, peft4)(input_ids=ids).logits.float()
    print(f"qlora {dtype}: merged vs 4-bit logits max abs diff {(got - want).abs().max().item():.2e} "
          f"(logit scale {want.abs().max().item():.2f})")
PY
else
  echo "peft/bitsandbytes not installed on this machine: QLoRA check skipped"
fi
