"""The λ-spectrum (PROTOCOL.md §3): `spectrum_logits` by hand and on its invariants,
and `SpectrumEngine` against the plain sampler and a teacher-forced re-scoring."""

from __future__ import annotations

import math

import _tolerance as tol
import pytest
import torch
from _helpers import REPO, load_script, spectrum_rescored
from transformers import LlamaForCausalLM

from distillab.models import build_char_tokenizer, micro_llama_config
from distillab.rollout.engine import TransformersEngine
from distillab.rollout.spectrum import SPECTRUM_CLIP, SpectrumEngine, plausibility_mask, spectrum_logits
from distillab.rollout.types import SamplingParams, left_pad, pack_rollouts, position_ids

torch.set_num_threads(1)
NEG = float("-inf")


def _logp(*vals: float) -> torch.Tensor:
    return torch.log(torch.tensor(vals, dtype=torch.float64))


def _hand_err(*logps: torch.Tensor) -> float:
    """float64 by hand against spectrum_logits: a few roundings (the logs, the weights' products and sums, a
    clip: 16) on log-probabilities as large as the inputs' (tests/_tolerance.py)."""
    return tol.gamma(16) * sum(float(x.abs().max()) for x in logps)


# --------------------------------------------------------------------------------------
# spectrum_logits by hand
# --------------------------------------------------------------------------------------


def test_interpolation_by_hand() -> None:
    ps, pt = _logp(0.5, 0.25, 0.25), _logp(0.25, 0.25, 0.5)
    z = spectrum_logits(ps, pt, 0.0)  # geometric mean: ½ log p_S + ½ log p_T
    expected = torch.tensor([0.5 * math.log(0.5 * 0.25), math.log(0.25), 0.5 * math.log(0.25 * 0.5)], dtype=torch.float64)
    assert ((z - expected).abs() <= _hand_err(ps, pt)).all()
    z = spectrum_logits(ps, pt, 0.5)  # ¾ log p_S + ¼ log p_T
    assert abs(z[0].item() - (0.75 * math.log(0.5) + 0.25 * math.log(0.25))) <= _hand_err(ps, pt)


def test_extrapolation_by_hand() -> None:
    # student (0.6, 0.3, 0.1), teacher (0.2, 0.3, 0.5); α = 0.2 → M_S: p ≥ 0.12 → (1, 1, 0)
    ps, pt = _logp(0.6, 0.3, 0.1), _logp(0.2, 0.3, 0.5)
    z = spectrum_logits(ps, pt, 2.0)  # k = ½, r = (log 3, 0, log 0.2) → clipped (log 3, 0, 0), masked (…, …, 0)
    expected = ps + 0.5 * torch.tensor([math.log(3.0), 0.0, 0.0], dtype=torch.float64)
    assert ((z - expected).abs() <= _hand_err(ps, pt)).all()
    # r_0 = log 3 < c = 2 log 3: not clipped; with c = 0.5 it is
    z = spectrum_logits(ps, pt, 2.0, c=0.5)
    assert abs(z[0].item() - (ps[0].item() + 0.25)) <= _hand_err(ps, pt)
    # λ = −1.5 (k = ¼) beyond the teacher: M_T: p ≥ 0.1 → (1, 1, 1); −r = (log ⅓, 0, log 5) → (0, 0, log 5)
    z = spectrum_logits(ps, pt, -1.5)
    expected = pt + 0.25 * torch.tensor([0.0, 0.0, math.log(5.0)], dtype=torch.float64)
    assert ((z - expected).abs() <= _hand_err(ps, pt)).all()


def test_plausibility_mask_by_hand() -> None:
    lp = _logp(0.5, 0.1, 0.09, 0.31)
    assert plausibility_mask(lp, 0.2).tolist() == [True, True, False, True]  # threshold 0.1
    assert plausibility_mask(lp, 1.0).tolist() == [True, False, False, False]


# --------------------------------------------------------------------------------------
# invariants on random float64 distributions
# --------------------------------------------------------------------------------------


def _random_pair(seed: int, B: int = 16, V: int = 50, spread: float = 3.0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    s = torch.log_softmax(spread * torch.randn(B, V, generator=g, dtype=torch.float64), -1)
    t = torch.log_softmax(spread * torch.randn(B, V, generator=g, dtype=torch.float64), -1)
    return s, t


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_endpoints_are_student_and_teacher(seed: int) -> None:
    s, t = _random_pair(seed)
    s[:, 0], t[:, 1] = NEG, NEG  # a token each model rules out must not leak into the other's endpoint
    s, t = torch.log_softmax(s, -1), torch.log_softmax(t, -1)
    # float64: the endpoint's log-probabilities renormalised by a softmax over 50 entries, each probability within
    # its row's bound of exp(log p) (tests/_tolerance.py), 2ρ relative
    for lam, want in ((1.0, s.exp()), (-1.0, t.exp())):
        rho = tol.row(50, torch.float64, tol.logit_range((s, 1.0), (t, 1.0)))
        assert ((torch.softmax(spectrum_logits(s, t, lam), -1) - want).abs() <= 2 * rho * want).all()
    assert torch.isfinite(spectrum_logits(s, t, 2.0)[:, 1]).all()  # student keeps token 1 beyond λ = 1
    assert (spectrum_logits(s, t, 0.3)[:, :2] == NEG).all()  # interpolation: either −inf gives −inf


@pytest.mark.parametrize("anchor", [1.0, -1.0])
def test_continuity_at_the_endpoints(anchor: float) -> None:
    s, t = _random_pair(3)
    p_end = torch.softmax(spectrum_logits(s, t, anchor), -1)
    gaps = []
    for eps in (1e-1, 1e-2, 1e-3, 1e-4, 1e-6):
        for lam in (anchor * (1 + eps), anchor * (1 - eps)):  # from outside and from inside
            gaps.append((torch.softmax(spectrum_logits(s, t, lam), -1) - p_end).abs().max().item())
    outside, inside = gaps[0::2], gaps[1::2]
    for seq in (outside, inside):
        assert all(b < a for a, b in zip(seq, seq[1:])), seq  # strictly shrinking with ε
        assert seq[-1] < 1e-5  # → 0 (linear in ε)
    assert outside[0] > 1e-4  # and the test can see a difference at all


@pytest.mark.parametrize("lam", [2.0, -2.0, 1.5, -1.7])
def test_pairwise_odds_amplification_is_bounded(lam: float) -> None:
    s, t = _random_pair(4, spread=5.0)
    z = spectrum_logits(s, t, lam)
    anchor = s if lam > 0 else t
    d = z - anchor  # (B, V) change of each token's log-odds against the anchor
    amp = d.unsqueeze(-1) - d.unsqueeze(-2)  # (B, V, V): log of pairwise odds amplification
    bound = SPECTRUM_CLIP * (abs(lam) - 1) / 2  # λ = ±2: log 3
    assert amp.max().item() <= bound + 1e-12
    assert amp.max().item() > 0.99 * bound  # the clip is reached: the bound is tight here
    if abs(lam) == 2.0:
        assert math.exp(amp.max().item()) <= 3.0 + 1e-9


@pytest.mark.parametrize("lam", [2.0, -2.0])
def test_masked_tokens_keep_their_anchor_logit(lam: float) -> None:
    s, t = _random_pair(5, spread=4.0)
    anchor = s if lam > 0 else t
    mask = plausibility_mask(anchor, 0.2)
    z = spectrum_logits(s, t, lam)
    assert (~mask).any() and mask.any()
    assert torch.equal(z[~mask], anchor[~mask])  # z = log π_anchor on masked tokens
    # so the odds between two masked tokens are the anchor's
    b = int((~mask).sum(-1).argmax())
    idx = (~mask[b]).nonzero().flatten()[:2]
    assert torch.equal(z[b, idx[0]] - z[b, idx[1]], anchor[b, idx[0]] - anchor[b, idx[1]])


@pytest.mark.parametrize(
    "kwargs, fragment",
    [({"lam": 2.5}, "lambda must be in [-2, 2]"), ({"lam": -3.0}, "lambda must be in [-2, 2]"),
     ({"lam": 0.0, "alpha": 0.0}, "alpha must be in (0, 1]"), ({"lam": 0.0, "c": -1.0}, "c must be >= 0")],
)
def test_spectrum_errors(kwargs: dict, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment.replace("[", r"\[").replace("(", r"\(")):
        spectrum_logits(torch.zeros(3), torch.zeros(3), **kwargs)
    with pytest.raises(ValueError, match="shape"):
        spectrum_logits(torch.zeros(3), torch.zeros(4), 0.0)


# --------------------------------------------------------------------------------------
# SpectrumEngine on two tiny models
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def models(tok):
    torch.manual_seed(0)
    student = LlamaForCausalLM(micro_llama_config(len(tok), 64, 1, 2, 64, 64, tok)).eval()
    torch.manual_seed(1)
    teacher = LlamaForCausalLM(micro_llama_config(len(tok), 64, 2, 2, 64, 64, tok)).eval()
    return student, teacher


def _prompts(tok) -> list[list[int]]:
    texts = ["10 7 3 -> 21", "ab", "75 50 2 1 -> 100"]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


@pytest.mark.parametrize("lam, tau_s, tau_t", [(1.0, 0.9, 0.5), (-1.0, 0.9, 0.5), (1.0, 1.0, 1.0)])
def test_endpoints_reproduce_the_plain_sampler(tok, models, lam: float, tau_s: float, tau_t: float) -> None:
    student, teacher = models
    sp = SamplingParams(temperature=1.0, max_tokens=20, n=4, seed=7)
    spec = SpectrumEngine(student, teacher, tok.eos_token_id, tok.pad_token_id, lam=lam, tau_s=tau_s, tau_t=tau_t)
    a = spec.generate(_prompts(tok), sp)
    anchor, tau = (student, tau_s) if lam > 0 else (teacher, tau_t)
    plain = TransformersEngine(anchor, tok.eos_token_id, tok.pad_token_id)
    b = plain.generate(_prompts(tok), SamplingParams(tau, 1.0, 20, 4, 7))
    assert a.completion_ids == b.completion_ids  # token for token
    assert a.finish_reasons == b.finish_reasons
    seqs, attn = left_pad([p + c for p, c in zip(b.prompt_ids, b.completion_ids)], tok.pad_token_id)
    gap = tol.logprob_gap(anchor, seqs, attn, tau)  # two float32 decodes of the anchor model (tests/_tolerance.py)
    for x, y in zip(a.logprobs, b.logprobs):
        assert (torch.tensor(x) - torch.tensor(y)).abs().max() <= gap


def _rescore(model, tok, ro, tau: float) -> list[float]:
    """Teacher-forced mean log π(y_t) at temperature τ per rollout (full forward, no cache)."""
    ids, attn, cmask = pack_rollouts(ro.prompt_ids, ro.completion_ids, tok.pad_token_id)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn, position_ids=position_ids(attn)).logits.double()
    lp = torch.log_softmax(logits / tau, -1).gather(-1, torch.roll(ids, -1, 1).unsqueeze(-1)).squeeze(-1)
    return [lp[b][cmask[b]].mean().item() for b in range(ids.shape[0])]


@pytest.mark.parametrize("lam", [-2.0, -0.5, 0.0, 0.7, 2.0])
def test_recorded_logliks_and_logprobs_match_a_rescoring(tok, models, lam: float) -> None:
    """The other model steps with its own KV cache: its recorded log-likelihoods must equal
    a full teacher-forced pass, and ``logprobs`` must be log π_λ of those full passes."""
    student, teacher = models
    tau_s, tau_t = 1.0, 0.7
    eng = SpectrumEngine(student, teacher, tok.eos_token_id, tok.pad_token_id, lam=lam, tau_s=tau_s, tau_t=tau_t)
    ro = eng.generate(_prompts(tok), SamplingParams(max_tokens=16, n=3, seed=11))
    assert len(ro.completion_ids) == 9 and all(len(c) for c in ro.completion_ids)
    # a cached float32 decode against a full pass: each token's log-probability within their gap (tests/_tolerance.py),
    # so their means too (the means' own roundings: γ_17 of the mean's size)
    seqs, attn = left_pad([p + c for p, c in zip(ro.prompt_ids, ro.completion_ids)], tok.pad_token_id)
    gaps = {"student_loglik": tol.logprob_gap(student, seqs, attn, tau_s),
            "teacher_loglik": tol.logprob_gap(teacher, seqs, attn, tau_t)}
    for k, model, tau in (("student_loglik", student, tau_s), ("teacher_loglik", teacher, tau_t)):
        got, want = torch.tensor(ro.extras[k], dtype=torch.float64), torch.tensor(_rescore(model, tok, ro, tau))
        assert ((got - want.double()).abs() <= gaps[k] + tol.gamma(17, torch.float32) * want.abs()).all(), k
    # log π_λ of the sampled tokens, from full passes of both models, within its bound (tests/_helpers.py)
    want, bound = spectrum_rescored(student, teacher, ro, tok.pad_token_id, lam, tau_s, tau_t)
    for lp, lz in zip(ro.logprobs, want):
        assert (torch.tensor(lp, dtype=torch.float64) - lz).abs().max() <= bound


def test_loglik_moves_with_lambda(tok, models) -> None:
    """Figure 4's check on two random models: along λ = −2 … 2 the mean student
    log-likelihood of the samples rises and the teacher's falls."""
    from distillab.rollout.spectrum import loglik_along_lambda

    student, teacher = models
    rows = loglik_along_lambda(student, teacher, tok, _prompts(tok) * 4, [-2.0, -1.0, 0.0, 1.0, 2.0],
                               tau_s=1.0, tau_t=1.0, max_tokens=16, n=8, seed=3)
    s = [r["student_loglik"] for r in rows]
    t = [r["teacher_loglik"] for r in rows]
    assert all(b > a for a, b in zip(s, s[1:])), s
    assert all(b < a for a, b in zip(t, t[1:])), t


def test_engine_rejects_bad_settings(tok, models) -> None:
    student, teacher = models
    with pytest.raises(ValueError, match="lambda"):
        SpectrumEngine(student, teacher, tok.eos_token_id, tok.pad_token_id, lam=3.0)
    with pytest.raises(ValueError, match="tau_s and tau_t"):
        SpectrumEngine(student, teacher, tok.eos_token_id, tok.pad_token_id, lam=0.0, tau_t=0.0)
    other = LlamaForCausalLM(micro_llama_config(len(tok) + 3, 64, 1, 2, 64, 64, tok)).eval()
    eng = SpectrumEngine(student, other, tok.eos_token_id, tok.pad_token_id, lam=0.0)
    with pytest.raises(ValueError, match="vocabularies differ"):
        eng.generate(_prompts(tok), SamplingParams(max_tokens=2))


@pytest.mark.slow
def test_figure4_check_on_micro_models() -> None:
    """scripts/spectrum_check.py on micro models prepared like the smoke sweep's but with
    400 SFT steps each (a few seconds; cached under .cache/models): along λ = −2 … 2 the
    student log-likelihood rises and the teacher's falls. (The smoke models themselves,
    20–30 SFT steps, are near-uniform: a near-uniform student scores its own samples
    lower than the teacher's, so they do not show it.)"""
    from distillab.config import load_sweep

    mod = load_script("scripts/spectrum_check.py")
    sweep = load_sweep(REPO / "search_spaces" / "smoke.yaml", {
        "models.cache_dir": str(REPO / ".cache" / "models"),
        "models.micro_teacher.sft_steps": 400, "models.micro_student.sft_steps": 400,
    })
    rows = mod.spectrum_table(sweep, prompts=32, n=4, threads=1)
    assert [r["lambda"] for r in rows] == [-2.0, -1.0, 0.0, 1.0, 2.0]
    assert mod.monotone(rows), rows
