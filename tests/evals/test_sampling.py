"""`evals.sampling.sample_batched` against one ``generate`` call per request, on a real
smoke-size Llama: a request alone at its sampling setting is sampled exactly as its own
call samples it (same seed, same ids); requests merged at one setting give, at a
near-greedy temperature (where a row's tokens do not depend on the sampler's stream),
the completions their own calls give, in request order; odd prompt counts and ``n``."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaForCausalLM

from distillab.evals.sampling import sample_batched
from distillab.models import build_char_tokenizer, micro_llama_config
from distillab.rollout.engine import TransformersEngine
from distillab.rollout.types import SamplingParams


class CountingEngine(TransformersEngine):
    """The real engine, counting its ``generate`` calls."""

    calls = 0

    def generate(self, prompt_ids, sampling):
        self.calls += 1
        return super().generate(prompt_ids, sampling)


@pytest.fixture(scope="module")
def engine_and_prompts():
    tok = build_char_tokenizer()
    torch.manual_seed(0)
    model = LlamaForCausalLM(micro_llama_config(len(tok), 64, 1, 2, 64, 256, tok)).eval()
    with torch.no_grad():  # peaked logits: no near-ties, so a near-greedy sample is the argmax however padded
        model.lm_head.weight.mul_(200.0)
    texts = ["12+7=", "3*4", "reverse abc", "sort 3 1 2", "9-", "Countdown: 25 5 3 -> 40", "a"]
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    return CountingEngine(model, tok.eos_token_id, tok.pad_token_id, batch_size=5), prompts


def _own(engine, prompts, sp):
    return engine.generate(prompts, sp).completion_ids


def test_a_request_alone_at_its_setting_is_sampled_as_its_own_call(engine_and_prompts) -> None:
    engine, prompts = engine_and_prompts
    requests = [(prompts[:5], SamplingParams(1.0, 1.0, 9, 3, 11)),    # alone at (1.0, 1.0, 9)
                (prompts[2:], SamplingParams(0.7, 0.9, 6, 1, 5))]     # alone at (0.7, 0.9, 6)
    engine.calls = 0
    done = sample_batched(engine, requests)
    assert engine.calls == 2  # one call per setting
    for (p, sp), got in zip(requests, done):
        assert len(got) == len(p) * sp.n
        assert got == _own(engine, p, sp)  # same ids, same seed: nothing changed for it


def test_requests_at_one_setting_share_a_call_and_keep_their_order(engine_and_prompts) -> None:
    engine, prompts = engine_and_prompts
    cold = dict(temperature=1e-4, top_p=1.0, max_tokens=8)  # near-greedy: a row's tokens are its argmax path
    requests = [(prompts[:3], SamplingParams(**cold, n=2, seed=1)),
                (prompts[3:], SamplingParams(**cold, n=1, seed=2)),
                (prompts[1:2], SamplingParams(1.0, 1.0, 8, 2, 3)),   # another setting: its own call
                (prompts[5:], SamplingParams(**cold, n=3, seed=4))]
    engine.calls = 0
    done = sample_batched(engine, requests)
    assert engine.calls == 2
    assert [len(d) for d in done] == [6, 4, 2, 6]
    for i in (0, 1, 3):
        assert done[i] == _own(engine, *requests[i]), i
    assert done[2] == _own(engine, *requests[2])  # alone at its setting: exactly its own call
    assert any(a != b for a, b in zip(done[0], done[1]))  # different prompts, different completions


def test_a_request_without_prompts_is_an_error(engine_and_prompts) -> None:
    engine, prompts = engine_and_prompts
    with pytest.raises(ValueError, match="request 1 has no prompts"):
        sample_batched(engine, [(prompts, SamplingParams()), ([], SamplingParams())])
