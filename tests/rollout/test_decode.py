"""The static-KV-cache sampler (platform/decode.py) against transformers: the forward pass
of every decode step equals the model's own (``DynamicCache``) bitwise, and the sampled
tokens equal ``model.generate``'s under the same seed, on a Llama and a Qwen2 (biases,
grouped-query attention) with padding, temperatures and top-p."""

from __future__ import annotations

import _tolerance as tol
import pytest
import torch
from transformers import DynamicCache, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from distillab.models import build_char_tokenizer, micro_llama_config
from distillab.ops.kl import token_logprobs
from distillab.rollout.decode import StaticKVDecoder, generate_positions, sample_tokens, static_decode_supported
from distillab.rollout.engine import TransformersEngine
from distillab.rollout.spectrum import SpectrumEngine, _CachedForward, _other_stepper
from distillab.rollout.types import SamplingParams, left_pad, position_ids

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def _llama(tok, seed=0):
    torch.manual_seed(seed)
    return LlamaForCausalLM(micro_llama_config(len(tok), 64, 2, 2, 96, 128, tok)).eval()


def _qwen2(tok):
    torch.manual_seed(1)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, tie_word_embeddings=False)
    return Qwen2ForCausalLM(cfg).eval()


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model(request, tok):
    return _llama(tok) if request.param == "llama" else _qwen2(tok)


def _err(model, ids, attn, last=False) -> float:
    """E of ``model``'s logits on the (left-padded) batch (tests/_tolerance.py, ``forward_err``); ``last``: the
    last position's only."""
    kw = dict(input_ids=ids, attention_mask=attn, position_ids=position_ids(attn))
    return tol.forward_err(lambda m: m(**kw).logits[:, -1] if last else m(**kw).logits, model)


def _batch(tok, lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompts = [[tok.bos_token_id] + torch.randint(12, len(tok), (n,), generator=g).tolist() for n in lengths]
    return left_pad(prompts, tok.pad_token_id)


@pytest.mark.parametrize("lengths", [(5, 2, 9), (4, 4)])  # padded, and not padded (no mask at all)
@torch.inference_mode()
def test_decode_steps_equal_the_models_forward(tok, model, lengths) -> None:
    """Prefill logits within two float32 forwards' rounding (transformers applies the lm_head to every
    prompt row, the decoder to the last one: one GEMM of another height), every decode step bitwise."""
    ids, attn = _batch(tok, lengths)
    cache = DynamicCache(config=model.config)
    want = model(input_ids=ids, attention_mask=attn, past_key_values=cache, use_cache=True).logits[:, -1].float()
    dec = StaticKVDecoder(model, attn, max_new=5)
    got = dec.prefill(ids)
    assert (got - want).abs().max() <= 4 * _err(model, ids, attn, last=True)  # tests/_tolerance.py: 4E
    g = torch.Generator().manual_seed(3)
    for _ in range(5):
        new = torch.randint(12, len(tok), (ids.shape[0],), generator=g)
        attn = torch.cat([attn, attn.new_ones(attn.shape[0], 1)], 1)
        want = model(input_ids=new[:, None], attention_mask=attn, past_key_values=cache, use_cache=True).logits[:, -1]
        assert torch.equal(dec.step(new), want.float())
    with pytest.raises(RuntimeError, match="full"):
        dec.step(new)


@torch.inference_mode()
def test_positions_argument_follows_the_given_positions(tok) -> None:
    """With ``position_ids`` (the λ-spectrum's second model) the decoder equals the model's
    forward given the same positions, bitwise after the prefill."""
    model = _llama(tok)
    ids, attn = _batch(tok, (6, 3))
    pos = position_ids(attn)
    table = torch.cat([pos, pos[:, -1:] + torch.arange(1, 4)], 1)
    dec = StaticKVDecoder(model, attn, 3, positions=table)
    cache = DynamicCache(config=model.config)
    want = model(input_ids=ids, attention_mask=attn, position_ids=pos, past_key_values=cache, use_cache=True).logits
    kw = dict(input_ids=ids, attention_mask=attn, position_ids=pos)
    E = tol.forward_err(lambda m: m(**kw).logits[:, -1], model)
    assert (dec.prefill(ids) - want[:, -1].float()).abs().max() <= 4 * E  # two float32 forwards: 4E
    new = torch.tensor([20, 30])
    attn = torch.cat([attn, attn.new_ones(2, 1)], 1)
    want = model(input_ids=new[:, None], attention_mask=attn, position_ids=pos[:, -1:] + 1, past_key_values=cache,
                 use_cache=True).logits[:, -1]
    assert torch.equal(dec.step(new), want.float())
    assert generate_positions(2, 4).tolist() == [[0, 1, 2, 3], [0, 1, 2, 3]]


SETTINGS = [(1.0, 1.0, (7, 3, 12, 1)), (0.5, 1.0, (4, 4, 4)), (1.0, 0.9, (9, 2)), (0.7, 0.8, (3, 11, 6, 6, 2))]


@pytest.mark.parametrize("tau, top_p, lengths", SETTINGS)
def test_sampled_tokens_equal_generate(tok, model, tau, top_p, lengths) -> None:
    """Same global seed: the same tokens as ``generate(do_sample=True, top_k=0)`` (finished
    rows padded, the same stopping step) and the logprobs of its raw logits to float32's rounding."""
    ids, attn = _batch(tok, lengths, seed=len(lengths))
    for seed in range(3):
        torch.manual_seed(seed)
        res = model.generate(input_ids=ids, attention_mask=attn, do_sample=True, temperature=tau, top_p=top_p, top_k=0,
                             max_new_tokens=10, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                             output_logits=True, return_dict_in_generate=True)
        want = res.sequences[:, ids.shape[1]:]
        torch.manual_seed(seed)
        with torch.inference_mode():
            got, lp = sample_tokens(model, ids, attn, temperature=tau, top_p=top_p, max_new=10,
                                    eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        assert torch.equal(got, want), seed
        seqs, full = res.sequences, torch.cat([attn, (want != tok.pad_token_id).long()], 1)
        gap = (lp - token_logprobs(torch.stack(res.logits, 1), want, tau)).abs()[want != tok.pad_token_id]
        assert gap.max() <= tol.logprob_gap(model, seqs, full, tau)


def test_stops_when_every_row_has_finished(tok) -> None:
    """An lm_head whose eos logit is +1e4: every row stops at its first token, after one
    step (no further forward pass), as generate() does."""
    model = _llama(tok)
    head = torch.nn.Linear(64, len(tok), bias=True)
    with torch.no_grad():
        head.weight.copy_(model.lm_head.weight)
        head.bias.zero_()
        head.bias[tok.eos_token_id] = 1e4
    model.lm_head = head
    ids, attn = _batch(tok, (3, 5))
    with torch.inference_mode():
        got, lp = sample_tokens(model, ids, attn, temperature=1.0, top_p=1.0, max_new=8, eos_token_id=tok.eos_token_id,
                                pad_token_id=tok.pad_token_id, logprobs=False)
    assert lp is None
    assert got.tolist() == [[tok.eos_token_id], [tok.eos_token_id]]


def test_supported_models(tok) -> None:
    """The static path takes plain Llama/Qwen2 with SDPA; not eager attention, other
    linear layers (a peft adapter) or other architectures, which keep generate()."""
    from transformers import GPT2Config, GPT2LMHeadModel

    assert static_decode_supported(_llama(tok)) and static_decode_supported(_qwen2(tok))
    eager = LlamaForCausalLM._from_config(_llama(tok).config, attn_implementation="eager")
    assert not static_decode_supported(eager)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=1, n_head=2))
    assert not static_decode_supported(gpt2)
    peft = pytest.importorskip("peft")
    lora = peft.get_peft_model(_llama(tok), peft.LoraConfig(r=2, target_modules=["q_proj"]))
    assert not static_decode_supported(lora) and not static_decode_supported(lora.base_model.model)


def test_engine_falls_back_to_generate_with_the_same_rollouts(tok, monkeypatch) -> None:
    """`TransformersEngine` gives the same rollouts on both paths (static decoder, generate())."""
    import distillab.rollout.engine as engine

    model = _llama(tok)
    prompts = [tok("10 7 3 -> 21", add_special_tokens=False)["input_ids"], tok("ab", add_special_tokens=False)["input_ids"]]
    sp = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=8, n=3, seed=11)
    fast = TransformersEngine(model, tok.eos_token_id, tok.pad_token_id).generate(prompts, sp)
    monkeypatch.setattr(engine, "static_decode_supported", lambda m: False)
    slow = TransformersEngine(model, tok.eos_token_id, tok.pad_token_id).generate(prompts, sp)
    assert fast.completion_ids == slow.completion_ids and fast.finish_reasons == slow.finish_reasons
    seqs, attn = left_pad([p + c for p, c in zip(fast.prompt_ids, fast.completion_ids)], tok.pad_token_id)
    bound = tol.logprob_gap(model, seqs, attn, 0.8)
    for a, b in zip(fast.logprobs, slow.logprobs):
        assert a == pytest.approx(b, abs=bound)


@pytest.mark.parametrize("lam", [0.5, -1.5])
def test_spectrum_other_model_on_both_paths(tok, monkeypatch, lam) -> None:
    """The λ-spectrum's second model stepped by the static decoder or by its own forward
    (`rollout.spectrum._CachedForward`): the same rollouts, logprobs and log-likelihoods to float32's
    rounding (tests/_tolerance.py: each model's log-probabilities within their bound, π_λ's a combination of
    them with weights summing to at most 1 + |λ|, then its own log-softmax; a log-likelihood a sum of ≤ 8)."""
    import distillab.rollout.spectrum as spectrum

    student, teacher = _llama(tok, 0), _llama(tok, 5)
    prompts = [tok("12 5 -> 7", add_special_tokens=False)["input_ids"], tok("abc", add_special_tokens=False)["input_ids"]]
    sp = SamplingParams(1.0, 0.9, 8, 2, 4)
    eng = SpectrumEngine(student, teacher, tok.eos_token_id, tok.pad_token_id, lam=lam, tau_s=1.0, tau_t=0.5)
    assert isinstance(_other_stepper(teacher, torch.ones(1, 2, dtype=torch.long), 2), StaticKVDecoder)
    fast = eng.generate(prompts, sp)
    monkeypatch.setattr(spectrum, "static_decode_supported", lambda m: False)
    assert isinstance(_other_stepper(teacher, torch.ones(1, 2, dtype=torch.long), 2), _CachedForward)
    slow = eng.generate(prompts, sp)
    assert fast.completion_ids == slow.completion_ids
    seqs, attn = left_pad([p + c for p, c in zip(fast.prompt_ids, fast.completion_ids)], tok.pad_token_id)
    each = {"student_loglik": tol.logprob_gap(student, seqs, attn, 1.0), "teacher_loglik": tol.logprob_gap(teacher, seqs, attn, 0.5)}
    for a, b in zip(fast.logprobs, slow.logprobs):
        assert a == pytest.approx(b, abs=(1 + abs(lam)) * sum(each.values()) + each["student_loglik"])
    for k in ("student_loglik", "teacher_loglik"):
        sum_err = tol.gamma(8, torch.float32) * max(map(abs, slow.extras[k]))  # the sum's own rounding
        assert fast.extras[k] == pytest.approx(slow.extras[k], abs=8 * each[k] + sum_err)


def test_bf16_student_decodes_as_its_forward_and_samples_as_generate(tok, model) -> None:
    """``trial.precision: bf16`` keeps the static path: with bf16 weights every decode
    step equals the model's own forward bitwise, and the sampled tokens equal
    generate()'s under the same seed (its logprobs to bf16 rounding, tests/_tolerance.py: generate's padded
    prefill attention rounds differently in bf16)."""
    import copy

    m = copy.deepcopy(model).to(torch.bfloat16)
    assert static_decode_supported(m)
    ids, attn = _batch(tok, (5, 2, 9))
    with torch.inference_mode():
        cache = DynamicCache(config=m.config)
        want = m(input_ids=ids, attention_mask=attn, past_key_values=cache, use_cache=True).logits[:, -1].float()
        dec = StaticKVDecoder(m, attn, max_new=3)
        assert (dec.prefill(ids) - want).abs().max() <= 4 * _err(m, ids, attn, last=True)  # two bf16 forwards: 4E
        for t in (20, 31, 17):
            new = torch.full((ids.shape[0],), t)
            attn = torch.cat([attn, attn.new_ones(attn.shape[0], 1)], 1)
            want = m(input_ids=new[:, None], attention_mask=attn, past_key_values=cache, use_cache=True).logits[:, -1]
            assert torch.equal(dec.step(new), want.float())
    ids, attn = _batch(tok, (7, 3, 12, 1), seed=4)
    for seed in range(2):
        torch.manual_seed(seed)
        res = m.generate(input_ids=ids, attention_mask=attn, do_sample=True, temperature=0.7, top_p=0.8, top_k=0,
                         max_new_tokens=10, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                         output_logits=True, return_dict_in_generate=True)
        want = res.sequences[:, ids.shape[1]:]
        torch.manual_seed(seed)
        with torch.inference_mode():
            got, lp = sample_tokens(m, ids, attn, temperature=0.7, top_p=0.8, max_new=10,
                                    eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        assert torch.equal(got, want), seed
        full = torch.cat([attn, (want != tok.pad_token_id).long()], 1)
        gap = (lp - token_logprobs(torch.stack(res.logits, 1), want, 0.7)).abs()[want != tok.pad_token_id]
        assert gap.max() <= tol.logprob_gap(m, res.sequences, full, 0.7)
