"""Differential test against TRL's GKD loss (a dev-only dependency): the same logits give
the same generalised JSD(β) as ops.kl (reference) and ops.triton_kl.

TRL's convention (trl 1.x, ``GKDTrainer.generalized_jsd_loss``): β = 0 is
KL(teacher ‖ student) (our forward), β = 1 is KL(student ‖ teacher) (our reverse), and
M = β π_T + (1 − β) π_S in between: the same as ours. Its ``reduction="batchmean"`` with
``labels`` divides by the number of unmasked tokens: our ``token_mean``. It has a single
temperature, so the comparison is at τ_S = τ_T = 1.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import textwrap
from pathlib import Path

import _tolerance as tol
import pytest
import torch

from distillab.ops.kl import distill_loss

if importlib.util.find_spec("trl") is None:
    pytest.skip("trl is not installed (dev extra)", allow_module_level=True)


def _load_trl_jsd():
    """TRL's ``GKDTrainer.generalized_jsd_loss``, the installed file's own source.

    The static method is compiled from the installed trl source (located without
    importing trl), with ``torch`` and ``torch.nn.functional as F`` as its globals,
    which is all it uses: importing the trainer module pulls in transformers'
    Trainer stack (20+ s on a loaded 2-core machine). Falls back to the import when
    the source layout is not recognised.
    """
    spec = importlib.util.find_spec("trl")
    root = Path(next(iter(spec.submodule_search_locations)))
    for rel in ("experimental/gkd/gkd_trainer.py", "trainer/gkd_trainer.py"):  # trl >= 1.0, older
        path = root / rel
        if not path.exists():
            continue
        text = path.read_text()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.name == "GKDTrainer":
                for fn in node.body:
                    if isinstance(fn, ast.FunctionDef) and fn.name == "generalized_jsd_loss":
                        src = textwrap.dedent(ast.get_source_segment(text, fn, padded=True))
                        namespace = {"torch": torch, "F": torch.nn.functional}
                        exec(compile(src, str(path), "exec"), namespace)
                        return namespace["generalized_jsd_loss"]
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    try:
        from trl.experimental.gkd.gkd_trainer import GKDTrainer
    except ImportError:
        from trl.trainer.gkd_trainer import GKDTrainer
    return GKDTrainer.generalized_jsd_loss


@pytest.fixture(scope="module")
def trl_jsd():
    fn = _load_trl_jsd()
    assert fn.__code__.co_filename.endswith("gkd_trainer.py")
    return fn


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_reference_equals_trl_generalized_jsd(trl_jsd, beta):
    gen = torch.Generator().manual_seed(4242 + int(10 * beta))
    B, T, V = 3, 6, 57
    s = torch.randn(B, T, V, generator=gen) * 2
    t = torch.randn(B, T, V, generator=gen) * 2
    mask = torch.rand(B, T, generator=gen) < 0.7
    mask[0, 0] = True
    labels = torch.where(mask, torch.randint(0, V, (B, T), generator=gen), torch.full((B, T), -100))

    x_trl = s.clone().requires_grad_()
    want = trl_jsd(x_trl, t, labels=labels, beta=beta, temperature=1.0, reduction="batchmean")
    (want_g,) = torch.autograd.grad(want, x_trl)
    want_sum = trl_jsd(s, t, labels=labels, beta=beta, temperature=1.0, reduction="sum")

    x = s.clone().requires_grad_()
    got = distill_loss(x, t, mask, kind="jsd", beta=beta, tau_s=1.0, tau_t=1.0, reduction="token_mean")
    (got_g,) = torch.autograd.grad(got, x)
    got_sum = distill_loss(s, t, mask, kind="jsd", beta=beta, tau_s=1.0, tau_t=1.0, reduction="sum")

    # two float32 computations of one JSD(β) (ours and TRL's): twice the bound of one (tests/_tolerance.py)
    rows = mask.nonzero(as_tuple=True)
    n, kw = len(rows[0]), dict(kind="jsd", beta=beta, tau_s=1.0, tau_t=1.0, dtype=torch.float32, ref=False)
    value, grad = tol.loss_bounds(s[rows], t[rows], torch.full((n,), 1 / n), **kw)
    value_sum, _ = tol.loss_bounds(s[rows], t[rows], torch.ones(n), **kw)
    assert abs(got.item() - want.item()) <= 2 * value
    assert abs(got_sum.item() - want_sum.item()) <= 2 * value_sum
    assert ((got_g[rows] - want_g[rows]).abs() <= 2 * grad).all() and (got_g[~mask] == 0).all()
    if beta in (0.0, 1.0):  # the endpoints are exactly our forward / reverse KL
        kind = "forward" if beta == 0.0 else "reverse"
        kl = distill_loss(s, t, mask, kind=kind, tau_s=1.0, tau_t=1.0, reduction="token_mean")
        assert abs(kl.item() - want.item()) <= 2 * value


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_triton_equals_trl_generalized_jsd(trl_jsd, beta):
    pytest.importorskip("triton")
    from distillab.ops.triton_kl import triton_distill_loss

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(99 + int(10 * beta))
    s = torch.randn(2, 4, 33, generator=gen) * 2
    t = torch.randn(2, 4, 33, generator=gen) * 2
    mask = torch.tensor([[True, True, False, True], [False, True, True, True]])
    labels = torch.where(mask, 0, -100)
    want = trl_jsd(s, t, labels=labels, beta=beta, temperature=1.0)
    got = triton_distill_loss(s.to(dev), t.to(dev), mask.to(dev), kind="jsd", beta=beta, tau_s=1.0, tau_t=1.0,
                              reduction="token_mean", block_size=16)
    rows = mask.nonzero(as_tuple=True)
    n = len(rows[0])
    value, _ = tol.loss_bounds(s[rows], t[rows], torch.full((n,), 1 / n), kind="jsd", beta=beta, tau_s=1.0, tau_t=1.0,
                               dtype=torch.float32, ref=False)
    assert abs(got.item() - want.item()) <= 2 * value  # two float32 computations
