"""Batched-sequence helpers and `TransformersEngine` (platform/rollout.py)."""

from __future__ import annotations

import _tolerance as tol
import pytest
import torch
from transformers import LlamaForCausalLM

from distillab.models import build_char_tokenizer, micro_llama_config
from distillab.rollout.engine import TransformersEngine
from distillab.rollout.types import Rollouts, SamplingParams, left_pad, pack_rollouts, position_ids

torch.set_num_threads(1)

T, F = True, False


# --------------------------------------------------------------------------------------
# helpers, by hand
# --------------------------------------------------------------------------------------


def test_left_pad() -> None:
    ids, mask = left_pad([[1, 2, 3], [4], [], [5, 6]], pad_id=0)
    assert ids.dtype == torch.long and mask.dtype == torch.long
    assert ids.tolist() == [[1, 2, 3], [0, 0, 4], [0, 0, 0], [0, 5, 6]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1], [0, 0, 0], [0, 1, 1]]
    ids, mask = left_pad([[7, 8]], pad_id=9)
    assert ids.tolist() == [[7, 8]] and mask.tolist() == [[1, 1]]


def test_position_ids() -> None:
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1], [0, 1, 1, 1], [0, 0, 0, 0]])
    assert position_ids(mask).tolist() == [[0, 1, 2, 3], [0, 0, 0, 1], [0, 0, 1, 2], [0, 0, 0, 0]]


def test_pack_rollouts() -> None:
    prompts = [[5, 6], [1, 2], [1, 2, 3, 4], [9]]
    completions = [[7, 8], [3, 4, 9], [], [2]]
    ids, attn, cmask = pack_rollouts(prompts, completions, pad_id=0)
    # width 5 = longest (2 + 3 and 4 + 0)
    assert ids.tolist() == [
        [0, 5, 6, 7, 8],
        [1, 2, 3, 4, 9],
        [0, 1, 2, 3, 4],
        [0, 0, 0, 9, 2],
    ]
    assert attn.tolist() == [
        [0, 1, 1, 1, 1],
        [1, 1, 1, 1, 1],
        [0, 1, 1, 1, 1],
        [0, 0, 0, 1, 1],
    ]
    # logits at t predict token t+1: row 0, token 6 (t=2) predicts 7 and token 7 (t=3) predicts 8
    assert cmask.dtype == torch.bool
    assert cmask.tolist() == [
        [F, F, T, T, F],
        [F, T, T, T, F],
        [F, F, F, F, F],
        [F, F, F, T, F],
    ]
    # the targets picked by the mask are exactly the completions, in order
    targets = torch.roll(ids, -1, dims=1)[cmask].tolist()
    assert targets == [7, 8, 3, 4, 9, 2]


def test_pack_rollouts_rejects_an_empty_prompt() -> None:
    """No position's logits predict the first token of a sequence, so a completion whose
    prompt is empty cannot be scored from its first token: the row was dropped (the
    longest row: its mask slice started at -1) or its first token was scored from the
    padding position before it. A clear error naming the row instead."""
    for prompts, completions in (([[], [1, 2]], [[5, 6, 7], [3]]),  # the longest row: dropped before
                                 ([[1, 2], []], [[3, 4, 5], [6, 7]])):  # a shorter row: mis-masked before
        row = prompts.index([])
        with pytest.raises(ValueError, match=rf"row {row} has an empty prompt"):
            pack_rollouts(prompts, completions, pad_id=0)
    ids, attn, cmask = pack_rollouts([[], [1]], [[], [2]], pad_id=0)  # empty prompt and completion: nothing to score
    assert cmask.tolist() == [[F, F], [T, F]]


# --------------------------------------------------------------------------------------
# TransformersEngine
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    torch.manual_seed(0)
    return LlamaForCausalLM(micro_llama_config(len(tok), 64, 1, 2, 64, 64, tok)).eval()


def _prompts(tok) -> list[list[int]]:
    return [tok("10 7 3 -> 21", add_special_tokens=False)["input_ids"], tok("ab", add_special_tokens=False)["input_ids"]]


def test_generate_reproducible_and_prompt_major(tok, model) -> None:
    eng = TransformersEngine(model, tok.eos_token_id, tok.pad_token_id)
    prompts = _prompts(tok)
    sp = SamplingParams(temperature=0.8, max_tokens=6, n=3, seed=123)
    a = eng.generate(prompts, sp)
    torch.manual_seed(999)  # the global RNG state must not matter
    torch.rand(3)
    b = eng.generate(prompts, sp)
    assert isinstance(a, Rollouts)
    assert a.completion_ids == b.completion_ids
    assert a.logprobs == b.logprobs
    assert len(a.completion_ids) == 2 * 3
    assert a.prompt_ids == [prompts[0]] * 3 + [prompts[1]] * 3
    c = eng.generate(prompts, SamplingParams(temperature=0.8, max_tokens=6, n=3, seed=124))
    assert c.completion_ids != a.completion_ids
    for comp, lp, reason in zip(a.completion_ids, a.logprobs, a.finish_reasons):
        assert len(lp) == len(comp) and 1 <= len(comp) <= 6
        assert all(x <= 0.0 for x in lp)
        if reason == "stop":
            assert comp[-1] == tok.eos_token_id and tok.eos_token_id not in comp[:-1]
        else:
            assert reason == "length" and len(comp) == 6 and tok.eos_token_id not in comp
    assert a.lengths == [len(x) for x in a.completion_ids]


def test_generate_batches_do_not_change_shapes(tok, model) -> None:
    prompts = _prompts(tok)
    sp = SamplingParams(temperature=1.0, max_tokens=4, n=2, seed=5)
    small = TransformersEngine(model, tok.eos_token_id, tok.pad_token_id, batch_size=3).generate(prompts, sp)
    assert small.prompt_ids == [prompts[0]] * 2 + [prompts[1]] * 2
    assert len(small.completion_ids) == len(small.logprobs) == len(small.finish_reasons) == 4


@pytest.mark.parametrize("tau", [0.5, 1.0])
def test_generate_logprobs_match_teacher_forced_pass(tok, model, tau: float) -> None:
    eng = TransformersEngine(model, tok.eos_token_id, tok.pad_token_id)
    out = eng.generate(_prompts(tok), SamplingParams(temperature=tau, max_tokens=8, n=2, seed=7))
    ids, attn, cmask = pack_rollouts(out.prompt_ids, out.completion_ids, tok.pad_token_id)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn, position_ids=position_ids(attn)).logits
    lp = torch.log_softmax(logits.float() / tau, dim=-1)
    targets = torch.roll(ids, -1, dims=1)
    got = lp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)[cmask]
    want = torch.tensor([x for row in out.logprobs for x in row])
    assert got.shape == want.shape == (sum(out.lengths),)
    # two float32 log-probabilities of each token (the cached decode, the teacher-forced pass): each within
    # 2 (2E)/τ of its logits' error and its row's ρ (tests/_tolerance.py)
    kw = dict(input_ids=ids, attention_mask=attn, position_ids=position_ids(attn))
    E = tol.forward_err(lambda m: m(**kw).logits, model)
    rho = tol.row(logits.shape[-1], torch.float32, tol.logit_range((logits[cmask], tau)))
    assert (got - want).abs().max() <= 2 * (2 * 2 * E / tau + rho)


def _biased(model, tok, eos_bias: float) -> LlamaForCausalLM:
    """A copy of ``model`` whose lm_head adds ``eos_bias`` to the eos logit."""
    m = LlamaForCausalLM(model.config).eval()
    m.load_state_dict(model.state_dict())
    head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size, bias=True)
    with torch.no_grad():
        head.weight.copy_(model.lm_head.weight)
        head.bias.zero_()
        head.bias[tok.eos_token_id] = eos_bias
    m.lm_head = head
    return m


def test_finish_reasons(tok, model) -> None:
    never = TransformersEngine(_biased(model, tok, -1e4), tok.eos_token_id, tok.pad_token_id)
    out = never.generate(_prompts(tok), SamplingParams(temperature=1.0, max_tokens=5, n=2, seed=0))
    assert out.finish_reasons == ["length"] * 4
    assert out.lengths == [5] * 4
    always = TransformersEngine(_biased(model, tok, 1e4), tok.eos_token_id, tok.pad_token_id)
    out = always.generate(_prompts(tok), SamplingParams(temperature=1.0, max_tokens=5, n=2, seed=0))
    assert out.finish_reasons == ["stop"] * 4
    assert out.completion_ids == [[tok.eos_token_id]] * 4
    # eos has probability 1 − O(e^-9990): its log-probability is 0 within its row's rounding bound, logits up to
    # 1e4 (tests/_tolerance.py; a logit range of 2e4 covers the others)
    assert all(abs(lp[0]) <= tol.row(len(tok), torch.float32, 2e4) for lp in out.logprobs)


def test_generate_restores_training_mode(tok, model) -> None:
    model.train()
    try:
        TransformersEngine(model, tok.eos_token_id, tok.pad_token_id).generate(
            _prompts(tok)[:1], SamplingParams(max_tokens=2)
        )
        assert model.training
    finally:
        model.eval()


def test_update_weights(tok, model) -> None:
    m = LlamaForCausalLM(model.config).eval()
    m.load_state_dict(model.state_dict())
    eng = TransformersEngine(m, tok.eos_token_id, tok.pad_token_id)
    new = torch.full_like(m.lm_head.weight, 0.5)
    eng.update_weights([("lm_head.weight", new)])
    assert torch.equal(m.lm_head.weight, new)
    with pytest.raises(KeyError, match="nope"):
        eng.update_weights([("nope", new)])


# --------------------------------------------------------------------------------------
# SamplingParams
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        (dict(temperature=0.0), "temperature"),
        (dict(temperature=-1.0), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_p=-0.1), "top_p"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(n=0), "n"),
    ],
)
def test_sampling_params_errors(kwargs, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        SamplingParams(**kwargs)


def test_sampling_params_bounds_allowed() -> None:
    sp = SamplingParams(temperature=1e-3, top_p=1.0)
    assert (sp.temperature, sp.top_p, sp.max_tokens, sp.n, sp.seed) == (1e-3, 1.0, 64, 1, 0)
