"""The estimators of ops.kl (loss.estimator: sampled, topk, k1, k2, k3): values and gradients
against float64 hand computation on a 3-token, 6-vocab batch; k = V top-k equals the full
divergence exactly; the closed-form rows (the chunked path) against autograd of the reference
on odd shapes; and unbiasedness for the quantity each estimator estimates, from >= 20,000
seeded draws (vectorised) and from the exact expectation over the vocabulary."""

from __future__ import annotations

import math

import _tolerance as tol
import pytest
import torch

from distillab.ops.chunked import chunked_distill_loss, estimator_rows
from distillab.ops.kl import (
    LOGPROB_FLOOR,
    estimator_loss,
    resolve_k_gradient,
    rollout_token_estimate_and_grad,
    rollout_token_loss,
    rollout_token_terms,
    sampled_token_loss,
    token_divergence,
    token_divergence_and_grad,
    topk_divergence,
    topk_divergence_and_grad,
    topk_support,
)

F32, F64 = torch.float32, torch.float64
TAU_S, TAU_T, BETA = 1.0, 0.5, 0.3

# 3 tokens x 6 vocab. Teacher row 0 ties at its 2nd-largest logit (1.0 twice); row 2 of the
# student ties at its 2nd largest (0.5 twice).
S_HAND = [[1.0, 2.0, 0.5, -1.0, 0.0, 0.3], [0.0, 0.2, -0.4, 1.5, 0.1, -2.0], [3.0, 0.5, 0.5, -1.0, 0.0, -0.5]]
T_HAND = [[2.0, 1.0, 1.0, 0.0, -1.0, 0.5], [1.0, -1.0, 2.0, 0.0, 0.5, -0.5], [0.5, 1.5, -2.0, 0.0, 1.0, -1.0]]
TARGETS = [1, 3, 0]  # the rollout token at each position


def py_softmax(z, tau):
    m = max(z)
    e = [math.exp((x - m) / tau) for x in z]
    return [x / sum(e) for x in e]


def py_top(z, k):
    thr = sorted(z, reverse=True)[k - 1]
    return {v for v, x in enumerate(z) if x >= thr}


def py_div(q_s, q_t, kind, beta=BETA):
    """The divergence ``kind`` of two categorical distributions (lists over the same categories)."""
    def kl(p, q):
        return sum(a * (math.log(a) - math.log(b)) for a, b in zip(p, q) if a > 0)

    if kind == "forward":
        return kl(q_t, q_s)
    if kind == "reverse":
        return kl(q_s, q_t)
    m = [beta * a + (1 - beta) * b for a, b in zip(q_t, q_s)]
    return beta * kl(q_t, m) + (1 - beta) * kl(q_s, m)


def py_topk(zs, zt, k, source, tail, kind):
    p_s, p_t = py_softmax(zs, TAU_S), py_softmax(zt, TAU_T)
    sup = {"teacher": py_top(zt, k), "student": py_top(zs, k), "union": py_top(zt, k) | py_top(zs, k)}[source]
    on = sorted(sup)
    q_s, q_t = [p_s[v] for v in on], [p_t[v] for v in on]
    if tail:
        off = [v for v in range(len(zs)) if v not in sup]
        q_s.append(sum(p_s[v] for v in off))
        q_t.append(sum(p_t[v] for v in off))
    else:
        q_s, q_t = [x / sum(q_s) for x in q_s], [x / sum(q_t) for x in q_t]
    return py_div(q_s, q_t, kind)


def hand_rho(s, t, dtype=F64):
    """ρ of each hand row (tests/_tolerance.py) in ``dtype``, against Python's float64 as well."""
    A = tol.logit_range((s, TAU_S), (t, TAU_T), rows=True)
    return tol.row(6, dtype, A) + tol.row(6, F64, A)


def hand_batch():
    return torch.tensor([S_HAND], dtype=F64), torch.tensor([T_HAND], dtype=F64), torch.ones(1, 3, dtype=torch.bool)


# ------------------------------------------------------------------------------ hand computation


def test_topk_support_keeps_ties_at_the_kth_logit_and_unions():
    s, t, _ = hand_batch()
    sup = topk_support(s, t, top_k=2, topk_source="teacher")[0]
    assert sup[0].nonzero().flatten().tolist() == [0, 1, 2]  # 2.0 and the tied 1.0, 1.0: |S| = 3 > k
    assert sup[1].nonzero().flatten().tolist() == [0, 2]
    stu = topk_support(s, t, top_k=2, topk_source="student")[0]
    assert stu[2].nonzero().flatten().tolist() == [0, 1, 2]  # 3.0 and the tied 0.5, 0.5
    uni = topk_support(s, t, top_k=2, topk_source="union")[0]
    assert uni[0].nonzero().flatten().tolist() == [0, 1, 2]  # {0,1,2} ∪ {1,0}
    assert uni[1].nonzero().flatten().tolist() == [0, 1, 2, 3]  # teacher {2, 0} ∪ student {3, 1}
    both = topk_support(s, t, top_k=2, topk_source="teacher") | topk_support(s, t, top_k=2, topk_source="student")
    assert torch.equal(uni, both[0])
    assert topk_support(s, t, top_k=6, topk_source="union").all()
    assert topk_support(s, t, top_k=99, topk_source="student").all()


@pytest.mark.parametrize("tail", [False, True])
@pytest.mark.parametrize("source", ["teacher", "student", "union"])
@pytest.mark.parametrize("kind", ["forward", "reverse", "jsd"])
def test_topk_against_hand_computation(kind, source, tail):
    s, t, mask = hand_batch()
    want = [py_topk(zs, zt, 2, source, tail, kind) for zs, zt in zip(S_HAND, T_HAND)]
    kw = dict(kind=kind, top_k=2, topk_source=source, topk_tail=tail, tau_s=TAU_S, tau_t=TAU_T, beta=BETA,
              compute_dtype=F64)
    got = topk_divergence(s, t, **kw)[0]
    E, _ = tol.estimator_magnitudes(s[0], t[0], estimator="topk", kind=kind, top_k=2, topk_source=source, topk_tail=tail)
    err = hand_rho(s[0], t[0]) * E  # float64 rows against Python's float64
    assert ((got - torch.tensor(want, dtype=F64)).abs() <= err).all()
    rows, _, _ = topk_divergence_and_grad(s[0], t[0], need_grad=False, **kw)
    assert ((rows - torch.tensor(want, dtype=F64)).abs() <= err).all()
    out = estimator_loss(s, t, mask, estimator="topk", kind=kind, top_k=2, topk_source=source, topk_tail=tail,
                         tau_s=TAU_S, tau_t=TAU_T, beta=BETA, compute_dtype=F64)
    mean_err = float(err.mean()) + tol.gamma(5, F64) * float(E.mean())
    assert abs(out.loss.item() - sum(want) / 3) <= mean_err and out.estimate.item() == out.loss.item()
    full = [py_div(py_softmax(zs, TAU_S), py_softmax(zt, TAU_T), kind) for zs, zt in zip(S_HAND, T_HAND)]
    if tail:  # merging categories never increases an f-divergence (the data-processing inequality)
        assert all(w <= f + 2 * float(e) for w, f, e in zip(want, full, err))  # both Python float64
    assert any(abs(w - f) > 1e-3 for w, f in zip(want, full))  # k = 2 of 6 is a real approximation here


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
@pytest.mark.parametrize("k_gradient", ["score", "pathwise"])
def test_rollout_token_estimators_against_hand_computation(estimator, k_gradient):
    s, t, mask = hand_batch()
    s.requires_grad_()
    y = torch.tensor([TARGETS])
    loss = rollout_token_loss(s, t, y, mask, estimator=estimator, k_gradient=k_gradient, tau_s=TAU_S, tau_t=TAU_T)
    (grad,) = torch.autograd.grad(loss, s)
    want_val, want_grad = 0.0, []
    for zs, zt, tok in zip(S_HAND, T_HAND, TARGETS):
        p_s, p_t = py_softmax(zs, TAU_S), py_softmax(zt, TAU_T)
        x = math.log(p_s[tok]) - math.log(p_t[tok])
        r = math.exp(-x)
        k = {"k1": x, "k2": 0.5 * x * x, "k3": (r - 1) - math.log(r)}[estimator]
        slope = {"k1": 1.0, "k2": x, "k3": 1 - r}[estimator]
        a = k if k_gradient == "score" else slope
        want_val += k / 3
        want_grad.append([a * ((v == tok) - p_s[v]) / TAU_S / 3 for v in range(6)])
    # float64 against Python's float64: ρ times the magnitudes, and the mean over 3 positions
    E, M = tol.estimator_magnitudes(s.detach()[0], t[0], estimator=estimator, targets=y[0], k_gradient=k_gradient)
    rho = hand_rho(s.detach()[0], t[0])
    value = float((rho * E).mean()) + tol.gamma(5, F64) * float(E.mean())
    grad_err = (rho.unsqueeze(-1) * M + tol.gamma(5, F64) * M) / 3
    assert abs(loss.item() - want_val) <= value
    assert ((grad[0] - torch.tensor(want_grad, dtype=F64)).abs() <= grad_err).all()
    # the closed-form rows (the chunked path's) give the same estimates and gradients
    est, g, _ = rollout_token_estimate_and_grad(s.detach()[0], t[0], y[0], estimator=estimator, k_gradient=k_gradient,
                                                tau_s=TAU_S, tau_t=TAU_T, compute_dtype=F64)
    assert abs(est.mean().item() - want_val) <= value
    assert ((g / 3 - torch.tensor(want_grad, dtype=F64)).abs() <= grad_err).all()


def test_pathwise_coefficients_are_autograd_of_the_estimators():
    """``pathwise`` is autograd of k w.r.t. log π_S(y): the coefficients 1, x, 1 − r."""
    ls = torch.tensor([-0.3, -2.0, -5.0, -0.01], dtype=F64, requires_grad=True)
    lt = torch.tensor([-1.2, -0.4, -5.5, -0.02], dtype=F64)
    x = ls - lt
    exprs = {"k1": x, "k2": 0.5 * x**2, "k3": torch.exp(-x) - 1 + x}
    # two float64 evaluations of k (expm1 against exp − 1) and its slope: a few roundings on x's magnitude
    # (|x| ≤ 2, e^{-x} ≤ e^2), γ_8 of 1 + |x| + e^{−x}
    err = tol.gamma(8, F64) * (1 + x.abs() + torch.exp(-x)).detach()
    for name, k in exprs.items():
        (auto,) = torch.autograd.grad(k.sum(), ls)
        est, coef = rollout_token_terms(ls, lt, estimator=name, k_gradient="pathwise")
        assert ((est - k.detach()).abs() <= err).all() and ((coef - auto).abs() <= err).all()
        _, score = rollout_token_terms(ls, lt, estimator=name, k_gradient="score")
        assert ((score - k.detach()).abs() <= err).all()
    assert [resolve_k_gradient(e) for e in ("k1", "k2", "k3")] == ["score", "pathwise", "pathwise"]
    # k1's score gradient and k2's pathwise gradient coincide (both x · ∇log π_S(y), the same float64 x)
    assert torch.equal(rollout_token_terms(ls, lt, estimator="k1", k_gradient="score")[1],
                       rollout_token_terms(ls, lt, estimator="k2", k_gradient="pathwise")[1])


@pytest.mark.parametrize("kind", ["forward", "reverse"])
def test_sampled_estimate_against_hand_computation(kind):
    """The draws are reproduced from the same seeded generator on the same probabilities."""
    s, t, mask = hand_batch()
    logp = torch.log_softmax((t / TAU_T) if kind == "forward" else (s / TAU_S), dim=-1)
    y = torch.multinomial(logp.exp().reshape(-1, 6), 1, generator=torch.Generator().manual_seed(3)).flatten().tolist()
    loss, est = sampled_token_loss(s, t, mask, kind=kind, tau_s=TAU_S, tau_t=TAU_T,
                                   generator=torch.Generator().manual_seed(3), return_estimate=True)
    want_est, want_loss = [], []
    for zs, zt, tok in zip(S_HAND, T_HAND, y):
        ls, lt = math.log(py_softmax(zs, TAU_S)[tok]), math.log(py_softmax(zt, TAU_T)[tok])
        want_est.append(lt - ls if kind == "forward" else ls - lt)
        want_loss.append(-ls if kind == "forward" else (ls - lt) * ls)
    # float64 against Python's float64: each log-probability within ρ, so the estimate within 2ρ and the loss
    # (−ℓ_S(y), or (ℓ_S − ℓ_T)(y) ℓ_S(y)) within ρ (1 + 3|ℓ_S(y)| + |ℓ_S − ℓ_T|(y)); means over 3 add γ_5
    rho = float(hand_rho(s[0], t[0]).max())
    mag = [1 + 3 * abs(w) + abs(e) for w, e in zip(want_loss, want_est)]
    assert all(abs(a - b) <= 2 * rho for a, b in zip(est[0].tolist(), want_est))
    assert abs(loss.item() - sum(want_loss) / 3) <= (rho + tol.gamma(5, F64)) * sum(mag) / 3
    out = estimator_loss(s, t, mask, estimator="sampled", kind=kind, tau_s=TAU_S, tau_t=TAU_T,
                         generator=torch.Generator().manual_seed(3))
    est_err = (2 * rho + tol.gamma(5, F64)) * sum(1 + abs(e) for e in want_est) / 3
    assert out.loss.item() == loss.item() and abs(out.estimate.item() - sum(want_est) / 3) <= est_err


# ------------------------------------------------------------------------------ k = V is the full divergence


@pytest.mark.parametrize("tail", [False, True])
@pytest.mark.parametrize("kind,beta", [("forward", 0.5), ("reverse", 0.5), ("jsd", 0.3), ("jsd", 1.0)])
def test_topk_with_k_equal_to_v_is_the_full_divergence_exactly(kind, beta, tail):
    gen = torch.Generator().manual_seed(17)
    s = torch.randn(2, 4, 41, generator=gen) * 3
    t = torch.randn(2, 4, 41, generator=gen) * 3
    s[0, 1, [3, 7]] = t[0, 1, [3, 7]] = float("-inf")
    kw = dict(kind=kind, beta=beta, tau_s=0.8, tau_t=0.5)
    for source in ("teacher", "student", "union"):
        topk = {"top_k": 41, "topk_source": source, "topk_tail": tail}
        assert torch.equal(topk_divergence(s, t, **topk, **kw), token_divergence(s, t, **kw))
        d, g, st = topk_divergence_and_grad(s[0], t[0], **topk, with_stats=True, **kw)
        d0, g0, st0 = token_divergence_and_grad(s[0], t[0], with_stats=True, **kw)
        assert torch.equal(d, d0) and torch.equal(g, g0) and torch.equal(st, st0)
    mask = torch.ones(2, 4, dtype=torch.bool)
    # one-hot hidden rows: the chunked op's logits are exactly s and t (finite: 0 · -inf would be NaN)
    hs, ws = torch.eye(8).reshape(2, 4, 8), s.clamp_min(-30).reshape(8, 41).T.contiguous()
    ht, wt = torch.eye(8).reshape(2, 4, 8), t.clamp_min(-30).reshape(8, 41).T.contiguous()
    a = chunked_distill_loss(hs, ws, ht, wt, mask, estimator="topk", top_k=41, topk_tail=tail, chunk_size=3, **kw)
    b = chunked_distill_loss(hs, ws, ht, wt, mask, chunk_size=3, backend="torch", **kw)
    assert torch.equal(a, b)


# ------------------------------------------------------------------------------ closed form vs autograd


@pytest.mark.parametrize("tail", [False, True])
@pytest.mark.parametrize("source", ["teacher", "student", "union"])
@pytest.mark.parametrize("kind,beta", [("forward", 0.5), ("reverse", 0.5), ("jsd", 0.3)])
def test_topk_rows_match_autograd_of_the_reference(kind, beta, source, tail):
    gen = torch.Generator().manual_seed(40 + len(kind) + len(source) + tail)
    zs = torch.randn(6, 29, generator=gen, dtype=F64) * 3
    zt = torch.randn(6, 29, generator=gen, dtype=F64) * 3
    zs[1, [2, 5]] = zt[1, [2, 5]] = float("-inf")  # both
    zt[2, [0, 7, 8]] = float("-inf")  # teacher only
    zs[3, [1, 4]] = float("-inf")  # student only
    zt[4, :6] = 2.0  # a 6-way tie at the top of the teacher
    zs[5, 10:] = float("-inf")  # the student's whole mass inside 10 entries: an empty-mass tail
    x = zs.clone().requires_grad_()
    kw = dict(kind=kind, top_k=5, topk_source=source, topk_tail=tail, tau_s=0.8, tau_t=0.5, beta=beta,
              compute_dtype=F64)
    want = topk_divergence(x, zt, **kw)
    (want_g,) = torch.autograd.grad(want.sum(), x)
    div, grad, stats = topk_divergence_and_grad(zs, zt, with_stats=True, **kw)
    assert torch.isfinite(div).all() and torch.isfinite(grad).all() and torch.isfinite(want_g).all()
    # two float64 computations (closed form, autograd of the reference): twice ρ times the magnitudes
    E, M = tol.estimator_magnitudes(zs, zt, estimator="topk", kind=kind, beta=beta, tau_s=0.8, tau_t=0.5, top_k=5,
                      topk_source=source, topk_tail=tail)
    rho = 2 * tol.row(29, F64, tol.logit_range((zs, 0.8), (zt, 0.5), rows=True))
    assert ((div - want.detach()).abs() <= rho * E).all()
    assert ((grad - want_g).abs() <= rho.unsqueeze(-1) * M).all()
    _, _, full_stats = token_divergence_and_grad(zs, zt, kind="forward", tau_s=0.8, compute_dtype=F64, with_stats=True)
    scale = tol.stats_scale(zs, zt, tau_s=0.8, tau_t=0.5)  # diagnostics stay full-vocabulary
    assert ((stats - full_stats).abs() <= rho.unsqueeze(-1) * scale).all()


SHAPES = [(2, 5, 8, 12, 37, 3), (3, 7, 16, 16, 131, 4), (1, 9, 12, 20, 41, 64)]  # B, T, H_s, H_t, V, chunk


def chunked_bounds(hs, ws, ht, wt, mask, targets, *, estimator, reduction, weights, **kw):
    """Bounds of the chunked estimator loss in float32 against its float64 reference (tests/_tolerance.py):
    the loss's absolute bound and ``[hidden, weight]`` relative norm-wise bounds of its gradients."""
    from distillab.ops.kl import row_coefficients

    rows = mask.nonzero(as_tuple=True)
    coef = row_coefficients(rows[0], mask.shape[0], reduction=reduction, weights=weights)
    zs, zt, dz = tol.linear_logits(hs[rows], ws, None, ht[rows], wt, None, tau_s=kw["tau_s"], tau_t=kw["tau_t"])
    A = tol.logit_range((zs, kw["tau_s"]), (zt, kw["tau_t"]), rows=True)
    rho = (tol.row(zs.shape[-1], F32, A, dz) + tol.gamma(len(coef) + 2, F32)
           + tol.row(zs.shape[-1], F64, A) + tol.gamma(len(coef) + 2, F64))
    E, M = tol.estimator_magnitudes(zs, zt, estimator=estimator, targets=targets[rows], **kw)
    x = zs.clone().requires_grad_()
    ref = estimator_loss(x[None], zt[None], torch.ones(1, len(coef), dtype=torch.bool), estimator=estimator,
                         targets=targets[rows][None], compute_dtype=F64, reduction="sum", **kw)
    (gz,) = torch.autograd.grad(ref.loss, x)  # each row's own gradient ∂ℓ_i/∂z_S
    gz = coef.double().unsqueeze(-1) * gz
    value = float((coef.double() * rho * E).sum())
    return value, tol.linear_grad_bounds(hs[rows], ws, gz, (coef.double() * rho).unsqueeze(-1) * M)[:2]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("estimator,kind,extra", [
    ("topk", "forward", dict(top_k=5)),
    ("topk", "jsd", dict(top_k=4, topk_source="union", topk_tail=True)),
    ("topk", "reverse", dict(top_k=3, topk_source="student", topk_tail=True)),
    ("k1", "reverse", {}),
    ("k2", "reverse", dict(k_gradient="score")),
    ("k3", "reverse", {}),
])
def test_chunked_estimators_match_the_float64_reference(shape, estimator, kind, extra):
    B, T, H_s, H_t, V, chunk = shape
    gen = torch.Generator().manual_seed(7 + V + len(estimator))
    hs, ht = torch.randn(B, T, H_s, generator=gen), torch.randn(B, T, H_t, generator=gen)
    ws = torch.randn(V, H_s, generator=gen) * (2.0 / H_s**0.5)
    wt = torch.randn(V, H_t, generator=gen) * (2.0 / H_t**0.5)
    mask = torch.rand(B, T, generator=gen) < 0.7
    mask[0, -1] = True
    hs[~mask] = float("nan")  # never read
    targets = torch.randint(0, V, (B, T), generator=gen)
    weights = torch.rand(B, generator=gen) + 0.5
    for reduction, w in (("seq_mean", None), ("token_mean", weights)):
        kw = dict(kind=kind, beta=0.3, tau_s=1.0, tau_t=0.5, reduction=reduction, weights=w, **extra)
        a, W = hs.double().requires_grad_(), ws.double().requires_grad_()
        zs = torch.where(mask.unsqueeze(-1), a, 0.0) @ W.T
        ref = estimator_loss(zs, ht.double() @ wt.double().T, mask, estimator=estimator, targets=targets,
                             compute_dtype=F64, **kw).loss
        ref_g = torch.autograd.grad(ref, (a, W))
        a2, W2 = hs.clone().requires_grad_(), ws.clone().requires_grad_()
        loss = chunked_distill_loss(a2, W2, ht, wt, mask, estimator=estimator, targets=targets, chunk_size=chunk, **kw)
        got_g = torch.autograd.grad(loss, (a2, W2))
        value, rels = chunked_bounds(hs, ws, ht, wt, mask, targets, estimator=estimator, **kw)
        assert abs(loss.item() - ref.item()) <= value
        for g, r, bound in zip(got_g, ref_g, rels):
            assert torch.isfinite(g).all()
            assert ((g.double() - r).norm() / r.norm()).item() <= bound


def test_estimator_errors_name_the_argument():
    s, t, mask = hand_batch()
    with pytest.raises(ValueError, match="estimator 'k4'.*'full'.*'k3'"):
        estimator_loss(s, t, mask, estimator="k4")
    with pytest.raises(ValueError, match="reverse KL"):
        estimator_loss(s, t, mask, estimator="k1", kind="forward", targets=torch.zeros(1, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match="targets"):
        estimator_loss(s, t, mask, estimator="k3", kind="reverse")
    with pytest.raises(ValueError, match=r"\[0, 6\)"):
        rollout_token_loss(s, t, torch.tensor([[0, 6, 1]]), mask)
    with pytest.raises(ValueError, match="top_k"):
        topk_support(s, t, top_k=0)
    with pytest.raises(ValueError, match="topk_source 'both'"):
        topk_support(s, t, top_k=2, topk_source="both")
    with pytest.raises(ValueError, match="k_gradient"):
        rollout_token_terms(s[0, 0], t[0, 0], estimator="k1", k_gradient="reinforce")
    with pytest.raises(ValueError, match="no chunked path"):
        estimator_rows("sampled")
    hs, w = torch.zeros(1, 3, 4), torch.zeros(6, 4)
    with pytest.raises(ValueError, match="'triton' has kernels for estimator 'full' only"):
        chunked_distill_loss(hs, w, hs, w, mask, estimator="topk", backend="triton")
    with pytest.raises(ValueError, match=r"targets must have shape \(1, 3\)"):
        chunked_distill_loss(hs, w, hs, w, mask, estimator="k1", kind="reverse",
                             targets=torch.zeros(3, dtype=torch.int64))


def test_k3_is_finite_where_the_teacher_dwarfs_the_student():
    """log r = log π_T(y) − log π_S(y) > 80 only where π_S(y) < e^-80: clamped inside exp."""
    ls = torch.tensor([LOGPROB_FLOOR, -200.0, -1.0])
    lt = torch.tensor([0.0, -0.5, -1.0])
    est, coef = rollout_token_terms(ls, lt, estimator="k3", k_gradient="pathwise")
    assert torch.isfinite(est).all() and torch.isfinite(coef).all() and est[2].item() == 0.0


# ------------------------------------------------------------------------------ unbiasedness


def _dists(V=5, seed=21):
    gen = torch.Generator().manual_seed(seed)
    zs, zt = torch.randn(V, generator=gen, dtype=F64), torch.randn(V, generator=gen, dtype=F64)
    return zs, zt, torch.log_softmax(zs / TAU_S, -1), torch.log_softmax(zt / TAU_T, -1)


@pytest.mark.parametrize("kind", ["forward", "reverse"])
def test_sampled_estimate_is_unbiased_for_the_kl(kind):
    n = 40_000
    zs, zt, ls, lt = _dists(seed=5 if kind == "forward" else 6)
    mask = torch.ones(1, n, dtype=torch.bool)
    _, est = sampled_token_loss(zs.expand(1, n, -1), zt.expand(1, n, -1), mask, kind=kind, tau_s=TAU_S, tau_t=TAU_T,
                                generator=torch.Generator().manual_seed(0), return_estimate=True)
    p = (lt if kind == "forward" else ls).exp()
    x = (lt - ls) if kind == "forward" else (ls - lt)  # the per-token estimate of each outcome
    exact = token_divergence(zs, zt, kind=kind, tau_s=TAU_S, tau_t=TAU_T, compute_dtype=F64).item()
    S = tol.divergence_scale(zs, zt, kind=kind, tau_s=TAU_S, tau_t=TAU_T)[1].item()  # two float64 rows
    assert abs((p * x).sum().item() - exact) <= 2 * tol.row(5, F64, tol.logit_range((zs, TAU_S), (zt, TAU_T))) * S
    se = math.sqrt(((p * x**2).sum().item() - exact**2) / n)
    assert abs(est.mean().item() - exact) < 4 * se and se < 0.05 * exact  # a sharp check, not a vacuous one


@pytest.mark.parametrize("estimator,unbiased", [("k1", True), ("k3", True), ("k2", False)])
def test_rollout_token_estimates_over_student_samples(estimator, unbiased):
    """E_{y~π_S}[k] = KL(π_S‖π_T) for k1 and k3 (20,000+ draws, and exactly over the vocabulary);
    k2 is biased (its exact expectation differs from the KL by far more than the MC error)."""
    n = 40_000
    zs, zt, ls, lt = _dists(seed=9)
    y = torch.multinomial(ls.exp().expand(n, -1), 1, replacement=True, generator=torch.Generator().manual_seed(1)).T
    mask = torch.ones(1, n, dtype=torch.bool)
    mc = rollout_token_loss(zs.expand(1, n, -1), zt.expand(1, n, -1), y, mask, estimator=estimator,
                            tau_s=TAU_S, tau_t=TAU_T, reduction="token_mean").item()
    est, _ = rollout_token_terms(ls, lt, estimator=estimator)  # (V,): the estimate of each possible token
    p = ls.exp()
    mean = (p * est).sum().item()
    exact = token_divergence(zs, zt, kind="reverse", tau_s=TAU_S, tau_t=TAU_T, compute_dtype=F64).item()
    se = math.sqrt(((p * est**2).sum().item() - mean**2) / n)
    assert abs(mc - mean) < 4 * se
    if unbiased:  # two float64 rows; the per-token terms' magnitudes (k3: r − 1 and x apart) set the scale
        x = ls - lt
        scale = 2 + (p * (est.abs() + 2 * x.abs() + torch.expm1(-x).abs())).sum().item()
        rho = tol.row(5, F64, tol.logit_range((zs, TAU_S), (zt, TAU_T)))
        assert abs(mean - exact) <= 2 * rho * scale and abs(mc - exact) < 4 * se
    else:
        assert abs(mean - exact) > 10 * se


def _expected_gradient(estimator, k_gradient, ls, lt):
    """E_{y~π_S}[a(y) (e_y − π_S)/τ_S], exactly: the expected training gradient w.r.t. z_S."""
    _, a = rollout_token_terms(ls, lt, estimator=estimator, k_gradient=k_gradient)
    p = ls.exp()
    per_y = a.unsqueeze(1) * (torch.eye(len(p), dtype=F64) - p) / TAU_S  # row y
    return (p.unsqueeze(1) * per_y).sum(0)


def test_expected_gradients_of_the_rollout_token_estimators():
    """k1-score and k2-pathwise are unbiased for ∇KL(π_S‖π_T); k1-pathwise has zero mean; k3-pathwise
    is ∇KL(π_T‖π_S), the forward KL's gradient (ops.rollout_token). A 20,000-draw
    average of the k3-pathwise gradient agrees."""
    zs, zt, ls, lt = _dists(seed=13)
    grads = {}
    for kind in ("forward", "reverse"):
        x = zs.clone().requires_grad_()
        (grads[kind],) = torch.autograd.grad(token_divergence(x, zt, kind=kind, tau_s=TAU_S, tau_t=TAU_T,
                                                              compute_dtype=F64), x)
    # two float64 computations: ρ on the magnitudes of each token's gradient (``magnitudes``), in expectation
    # under π_S, and of the autograd gradient (divergence_scale's m)
    V = len(zs)
    rho = tol.row(V, F64, tol.logit_range((zs, TAU_S), (zt, TAU_T))) + tol.gamma(V + 2, F64)
    for est, how, kind in (("k1", "score", "reverse"), ("k2", "pathwise", "reverse"), ("k3", "pathwise", "forward")):
        M = tol.estimator_magnitudes(zs.expand(V, V), zt.expand(V, V), estimator=est, k_gradient=how, targets=torch.arange(V))[1]
        err = rho * ((ls.exp().unsqueeze(1) * M).sum(0)
                     + tol.divergence_scale(zs, zt, kind=kind, tau_s=TAU_S, tau_t=TAU_T)[2])
        assert ((_expected_gradient(est, how, ls, lt) - grads[kind]).abs() <= err).all()
    # k1-pathwise: Σ_y π_S(y)(e_y − π_S)/τ_S = (π_S − π_S Σ π_S)/τ_S, 0 up to the sum's and products' roundings
    assert _expected_gradient("k1", "pathwise", ls, lt).abs().max().item() <= tol.gamma(V + 2, F64) / TAU_S
    assert (_expected_gradient("k3", "score", ls, lt) - grads["reverse"]).norm() > 1e-2 * grads["reverse"].norm()
    n = 20_000
    y = torch.multinomial(ls.exp().expand(n, -1), 1, replacement=True, generator=torch.Generator().manual_seed(4)).T
    leaf = zs.clone().requires_grad_()
    loss = rollout_token_loss(leaf.expand(1, n, -1), zt.expand(1, n, -1), y, torch.ones(1, n, dtype=torch.bool),
                              estimator="k3", tau_s=TAU_S, tau_t=TAU_T, reduction="token_mean")
    (mc,) = torch.autograd.grad(loss, leaf)
    assert ((mc - grads["forward"]).norm() / grads["forward"].norm()).item() < 0.05


def test_the_configs_names_are_the_ops_names() -> None:
    """One set of names from the YAML to the kernels: each `config.LossConfig` ``Literal`` is the
    registry's tuple, which ``ops.kl`` re-exports (the same object), and every field the loss
    adapter (`loss.divergence_kwargs`) hands the ops is a parameter of the ops by its field name."""
    import inspect
    import typing

    from distillab import ops, registry
    from distillab.config import LossConfig
    from distillab.recipe.loss import divergence_kwargs
    from distillab.ops import chunked, kl

    fields = LossConfig.model_fields
    for field, name, values in (
        ("kind", "KINDS", ("forward", "reverse", "jsd")),
        ("estimator", "ESTIMATORS", ("full", "sampled", "topk", "k1", "k2", "k3")),
        ("topk_source", "TOPK_SOURCES", ("teacher", "student", "union")),
        ("k_gradient", "K_GRADIENTS", ("auto", "score", "pathwise")),
        ("reduction", "REDUCTIONS", ("seq_mean", "token_mean", "sum")),
    ):
        assert typing.get_args(fields[field].annotation) == getattr(registry, name) == values, field
        assert getattr(kl, name) is getattr(registry, name), name
    assert ops.ESTIMATORS is registry.ESTIMATORS and kl.SAMPLED_KINDS is registry.SAMPLED_KINDS
    assert kl.ROLLOUT_ESTIMATORS is registry.ROLLOUT_ESTIMATORS
    L = LossConfig(kind="jsd", beta=0.25, estimator="topk", top_k=5, topk_source="union", topk_tail=True)
    kw = divergence_kwargs(L)
    assert kw == {"kind": "jsd", "tau_s": 1.0, "tau_t": 0.5, "beta": 0.25, "estimator": "topk", "top_k": 5,
                  "topk_source": "union", "topk_tail": True, "k_gradient": "auto"}
    for fn in (kl.estimator_loss, chunked.chunked_distill_loss):
        assert set(kw) <= set(inspect.signature(fn).parameters), fn.__name__
    assert set(divergence_kwargs(L, divergence=False)) - {"estimator"} <= set(
        inspect.signature(kl.topk_divergence).parameters) | {"k_gradient"}
    assert set(divergence_kwargs(L, divergence=False)) <= set(inspect.signature(chunked.estimator_rows).parameters)


def test_the_estimator_kind_rule_is_one_function() -> None:
    """`registry.check_estimator` is the rule: the config, ``ops.kl.estimator_loss`` and
    ``ops.chunked.chunked_distill_loss`` give its message for the same pair."""
    from distillab.config import LossConfig
    from distillab.ops.chunked import chunked_distill_loss
    from distillab.registry import check_estimator

    z, m = torch.zeros(1, 2, 4), torch.ones(1, 2, dtype=torch.bool)
    h, w = torch.zeros(1, 2, 3), torch.zeros(4, 3)
    for est, kind in (("k2", "forward"), ("sampled", "jsd")):
        with pytest.raises(ValueError) as rule:
            check_estimator(est, kind)
        with pytest.raises(ValueError) as e:
            estimator_loss(z, z, m, estimator=est, kind=kind, targets=torch.zeros(1, 2, dtype=torch.long))
        assert str(e.value) == str(rule.value)
        with pytest.raises(ValueError) as e:
            chunked_distill_loss(h, w, h, w, m, estimator=est, kind=kind, targets=torch.zeros(1, 2, dtype=torch.long))
        assert str(e.value) == str(rule.value)
        with pytest.raises(ValueError, match="loss.estimator") as e:
            LossConfig(estimator=est, kind=kind)
        check = "estimates the reverse KL" if est == "k2" else "'forward' and 'reverse' only"
        assert check in str(e.value) and check in str(rule.value)
