r"""Float tolerances of the tests, derived from the format and the length of the computation, so
the suite passes on any CPU (any instruction set, so any vector width, summation order and
vectorised ``exp``/``log``), never from what one machine happens to give.

Rounding model
--------------
The standard model (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., 2002,
§2.2, eq. (2.4)): each basic operation is exact, then rounded, fl(x op y) = (x op y)(1 + δ) with
|δ| ≤ u, the unit roundoff of the format, ``u(dtype)``: 2^-53 (float64), 2^-24 (float32), 2^-11
(float16), 2^-8 (bfloat16) (Higham Table 2.1; ``torch.finfo(dtype).eps`` is 2u). An elementary
function (exp, log, log1p, softplus) counts as two roundings: the vectorised libraries PyTorch
picks per instruction set (SLEEF's ``u10`` functions) and glibc are within 1 ulp ≤ 2u.

A sum or dot product of n terms, in any order (Higham Lemma 3.1, eqs. (3.4)–(3.5); §4.2, (4.4)):

    |fl(Σ x_i) − Σ x_i| ≤ γ_{n−1} Σ |x_i|,   γ_n = n u / (1 − n u);

any order is what makes it hold on every CPU (an instruction set changes a reduction's blocking
and vector width, not the bound). For long reductions the worst case is far from what happens, so
``gamma`` takes the smaller of it and Higham and Mary's probabilistic bound ("A New Approach to
Probabilistic Rounding Error Analysis", SIAM J. Sci. Comput. 41(5), 2019, Thms. 2.4 and 3.1):
with rounding errors independent of mean zero, the same error is within
γ̃_n(λ) = exp(λ√n u + n u²/(1 − u)) − 1 ≈ λ√n u of Σ|x_i| with probability ≥ 1 − 2n e^{−λ²(1−u)²/2};
λ follows from ``FAILURE`` (10^-9). Two computations of one value (two code paths, or a path and
its float64 reference) differ by at most the sum of their bounds (``both``).

Rows of log-softmax divergences
-------------------------------
A log-probability ℓ = log_softmax(z/τ) is computed as a = z/τ, d = a − max a, ℓ = d − log Σ exp d:
its absolute error is at most u(|a| + |max a| + |d| + |ℓ|) from the elementwise steps, plus the
relative error of Σ exp d (γ_{V−1} and 2u per exp) and of the log: with A = max|a_S| + max|a_T|
(``logit_range``; −inf entries excluded) every log-probability of a student/teacher pair is within

    ρ = ``row(V, dtype, A)`` = γ_{2V}(dtype) + (16 + 3A) u

of exact, and so is any quantity a row computes from them (a KL or JSD(β), a gradient entry, a
statistic), per unit of its magnitude: the row's own sum of V terms adds the second γ_V, and the
16 counts the elementwise roundings on the longest path (scale, subtract, exp, log, subtract; the
weight's exp, the difference, the product; JSD's logaddexp and coefficients), an elementary
function as two. ``divergence_scale`` gives those magnitudes from the float64 reference itself:
a value D = Σ_v t_v errs by at most ρ S with S = 2 + Σ_v |t_v| (the 2: each log-softmax's shift,
which moves D one for one), and a gradient entry g_v by ρ m_v (forward (π_S − π_T)/τ_S:
m = (π_S + π_T)/τ_S; reverse π_S (r − D)/τ_S: m = π_S(|r| + S)/τ_S; JSD (1 − β) π_S (h − Σ π_S h)/τ_S
with h = −softplus(ℓ_T − ℓ_S + log(β/(1 − β))): m = 2 (1 − β) π_S (|h| + Σ π_S |h|)/τ_S, since
softplus' ≤ softplus makes h's error relative). A reduction over N rows adds γ_{N+2} (the sum,
the division, a weight); a logit from a matmul carries ``matmul_err``, which ``row`` takes as
``dz`` (every log-probability moves by at most 2 max|δz|/τ). ``loss_bounds`` puts these together
for a reduced loss on logits, ``linear_loss_bounds`` for one on hidden states and lm_heads (the
chunked op), ``estimator_magnitudes`` gives the magnitudes of the other estimators.

Other computations
------------------
- float64 values of a few operations (statistics, schedules, shares): ``approx64``, within γ_n of
  the counted roundings, the decimal literals' own included.
- Networks: ``forward_err`` measures a model's float32 (or bf16) output error against the same
  model in float64 on the inputs at hand; two computations of the same output in that dtype are
  compared within 4E, log-probabilities within ``logprob_gap``; ``backward_gains`` carries a
  relative error of an output gradient to each parameter's gradient.
- Not rounding, and so not from here: Monte Carlo checks (a few standard errors of the draws),
  thresholds that show a check can fail (a value differs by more than x), mathematical limits
  (a quantity linear in ε is below x at ε = 1e-6), and numbers a test reads from printed output
  (half a unit of the last printed digit). Bitwise assertions (determinism, resume, k = 0 against
  the synchronous trial) stay bitwise.
"""

from __future__ import annotations

import math

import torch

#: probability that one bound of ``gamma`` fails by chance (Higham and Mary's model)
FAILURE = 1e-9

_BITS = {"float64": 53, "float32": 24, "float16": 11, "bfloat16": 8}


def u(dtype=torch.float64) -> float:
    """Unit roundoff 2^-p of ``dtype`` (a torch dtype or its name; p significand bits with the hidden one)."""
    name = str(dtype).rsplit(".", 1)[-1]
    if name not in _BITS:
        raise ValueError(f"no unit roundoff for dtype {dtype!r}; known: {', '.join(_BITS)}")
    return 2.0 ** -_BITS[name]


def gamma(n: int, dtype=torch.float64) -> float:
    """Relative bound of n roundings, or of a sum or dot product of n + 1 terms relative to Σ|x_i| in any
    order: min(γ_n, γ̃_n(λ)) of the module docstring, λ from ``FAILURE``."""
    n, uu = max(int(n), 1), u(dtype)
    worst = n * uu / (1 - n * uu) if n * uu < 1 else math.inf
    lam = math.sqrt(2 * math.log(2 * n / FAILURE)) / (1 - uu)
    return min(worst, math.expm1(lam * math.sqrt(n) * uu + n * uu * uu / (1 - uu)))


def both(bound, n, dtype, *rest) -> float:
    """``bound(n, dtype, *rest) + bound(n, float64, *rest)`` (``bound``: ``gamma`` or ``row``): the gap
    between a computation in ``dtype`` and its float64 reference, both in error."""
    return bound(n, dtype, *rest) + bound(n, torch.float64, *rest)


def logit_range(*pairs, rows: bool = False):
    """A = Σ over ``(z, tau)`` pairs of max |z/τ| over the finite entries (0 if none): one float, or with
    ``rows`` a tensor (...) of each row's (max over the last dim)."""
    total = 0.0
    for z, tau in pairs:
        a = (z.detach().double() / tau).abs()
        a = torch.where(torch.isfinite(a), a, 0.0)
        total = total + (a.amax(-1) if rows else float(a.max()) if a.numel() else 0.0)
    return total


def row(V: int, dtype, A, dz=0.0):
    """ρ: the bound, per unit of magnitude, on any quantity computed from a student/teacher pair of
    log-softmax rows over V entries with ``logit_range`` A, in ``dtype`` (module docstring); ``dz`` is
    Σ over the pair of max|δz|/τ, the logits' own errors (``matmul_err``). A float, or a tensor of one
    per row where A or dz is one."""
    return gamma(2 * V, dtype) + (16 + 3 * A) * u(dtype) + 2 * dz


def matmul_err(a: torch.Tensor, b: torch.Tensor, dtype, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Entrywise bound on the error of ``a @ b (+ bias)`` computed in ``dtype`` from exact (float64)
    ``a`` (..., k), ``b`` (k, n): γ_{k+1} (|a| @ |b| + |bias|) (Higham eq. (3.13), and the bias' sum)."""
    mag = a.detach().double().abs() @ b.detach().double().abs()
    if bias is not None:
        mag = mag + bias.double().abs()
    return gamma(a.shape[-1] + 1, dtype) * torch.nan_to_num(mag, nan=0.0)


def divergence_scale(zs: torch.Tensor, zt: torch.Tensor, *, kind: str, tau_s: float, tau_t: float,
                     beta: float = 0.5) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(D, S, m)`` of one divergence per position, in float64 from the logits ``zs``, ``zt`` (..., V):
    its value D (...), the magnitude S = 2 + Σ_v |t_v| (...) its error is relative to, and m (..., V)
    that of each entry of its gradient w.r.t. z_S (module docstring). ``kind`` forward | reverse | jsd;
    β = 0 and 1 are the KLs, as in the ops. Log-probabilities are floored as the ops floor them."""
    from distillab.ops.divergence import LOGPROB_FLOOR

    ls = torch.log_softmax(zs.detach().double() / tau_s, -1)
    lt = torch.log_softmax(zt.detach().double() / tau_t, -1)
    ps, pt = ls.exp(), lt.exp()
    ls, lt = ls.clamp_min(LOGPROB_FLOOR), lt.clamp_min(LOGPROB_FLOOR)
    if kind == "jsd" and beta in (0.0, 1.0):
        kind = "forward" if beta == 0.0 else "reverse"
    if kind == "forward":
        t = pt * (lt - ls)
        D = t.sum(-1)
        S = 2 + t.abs().sum(-1)
        return D, S, (ps + pt) / tau_s
    if kind == "reverse":
        t = ps * (ls - lt)
        D = t.sum(-1)
        S = 2 + t.abs().sum(-1)
        return D, S, ps * ((ls - lt).abs() + S.unsqueeze(-1)) / tau_s
    log_m = torch.logaddexp(lt + math.log(beta), ls + math.log1p(-beta))
    t = torch.cat([beta * pt * (lt - log_m), (1 - beta) * ps * (ls - log_m)], -1)
    h = torch.nn.functional.softplus(lt - ls + math.log(beta) - math.log1p(-beta))
    hbar = (ps * h).sum(-1, keepdim=True)
    return t.sum(-1), 2 + t.abs().sum(-1), 2 * (1 - beta) * ps * (h + hbar) / tau_s


def norm_ratio(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a‖ / ‖b‖ (float64), e.g. an entrywise error bound over the reference it bounds."""
    return float(a.double().norm() / b.double().norm().clamp_min(1e-300))


def loss_bounds(zs: torch.Tensor, zt: torch.Tensor, coef: torch.Tensor, *, kind: str, tau_s: float, tau_t: float,
                beta: float = 0.5, dtype, dz: float = 0.0, ref: bool = True) -> tuple[float, torch.Tensor]:
    """Bounds on a reduced divergence L = Σ_i c_i D_i of the rows ``zs``, ``zt`` (N, V) (exact logits) with
    coefficients ``coef`` (N,) (``row_coefficients``), computed in ``dtype``; ``ref`` adds the float64
    reference's own bound (the gap to it). Returns ``(value, grad)``: an absolute bound on L and an
    entrywise (N, V) bound on its gradient c_i ∂D_i/∂z_S; ``dz`` as in ``row``."""
    _, S, m = divergence_scale(zs, zt, kind=kind, tau_s=tau_s, tau_t=tau_t, beta=beta)
    A = logit_range((zs, tau_s), (zt, tau_t), rows=True)  # (N,)
    V, N = zs.shape[-1], zs.shape[0]
    rho = row(V, dtype, A, dz) + gamma(N + 2, dtype)
    if ref:
        rho = rho + row(V, torch.float64, A) + gamma(N + 2, torch.float64)
    c = coef.detach().double().abs()
    return float((rho * c * S).sum()), (rho * c).unsqueeze(-1) * m


def estimator_magnitudes(zs: torch.Tensor, zt: torch.Tensor, *, estimator: str, kind: str = "reverse", beta: float = 0.5,
                         tau_s: float = 1.0, tau_t: float = 0.5, targets: torch.Tensor | None = None, top_k: int = 64,
                         topk_source: str = "teacher", topk_tail: bool = False,
                         k_gradient: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """``(E, M)``: the magnitudes (float64) that the rounding bound ρ of a row (``row``)
    multiplies for an estimator's per-position value, E (N,), and each entry of its gradient w.r.t. z_S,
    M (N, V). Top-k: a divergence over the support (renormalised) or the support and a tail bucket,
    whose terms the full vocabulary's, the support's and one more (|q log(q/p)| ≤ Σ_tail |t| + 1) bound,
    with the generic gradient magnitude (π_S + π_T)(2 + |ℓ_S − ℓ_T| + E)/τ_S. k1/k2/k3: x = ℓ_S(y) − ℓ_T(y)
    errs by 2ρ, so k by 2|k'(x)|ρ (+3u|k|), the coefficient a by 2|a'(x)|ρ, and a (e_y − π_S)/τ_S by
    (|δa| |e_y − π_S| + |a| π_S ρ)/τ_S. ``full``: ``divergence_scale``'s S and m. ``sampled`` (one draw y per
    position, not given): forward −ℓ_S(y), gradient (π_S − e_y)/τ_S; reverse x ℓ_S(y), gradient x (e_y − π_S)/τ_S;
    bounded over every y."""
    from distillab.ops.divergence import LOGPROB_FLOOR
    from distillab.ops.rollout_token import resolve_k_gradient
    from distillab.ops.topk import topk_support

    zs, zt = zs.detach().double(), zt.detach().double()
    ls, lt = torch.log_softmax(zs / tau_s, -1), torch.log_softmax(zt / tau_t, -1)
    ps, pt = ls.exp(), lt.exp()
    if estimator == "full":
        _, S, m = divergence_scale(zs, zt, kind=kind, tau_s=tau_s, tau_t=tau_t, beta=beta)
        return S, m
    if estimator == "sampled":
        fs, ft = ls.clamp_min(LOGPROB_FLOOR), lt.clamp_min(LOGPROB_FLOOR)
        xmax = (fs - ft).abs().amax(-1, keepdim=True)
        if kind == "forward":
            return 1 + fs.abs().amax(-1), (ps + 1) / tau_s
        return (2 + xmax + 3 * fs.abs().amax(-1, keepdim=True)).squeeze(-1), (2 + xmax) * (ps + 1) / tau_s
    if estimator == "topk":
        sup = topk_support(zs, zt, top_k=top_k, topk_source=topk_source)
        ninf = torch.tensor(float("-inf"), dtype=torch.float64)
        kw = dict(kind=kind, beta=beta, tau_s=tau_s, tau_t=tau_t)
        E = (divergence_scale(zs, zt, **kw)[1] + 1
             + divergence_scale(torch.where(sup, zs, ninf), torch.where(sup, zt, ninf), **kw)[1])
        r = (ls.clamp_min(LOGPROB_FLOOR) - lt.clamp_min(LOGPROB_FLOOR)).abs()
        return E, (ps + pt) * (2 + r + E.unsqueeze(-1)) / tau_s
    y = targets.unsqueeze(-1)
    x = (ls.gather(-1, y) - lt.gather(-1, y)).squeeze(-1).clamp(-1e4, 1e4)
    k, d1, d2 = {"k1": (x, torch.ones_like(x), torch.zeros_like(x)),
                 "k2": (0.5 * x * x, x, torch.ones_like(x)),
                 "k3": (torch.expm1(-x) + x, -torch.expm1(-x), torch.exp(-x))}[estimator]
    a, da = (k, d1) if resolve_k_gradient(estimator, k_gradient) == "score" else (d1, d2)
    onehot = torch.zeros_like(ps).scatter_(-1, y, 1.0)
    E = 2 * d1.abs() + k.abs()  # per unit of ρ: x errs by 2ρ; k's own roundings (3u|k|) are within ρ|k|
    return E, (2 * da.abs().unsqueeze(-1) * (onehot - ps).abs() + (a.abs().unsqueeze(-1) * ps)) / tau_s


def stats_scale(zs: torch.Tensor, zt: torch.Tensor, *, tau_s: float, tau_t: float) -> torch.Tensor:
    """(..., 4) magnitudes of the ``STAT_NAMES`` columns (forward KL, reverse KL, H(π_T), H(π_T, π_S)) of
    each position, as ``divergence_scale``'s S: 2 + Σ_v |term_v| (float64, log-probabilities floored)."""
    from distillab.ops.divergence import LOGPROB_FLOOR

    ls = torch.log_softmax(zs.detach().double() / tau_s, -1)
    lt = torch.log_softmax(zt.detach().double() / tau_t, -1)
    pt = lt.exp()
    ls, lt = ls.clamp_min(LOGPROB_FLOOR), lt.clamp_min(LOGPROB_FLOOR)
    cols = [pt * (lt - ls), ls.exp() * (ls - lt), pt * lt, pt * ls]
    return torch.stack([2 + c.abs().sum(-1) for c in cols], -1)


def linear_logits(hs: torch.Tensor, ws: torch.Tensor, bs: torch.Tensor | None, ht: torch.Tensor, wt: torch.Tensor,
                  bt: torch.Tensor | None, *, tau_s: float, tau_t: float, dtype=torch.float32,
                  ref: bool = True) -> tuple[torch.Tensor, torch.Tensor, float]:
    """``(zs, zt, dz)``: the exact (float64) logits h Wᵀ + b of rows ``hs``, ``ht`` (N, H) and ``dz`` for
    ``row``: Σ over the pair of the largest ``matmul_err`` over τ, in ``dtype`` (and, with ``ref``, in the
    float64 reference)."""
    h, w, h_t, w_t = (x.detach().double() for x in (hs, ws, ht, wt))
    b, b_t = (None if x is None else x.detach().double() for x in (bs, bt))
    zs, zt = h @ w.T + (0 if b is None else b), h_t @ w_t.T + (0 if b_t is None else b_t)

    def dz(x, y, bias, tau):
        err = matmul_err(x, y.T, dtype, bias) + (matmul_err(x, y.T, torch.float64, bias) if ref else 0)
        return float(err[torch.isfinite(err)].max()) / tau

    return zs, zt, dz(h, w, b, tau_s) + dz(h_t, w_t, b_t, tau_t)


def linear_grad_bounds(hs: torch.Tensor, ws: torch.Tensor, gz: torch.Tensor, G: torch.Tensor,
                       dtype=torch.float32) -> list[float]:
    """Relative norm-wise bounds ``[hidden, weight, bias]`` on the gradients gz W, gzᵀ h and Σ_i gz_i of a
    loss of the logits z = h Wᵀ + b, given its exact gradient ``gz`` (N, V) w.r.t. the logits and an
    entrywise bound ``G`` on that gradient's error: products of V and of N terms, a sum of N rows."""
    h, w, gz, a = hs.detach().double(), ws.detach().double(), gz.double(), gz.double().abs()
    N, V = gz.shape
    errs = (G @ w.abs() + gamma(V + 1, dtype) * a @ w.abs(), G.T @ h.abs() + gamma(N + 1, dtype) * a.T @ h.abs(),
            G.sum(0) + gamma(N, dtype) * a.sum(0))
    return [norm_ratio(e, r) for e, r in zip(errs, (gz @ w, gz.T @ h, gz.sum(0)))]


def linear_loss_bounds(hs: torch.Tensor, ws: torch.Tensor, bs: torch.Tensor | None, ht: torch.Tensor,
                       wt: torch.Tensor, bt: torch.Tensor | None, coef: torch.Tensor, *, kind: str, beta: float = 0.5,
                       tau_s: float = 1.0, tau_t: float = 0.5, dtype=torch.float32,
                       ref: bool = True) -> tuple[float, list[float]]:
    """``loss_bounds`` of the logits z = h Wᵀ + b of rows ``hs``, ``ht`` (N, H) (a chunked fused-linear
    loss, ``ops.chunked``): the loss's absolute bound and ``linear_grad_bounds`` of its gradients."""
    from distillab.ops.divergence import token_divergence

    kw = dict(kind=kind, beta=beta, tau_s=tau_s, tau_t=tau_t)
    zs, zt, dz = linear_logits(hs, ws, bs, ht, wt, bt, tau_s=tau_s, tau_t=tau_t, dtype=dtype, ref=ref)
    value, G = loss_bounds(zs, zt, coef, dtype=dtype, dz=dz, ref=ref, **kw)
    x = zs.clone().requires_grad_()
    (gz,) = torch.autograd.grad((coef.double() * token_divergence(x, zt, compute_dtype=torch.float64, **kw)).sum(), x)
    return value, linear_grad_bounds(hs, ws, gz, G, dtype)


def backward_gains(h: torch.Tensor, params: dict[str, torch.Tensor], g: torch.Tensor, *, probes: int = 16,
                   seed: int = 0) -> dict[str, float]:
    """How much each parameter's gradient amplifies a relative error of the output gradient ``g`` of ``h``:
    the gradient of parameter p is J_p g, with J_p the backward of the graph from p to ``h`` (kept with
    ``retain_graph``), the same float32 code whatever computed g. An error δ of g in a random direction
    (the rounding model of Higham and Mary) moves it by about ‖J_p‖_F ‖δ‖/√dim h, so relative to ‖J_p g‖
    its relative error grows by (‖J_p‖_F/√dim h)(‖g‖/‖J_p g‖); ‖J_p‖_F² = E‖J_p v‖² for v ~ N(0, I)
    (Hutchinson's estimator), from ``probes`` draws. Returned times 4, which covers the estimate's spread
    and ‖J_p δ‖'s around its mean. ``params``: name → leaf tensor."""
    names = list(params)
    gen = torch.Generator().manual_seed(seed)

    def vjp(v):
        out = torch.autograd.grad(h, [params[n] for n in names], grad_outputs=v, retain_graph=True, allow_unused=True)
        return [torch.zeros_like(params[n]) if o is None else o.double() for n, o in zip(names, out)]

    sq = [0.0] * len(names)
    for _ in range(probes):
        v = torch.randn(h.shape, generator=gen, dtype=torch.float64).to(h.dtype)
        for i, o in enumerate(vjp(v)):
            sq[i] += float(o.pow(2).sum()) / probes
    dim, gn = h.numel(), float(g.double().norm())
    return {n: 4 * math.sqrt(s / dim) * gn / max(float(o.norm()), 1e-300) for n, s, o in zip(names, sq, vjp(g.to(h.dtype)))}


def approx64(expected, n: int, scale: float = 1.0):
    """``pytest.approx(expected)`` for float64 values (Python floats, Polars Float64, float64 tensors'
    items) computed by n roundings, the decimal literals' own included, from inputs of magnitude at most
    ``scale``: within γ_n (float64) relative to ``expected`` or γ_n · ``scale`` absolute, whichever is
    larger (a difference, or a value near 0, errs relative to its inputs, not to itself). Count a sum or
    mean of k values as k, a product, quotient or square root as 1, an elementary function as 2."""
    import pytest

    return pytest.approx(expected, rel=gamma(n), abs=gamma(n) * scale)


def forward_err(fn, model, *, dtype=torch.float32) -> float:
    """E: the largest rounding error of a model's output, ``fn(model)`` (a tensor; e.g. the logits of given
    inputs), computed in ``dtype``, measured against a float64 copy of the model (the reference: its own
    error is 2^-29 times smaller), over the finite entries.

    A network's forward error follows from its products' bounds (Higham eq. (3.13), layer after layer) times
    how the layers amplify it, which is the model's own; measured against float64 on the inputs at hand it
    is exactly this computation's error on this CPU. Another computation of the same output in ``dtype`` (a
    padded batch, a cached decode step, a compiled or sharded pass, another instruction set) does the same
    operations in another order or blocking: the same bounds hold for it and, under Higham and Mary's model,
    its error has the same distribution, so two of them are compared within 2E each: 4E. A log-probability
    from logits within E errs by at most 2E more than its log-softmax's own ``row`` bound."""
    import copy

    ref = copy.deepcopy(model).to(torch.float64)
    with torch.no_grad():
        got, want = fn(model).double(), fn(ref).double()
    fin = torch.isfinite(want)
    return float((got[fin] - want[fin]).abs().max()) if fin.any() else 0.0


def logprob_gap(model, seqs: torch.Tensor, attn: torch.Tensor, tau: float) -> float:
    """The gap allowed between two float32 computations (a cached decode, a teacher-forced pass) of the
    log-probabilities at temperature τ that ``model`` gives the tokens of ``seqs`` (B, T) under ``attn``:
    each within 2 (2E)/τ of its logits' error (``forward_err``) and its row's ``row`` bound."""
    from distillab.rollout.types import position_ids

    kw = dict(input_ids=seqs, attention_mask=attn, position_ids=position_ids(attn))
    E = forward_err(lambda m: m(**kw).logits, model)
    with torch.no_grad():
        A = logit_range((model(**kw).logits, tau))
    return 2 * (2 * 2 * E / tau + row(model.config.vocab_size, torch.float32, A))
