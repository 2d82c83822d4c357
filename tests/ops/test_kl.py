"""Tests of distillab.ops.kl: values against hand computation, float64 references,
gradients, masking/padding behaviour, numerics and the sampled estimators."""

from __future__ import annotations

import math

import _tolerance as tol
import pytest
import torch

from distillab.ops.kl import (
    LOGPROB_FLOOR,
    distill_loss,
    engine_mismatch_weights,
    entropy_and_cross_entropy,
    reduce_loss,
    sampled_token_loss,
    token_divergence,
)

KINDS = ("forward", "reverse", "jsd")
F32, F64 = torch.float32, torch.float64

# ----------------------------------------------------------------- pure-Python helpers

S_HAND = [[1.0, 2.0, 0.5, -1.0], [0.0, 0.0, 0.0, 0.0], [3.0, -2.0, 1.0, 0.0]]
T_HAND = [[0.5, 1.5, -0.5, 0.0], [1.0, -1.0, 2.0, 0.0], [2.0, 0.0, 0.0, -3.0]]


def py_softmax(z, tau):
    m = max(z)
    e = [math.exp((x - m) / tau) for x in z]
    s = sum(e)
    return [x / s for x in e]


def py_kl(p, q):
    return sum(pi * (math.log(pi) - math.log(qi)) for pi, qi in zip(p, q) if pi > 0)


def py_jsd(p_t, p_s, beta):
    m = [beta * a + (1 - beta) * b for a, b in zip(p_t, p_s)]
    return beta * py_kl(p_t, m) + (1 - beta) * py_kl(p_s, m)


def rand_logits(gen, shape, dtype=torch.float64, scale=2.0):
    return torch.randn(*shape, generator=gen, dtype=dtype) * scale


# -------------------------------------------------------------------- hand-computed values


def test_hand_computed_forward_reverse_jsd():
    s = torch.tensor([S_HAND])
    t = torch.tensor([T_HAND])
    mask = torch.ones(1, 3, dtype=torch.bool)
    p_s = [py_softmax(z, 1.0) for z in S_HAND]
    p_t = [py_softmax(z, 0.5) for z in T_HAND]
    expected = {
        "forward": [py_kl(pt, ps) for pt, ps in zip(p_t, p_s)],
        "reverse": [py_kl(ps, pt) for pt, ps in zip(p_t, p_s)],
        "jsd": [py_jsd(pt, ps, 0.3) for pt, ps in zip(p_t, p_s)],
    }
    for kind, exp in expected.items():
        got = token_divergence(s, t, kind=kind, tau_s=1.0, tau_t=0.5, beta=0.3)
        assert got.shape == (1, 3) and got.dtype == torch.float32
        # float32 rows against Python's float64: the row bound at each position, and its seq_mean
        _, S, _ = tol.divergence_scale(s[0], t[0], kind=kind, tau_s=1.0, tau_t=0.5, beta=0.3)
        rho = tol.both(tol.row, 4, F32, tol.logit_range((s, 1.0), (t, 0.5)))
        assert all(abs(g - e) <= rho * b for g, e, b in zip(got[0].tolist(), exp, S.tolist()))
        loss = distill_loss(s, t, mask, kind=kind, tau_s=1.0, tau_t=0.5, beta=0.3)
        value, _ = tol.loss_bounds(s[0], t[0], torch.full((3,), 1 / 3), kind=kind, tau_s=1.0, tau_t=0.5, beta=0.3,
                                   dtype=F32)
        assert abs(loss.item() - sum(exp) / 3) <= value
    # sanity of the hand values themselves: they are genuinely different and positive
    assert all(v > 0.01 for v in expected["forward"] + expected["reverse"])
    assert expected["forward"] != pytest.approx(expected["reverse"], abs=1e-3)


def test_hand_computed_gradient_formulas():
    """Closed-form gradients of the module docstring, against autograd (float64)."""
    gen = torch.Generator().manual_seed(11)
    zs = rand_logits(gen, (7,)).requires_grad_()
    zt = rand_logits(gen, (7,))
    tau_s, tau_t, beta = 1.3, 0.5, 0.4
    ps = torch.softmax(zs.detach() / tau_s, -1)
    pt = torch.softmax(zt / tau_t, -1)
    r = ps.log() - pt.log()
    m = beta * pt + (1 - beta) * ps
    g = ps.log() - m.log()
    closed = {
        "forward": (ps - pt) / tau_s,
        "reverse": ps * (r - (ps * r).sum()) / tau_s,
        "jsd": (1 - beta) * ps * (g - (ps * g).sum()) / tau_s,
    }
    for kind, want in closed.items():
        (grad,) = torch.autograd.grad(
            token_divergence(zs, zt, kind=kind, tau_s=tau_s, tau_t=tau_t, beta=beta, compute_dtype=torch.float64),
            zs,
        )
        # two float64 computations of one row: twice the row bound, entry by entry
        _, _, m = tol.divergence_scale(zs, zt, kind=kind, tau_s=tau_s, tau_t=tau_t, beta=beta)
        rho = 2 * tol.row(7, F64, tol.logit_range((zs, tau_s), (zt, tau_t)))
        assert ((grad - want).abs() <= rho * m).all()


def test_entropy_and_cross_entropy_hand_computed():
    s = torch.tensor([S_HAND])
    t = torch.tensor([T_HAND])
    mask = torch.tensor([[True, False, True]])
    ent, ce = entropy_and_cross_entropy(s, t, mask, 1.0, 0.5)
    rows = [0, 2]
    p_s = [py_softmax(S_HAND[i], 1.0) for i in rows]
    p_t = [py_softmax(T_HAND[i], 0.5) for i in rows]
    h = [-sum(p * math.log(p) for p in pt) for pt in p_t]
    x = [-sum(a * math.log(b) for a, b in zip(pt, ps)) for pt, ps in zip(p_t, p_s)]
    assert ent.dim() == 0 and not ent.requires_grad
    # float32 against float64: the row bound on the magnitudes 2 + Σ π_T |log π|, averaged over 2 rows
    lt = [[math.log(p) for p in pt] for pt in p_t]
    lp = [[math.log(p) for p in ps] for ps in p_s]
    rho = tol.both(tol.row, 4, F32, tol.logit_range((s[0, rows], 1.0), (t[0, rows], 0.5))) + tol.gamma(4, F32)
    for got, want, logs in ((ent, sum(h) / 2, lt), (ce, sum(x) / 2, lp)):
        scale = sum(2 + sum(p * abs(v) for p, v in zip(pt, lv)) for pt, lv in zip(p_t, logs)) / 2
        assert abs(got.item() - want) <= rho * scale
    none = torch.zeros(1, 3, dtype=torch.bool)
    assert [v.item() for v in entropy_and_cross_entropy(s, t, none)] == [0.0, 0.0]


# ------------------------------------------------------------------ dtype / float64 reference


@pytest.mark.parametrize("kind", KINDS)
def test_float32_matches_float64_reference(kind):
    gen = torch.Generator().manual_seed(1234 + KINDS.index(kind))
    s64 = rand_logits(gen, (3, 5, 33))
    t64 = rand_logits(gen, (3, 5, 33))
    mask = torch.rand(3, 5, generator=gen) < 0.7
    mask[:, 0] = True
    out = {}
    for dt in (torch.float32, torch.float64):
        s = s64.clone().requires_grad_()
        loss = distill_loss(s, t64, mask, kind=kind, beta=0.3, compute_dtype=dt)
        (grad,) = torch.autograd.grad(loss, s)
        assert loss.dtype == dt
        out[dt] = (loss.double(), grad.double())
    (l32, g32), (l64, g64) = out[torch.float32], out[torch.float64]
    coef, rows = _seq_mean_rows(mask)
    value, grad = tol.loss_bounds(s64[mask], t64[mask], coef, kind=kind, beta=0.3, tau_s=1.0, tau_t=0.5, dtype=F32)
    assert abs(l32 - l64) <= value
    assert rel(g32, g64) <= tol.norm_ratio(grad, g64[rows])


def test_low_precision_inputs_compute_in_float32():
    gen = torch.Generator().manual_seed(5)
    s = rand_logits(gen, (2, 4, 16), dtype=torch.float32).bfloat16()
    t = rand_logits(gen, (2, 4, 16), dtype=torch.float32).half()
    out = token_divergence(s, t, kind="forward")
    assert out.dtype == torch.float32 and out.shape == (2, 4)
    ref = token_divergence(s.double(), t.double(), kind="forward", compute_dtype=torch.float64)
    # bf16/fp16 values are exact in float32: only the float32 compute errs, by the row bound
    _, S, _ = tol.divergence_scale(s, t, kind="forward", tau_s=1.0, tau_t=0.5)
    assert ((out.double() - ref).abs() <= tol.both(tol.row, 16, F32, tol.logit_range((s, 1.0), (t, 0.5))) * S).all()


@pytest.mark.parametrize("kind,beta", [("forward", 0.5), ("reverse", 0.5), ("jsd", 0.5), ("jsd", 0.2)])
def test_gradcheck_float64(kind, beta):
    gen = torch.Generator().manual_seed(77)
    s = rand_logits(gen, (2, 3, 4), scale=1.0).requires_grad_()
    t = rand_logits(gen, (2, 3, 4), scale=1.0)
    mask = torch.tensor([[True, True, False], [False, True, True]])
    w = torch.tensor([0.5, 1.5], dtype=torch.float64)
    # full Jacobian check for the protocol's reduction, fast mode for the other (keeps it quick)
    for reduction, fast in (("seq_mean", False), ("token_mean", True)):
        assert torch.autograd.gradcheck(
            lambda x: distill_loss(
                x, t, mask, kind=kind, beta=beta, tau_s=0.8, tau_t=0.5,
                reduction=reduction, weights=w, compute_dtype=torch.float64,
            ),
            (s,),
            fast_mode=fast,
        )


def test_teacher_is_detached():
    gen = torch.Generator().manual_seed(3)
    s = rand_logits(gen, (1, 2, 4)).requires_grad_()
    t = rand_logits(gen, (1, 2, 4)).requires_grad_()
    distill_loss(s, t, torch.ones(1, 2, dtype=torch.bool)).backward()
    assert s.grad is not None and t.grad is None


# --------------------------------------------------- saturated JSD: reference gradient, oracle

SATURATED = [(std, beta, V) for std in (8.0, 16.0) for beta in (0.1, 0.5, 0.9) for V in (41, 1271)]
TAUS = dict(tau_s=1.3, tau_t=0.7)


def definition_jsd(z_s, z_t, beta, tau_s, tau_t):
    """JSD(β) per row as defined (GKD, Agarwal et al. 2024, Eq. 1), in the logits' dtype: autograd
    of it in float64 is the ground truth (independent of ops.kl's gradient code)."""
    ls, lt = torch.log_softmax(z_s / tau_s, -1), torch.log_softmax(z_t / tau_t, -1)
    log_m = torch.logaddexp(lt + math.log(beta), ls + math.log1p(-beta))
    return beta * (lt.exp() * (lt - log_m)).sum(-1) + (1 - beta) * (ls.exp() * (ls - log_m)).sum(-1)


def saturated_batch(std, V, seed=0):
    """(3, 4, V) float32 student and teacher logits N(0, std²), independent (so JSD(β) nears its
    maximum), with a partly masked and a fully masked sequence holding garbage at masked rows."""
    gen = torch.Generator().manual_seed(seed)
    s = (torch.randn(3, 4, V, generator=gen, dtype=torch.float64) * std).float()
    t = (torch.randn(3, 4, V, generator=gen, dtype=torch.float64) * std).float()
    mask = torch.tensor([[True, True, False, True], [False, False, False, False], [True, True, True, True]])
    s[~mask], t[~mask] = _garbage((int((~mask).sum()), V)), _garbage((int((~mask).sum()), V))
    return s, t, mask


def definition_seq_mean(s, t, mask, beta):
    """The seq_mean reduction of `definition_jsd` over the masked rows, by hand (float64)."""
    per_seq = [definition_jsd(s[b][mask[b]], t[b][mask[b]], beta, **TAUS).mean() for b in range(s.shape[0])
               if mask[b].any()]
    return torch.stack(per_seq).mean()


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _seq_mean_rows(mask):
    """The seq_mean coefficients (N,) of the masked rows of a (B, T) ``mask`` and the rows' index."""
    from distillab.ops.kl import row_coefficients

    seq = torch.arange(mask.shape[0]).unsqueeze(1).expand_as(mask)[mask]
    return row_coefficients(seq, mask.shape[0]), mask.nonzero(as_tuple=True)


@pytest.mark.parametrize("std,beta,V", SATURATED + [(8.0, 0.1, 32_000), (8.0, 0.9, 32_000)])
def test_saturated_jsd_reference_gradient_within_rounding_of_float64(std, beta, V):
    """The reference path's float32 JSD(β) value and gradient w.r.t. the student logits
    (distill_loss) and, of token_divergence, the teacher logits, within float32's rounding bound
    (tests/_tolerance.py: 3e-5 to 1e-4 relative at V ≤ 1,271, 3e-4 at V = 32,000, where two
    float32 sums of 32,000 terms set it) of float64 autograd of the definition on the same logits,
    where JSD(β) saturates (autograd through log M in float32 was up to 1e-2 off at std 8 and
    V = 32,000, 2e2 at std 16: ops.divergence, "Precision of the JSD gradient"); masked rows get 0."""
    s, t, mask = saturated_batch(std, V)
    top = -beta * math.log(beta) - (1 - beta) * math.log1p(-beta)  # JSD(β)'s maximum
    x64, y64 = s.double().requires_grad_(), t.double().requires_grad_()
    want = definition_seq_mean(x64, y64.detach(), mask, beta)
    (want_g,) = torch.autograd.grad(want, x64)
    assert want.item() > 0.9 * top  # saturated
    x = s.clone().requires_grad_()
    got = distill_loss(x, t, mask, kind="jsd", beta=beta, **TAUS)
    (got_g,) = torch.autograd.grad(got, x)
    coef, rows = _seq_mean_rows(mask)
    value, grad = tol.loss_bounds(s[rows].double(), t[rows].double(), coef, kind="jsd", beta=beta, dtype=F32, **TAUS)
    assert got.dtype == torch.float32 and abs(got.item() - want.item()) <= value
    assert rel(got_g, want_g) <= tol.norm_ratio(grad, want_g[rows])
    assert torch.equal(got_g[~mask], torch.zeros_like(got_g[~mask]))
    want_t = torch.autograd.grad(definition_jsd(x64[rows], y64[rows], beta, **TAUS).sum(), y64)[0][rows]
    yt = t[rows].clone().requires_grad_()
    (got_t,) = torch.autograd.grad(token_divergence(s[rows], yt, kind="jsd", beta=beta, **TAUS).sum(), yt)
    # the teacher's gradient, per position summed: the same bound with the roles of S and T swapped
    rev = dict(tau_s=TAUS["tau_t"], tau_t=TAUS["tau_s"])
    _, grad_t = tol.loss_bounds(t[rows].double(), s[rows].double(), torch.ones(len(coef)), kind="jsd", beta=1 - beta,
                                dtype=F32, **rev)
    assert rel(got_t, want_t) <= tol.norm_ratio(grad_t, want_t)


@pytest.mark.parametrize("std,beta,V", SATURATED[::2])
def test_saturated_jsd_value_is_the_log_m_form(std, beta, V):
    """The closed-form backward leaves the value as it was: bitwise the log M form of the
    log-probabilities (ops.divergence._logprob_divergence), in float32 and float64."""
    from distillab.ops.divergence import _logprob_divergence

    s, t, mask = saturated_batch(std, V)
    for dt in (torch.float32, torch.float64):
        ls, lt = torch.log_softmax(s[mask].to(dt) / 1.3, -1), torch.log_softmax(t[mask].to(dt) / 0.7, -1)
        got = token_divergence(s[mask].requires_grad_(), t[mask], kind="jsd", beta=beta, compute_dtype=dt, **TAUS)
        assert got.requires_grad and torch.equal(got.detach(), _logprob_divergence(ls, lt, "jsd", beta))


@pytest.mark.parametrize("std,beta,V", SATURATED)
def test_saturated_jsd_oracle_grad_cos_is_one(std, beta, V):
    """The estimator oracle of the exact JSD (estimator full, kind jsd) on the reference path: the
    loss's float32 autograd gradient against the oracle's float32 closed form, grad_cos 1 to
    rounding (was 1 − 0.4 at std 16), norm ratio 1 and bias 0 to rounding (tests/_tolerance.py:
    each gradient within ε relative of exact, so |1 − cos| ≤ 2(2ε)² and |ratio − 1| ≤ 2ε; the
    bias within both values' bounds)."""
    from distillab.ops.kl import estimator_loss
    from distillab.ops.oracle import logits_oracle

    s, t, mask = saturated_batch(std, V)
    x = s.clone().requires_grad_()
    out = estimator_loss(x, t, mask, estimator="full", kind="jsd", beta=beta, **TAUS)
    (g,) = torch.autograd.grad(out.loss, x)
    coef, rows = _seq_mean_rows(mask)
    got = logits_oracle(s[mask], t[mask], g[mask], coef, estimate=float(out.estimate), kind="jsd", beta=beta, **TAUS)
    value, grad = tol.loss_bounds(s[rows].double(), t[rows].double(), coef, kind="jsd", beta=beta, dtype=F32,
                                  ref=False, **TAUS)
    eps = tol.norm_ratio(grad, g[rows])  # each float32 gradient's relative error bound
    assert abs(got["grad_cos"] - 1.0) <= 2 * (2 * eps) ** 2 + tol.gamma(3 * g[rows].numel(), F64)
    assert abs(got["grad_norm_ratio"] - 1.0) <= 2 * eps
    assert abs(got["bias"]) <= 2 * value


# ------------------------------------------------------------------------ JSD endpoints


def test_jsd_endpoints_are_exactly_forward_and_reverse():
    gen = torch.Generator().manual_seed(99)
    s = rand_logits(gen, (2, 3, 11), dtype=torch.float32)
    t = rand_logits(gen, (2, 3, 11), dtype=torch.float32)
    fwd = token_divergence(s, t, kind="forward")
    rev = token_divergence(s, t, kind="reverse")
    assert torch.equal(token_divergence(s, t, kind="jsd", beta=0.0), fwd)
    assert torch.equal(token_divergence(s, t, kind="jsd", beta=1.0), rev)
    mid = token_divergence(s, t, kind="jsd", beta=0.5)
    assert not torch.equal(mid, fwd) and not torch.equal(mid, rev)
    _, S, _ = tol.divergence_scale(s, t, kind="jsd", tau_s=1.0, tau_t=0.5)
    err = tol.row(11, F32, tol.logit_range((s, 1.0), (t, 0.5))) * S  # float32's bound per position
    assert (mid <= math.log(2) + err).all() and (mid >= -err).all()  # symmetric JSD bound


# --------------------------------------------------------------------- padding / masking


def _garbage(shape):
    g = torch.full(shape, float("nan"))
    g[..., 0] = float("inf")
    g[..., 1] = float("-inf")
    return g


@pytest.mark.parametrize("kind", KINDS)
def test_padding_invariance(kind):
    gen = torch.Generator().manual_seed(2024)
    V, T = 6, 7
    lens = (4, 2)
    comp_s = [rand_logits(gen, (n, V), dtype=torch.float32) for n in lens]
    comp_t = [rand_logits(gen, (n, V), dtype=torch.float32) for n in lens]
    # left-padded batch; prompt and padding positions hold NaN/inf garbage
    s = _garbage((2, T, V))
    t = _garbage((2, T, V))
    mask = torch.zeros(2, T, dtype=torch.bool)
    for b, n in enumerate(lens):
        s[b, T - n:] = comp_s[b]
        t[b, T - n:] = comp_t[b]
        mask[b, T - n:] = True
    s.requires_grad_()
    loss = distill_loss(s, t, mask, kind=kind)
    singles = [
        distill_loss(cs[None], ct[None], torch.ones(1, n, dtype=torch.bool), kind=kind)
        for cs, ct, n in zip(comp_s, comp_t, lens)
    ]
    # two float32 computations of each reduction: twice its bound (no float64 reference)
    zs, zt = torch.cat(comp_s), torch.cat(comp_t)
    n = len(zs)
    coefs = {"seq_mean": torch.tensor([1 / 8] * 4 + [1 / 4] * 2), "token_mean": torch.full((n,), 1 / n),
             "sum": torch.ones(n)}
    bound = {red: 2 * tol.loss_bounds(zs, zt, c, kind=kind, tau_s=1.0, tau_t=0.5, dtype=F32, ref=False)[0]
             for red, c in coefs.items()}
    assert abs(loss.item() - (singles[0].item() + singles[1].item()) / 2) <= bound["seq_mean"]
    # token_mean weighs every token equally
    per_tok = [token_divergence(cs, ct, kind=kind) for cs, ct in zip(comp_s, comp_t)]
    tm = distill_loss(s, t, mask, kind=kind, reduction="token_mean")
    assert abs(tm.item() - torch.cat(per_tok).sum().item() / sum(lens)) <= bound["token_mean"]
    sm = distill_loss(s, t, mask, kind=kind, reduction="sum")
    assert abs(sm.item() - torch.cat(per_tok).sum().item()) <= bound["sum"]
    loss.backward()
    assert torch.isfinite(s.grad).all()
    assert (s.grad[~mask] == 0).all()
    assert (s.grad[mask].abs().sum(-1) > 0).all()


def test_all_masked_sequence_contributes_nothing():
    gen = torch.Generator().manual_seed(8)
    s = rand_logits(gen, (3, 4, 5), dtype=torch.float32)
    t = rand_logits(gen, (3, 4, 5), dtype=torch.float32)
    mask = torch.tensor([[True, True, False, False], [False] * 4, [True, True, True, True]])
    s[1] = float("nan")
    t[1] = float("inf")
    s.requires_grad_()
    w = torch.tensor([2.0, float("nan"), 0.5])
    rows = mask.nonzero(as_tuple=True)
    for kind in KINDS:
        loss = distill_loss(s, t, mask, kind=kind)
        ref = distill_loss(s[[0, 2]].detach(), t[[0, 2]], mask[[0, 2]], kind=kind)
        # the same rows in float32 twice: twice the bound of the (weighted) seq_mean
        coefs = {"plain": [1 / 4] * 2 + [1 / 8] * 4, "weighted": [2.0 / 4] * 2 + [0.5 / 8] * 4}  # seq_mean's c_i
        bound = {k: 2 * tol.loss_bounds(s[rows].detach(), t[rows], torch.tensor(c), kind=kind, tau_s=1.0, tau_t=0.5,
                                        dtype=F32, ref=False)[0] for k, c in coefs.items()}
        assert abs(loss.item() - ref.item()) <= bound["plain"]
        (g,) = torch.autograd.grad(loss, s)
        assert torch.isfinite(g).all() and (g[1] == 0).all()
        # weights of an empty sequence (even NaN) are ignored too
        lw = distill_loss(s, t, mask, kind=kind, weights=w)
        p0 = token_divergence(s[0, :2].detach(), t[0, :2], kind=kind).mean()
        p2 = token_divergence(s[2].detach(), t[2], kind=kind).mean()
        assert abs(lw.item() - (2.0 * p0 + 0.5 * p2).item() / 2) <= bound["weighted"]


@pytest.mark.parametrize("reduction", ["seq_mean", "token_mean", "sum"])
def test_fully_masked_batch_is_zero_with_finite_grad(reduction):
    s = torch.full((2, 3, 4), float("nan")).requires_grad_()
    t = torch.full((2, 3, 4), float("nan"))
    mask = torch.zeros(2, 3, dtype=torch.bool)
    loss = distill_loss(s, t, mask, kind="reverse", reduction=reduction)
    assert loss.item() == 0.0 and loss.grad_fn is not None
    loss.backward()
    assert torch.equal(s.grad, torch.zeros_like(s.grad))


def test_reduce_loss_values_and_weights():
    # every value, sum, product and quotient here is a small dyadic rational: exact in float32, so equal
    per_tok = torch.tensor([[1.0, 2.0, float("nan")], [4.0, float("inf"), 6.0], [7.0, 8.0, 9.0]], requires_grad=True)
    mask = torch.tensor([[True, True, False], [True, False, True], [False, False, False]])
    assert reduce_loss(per_tok, mask).item() == (1.5 + 5.0) / 2
    assert reduce_loss(per_tok, mask, reduction="token_mean").item() == 13.0 / 4
    assert reduce_loss(per_tok, mask, reduction="sum").item() == 13.0
    w = torch.tensor([2.0, 0.5, 3.0], requires_grad=True)
    assert reduce_loss(per_tok, mask, weights=w).item() == (2 * 1.5 + 0.5 * 5.0) / 2
    assert reduce_loss(per_tok, mask, reduction="token_mean", weights=w).item() == (6.0 + 5.0) / 4
    loss = reduce_loss(per_tok, mask, reduction="sum", weights=w)
    assert loss.item() == 11.0
    loss.backward()
    assert w.grad is None  # weights are detached
    assert torch.equal(per_tok.grad, torch.tensor([[2.0, 2.0, 0.0], [0.5, 0.0, 0.5], [0.0, 0.0, 0.0]]))
    empty = torch.zeros(3, 3, dtype=torch.bool)
    for red in ("seq_mean", "token_mean", "sum"):
        z = reduce_loss(per_tok, empty, reduction=red)
        assert z.item() == 0.0 and z.grad_fn is not None


# ----------------------------------------------------------------------------- numerics


@pytest.mark.parametrize("kind", KINDS)
def test_neg_inf_in_both_equals_reduced_vocab(kind):
    gen = torch.Generator().manual_seed(31)
    s = rand_logits(gen, (2, 3, 8))
    t = rand_logits(gen, (2, 3, 8))
    banned = torch.tensor([1, 4, 5])
    keep = torch.tensor([0, 2, 3, 6, 7])
    s_inf, t_inf = s.clone(), t.clone()
    s_inf[..., banned] = float("-inf")
    t_inf[..., banned] = float("-inf")
    s_inf.requires_grad_()
    mask = torch.ones(2, 3, dtype=torch.bool)
    loss = distill_loss(s_inf, t_inf, mask, kind=kind, compute_dtype=torch.float64)
    s_red = s[..., keep].clone().requires_grad_()
    ref = distill_loss(s_red, t[..., keep], mask, kind=kind, compute_dtype=torch.float64)
    # two float64 computations, over 8 entries (3 of them -inf) and over 5: the sum of their bounds
    coef, kw = torch.full((6,), 1 / 6), dict(kind=kind, tau_s=1.0, tau_t=0.5, dtype=F64, ref=False)
    v8, g8 = tol.loss_bounds(s_inf.detach().reshape(6, 8), t_inf.reshape(6, 8), coef, **kw)
    v5, g5 = tol.loss_bounds(s[..., keep].reshape(6, 5), t[..., keep].reshape(6, 5), coef, **kw)
    assert abs(loss.item() - ref.item()) <= v8 + v5
    loss.backward()
    ref.backward()
    assert torch.isfinite(s_inf.grad).all() and (s_inf.grad[..., banned] == 0).all()
    assert ((s_inf.grad[..., keep] - s_red.grad).abs() <= g8[:, keep].view(2, 3, 5) + g5.view(2, 3, 5)).all()


def test_neg_inf_in_teacher_only():
    zs = [0.3, -0.2, 1.0, 0.1]
    zt = [1.0, float("-inf"), 0.5, float("-inf")]
    s = torch.tensor([[zs]], dtype=torch.float64, requires_grad=True)
    t = torch.tensor([[zt]], dtype=torch.float64)
    mask = torch.ones(1, 1, dtype=torch.bool)
    p_s = py_softmax(zs, 1.0)
    p_t = py_softmax([1.0, 0.5], 0.5)
    p_t = [p_t[0], 0.0, p_t[1], 0.0]
    # forward KL: entries with π_T = 0 contribute 0
    want_f = sum(a * (math.log(a) - math.log(b)) for a, b in zip(p_t, p_s) if a > 0)
    # reverse KL: +inf mathematically; with the documented floor, log π_T := -1e4 where π_T = 0
    want_r = sum(b * (math.log(b) - (math.log(a) if a > 0 else LOGPROB_FLOOR)) for a, b in zip(p_t, p_s))
    for kind, want in (("forward", want_f), ("reverse", want_r), ("jsd", None)):
        loss = distill_loss(s, t, mask, kind=kind, compute_dtype=torch.float64)
        (g,) = torch.autograd.grad(loss, s)
        assert torch.isfinite(loss) and torch.isfinite(g).all()
        if want is not None:  # float64 against Python's float64 (the floor's 1e4 is in the magnitude S)
            value, _ = tol.loss_bounds(s[0].detach(), t[0], torch.ones(1), kind=kind, tau_s=1.0, tau_t=0.5, dtype=F64)
            assert abs(loss.item() - want) <= value
    assert want_r > 1e3  # the floor shows up as a large finite penalty


def test_neg_inf_in_student_only_and_huge_logits_are_finite():
    gen = torch.Generator().manual_seed(4)
    s = rand_logits(gen, (2, 3, 6), dtype=torch.float32)
    t = rand_logits(gen, (2, 3, 6), dtype=torch.float32)
    s[0, :, 2] = float("-inf")
    s[1, 0] = torch.tensor([1e4, -1e4, 1e4, -1e4, 0.0, 5.0])
    t[1, 0] = torch.tensor([-1e4, 1e4, 1e4, -1e4, 0.0, -5.0])
    t[1, 1] = 1e4
    s[1, 2] = -1e4
    mask = torch.ones(2, 3, dtype=torch.bool)
    for kind in KINDS:
        for red in ("seq_mean", "token_mean", "sum"):
            x = s.clone().requires_grad_()
            loss = distill_loss(x, t, mask, kind=kind, reduction=red)
            loss.backward()
            assert torch.isfinite(loss), (kind, red)
            assert torch.isfinite(x.grad).all(), (kind, red)
        for dt in (torch.float32, torch.float64):
            assert torch.isfinite(token_divergence(s, t, kind=kind, compute_dtype=dt)).all()


# ------------------------------------------------------------------------------ errors


def test_vocab_mismatch_names_both_sizes():
    s = torch.zeros(1, 2, 5)
    t = torch.zeros(1, 2, 7)
    mask = torch.ones(1, 2, dtype=torch.bool)
    for fn in (
        lambda: token_divergence(s, t, kind="forward"),
        lambda: distill_loss(s, t, mask),
        lambda: sampled_token_loss(s, t, mask),
    ):
        with pytest.raises(ValueError) as ei:
            fn()
        msg = str(ei.value)
        assert "5" in msg and "7" in msg and "vocab" in msg


def test_invalid_arguments_raise():
    s = torch.zeros(1, 2, 4)
    mask = torch.ones(1, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"\(1, 2, 4\).*\(1, 3, 4\)"):
        token_divergence(s, torch.zeros(1, 3, 4), kind="forward")
    for kw in ({"tau_s": 0.0}, {"tau_t": -1.0}, {"tau_s": float("nan")}):
        with pytest.raises(ValueError, match="tau"):
            token_divergence(s, s, kind="forward", **kw)
    with pytest.raises(ValueError, match="'forward'.*'reverse'.*'jsd'"):
        token_divergence(s, s, kind="kl")
    for b in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="beta"):
            token_divergence(s, s, kind="jsd", beta=b)
    with pytest.raises(ValueError, match="compute_dtype"):
        token_divergence(s, s, kind="forward", compute_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="'seq_mean'.*'token_mean'.*'sum'"):
        distill_loss(s, s, mask, reduction="mean")
    with pytest.raises(ValueError, match="mask shape"):
        reduce_loss(torch.zeros(2, 3), torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="weights"):
        reduce_loss(torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool), weights=torch.ones(3))
    with pytest.raises(TypeError, match="bool"):
        distill_loss(s, s, torch.ones(1, 2))
    with pytest.raises(ValueError, match="'forward'.*'reverse'"):
        sampled_token_loss(s, s, mask, kind="jsd")


# --------------------------------------------------------------------- sampled estimators


@pytest.mark.parametrize("kind", ["forward", "reverse"])
def test_sampled_loss_is_reproducible(kind):
    gen = torch.Generator().manual_seed(12)
    s = rand_logits(gen, (3, 6, 10), dtype=torch.float32)
    t = rand_logits(gen, (3, 6, 10), dtype=torch.float32)
    mask = torch.rand(3, 6, generator=gen) < 0.6
    mask[0, 0] = True

    def run(seed, garbage=False):
        ss, tt = s.clone(), t.clone()
        if garbage:
            ss[~mask] = float("nan")
            tt[~mask] = float("-inf")
        return sampled_token_loss(ss, tt, mask, kind=kind, generator=torch.Generator().manual_seed(seed))

    a, b = run(0), run(0)
    assert torch.equal(a, b) and torch.isfinite(a)
    assert torch.equal(run(0, garbage=True), a)  # masked contents change neither draws nor value
    assert any(not torch.equal(run(k), a) for k in (1, 2, 3))


def _mc_setup(n, V=4, seed=21):
    gen = torch.Generator().manual_seed(seed)
    zs = rand_logits(gen, (V,), scale=1.0)
    zt = rand_logits(gen, (V,), scale=1.0)
    mask = torch.ones(1, n, dtype=torch.bool)
    return zs, zt, mask


def test_sampled_forward_mc_matches_cross_entropy():
    n = 20000
    zs, zt, mask = _mc_setup(n)
    leaf = zs.clone().requires_grad_()
    s = leaf.expand(1, n, -1)
    t = zt.expand(1, n, -1)
    loss = sampled_token_loss(s, t, mask, kind="forward", tau_s=1.0, tau_t=0.5,
                              generator=torch.Generator().manual_seed(0))
    (grad,) = torch.autograd.grad(loss, leaf)
    ps = torch.softmax(zs, -1)
    pt = torch.softmax(zt / 0.5, -1)
    nll = -ps.log()
    ce = (pt * nll).sum()
    kl = token_divergence(zs, zt, kind="forward", compute_dtype=torch.float64)
    ent = -(pt * pt.log()).sum()
    # three float64 rows over V = 4 (the cross-entropy, the KL, the entropy): three row bounds
    scale = 2 + (pt * (pt.log().abs() + nll)).sum().item()
    assert abs(ce.item() - (kl + ent).item()) <= 3 * tol.row(4, F64, tol.logit_range((zs, 1.0), (zt, 0.5))) * scale
    se = math.sqrt(((pt * nll**2).sum() - ce**2).item() / n)
    assert abs(loss.item() - ce.item()) < 5 * se
    # expected gradient (π_S − π_T)/τ_S; per-sample gradient is π_S − e_y
    se_g = (pt * (1 - pt) / n).sqrt()
    # 5 standard errors, and the float64 rounding of the mean of n per-draw gradients (entries in [−1, 1])
    assert ((grad - (ps - pt)).abs() < 5 * se_g + tol.gamma(n + 16, F64)).all()


def test_sampled_reverse_gradient_mc_matches_reverse_kl_gradient():
    n = 20000
    tau_s = 1.0
    zs, zt, mask = _mc_setup(n, seed=5)
    leaf = zs.clone().requires_grad_()
    loss = sampled_token_loss(leaf.expand(1, n, -1), zt.expand(1, n, -1), mask, kind="reverse",
                              tau_s=tau_s, tau_t=0.5, generator=torch.Generator().manual_seed(1))
    (grad,) = torch.autograd.grad(loss, leaf)
    x = zs.clone().requires_grad_()
    (want,) = torch.autograd.grad(
        token_divergence(x, zt, kind="reverse", tau_s=tau_s, compute_dtype=torch.float64), x
    )
    # exact expectation of the per-sample gradient g(y) = r_y (e_y − π_S)/τ_S, and its spread
    ps = torch.softmax(zs / tau_s, -1)
    r = ps.log() - torch.log_softmax(zt / 0.5, -1)
    g = r[:, None] * (torch.eye(len(zs), dtype=zs.dtype) - ps) / tau_s  # row y = g(y)
    mean = (ps[:, None] * g).sum(0)
    _, _, m = tol.divergence_scale(zs, zt, kind="reverse", tau_s=tau_s, tau_t=0.5)
    assert ((mean - want).abs() <= 2 * tol.row(4, F64, tol.logit_range((zs, tau_s), (zt, 0.5))) * m).all()
    se = (((ps[:, None] * g**2).sum(0) - mean**2).clamp_min(0) / n).sqrt()
    # 5 standard errors, and the float64 rounding of the mean of n per-draw gradients (entries ≤ max|r|/τ_S)
    assert ((grad - want).abs() < 5 * se + tol.gamma(n + 16, F64) * r.abs().max() / tau_s).all()
    assert want.abs().max() > 10 * se.max()  # the check is not vacuous


# ---------------------------------------------------------------- engine mismatch weights


def test_engine_mismatch_weights_hand_example():
    lp_q = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -1.0, -1.5], [-1.0, -1.0, -1.0]])
    diff = torch.tensor([
        [0.0, math.log(3.0), float("nan")],     # ratios 1, 3 -> clip 2; third masked
        [math.log(0.5), 0.0, math.log(1.5)],    # 0.5, 1, 1.5
        [5.0, 5.0, 5.0],                        # no tokens
    ])
    lp_p = (lp_q + diff).requires_grad_()
    mask = torch.tensor([[True, True, False], [True, True, True], [False, False, False]])
    w = engine_mismatch_weights(lp_p, lp_q, mask)
    assert not w.requires_grad and w.shape == (3,)
    # float32: each ratio exp(lp_p − lp_q) errs by 2u (exp) + the rounding of log(x) (u·1.1), of lp_q + diff
    # (u·4.2) and of the difference back (u·1.1), times its size ≤ 2; then the mean of ≤ 3: γ_3
    err = (tol.u(F32) * (2 + 1.1 + 4.2 + 1.1) + tol.gamma(3, F32)) * 2
    assert ((w - torch.tensor([1.5, 1.0, 0.0])).abs() <= err).all()
    w4 = engine_mismatch_weights(lp_p, lp_q, mask, clip=4.0)
    assert ((w4 - torch.tensor([2.0, 1.0, 0.0])).abs() <= err).all()
    with pytest.raises(ValueError, match="clip"):
        engine_mismatch_weights(lp_p, lp_q, mask, clip=0.0)
    # weights plug into the loss
    per_tok = torch.ones(3, 3)
    assert abs(reduce_loss(per_tok, mask, weights=w).item() - (1.5 + 1.0) / 2) <= err + tol.gamma(4, F32) * 1.5
