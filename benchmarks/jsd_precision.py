"""Precision of the saturated-JSD gradient in float32 against float64 (ops.divergence, "Precision of
the JSD gradient"): relative error ‖g32 − g64‖ / ‖g64‖ of ∂JSD(β)/∂z_S at V = 32,000, logits
N(0, std²) (teacher and student independent, so the divergence nears its maximum, the binary
entropy of β: column JSD/max),
τ_S = 1, τ_T = 0.5, for the reference path (autograd of ``ops.divergence.token_divergence`` in float32,
what ``distill_loss`` and the estimator oracle's reference-path gradient use), the chunked op's
torch row math and, where they run, the Triton kernels.

    python benchmarks/jsd_precision.py                  # ~20 s on CPU
    TRITON_INTERPRET=1 python benchmarks/jsd_precision.py --triton   # + the kernels, interpreted (~2 min)
    python benchmarks/jsd_precision.py --plumbing       # the path at V = 257, 2 rows (seconds)

The float64 peer is the definition itself, autograd through log M = log(β π_T + (1 − β) π_S) in
float64 on the same float32 logits (independent of the ops' gradient code).
"""

from __future__ import annotations

import argparse
import math

import torch

from distillab.ops.divergence import token_divergence, token_divergence_and_grad


def definition_jsd(z_s: torch.Tensor, z_t: torch.Tensor, beta: float, tau_s: float = 1.0,
                   tau_t: float = 0.5) -> torch.Tensor:
    """JSD(β) per row written as defined (GKD, Agarwal et al. 2024, Eq. 1), in the logits' dtype."""
    ls, lt = torch.log_softmax(z_s / tau_s, -1), torch.log_softmax(z_t / tau_t, -1)
    log_m = torch.logaddexp(lt + math.log(beta), ls + math.log1p(-beta))
    return beta * (lt.exp() * (lt - log_m)).sum(-1) + (1 - beta) * (ls.exp() * (ls - log_m)).sum(-1)


def reference_rows(z_s, z_t, *, kind, beta):
    """The reference path's value and gradient: autograd of ``token_divergence`` (float32)."""
    x = z_s.clone().requires_grad_()
    div = token_divergence(x, z_t, kind=kind, beta=beta)
    (g,) = torch.autograd.grad(div.sum(), x)
    return div.detach(), g, None


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vocab", type=int, default=32_000)
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--triton", action="store_true", help="also the Triton kernels (CUDA, or TRITON_INTERPRET=1)")
    p.add_argument("--plumbing", action="store_true", help="V = 257 and 2 rows (seconds; the numbers mean nothing)")
    args = p.parse_args(argv)
    if args.plumbing:
        args.vocab, args.rows = 257, 2
    torch.set_num_threads(1)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    rows = [("reference", reference_rows), ("torch rows", token_divergence_and_grad)]
    if args.triton:
        from distillab.ops.triton_kl import triton_token_divergence_and_grad

        rows.append(("triton", triton_token_divergence_and_grad))
    print(f"JSD(β) gradient, float32 vs float64, V={args.vocab:,}, {args.rows} rows, τ_S=1, τ_T=0.5")
    print(f"{'std':>5} {'beta':>5} {'JSD/max':>9}  " + "  ".join(f"{name:>11}" for name, _ in rows))
    for std in (2.0, 8.0, 16.0):
        for beta in (0.1, 0.5, 0.9):
            gen = torch.Generator().manual_seed(0)
            z_s = (torch.randn(args.rows, args.vocab, generator=gen, dtype=torch.float64) * std).float()
            z_t = (torch.randn(args.rows, args.vocab, generator=gen, dtype=torch.float64) * std).float()
            x = z_s.double().requires_grad_()
            ref = definition_jsd(x, z_t.double(), beta)
            (g64,) = torch.autograd.grad(ref.sum(), x)
            errs = []
            for _, fn in rows:
                _, g, _ = fn(z_s.to(dev), z_t.to(dev), kind="jsd", beta=beta)
                errs.append(((g.double().cpu() - g64).norm() / g64.norm()).item())
            top = -beta * math.log(beta) - (1 - beta) * math.log1p(-beta)  # JSD(β)'s maximum (disjoint supports)
            print(f"{std:5g} {beta:5g} {ref.mean().item() / top:9.4f}  "
                  + "  ".join(f"{e:11.2e}" for e in errs))


if __name__ == "__main__":
    main()
