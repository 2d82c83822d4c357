"""How a trial computes in bf16 on this machine: whether the CPU multiplies bf16 matrices natively,
the float32 mode for CPUs that do not (``DISTILLAB_BF16_MATMULS``), and the run record of it.
"""

from __future__ import annotations

import os
import platform
from contextlib import nullcontext
from pathlib import Path
from typing import ContextManager

import torch
import torch.nn.functional as F

from distillab.registry import ENV_SWITCHES

#: The precision names of the config (``trial.precision``, ``trial.master_weights``,
#: ``evaluation.sparsity_dtype``) as torch dtypes.
DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16}


def cpu_has_native_bf16() -> bool:
    """Whether this machine's CPU multiplies bf16 matrices natively: oneDNN's bf16 kernels,
    which torch uses for CPU bf16 matrix products where the CPU has AVX-512 (BF16 or BW) or
    AMX (`torch.ops.mkldnn._is_mkldnn_bf16_supported`). Without them torch falls back to a
    generic kernel, 8.2-9.8x slower than float32 for the micro student's forward and
    backward on a 2-core AVX2 EPYC (``python benchmarks/bf16_matmul.py``, three runs, 2026-12-03)."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


#: The matrix products `Bf16MatmulsInFloat32` computes on float32 copies of bf16 operands.
BF16_MATMULS = frozenset({F.linear, torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.mm,
                          torch.Tensor.mm, torch.bmm, torch.Tensor.bmm, torch.addmm, torch.Tensor.addmm,
                          torch.baddbmm, torch.Tensor.baddbmm, F.scaled_dot_product_attention})


class Bf16MatmulsInFloat32(torch.overrides.TorchFunctionMode):
    """A torch function mode: every matrix product of `BF16_MATMULS` whose floating-point
    operands are all bf16 CPU tensors runs on float32 copies of them, and its result is
    rounded to bf16 (round to nearest even). Other calls run unchanged.

    This is the arithmetic of a bf16 GEMM as oneDNN and torch's generic CPU kernel do it
    (bf16 operands; their products are exact in float32, 8 + 8 significand bits; float32
    accumulation; the output rounded to bf16), so results equal the native kernel's up to
    the order of the float32 summation (``tests/test_bf16_matmuls.py``: equal elements or one
    bf16 ulp apart). Attention is softmax(QKᵀ/√d)V in float32 rounded once; torch's native
    bf16 attention also rounds the probabilities to bf16 before the product with V, so there
    the mode is the closer of the two to float64. Backward: autograd differentiates the
    float32 product and the casts, so the gradients are float32 products rounded to the
    operands' bf16, as natively.
    Why: on CPUs without native bf16 products (`cpu_has_native_bf16`) the float32 kernels
    are ~10x faster (micro student forward + backward: ``python benchmarks/bf16_matmul.py``).
    Calls with ``out=`` or mixed dtypes run natively (and raise where torch raises).
    Shapes and dtypes: as the wrapped function's; the result's dtype is bf16."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in BF16_MATMULS and "out" not in kwargs:
            floats = [t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor) and t.is_floating_point()]
            if floats and all(t.dtype == torch.bfloat16 and t.device.type == "cpu" for t in floats):
                up = [a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
                kw = {k: v.float() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                      for k, v in kwargs.items()}
                return func(*up, **kw).to(torch.bfloat16)
        return func(*args, **kwargs)


#: ``DISTILLAB_BF16_MATMULS``: where a bf16 trial's CPU matrix products run (`bf16_matmuls`).
BF16_MATMULS_ENV = "DISTILLAB_BF16_MATMULS"
BF16_MATMULS_CHOICES = ENV_SWITCHES[BF16_MATMULS_ENV]  # checked before anything starts (`checks.env_errors`)


def bf16_matmuls_choice() -> str:
    """``$DISTILLAB_BF16_MATMULS`` (default ``auto``): ``auto`` (float32 products where the CPU
    lacks native bf16 ones), ``native`` (torch's bf16 kernels always: the peer the mode is
    checked against), ``float32`` (`Bf16MatmulsInFloat32` on any CPU, e.g. to compare a
    native-bf16 machine's run with an AVX2 machine's).

    Raises:
        ValueError: another value (names the variable and the allowed values)."""
    choice = os.environ.get(BF16_MATMULS_ENV, "auto")
    if choice not in BF16_MATMULS_CHOICES:
        raise ValueError(f"{BF16_MATMULS_ENV}={choice!r}; allowed values: {', '.join(BF16_MATMULS_CHOICES)}")
    return choice


def bf16_in_float32(precision: str, device: torch.device | str = "cpu") -> str | None:
    """Why a trial of ``precision`` on ``device`` computes its bf16 products in float32
    (`Bf16MatmulsInFloat32`), or None where it does not: ``"auto"`` (bf16 on a CPU without
    native bf16 products, `cpu_has_native_bf16`) or ``"float32"`` (bf16 on any CPU, asked by
    ``DISTILLAB_BF16_MATMULS=float32``). None for float32, GPUs, CPUs with AVX-512/AMX under
    ``auto``, and ``native``.

    Raises:
        ValueError: a bad ``DISTILLAB_BF16_MATMULS`` (`bf16_matmuls_choice`)."""
    choice = bf16_matmuls_choice()
    if precision != "bf16" or torch.device(device).type != "cpu" or choice == "native":
        return None
    return choice if choice == "float32" or not cpu_has_native_bf16() else None


def cpu_model() -> str:
    """This machine's CPU model: the first ``model name`` of /proc/cpuinfo (Linux), else
    `platform.processor`, else "unknown"."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def arithmetic() -> dict[str, str]:
    """How this machine computes a bf16 trial's matrix products on the CPU, for a sweep's run
    record (`tables.record_run`; findings.md sets runs side by side by it, issue 33): ``{"cpu":
    `cpu_model`, "bf16_products": "native" | "float32 (DISTILLAB_BF16_MATMULS=float32)" |
    "float32 (no native bf16)"}`` (`bf16_in_float32` for a bf16 CPU trial).

    Raises:
        ValueError: a bad ``DISTILLAB_BF16_MATMULS`` (`bf16_matmuls_choice`)."""
    why = bf16_in_float32("bf16", "cpu")
    mode = {None: "native", "float32": f"float32 ({BF16_MATMULS_ENV}=float32)", "auto": "float32 (no native bf16)"}
    return {"cpu": cpu_model(), "bf16_products": mode[why]}


def bf16_matmuls(precision: str, device: torch.device | str = "cpu") -> ContextManager:
    """The context a trial's compute runs in: `Bf16MatmulsInFloat32` where `bf16_in_float32`
    gives a reason, a no-op context otherwise.

    Raises:
        ValueError: a bad ``DISTILLAB_BF16_MATMULS`` (`bf16_matmuls_choice`)."""
    return Bf16MatmulsInFloat32() if bf16_in_float32(precision, device) else nullcontext()
