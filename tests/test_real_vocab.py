"""The real vocabulary through every path (issue 43, item 3): SmolLM2-135M-Instruct's 49,152
tokens, its tied embeddings.

- the KL ops at V = 49,152 on a slice of rows: the reference (float32), the chunked op, the
  Triton kernel (interpreted on CPU), top-k with and without the tail bucket, the rollout-token
  estimators, the estimator oracle and the λ-spectrum's logits, each against the float64
  reference; `ops.chunked.pad_vocab` on a tied student head;
- a tiny random pair with SmolLM2's real tokenizer (`_checkpoints.smol_pair`, the student a
  ``derive`` of the teacher): the static-KV sampler against ``generate``, the shared teacher's
  hidden payload against in-worker scoring (the lm_head read from a tied checkpoint), the
  spectrum sampler against a float64 rescoring, the checkpoint checks;
- (slow) a distillation trial sampling from the vLLM CPU engine loaded from the prepared
  directory, synced every step, and ZeRO-3 with exact resume on two ranks.

Tolerances: float32 rounding of a sum of n terms is, with high probability, within
λ·√n·u of the terms' magnitude (u = 2⁻²⁴; Higham & Mary 2019, "A New Approach to Probabilistic
Rounding Error Analysis", SIAM J. Sci. Comput. 41(5)); the divergences sum over V = 49,152
terms after a log-sum-exp over as many and a matmul over H, so `tol` takes n = V and λ = 8.
"""

from __future__ import annotations

import math

import pytest
import torch

from distillab.ops.chunked import chunked_distill_loss, estimator_rows, pad_vocab
from distillab.ops.kl import distill_loss, estimator_loss, row_coefficients
from distillab.ops.oracle import chunked_oracle, logits_oracle
from distillab.rollout.spectrum import spectrum_logits

torch.set_num_threads(1)

V, H = 49152, 64
U32 = 2.0 ** -24


def tol(n: int = V) -> float:
    """The relative error bound of a float32 reduction of length ``n`` (module docstring)."""
    return 8 * math.sqrt(n) * U32


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def _slice(seed: int = 0):
    """Hidden states (2, 5, H) of student and teacher, their (V, H) lm_heads (logits of scale ~4,
    peaked as a trained head's; the teacher's a perturbation of the student's, so that the two
    disagree by a few nats as a distilled pair does, not by the ~20 of unrelated random heads), a
    completion mask with a masked row, rollout tokens (2, 5)."""
    g = torch.Generator().manual_seed(seed)
    h_s = torch.randn(2, 5, H, generator=g)
    h_t = h_s + 0.5 * torch.randn(2, 5, H, generator=g)
    w_s = torch.randn(V, H, generator=g) * (4 / math.sqrt(H))
    w_t = w_s + 0.5 * torch.randn(V, H, generator=g) * (4 / math.sqrt(H))
    mask = torch.tensor([[0, 1, 1, 1, 1], [0, 0, 1, 0, 1]], dtype=torch.bool)
    targets = torch.randint(0, V, (2, 5), generator=g)
    return h_s, w_s, h_t, w_t, mask, targets


CASES = [
    {"estimator": "full", "kind": "forward"}, {"estimator": "full", "kind": "reverse"},
    {"estimator": "full", "kind": "jsd", "beta": 0.3},
    {"estimator": "topk", "kind": "forward", "top_k": 8, "topk_source": "teacher", "topk_tail": True},
    {"estimator": "topk", "kind": "reverse", "top_k": 8, "topk_source": "student", "topk_tail": False},
    {"estimator": "topk", "kind": "forward", "top_k": 8, "topk_source": "union", "topk_tail": True},
    *[{"estimator": k, "kind": "reverse"} for k in ("k1", "k2", "k3")],
]


def _f64(h_s, w_s, h_t, w_t, mask, targets, est: dict):
    """The float64 reference of ``est``: loss and its gradients w.r.t. h_s and w_s."""
    hs, ws = h_s.double().requires_grad_(), w_s.double().requires_grad_()
    out = estimator_loss(hs @ ws.T, h_t.double() @ w_t.double().T, mask, targets=targets, tau_s=1.0, tau_t=0.7,
                         compute_dtype=torch.float64, **est)
    return (out.loss.detach(), *torch.autograd.grad(out.loss, (hs, ws)))


@pytest.mark.parametrize("est", CASES, ids=lambda e: "-".join(str(v) for v in e.values()))
def test_reference_and_chunked_kl_at_the_real_vocabulary_equal_float64(est) -> None:
    """Loss and gradients (hidden states and lm_head) of the float32 reference op and the chunked
    op (two-row chunks: several chunks) equal the float64 reference within `tol`."""
    h_s, w_s, h_t, w_t, mask, targets = _slice()
    want, gh, gw = _f64(h_s, w_s, h_t, w_t, mask, targets, est)
    hs, ws = h_s.clone().requires_grad_(), w_s.clone().requires_grad_()
    ref = estimator_loss(hs @ ws.T, h_t @ w_t.T, mask, targets=targets, tau_s=1.0, tau_t=0.7, **est).loss
    chunked = chunked_distill_loss(hs, ws, h_t, w_t, mask, targets=targets, tau_s=1.0, tau_t=0.7, chunk_size=2,
                                   backend="torch", **est)
    for name, loss in (("reference", ref), ("chunked", chunked)):
        g = torch.autograd.grad(loss, (hs, ws))
        assert abs(loss.item() - want.item()) <= tol() * abs(want.item()), name
        assert _rel(g[0], gh) <= tol() and _rel(g[1], gw) <= tol(), name


@pytest.mark.parametrize("kind", ["forward", "reverse", "jsd"])
def test_triton_kernel_at_the_real_vocabulary_equals_float64(kind) -> None:
    """`ops.triton_kl.triton_distill_loss` (interpreted on CPU; blocks of 16,384 of the 49,152
    columns, three per row) against the float64 reference: loss and logit gradient within `tol`."""
    pytest.importorskip("triton")
    from distillab.ops.triton_kl import triton_distill_loss

    h_s, w_s, h_t, w_t, mask, _ = _slice(1)
    zs, zt = h_s @ w_s.T, h_t @ w_t.T
    z64 = zs.double().requires_grad_()
    want = distill_loss(z64, zt.double(), mask, kind=kind, tau_s=0.9, tau_t=0.7, compute_dtype=torch.float64)
    (g64,) = torch.autograd.grad(want, z64)
    z32 = zs.clone().requires_grad_()
    got = triton_distill_loss(z32.to("cuda" if torch.cuda.is_available() else "cpu"), zt.to(z32.device), mask,
                              kind=kind, tau_s=0.9, tau_t=0.7, block_size=16384)
    (g32,) = torch.autograd.grad(got, z32)
    assert abs(got.item() - want.item()) <= tol() * abs(want.item())
    assert _rel(g32[mask], g64[mask]) <= tol() and not g32[~mask].any()


def test_oracle_at_the_real_vocabulary_equals_float64() -> None:
    """The oracle of a top-k-with-tail estimator (bias, gradient cosines, norm ratio) two ways in
    float32, the chunked path's (`ops.oracle.chunked_oracle`, three-row chunks) and the reference
    path's (`ops.oracle.logits_oracle` on the autograd gradient of the seq_mean loss), against the
    chunked oracle computed in float64: bias within `tol` of the exact divergence, the ratios within `tol`."""
    h_s, w_s, h_t, w_t, mask, _ = _slice(2)
    est = {"estimator": "topk", "top_k": 8, "topk_source": "teacher", "topk_tail": True}
    kw = dict(kind="forward", tau_s=1.0, tau_t=0.7)
    rows = estimator_rows(**est)
    coef = row_coefficients(mask.nonzero()[:, 0], 2, reduction="seq_mean", dtype=torch.float64)
    rs, rt = h_s[mask], h_t[mask]
    want = chunked_oracle(rs.double(), w_s.double(), None, rt.double(), w_t.double(), None, coef, est=rows,
                          compute_dtype=torch.float64, **kw)
    chunked = chunked_oracle(rs, w_s, None, rt, w_t, None, coef, est=rows, chunk_size=3, **kw)
    zs = (h_s @ w_s.T).requires_grad_()
    zt = h_t @ w_t.T
    loss = estimator_loss(zs, zt, mask, **est, **kw).loss
    (g,) = torch.autograd.grad(loss, zs)
    reference = logits_oracle(zs.detach()[mask], zt[mask], g[mask], coef, estimate=loss.item(), **kw)
    exact = abs(want["bias"] - loss.item())  # the exact divergence, nats
    assert abs(want["bias"]) > 1e-3 and want["grad_cos"] < 1 - 1e-3  # a biased estimator: the checks can fail
    for name, got in (("chunked", chunked), ("reference", reference)):
        assert got.keys() == want.keys(), name
        assert abs(got["bias"] - want["bias"]) <= tol() * exact, name
        for k in ("grad_cos", "grad_cos_forward", "grad_cos_reverse", "grad_norm_ratio"):
            assert abs(got[k] - want[k]) <= tol(), (name, k)


@pytest.mark.parametrize("lam", [-2.0, -0.5, 0.5, 2.0])
def test_spectrum_logits_at_the_real_vocabulary_equal_float64(lam) -> None:
    """log π_λ over 49,152 tokens from float32 log-probabilities equals the float64 computation
    within `tol` (absolute, nats, on log-probabilities above −30)."""
    h_s, w_s, h_t, w_t, _, _ = _slice(3)
    zs, zt = (h_s @ w_s.T)[0], (h_t @ w_t.T)[0]
    ls, lt = torch.log_softmax(zs, -1), torch.log_softmax(zt, -1)
    got = torch.log_softmax(spectrum_logits(ls, lt, lam), -1)
    want = torch.log_softmax(spectrum_logits(torch.log_softmax(zs.double(), -1), torch.log_softmax(zt.double(), -1),
                                             lam), -1)
    keep = want > -30
    assert keep.sum() > 1000 and ((got.double() - want)[keep].abs() / want[keep].abs().clamp_min(1)).max() <= tol()


def test_pad_vocab_on_a_tied_student_head() -> None:
    """A tied student (its lm_head is its input embedding) padded to a teacher head of 49,152 + 128
    rows whose extra rows are −inf (`pad_vocab`): the chunked loss equals the unpadded pair's, and the
    gradient reaching the tied embedding matrix through the padding equals the unpadded one's
    (float32 both: only the −inf columns differ)."""
    h_s, w_s, h_t, w_t, mask, _ = _slice(4)
    emb = torch.nn.Embedding(V, H)
    with torch.no_grad():
        emb.weight.copy_(w_s)
    head = torch.nn.Linear(H, V, bias=False)
    head.weight = emb.weight  # tied, as tie_word_embeddings does
    w_tp, b_tp = pad_vocab(w_t, V + 128)
    w_sp, b_sp = pad_vocab(head.weight, V + 128)
    padded = chunked_distill_loss(h_s, w_sp, h_t, w_tp, mask, student_bias=b_sp, teacher_bias=b_tp, backend="torch")
    (g_pad,) = torch.autograd.grad(padded, emb.weight)
    plain = chunked_distill_loss(h_s, head.weight, h_t, w_t, mask, backend="torch")
    (g_plain,) = torch.autograd.grad(plain, emb.weight)
    assert abs(padded.item() - plain.item()) <= tol() * abs(plain.item())
    assert _rel(g_pad, g_plain) <= tol() and g_pad.shape == (V, H)
