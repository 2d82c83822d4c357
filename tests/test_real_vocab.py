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
- (slow) the vLLM CPU engine loaded from the derived student's directory and synced after every
  optimizer step, ZeRO-3 on two ranks against ZeRO-0, and exact resume, on the tied pair.

Tolerances: float32 rounding of a sum of n terms is, with high probability, within
λ·√n·u of the terms' magnitude (u = 2⁻²⁴; Higham & Mary 2019, "A New Approach to Probabilistic
Rounding Error Analysis", SIAM J. Sci. Comput. 41(5)); the divergences sum over V = 49,152
terms after a log-sum-exp over as many and a matmul over H, so `tol` takes n = V and λ = 8.
"""

from __future__ import annotations

import math
import os
import shutil

import pytest
import torch
from _helpers import init_local_ray

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


# --------------------------------------------------------------------------------------------------
# A tiny pair with SmolLM2's tokenizer and vocabulary (tests/_checkpoints.smol_pair)
# --------------------------------------------------------------------------------------------------


def _prompts(tok) -> list[list[int]]:
    """Three chat-template prompts of different lengths, as SmolLM2 renders them."""
    texts = ["Using the numbers 25, 7 and 3, make 96.", "Hi", "Name two prime numbers between 10 and 20, please."]
    return [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True,
                                    return_dict=False) for t in texts]


def test_the_checks_accept_the_tied_pair_at_the_real_vocabulary(smol_pair) -> None:
    """The pair as ``hf`` sources: one tokenizer of 49,152 tokens, both lm_heads of 49,152 rows (the
    tied embedding matrices), the student's 2 layers; no padding needed."""
    from distillab.config import load_sweep
    from distillab.driver.plan import check_checkpoints

    from _helpers import REPO

    sweep = load_sweep(REPO / "search_spaces" / "smoke.yaml", {"models.teacher": {"hf": str(smol_pair[0])},
                                                               "models.student": {"hf": str(smol_pair[1])}})
    roles = check_checkpoints(sweep)
    assert [(r.vocab_rows, len(r.tokenizer), r.config.tie_word_embeddings, r.config.num_hidden_layers)
            for r in roles.values()] == [(V, V, True, 3), (V, V, True, 2)]


@pytest.mark.parametrize("tau, top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_static_kv_sampler_equals_generate_at_the_real_vocabulary(smol_pair, tau, top_p) -> None:
    """`rollout.decode.sample_tokens` (the transformers engine's static KV cache) on the tied
    3-layer model: the tokens of ``generate(do_sample=True)`` under the same seed, and the
    logprobs of its raw logits within 2·`tol`(H)·max|z|: the prefill's lm_head is one GEMM of
    another height than generate's (tests/rollout/test_decode.py), so each logit may round
    differently over its H = 64 products, and a logprob z_y − lse carries two such errors."""
    from distillab.models import load_model, load_tokenizer
    from distillab.ops.kl import token_logprobs
    from distillab.rollout.decode import sample_tokens, static_decode_supported
    from distillab.rollout.types import left_pad

    tok, model = load_tokenizer(smol_pair[0]), load_model(smol_pair[0]).eval()
    assert static_decode_supported(model) and model.get_output_embeddings().weight is model.model.embed_tokens.weight
    ids, attn = left_pad(_prompts(tok), tok.pad_token_id)
    for seed in range(2):
        torch.manual_seed(seed)
        res = model.generate(input_ids=ids, attention_mask=attn, do_sample=True, temperature=tau, top_p=top_p, top_k=0,
                             max_new_tokens=8, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                             output_logits=True, return_dict_in_generate=True)
        want = res.sequences[:, ids.shape[1]:]
        torch.manual_seed(seed)
        with torch.inference_mode():
            got, lp = sample_tokens(model, ids, attn, temperature=tau, top_p=top_p, max_new=8,
                                    eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        assert torch.equal(got, want) and int(want.max()) < V
        logits = torch.stack(res.logits, 1)
        atol = 2 * tol(H) * float(logits.abs().max()) / tau
        torch.testing.assert_close(lp, token_logprobs(logits, want, tau), rtol=0, atol=atol)


@pytest.mark.parametrize("loss", [{"kind": "forward", "impl": "chunked"}, {"kind": "reverse", "impl": "reference"},
                                  {"kind": "forward", "estimator": "topk", "top_k": 8, "topk_tail": True}],
                         ids=lambda x: "-".join(map(str, x.values())))
def test_hidden_payload_equals_in_worker_scoring_at_the_real_vocabulary(smol_pair, loss) -> None:
    """``teacher.serve: shared`` with the ``hidden`` payload on the tied teacher: the lm_head read
    from the checkpoint's safetensors (`teacher.load_lm_head`: stored once, as the input embedding)
    is the model's, and the loss, diagnostics (the oracle's included) and every student gradient
    equal in-worker scoring to 1e-6 (tests/test_teacher.py at micro scale)."""
    from _helpers import EngineStandIn, random_rollouts

    from distillab.config import TrialConfig
    from distillab.models import load_model, load_tokenizer
    from distillab.recipe.loss import loss_step
    from distillab.recipe.teacher import LocalTeacher, SharedTeacher, TeacherScorer, load_lm_head

    teacher_dir, student_dir = smol_pair
    pad = load_tokenizer(teacher_dir).pad_token_id
    in_worker = load_model(teacher_dir).eval().requires_grad_(False)
    w, b = load_lm_head(teacher_dir, torch.float32)
    assert b is None and torch.equal(w, in_worker.model.embed_tokens.weight)
    cfg = {"rollout": {"policy": "onpd"}, "loss": {**loss, "oracle_every": 1}}
    results = []
    for trial, teacher in (
        (TrialConfig.model_validate(cfg), LocalTeacher(in_worker)),
        (TrialConfig.model_validate({**cfg, "teacher": {"serve": "shared", "payload": "hidden"}}), None),
    ):
        if teacher is None:
            teacher = SharedTeacher(trial.teacher, w, b, TeacherScorer(str(teacher_dir)), "t")
        student = load_model(student_dir)
        value, diag = loss_step(trial, EngineStandIn(student), teacher, random_rollouts(V, 3), pad,
                                torch.Generator().manual_seed(0), step=1)
        value.backward()
        results.append((value.item(), {k: v for k, v in diag.items() if not k.startswith("teacher/")},
                        {n: p.grad for n, p in student.named_parameters()}))
    (want, want_diag, want_grads), (got, got_diag, got_grads) = results
    assert got == pytest.approx(want, rel=1e-6) and "estimator/bias" in got_diag
    assert got_diag == pytest.approx(want_diag, rel=1e-6, abs=1e-6, nan_ok=True)
    assert "model.embed_tokens.weight" in got_grads and "lm_head.weight" not in got_grads  # tied: one parameter
    for n, g in got_grads.items():
        torch.testing.assert_close(g, want_grads[n], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("lam", [0.5, -2.0])
def test_spectrum_sampler_at_the_real_vocabulary_matches_a_float64_rescoring(smol_pair, lam) -> None:
    """`rollout.spectrum.SpectrumEngine` between the derived student and its teacher: each sampled
    token's recorded logprob is log π_λ of full teacher-forced passes of both models, recomputed in
    float64, within the bound of their float32 computation (tests/_helpers.py ``spectrum_rescored``;
    tests/rollout/test_spectrum.py at micro scale)."""
    from distillab.models import load_model, load_tokenizer
    from _helpers import spectrum_rescored

    from distillab.rollout.spectrum import SpectrumEngine
    from distillab.rollout.types import SamplingParams

    tok = load_tokenizer(smol_pair[0])
    teacher, student = load_model(smol_pair[0]).eval(), load_model(smol_pair[1]).eval()
    tau_s, tau_t = 1.0, 0.7
    eng = SpectrumEngine(student, teacher, tok.eos_token_id, tok.pad_token_id, lam=lam, tau_s=tau_s, tau_t=tau_t)
    ro = eng.generate(_prompts(tok), SamplingParams(max_tokens=8, n=2, seed=11))
    want, bound = spectrum_rescored(student, teacher, ro, tok.pad_token_id, lam, tau_s, tau_t)
    assert sum(map(len, ro.completion_ids)) > 0 and student.config.vocab_size == V
    for lp, lz in zip(ro.logprobs, want):
        assert (torch.tensor(lp, dtype=torch.float64) - lz).abs().max() <= bound


# --------------------------------------------------------------------------------------------------
# Trials on the tiny SmolLM2-vocabulary pair (slow): vLLM CPU synced every step, ZeRO-3, exact resume
# --------------------------------------------------------------------------------------------------


def _smol_trial(**optimizer) -> dict:
    """An OnPD forward-KL trial of a few steps with the smallest evaluation (one item per metric)."""
    return {"seed": 42, "rollout": {"policy": "onpd", "max_tokens": 8}, "loss": {"kind": "forward"},
            "optimizer": {"lr": 1e-3, "steps": 2, "prompts_per_step": 4, "warmup_steps": 1, "train_prompts": 64,
                          **optimizer},
            "evaluation": {"countdown_tasks": ["countdown3"], "id_items": 1, "pass_items": 1, "pass_n": 1,
                           "pass_k": [1], "ood_items": 1, "max_tokens": 4}}


def _per_step(root, names=("loss", "grad_norm")) -> dict[str, dict[int, float]]:
    import polars as pl

    from distillab.analysis.results import load

    m = load(root).metrics.filter(pl.col("stage") == "distill").collect()
    return {n: dict(zip(*m.filter(pl.col("name") == n).select("step", "value").to_dict(as_series=False).values()))
            for n in names}


@pytest.fixture
def one_rank():
    from _helpers import one_gloo_rank

    yield from one_gloo_rank()


def _trainer_logprobs(model, ids: list[int], tau: float = 1.0) -> torch.Tensor:
    """log softmax(z/τ) of ids[1:] given their prefixes, float64 (len(ids) - 1,)."""
    with torch.no_grad():
        z = model(input_ids=torch.tensor([ids])).logits[0, :-1].double() / tau
    return torch.log_softmax(z, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]


@pytest.mark.slow
def test_vllm_engine_loads_the_derived_student_and_is_synced_every_step(smol_pair) -> None:
    """vLLM CPU (`rollout.actor.start_rollout_actor`) loads the derived student's directory (tied
    embeddings, 49,152 rows): its sampling logprobs equal the trainer's at τ to 1e-3; then after each
    of two optimizer steps the sync of the trial's client (`rollout.actor.ActorSampler.sync`: the
    state dict, where the tied matrix has both names) brings the engine's logprobs of a chat prompt and
    its completion to the new weights' (1e-3, tests/rollout/test_vllm.py's bound), where the step had
    moved them by more than 1e-2 (the check can fail). One engine start."""
    if not os.environ.get("DISTILLAB_REQUIRE_VLLM"):
        pytest.importorskip("vllm")
    import ray

    from distillab.models import load_model, load_tokenizer
    from distillab.rollout.actor import ActorSampler, start_rollout_actor
    from distillab.rollout.types import SamplingParams

    tok, model = load_tokenizer(smol_pair[1]), load_model(smol_pair[1])
    prompt = _prompts(tok)[0]
    init_local_ray(2)
    try:
        actor = start_rollout_actor("vllm", smol_pair[1], tok.eos_token_id, tok.pad_token_id, threads=1, seed=0,
                                    max_model_len=256, kv_cache_gib=1)
        sampler = ActorSampler(actor)
        ro = sampler.generate([prompt], SamplingParams(temperature=0.7, top_p=1.0, max_tokens=12, n=2, seed=5))
        for c, lp in zip(ro.completion_ids, ro.logprobs):
            want = _trainer_logprobs(model.eval(), prompt + c, tau=0.7)[len(prompt) - 1:]
            assert max(c) < V and (torch.tensor(lp, dtype=torch.float64) - want).abs().max() <= 1e-3
        seq = prompt + ro.completion_ids[0]
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for _ in range(2):
            before = _trainer_logprobs(model.eval(), seq)
            ids = torch.tensor([seq])
            torch.nn.functional.cross_entropy(model.train()(input_ids=ids).logits[0, :-1], ids[0, 1:]).backward()
            opt.step()
            opt.zero_grad()
            after = _trainer_logprobs(model.eval(), seq)
            assert (after - before).abs().max() > 1e-2
            assert sampler.sync(model) > 0
            synced = torch.tensor(ray.get(actor.prompt_logprobs.remote(seq)), dtype=torch.float64)
            assert (synced - after).abs().max() <= 1e-3, float((synced - after).abs().max())
        ray.kill(actor)
    finally:
        ray.shutdown()


@pytest.mark.slow
def test_zero3_trains_the_tied_student_as_zero0(smol_pair, tmp_path) -> None:
    """ZeRO-3 on two gloo ranks, every parameter partitioned, the tied lm_head kept whole for the
    fused loss (`recipe.optim._persist_lm_head`, which here is the input embedding too), against
    ZeRO-0: per-step losses and gradient norms within tests/test_zero3.py's 1e-5 relative (the same
    arithmetic summed in another order), and the evaluation of the gathered student equal."""
    import json
    import socket

    import torch.multiprocessing as mp
    from test_zero3 import _worker

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    trial = json.dumps(_smol_trial())
    mp.spawn(_worker, args=(2, port, str(smol_pair[0]), str(smol_pair[1]), str(tmp_path), trial), nprocs=2, join=True)
    z0, z3 = _per_step(tmp_path / "zero0"), _per_step(tmp_path / "zero3")
    assert sorted(z0["loss"]) == [1, 2]
    for name in ("loss", "grad_norm"):
        assert z3[name] == pytest.approx(z0[name], rel=1e-5), name
    f0, f3 = (json.loads((tmp_path / f"final{z}.json").read_text()) for z in (0, 3))
    evals = sorted(k for k in f0 if k.startswith("eval/distill/") and "/params/model" not in k)
    assert "eval/distill/countdown3/accuracy" in evals
    assert {k: f3[k] for k in evals} == pytest.approx({k: f0[k] for k in evals}, abs=1e-9)
    assert f3["eval/distill/params/sparsity@1e-06"] < 1  # the partitioned student was trained and gathered


@pytest.mark.slow
def test_a_resumed_trial_of_the_tied_pair_continues_exactly(smol_pair, one_rank, tmp_path) -> None:
    """A 4-step OnPD trial checkpointed at step 2 and resumed in a fresh worker: steps 3–4 equal the
    uninterrupted run's to 1e-6 (tests/test_resume.py at micro scale: bitwise measured there), and so
    does the final evaluation; the checkpoint stores the tied matrix once."""
    from safetensors import safe_open

    from distillab.config import RuntimeContext, TrialConfig
    from distillab.recipe.distill import run_worker
    from distillab.recipe.session import LocalSession

    kept = {}

    class Keeping(LocalSession):
        def report(self, metrics, checkpoint=None):
            if checkpoint is not None:
                kept[int(metrics["step"])] = shutil.copytree(checkpoint, tmp_path / f"step{int(metrics['step'])}")
            super().report(metrics, checkpoint)

    trial = TrialConfig.model_validate(_smol_trial(steps=4, checkpoint_every=2))

    def ctx(name: str):
        return RuntimeContext(teacher_path=str(smol_pair[0]), student_path=str(smol_pair[1]),
                              results_root=str(tmp_path / name), shared_cache=str(tmp_path / "shared"))

    whole = run_worker(trial, ctx("whole"), "t", Keeping())
    with safe_open(str(kept[2] / "model.safetensors"), framework="pt") as f:
        assert "model.embed_tokens.weight" in f.keys() and "lm_head.weight" not in f.keys()
    resumed = run_worker(trial, ctx("resumed"), "t", LocalSession(resume_from=kept[2]))
    a, b = _per_step(tmp_path / "whole"), _per_step(tmp_path / "resumed")
    assert sorted(b["loss"]) == [3, 4]
    for name in ("loss", "grad_norm"):
        assert [b[name][s] for s in (3, 4)] == pytest.approx([a[name][s] for s in (3, 4)], rel=1e-6, abs=1e-6), name
    evals = sorted(k for k in whole if k.startswith("eval/distill/"))
    assert evals and {k: resumed[k] for k in evals} == {k: whole[k] for k in evals}
