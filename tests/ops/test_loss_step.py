"""loss.loss_step with each LossConfig.impl on tiny Llama/Qwen2 models: the chunked and
Triton paths (final hidden states + lm_head) give the reference path's loss, gradients
and diagnostics; vocab-size mismatches are errors unless LossConfig.pad_vocab."""

from __future__ import annotations

import importlib.util
import math

import _tolerance as tol
import pytest
import torch
from _helpers import EngineStandIn, random_rollouts
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from distillab.config import LossConfig, TrialConfig
from distillab.recipe.loss import loss_step
from distillab.ops.kl import distill_loss, row_coefficients, token_divergence
from distillab.rollout.types import Rollouts, pack_rollouts, position_ids
from distillab.recipe.teacher import LocalTeacher

V, PAD = 41, 0


def _models(teacher_vocab=V, student_vocab=V):
    torch.manual_seed(0)
    teacher = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=teacher_vocab, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, pad_token_id=PAD,
    )).eval()
    student = LlamaForCausalLM(LlamaConfig(
        vocab_size=student_vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, pad_token_id=PAD, tie_word_embeddings=False,
    ))
    teacher.requires_grad_(False)
    return teacher, student


def _rollouts():
    return random_rollouts(V, 1)  # (prompt, completion) lengths (3, 5), (6, 2), (2, 0), (4, 7)


def _run(impl, kind="forward", teacher_vocab=V, student_vocab=V, pad=False):
    teacher, student = _models(teacher_vocab, student_vocab)
    trial = TrialConfig(loss=LossConfig(kind=kind, impl=impl, pad_vocab=pad))
    loss, diag = loss_step(trial, EngineStandIn(student), LocalTeacher(teacher), _rollouts(), PAD, torch.Generator().manual_seed(0))
    loss.backward()
    grads = {n: p.grad.clone() for n, p in student.named_parameters() if p.grad is not None}
    return loss, diag, grads


def _bounds(kind, teacher_vocab=V, student_vocab=V, beta=0.5, ref=False):
    """Rounding bounds of one loss path against another (``ref``: against float64 on the hidden states),
    from the models' final hidden states on: ``(loss, diagnostics, grads)``, the loss's and each
    diagnostic's absolute bound and each student parameter's relative norm-wise gradient bound
    (tests/_tolerance.py: the lm_head's directly, the others through ``backward_gains``). Two float32
    paths differ by twice one's bound. The student's hidden states are the same float32 code in both."""
    teacher, student = _models(teacher_vocab, student_vocab)
    ro = _rollouts()
    ids, attn, cmask = pack_rollouts(ro.prompt_ids, ro.completion_ids, PAD)
    kw = dict(input_ids=ids, attention_mask=attn, position_ids=position_ids(attn))
    h = student.model(**kw).last_hidden_state  # (B, T, H), with the graph to the parameters
    with torch.no_grad():
        h_t = teacher.model(**kw).last_hidden_state
    rows = cmask.nonzero(as_tuple=True)
    coef = row_coefficients(rows[0], cmask.shape[0])
    W, W_t = student.lm_head.weight.detach(), teacher.lm_head.weight
    if W_t.shape[0] > W.shape[0]:  # pad_vocab: the student's extra rows have logit -inf
        W = torch.cat([W, torch.zeros(W_t.shape[0] - W.shape[0], W.shape[1])])
    bias = None if W_t.shape[0] == student_vocab else torch.cat(
        [torch.zeros(student_vocab), torch.full((W_t.shape[0] - student_vocab,), float("-inf"))])
    k = 2 if not ref else 1
    bkw = dict(kind=kind, beta=beta, tau_s=1.0, tau_t=0.5, ref=ref)
    value, rels = tol.linear_loss_bounds(h[rows].detach(), W, bias, h_t[rows], W_t, None, coef, **bkw)
    zs, zt, dz = tol.linear_logits(h[rows], W, bias, h_t[rows], W_t, None, tau_s=1.0, tau_t=0.5, ref=ref)
    rho = tol.row(W.shape[0], torch.float32, tol.logit_range((zs, 1.0), (zt, 0.5), rows=True), dz)
    if ref:
        rho = rho + tol.row(W.shape[0], torch.float64, tol.logit_range((zs, 1.0), (zt, 0.5), rows=True))
    scale = tol.stats_scale(zs, zt, tau_s=1.0, tau_t=0.5)  # (N, 4): the diagnostics are their token means
    diag = (rho.unsqueeze(-1) * scale).mean(0) + tol.gamma(len(coef) + 1, torch.float32) * scale.mean(0)
    x = zs.clone().requires_grad_()
    (gz,) = torch.autograd.grad((coef.double() * token_divergence(x, zt, compute_dtype=torch.float64, **{
        k_: v for k_, v in bkw.items() if k_ != "ref"})).sum(), x)
    g = torch.zeros(h.shape, dtype=torch.float64)
    g[rows] = gz @ W.double()
    params = {n: p for n, p in student.named_parameters() if n != "lm_head.weight"}
    gains = tol.backward_gains(h, params, g)
    grads = {n: k * rels[0] * gain for n, gain in gains.items()} | {"lm_head.weight": k * rels[1]}
    names = ("kl/forward", "kl/reverse", "teacher/entropy", "teacher/cross_entropy")
    return k * value, {n: k * float(d) for n, d in zip(names, diag)}, grads


def _impls():
    out = ["chunked"]
    if importlib.util.find_spec("triton") is not None:
        out.append("triton")
    return out


@pytest.mark.parametrize("kind", ["forward", "reverse"])
@pytest.mark.parametrize("impl", _impls())
def test_fused_impls_match_reference(impl, kind):
    if impl == "triton" and not torch.cuda.is_available():
        from distillab.ops.triton_kl import check_triton_usable

        try:
            check_triton_usable("cpu")
        except RuntimeError as e:  # the interpreter is decided at import; see tests/ops/conftest.py
            pytest.skip(str(e))
    ref_loss, ref_diag, ref_grads = _run("reference", kind)
    loss, diag, grads = _run(impl, kind)
    value, diag_err, grad_err = _bounds(kind)
    assert abs(loss.item() - ref_loss.item()) <= value
    assert diag.keys() == ref_diag.keys()
    for k in diag:
        assert abs(diag[k] - ref_diag[k]) <= diag_err[k], k
    assert grads.keys() == ref_grads.keys() and "lm_head.weight" in grads
    for n, g in grads.items():
        assert ((g - ref_grads[n]).norm() / ref_grads[n].norm()).item() <= grad_err[n], n


@pytest.mark.parametrize("kind", ["forward", "reverse"])
def test_diagnostics_when_every_completion_is_empty(kind):
    """A worker's batch of empty completions (every rollout stopped at once): no token to
    score, so the loss is 0 with zero gradients and every diagnostic is 0 on each
    implementation, as ``ops.kl.entropy_and_cross_entropy`` defines for no masked token
    (the reference path returned NaN kl/forward and kl/reverse: a mean over no rows)."""
    teacher, student = _models()
    ro = _rollouts()
    empty = Rollouts(ro.prompt_ids, [[] for _ in ro.prompt_ids], [[] for _ in ro.prompt_ids], ro.finish_reasons)
    for impl in ("reference", "chunked"):
        trial = TrialConfig(loss=LossConfig(kind=kind, impl=impl))
        loss, diag = loss_step(trial, EngineStandIn(student), LocalTeacher(teacher), empty, PAD, torch.Generator().manual_seed(0))
        assert loss.item() == 0.0, impl
        assert diag == {"kl/forward": 0.0, "kl/reverse": 0.0, "teacher/entropy": 0.0,
                        "teacher/cross_entropy": 0.0}, impl


@pytest.mark.parametrize("impl", ["reference", "chunked"])
@pytest.mark.parametrize("beta", [0.0, 0.3, 1.0])
def test_jsd_loss_step_equals_the_float64_reference(impl, beta):
    """loss.kind jsd: loss_step's loss, its diagnostics and the student's lm_head gradient
    equal JSD(β) computed by ops.kl in float64 on the models' own logits (β = 0 and 1 are
    the forward and reverse KL exactly)."""
    teacher, student = _models()
    ro = _rollouts()
    trial = TrialConfig(loss=LossConfig(kind="jsd", beta=beta, impl=impl))
    loss, diag = loss_step(trial, EngineStandIn(student), LocalTeacher(teacher), ro, PAD, torch.Generator().manual_seed(0))
    loss.backward()
    grad = student.lm_head.weight.grad.clone()

    ids, attn, cmask = pack_rollouts(ro.prompt_ids, ro.completion_ids, PAD)
    kw = dict(input_ids=ids, attention_mask=attn, position_ids=position_ids(attn))
    student.zero_grad()
    h = student.model(**kw).last_hidden_state.double()  # (B, T, H)
    w = student.lm_head.weight.double().detach().requires_grad_(True)
    with torch.no_grad():
        t_logits = teacher(**kw).logits.double()
    ref = distill_loss(h.detach() @ w.T, t_logits, cmask, kind="jsd", beta=beta, tau_s=1.0, tau_t=0.5,
                       compute_dtype=torch.float64)
    ref.backward()
    value, diag_err, grad_err = _bounds("jsd", beta=beta, ref=True)
    assert abs(loss.item() - ref.item()) <= value
    assert ((grad.double() - w.grad).norm() / w.grad.norm()).item() <= grad_err["lm_head.weight"]
    if beta in (0.0, 1.0):  # the endpoints are the KL directions, exactly as ops.kl defines them: the same math
        kl = distill_loss((h @ w.T).detach(), t_logits, cmask, kind="forward" if beta == 0.0 else "reverse",
                          compute_dtype=torch.float64)
        assert ref.item() == kl.item()
    s_rows = (h.detach() @ w.detach().T)[cmask]
    fkl = token_divergence(s_rows, t_logits[cmask], kind="forward", tau_s=1.0, tau_t=0.5, compute_dtype=torch.float64)
    assert abs(diag["kl/forward"] - fkl.mean().item()) <= diag_err["kl/forward"]


def test_vocab_mismatch_is_an_error_unless_padded():
    for impl in ("reference", "chunked"):
        with pytest.raises(ValueError) as ei:
            _run(impl, teacher_vocab=V + 7)
        assert str(V) in str(ei.value) and str(V + 7) in str(ei.value)
    ref_loss, ref_diag, _ = _run("reference", teacher_vocab=V + 7, pad=True)
    loss, diag, grads = _run("chunked", teacher_vocab=V + 7, pad=True)
    value, diag_err, _ = _bounds("forward", teacher_vocab=V + 7)
    assert torch.isfinite(loss) and abs(loss.item() - ref_loss.item()) <= value
    assert abs(diag["kl/reverse"] - ref_diag["kl/reverse"]) <= diag_err["kl/reverse"]
    assert grads["lm_head.weight"].shape == (V, 32)


def test_sampled_estimator_stays_on_the_reference_path():
    teacher, student = _models()
    trial = TrialConfig(loss=LossConfig(estimator="sampled", impl="chunked"))
    loss, diag = loss_step(trial, EngineStandIn(student), LocalTeacher(teacher), _rollouts(), PAD, torch.Generator().manual_seed(0))
    assert torch.isfinite(loss) and set(diag) >= {"kl/forward", "kl/reverse"}


# --------------------------------------------------------------------------------------
# loss.importance_weight: the engine-mismatch weight w(y) inside the training step
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def char_models():
    from distillab.models import build_char_tokenizer, micro_llama_config

    tok = build_char_tokenizer()
    torch.manual_seed(0)
    teacher = LlamaForCausalLM(micro_llama_config(len(tok), 64, 1, 2, 64, 128, tok)).eval()
    torch.manual_seed(1)
    student = LlamaForCausalLM(micro_llama_config(len(tok), 64, 1, 2, 64, 128, tok)).eval()
    return tok, teacher, student


def _iw_trial(policy: str, impl: str, importance_weight: bool) -> TrialConfig:
    return TrialConfig.model_validate({
        "optimizer": {"steps": 3, "prompts_per_step": 4, "train_prompts": 100},
        "rollout": {"policy": policy, "max_tokens": 10},
        "loss": {"impl": impl, "importance_weight": importance_weight},
        "evaluation": {"id_items": 4, "pass_items": 2},
    })


def _logprob_err(trial, student, teacher, rollouts, pad_id) -> float:
    """A bound E on the error of one float32 log-probability (or divergence row, per unit of its magnitude)
    that a float32 forward of these models gives: the row bound ρ (tests/_tolerance.py) with, as the
    logits' own error dz, twice the largest error of the float32 logits against the same models in
    float64 (the reference), over τ: another float32 forward of the same tokens (the sampler's cached
    decode, another batch) errs as much."""
    import copy

    ids, attn, cmask = pack_rollouts(rollouts.prompt_ids, rollouts.completion_ids, pad_id)
    kw = dict(input_ids=ids, attention_mask=attn, position_ids=position_ids(attn))
    with torch.no_grad():
        z = [(m(**kw).logits[cmask].double(), copy.deepcopy(m).double()(**kw).logits[cmask]) for m in (student, teacher)]
    dz = sum(2 * float((a - b).abs().max()) / tau for (a, b), tau in zip(z, (trial.loss.tau_s, trial.loss.tau_t)))
    A = tol.logit_range((z[0][1], trial.loss.tau_s), (z[1][1], trial.loss.tau_t))
    return tol.row(z[0][1].shape[-1], torch.float32, A, dz) + tol.row(z[0][1].shape[-1], torch.float64, A)


def _per_sequence_losses(trial, student, teacher, rollouts, pad_id) -> tuple[list[float], list[float]]:
    """Each rollout's own seq_mean divergence (a batch of one), float64 reference, and the mean over its
    tokens of the magnitude 2 + Σ|t| its rounding is relative to (tests/_tolerance.py)."""
    out, scales = [], []
    for k in range(len(rollouts.completion_ids)):
        ids, attn, cmask = pack_rollouts([rollouts.prompt_ids[k]], [rollouts.completion_ids[k]], pad_id)
        kw = dict(input_ids=ids, attention_mask=attn, position_ids=position_ids(attn))
        with torch.no_grad():
            s, t = student(**kw).logits.double(), teacher(**kw).logits.double()
        out.append(float(distill_loss(s, t, cmask, kind=trial.loss.kind, tau_s=trial.loss.tau_s,
                                      tau_t=trial.loss.tau_t, compute_dtype=torch.float64)))
        scales.append(float(tol.divergence_scale(s[cmask], t[cmask], kind=trial.loss.kind, tau_s=trial.loss.tau_s,
                                                 tau_t=trial.loss.tau_t)[1].mean()))
    return out, scales


@pytest.mark.parametrize("impl", ["reference", "chunked"])
@pytest.mark.parametrize("policy", ["offpd", "onpd"])
def test_importance_weight_in_the_loss(char_models, impl, policy) -> None:
    from distillab.rollout.source import sample_rollouts, step_prompts
    from distillab.tasks.data import train_prompts

    tok, teacher, student = char_models
    trial, plain = _iw_trial(policy, impl, True), _iw_trial(policy, impl, False)
    prompts = step_prompts(train_prompts(trial, tok, 0), 0, 4, 1)
    ro = sample_rollouts(trial, teacher, student, tok, prompts, seed=3)  # q = the trainer's own distribution
    gen = torch.Generator().manual_seed(0)
    eng = EngineStandIn(student)
    loss_w, diag = loss_step(trial, eng, LocalTeacher(teacher), ro, tok.pad_token_id, gen)
    loss_0, _ = loss_step(plain, eng, LocalTeacher(teacher), ro, tok.pad_token_id, gen)
    # the sampler's and the trainer's float32 log-probabilities of a token differ by Δ, |Δ| ≤ 2E, so each
    # ratio e^Δ is 1 within e^{2E} − 1 (and the mean adds γ_N); the weighted loss moves by that share
    E = _logprob_err(trial, student, teacher, ro, tok.pad_token_id)
    n = sum(len(c) for c in ro.completion_ids)
    w_err = math.expm1(2 * E) * (1 + tol.gamma(n + 1, torch.float32)) + tol.gamma(n + 1, torch.float32)
    assert abs(diag["is/weight_mean"] - 1.0) <= w_err  # exp(0) = 1 for every token
    assert abs(float(loss_w.detach()) - float(loss_0.detach())) <= (w_err + tol.gamma(n + 4, torch.float32)) * abs(
        float(loss_0.detach()))

    # engine logprobs off by -1 nat on sequence 0 (ratio e, clipped to 2) and +log 2 on
    # sequence 1 (ratio 1/2): w = (2, 1/2, 1, 1)
    ro.logprobs[0] = [x - 1.0 for x in ro.logprobs[0]]
    ro.logprobs[1] = [x + math.log(2.0) for x in ro.logprobs[1]]
    loss_w, diag = loss_step(trial, eng, LocalTeacher(teacher), ro, tok.pad_token_id, gen)
    ls, S = _per_sequence_losses(trial, student, teacher, ro, tok.pad_token_id)
    expected = (2.0 * ls[0] + 0.5 * ls[1] + ls[2] + ls[3]) / 4
    # float32 rows (E per unit of their magnitude S) and weights, against float64 per-sequence losses of
    # float32 logits from another batch (their own error: in E)
    scale = (2.0 * S[0] + 0.5 * S[1] + S[2] + S[3]) / 4
    assert abs(float(loss_w.detach()) - expected) <= E * scale + w_err * expected
    assert abs(diag["is/weight_mean"] - (2.0 + 0.5 + 1 + 1) / 4) <= w_err * 2.0


# --------------------------------------------------------------------------------------
# the oracle: every loss.oracle_every steps, the estimator against the exact divergence
# --------------------------------------------------------------------------------------

ORACLE_CASES = [  # (impl, loss fields, rollout policy)
    ("chunked", {"kind": "forward"}, "offpd"),
    ("reference", {"kind": "reverse"}, "offpd"),
    ("reference", {"kind": "forward", "estimator": "sampled"}, "offpd"),
    ("chunked", {"kind": "jsd", "beta": 0.3, "estimator": "topk", "top_k": 4, "topk_source": "union",
                 "topk_tail": True}, "offpd"),
    ("chunked", {"kind": "reverse", "estimator": "k3"}, "onpd"),
    ("reference", {"kind": "reverse", "estimator": "k1"}, "onpd"),
]


def _oracle_trial(impl, loss, policy, every=10):
    return TrialConfig.model_validate({"rollout": {"policy": policy},
                                       "loss": {"impl": impl, "oracle_every": every, **loss}})


def _step(trial, step, seed=0):
    teacher, student = _models()
    gen = torch.Generator().manual_seed(seed)
    loss, diag = loss_step(trial, EngineStandIn(student), LocalTeacher(teacher), _rollouts(), PAD, gen, step=step)
    loss.backward()
    return loss, diag, {n: p.grad.clone() for n, p in student.named_parameters() if p.grad is not None}, gen.get_state()


@pytest.mark.parametrize("impl,loss,policy", ORACLE_CASES)
def test_the_oracle_does_not_change_the_training_step(impl, loss, policy):
    """At an oracle step (10 of oracle_every 10) the loss, every parameter gradient and the loss
    generator's state are bitwise those of a step without it; the diagnostics gain estimator/*."""
    trial = _oracle_trial(impl, loss, policy)
    plain_loss, plain_diag, plain_grads, plain_gen = _step(trial, 9)
    loss_v, diag, grads, gen_state = _step(trial, 10)
    assert torch.equal(loss_v, plain_loss) and torch.equal(gen_state, plain_gen)
    assert grads.keys() == plain_grads.keys()
    assert all(torch.equal(grads[n], plain_grads[n]) for n in grads)
    assert not any(k.startswith("estimator/") for k in plain_diag)
    assert set(diag) - set(plain_diag) == {"estimator/bias", "estimator/grad_cos", "estimator/grad_norm_ratio",
                                           "estimator/grad_cos_forward", "estimator/grad_cos_reverse"}
    assert {k: diag[k] for k in plain_diag} == plain_diag
    assert _step(_oracle_trial(impl, loss, policy, every=0), 10)[1] == plain_diag  # 0 = off


def _peer_oracle(trial, seed=0):
    """The oracle's numbers computed independently: full (B, T, V) float64 logits, the estimator's
    loss on them (ops.kl.estimator_loss, the same draws), autograd for both gradients."""
    from distillab.recipe.loss import forward, pack_batch
    from distillab.ops.kl import estimator_loss

    teacher, student = _models()
    L = trial.loss
    batch = pack_batch(_rollouts(), PAD)
    fwd = forward(EngineStandIn(student), LocalTeacher(teacher), batch, False)
    s = (fwd.h_s.detach().double() @ fwd.w_s.detach().double().T).requires_grad_()
    t = fwd.h_t.double() @ fwd.w_t.double().T
    kw = dict(tau_s=L.tau_s, tau_t=L.tau_t, beta=L.beta)
    out = estimator_loss(s, t, batch.cmask, estimator=L.estimator, kind=L.kind, top_k=L.top_k,
                         topk_source=L.topk_source, topk_tail=L.topk_tail, k_gradient=L.k_gradient,
                         targets=batch.targets, generator=torch.Generator().manual_seed(seed), compute_dtype=F64, **kw)
    (g_est,) = torch.autograd.grad(out.loss, s)
    exact = {}
    for k in ("forward", "reverse", L.kind):
        x = s.detach().clone().requires_grad_()
        val = distill_loss(x, t, batch.cmask, kind=k, compute_dtype=F64, **kw)
        exact[k] = (val.item(), torch.autograd.grad(val, x)[0])
    cos = {k: (torch.sum(g_est * g) / (g_est.norm() * g.norm())).item() for k, (_, g) in exact.items()}
    metrics = {"estimator/bias": out.estimate.item() - exact[L.kind][0], "estimator/grad_cos": cos[L.kind],
               "estimator/grad_norm_ratio": (g_est.norm() / exact[L.kind][1].norm()).item(),
               "estimator/grad_cos_forward": cos["forward"], "estimator/grad_cos_reverse": cos["reverse"]}
    return metrics, _oracle_bounds(L, fwd, batch, g_est, exact)


def _oracle_bounds(L, fwd, batch, g_est, exact) -> dict[str, float]:
    """The oracle's float32 numbers against the float64 peer (tests/_tolerance.py): the estimator's gradient
    and each exact gradient err by ε_est, ε_k relative (ρ times their magnitudes, ``estimator_magnitudes``),
    so a cosine by at most 2(ε_est + ε_k), the norm ratio by (ε_est + ε_k) times itself, and the bias by
    the bounds of the estimate and of the exact value."""
    rows = batch.cmask.nonzero(as_tuple=True)
    coef = row_coefficients(rows[0], batch.cmask.shape[0]).double()
    zs, zt, dz = tol.linear_logits(fwd.h_s[rows], fwd.w_s, None, fwd.h_t[rows], fwd.w_t, None, tau_s=L.tau_s,
                                   tau_t=L.tau_t)
    A = tol.logit_range((zs, L.tau_s), (zt, L.tau_t), rows=True)
    rho = (tol.row(zs.shape[-1], torch.float32, A, dz) + tol.row(zs.shape[-1], F64, A)
           + tol.gamma(len(coef) + 2, torch.float32)) * coef
    kw = dict(tau_s=L.tau_s, tau_t=L.tau_t, beta=L.beta)
    E, M = tol.estimator_magnitudes(zs, zt, estimator=L.estimator, kind=L.kind, targets=batch.targets[rows],
                                    top_k=L.top_k, topk_source=L.topk_source, topk_tail=L.topk_tail,
                                    k_gradient=L.k_gradient, **kw)
    eps_est = tol.norm_ratio(rho.unsqueeze(-1) * M, g_est[rows])
    eps, value = {}, {}
    for k in exact:
        _, S, m = tol.divergence_scale(zs, zt, kind=k, **kw)
        eps[k], value[k] = tol.norm_ratio(rho.unsqueeze(-1) * m, exact[k][1][rows]), float((rho * S).sum())
    ratio = float(g_est.norm() / exact[L.kind][1].norm())
    cos = {f"estimator/grad_cos{s}": 2 * (eps_est + eps[k]) + tol.gamma(3 * g_est.numel(), F64)
           for s, k in (("", L.kind), ("_forward", "forward"), ("_reverse", "reverse"))}
    return {"estimator/bias": float((rho * E).sum()) + value[L.kind],
            "estimator/grad_norm_ratio": (eps_est + eps[L.kind]) * ratio, **cos}


F64 = torch.float64


@pytest.mark.parametrize("impl,loss,policy", ORACLE_CASES)
def test_the_oracle_matches_a_float64_peer(impl, loss, policy):
    trial = _oracle_trial(impl, loss, policy)
    _, diag, _, _ = _step(trial, 10)
    want, bound = _peer_oracle(trial)
    for k, v in want.items():
        assert abs(diag[k] - v) <= bound[k], (k, diag[k], v, bound[k])


def test_grad_cos_is_one_for_full_and_below_one_for_sampled_on_the_same_batch():
    full = {impl: _step(_oracle_trial(impl, {"kind": "forward"}, "offpd"), 10)[1] for impl in ("chunked", "reference")}
    sampled = _step(_oracle_trial("reference", {"kind": "forward", "estimator": "sampled"}, "offpd"), 10)[1]
    for impl, diag in full.items():  # 1 and 0 within float32's bounds on both gradients (as against the peer)
        _, bound = _peer_oracle(_oracle_trial(impl, {"kind": "forward"}, "offpd"))
        assert abs(diag["estimator/grad_cos"] - 1.0) <= bound["estimator/grad_cos"]
        assert abs(diag["estimator/bias"]) <= bound["estimator/bias"]
        assert abs(diag["estimator/grad_norm_ratio"] - 1.0) <= bound["estimator/grad_norm_ratio"]
    assert sampled["estimator/grad_cos"] < 0.9 and sampled["estimator/bias"] != 0.0
    assert sampled["kl/forward"] == full["reference"]["kl/forward"]  # the same batch, the same exact KL
