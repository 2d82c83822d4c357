#!/usr/bin/env bash
# GPU check, run in one call where a GPU machine is lent (it has torch + transformers, no network):
#   bash benchmarks/gpu_check.sh
# Installs distillab without dependencies, then checks the KL ops on CUDA against the
# float64 reference (fp32 and bf16 logits) and times forward+backward of the reference op.
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
