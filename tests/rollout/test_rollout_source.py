"""What trials share: OffPD rollout reuse (issue 4, item 3) and the untrained
student's evaluation, on tiny models built from config. The importance weight is
tested with the loss step in tests/ops/test_loss_step.py."""

from __future__ import annotations

import _tolerance as tol
import pytest
import torch
from transformers import LlamaForCausalLM

from distillab.config import TrialConfig
from distillab.models import build_char_tokenizer, micro_llama_config
from distillab.rollout.engine import TransformersEngine
from distillab.rollout.types import pack_rollouts, position_ids
from distillab.rollout.source import offpd_rollout_path, offpd_rollout_set, rollout_seed, sample_rollouts, step_prompts
from distillab.tasks.data import train_prompts


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def models(tok, tmp_path_factory):
    torch.manual_seed(0)
    teacher = LlamaForCausalLM(micro_llama_config(len(tok), 64, 1, 2, 64, 128, tok)).eval()
    torch.manual_seed(1)
    student = LlamaForCausalLM(micro_llama_config(len(tok), 64, 1, 2, 64, 128, tok)).eval()
    path = tmp_path_factory.mktemp("teacher")
    teacher.save_pretrained(path, safe_serialization=True)
    return teacher, student, path


def _trial(**over) -> TrialConfig:
    d = {
        "optimizer": {"steps": 3, "prompts_per_step": 4, "train_prompts": 100},
        "rollout": {"policy": "offpd", "max_tokens": 10, "offpd_reuse": True},
        "evaluation": {"id_items": 4, "pass_items": 2},
    }
    for k, v in over.items():
        d.setdefault(k, {}).update(v)
    return TrialConfig.model_validate(d)


def test_offpd_reuse_is_the_in_trial_sampling_and_is_generated_once(tok, models, tmp_path) -> None:
    teacher, student, path = models
    trial = _trial()
    engine = TransformersEngine(teacher, tok.eos_token_id, tok.pad_token_id)
    calls = []

    def generate(prompts, sp):
        calls.append(sp.seed)
        return engine.generate(prompts, sp)

    sets = offpd_rollout_set(trial, path, tok, 0, 1, tmp_path, generate=generate)
    assert calls == [rollout_seed(trial, s, 0) for s in range(3)]  # one generate per step, the trial's seeds
    assert [p.name for p in tmp_path.iterdir()] == [offpd_rollout_path(tmp_path, trial, path, 0, 1).name]  # no temp file left
    prompts = train_prompts(trial, tok, 0)
    for step in range(3):  # exactly what the trial would have sampled itself
        fresh = sample_rollouts(trial, teacher, student, tok, step_prompts(prompts, step, 4, 1),
                                seed=rollout_seed(trial, step, 0))
        got = sets[step]
        assert got.prompt_ids == fresh.prompt_ids and got.completion_ids == fresh.completion_ids
        assert got.finish_reasons == fresh.finish_reasons
        # two float32 decodes of the same tokens: each log-probability within 2 (2E)/τ and its row's ρ
        # (tests/_tolerance.py), E the teacher's float32 logits' error on these rollouts
        ids, attn, cmask = pack_rollouts(fresh.prompt_ids, fresh.completion_ids, tok.pad_token_id)
        kw = dict(input_ids=ids, attention_mask=attn, position_ids=position_ids(attn))
        E, tau = tol.forward_err(lambda m: m(**kw).logits, teacher), trial.rollout.tau_t
        with torch.no_grad():
            A = tol.logit_range((teacher(**kw).logits[cmask], tau))
        bound = 2 * (2 * 2 * E / tau + tol.row(len(tok), torch.float32, A))
        for a, b in zip(got.logprobs, fresh.logprobs):
            assert a == pytest.approx(b, abs=bound)
    batched = offpd_rollout_set(trial, path, tok, 0, 1, tmp_path / "b", generate_many=engine.generate_many)
    assert [r.completion_ids for r in batched] == [r.completion_ids for r in sets]
    again = offpd_rollout_set(trial, path, tok, 0, 1, tmp_path, generate=generate)  # from the cache
    assert len(calls) == 3 and [r.completion_ids for r in again] == [r.completion_ids for r in sets]
    # every input of the rollouts is in the key; the LR is not (trials of an LR grid share a set)
    key = offpd_rollout_path(tmp_path, trial, path, 0, 1)
    assert offpd_rollout_path(tmp_path, _trial(rollout={"tau_t": 0.7}), path, 0, 1) != key
    assert offpd_rollout_path(tmp_path, _trial(optimizer={"steps": 4}), path, 0, 1) != key
    assert offpd_rollout_path(tmp_path, trial, path, 1, 2) != key
    assert offpd_rollout_path(tmp_path, _trial(optimizer={"lr": 3e-3}), path, 0, 1) == key
    assert offpd_rollout_path(tmp_path, _trial(loss={"kind": "reverse"}), path, 0, 1) == key


def test_offpd_reuse_errors(tok, models, tmp_path) -> None:
    _, _, path = models
    with pytest.raises(ValueError, match="rollout.policy must be 'offpd'"):
        offpd_rollout_set(_trial(rollout={"policy": "onpd"}), path, tok, 0, 1, tmp_path)
    with pytest.raises(FileNotFoundError, match="no cached OffPD rollouts"):
        offpd_rollout_set(_trial(), path, tok, 0, 1, tmp_path)


def test_importance_weight_config_errors() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="loss.importance_weight needs rollout.policy 'offpd' or 'onpd'"):
        TrialConfig.model_validate({"rollout": {"policy": "spectrum", "lambda": 0.0},
                                    "loss": {"importance_weight": True}})
    with pytest.raises(ValidationError, match="engine"):
        TrialConfig.model_validate({"rollout": {"engine": "sglang"}})
    with pytest.raises(ValidationError, match="sync_every"):
        TrialConfig.model_validate({"rollout": {"sync_every": 0}})


def test_pre_eval_is_shared_between_trials_with_the_same_student_and_settings(tok, models, tmp_path) -> None:
    """The untrained student's evaluation is computed once and reused (same rows)."""
    import json

    from distillab.evals.suite import evaluate_stage as _evaluate
    from distillab.evals.suite import pre_eval_path

    _, student, path = models

    class CountingEvaluator:
        calls = 0

        def evaluate(self, model, seed, samples):
            CountingEvaluator.calls += 1
            samples.append({"task": "countdown3", "prompt": "1 2 3 -> 6", "completion": "1+2+3", "reward": 1.0})
            return [{"task": "countdown3", "metric": "accuracy", "value": 0.25, "n": 4}]

    trial = _trial()
    cache = pre_eval_path(tmp_path / "shared", trial, path)
    init = {k: v.detach().float().clone() for k, v in student.state_dict().items()}
    a = _evaluate(CountingEvaluator(), student, trial, "t1", "pre", 0, tmp_path / "res", init, cache=cache)
    b = _evaluate(CountingEvaluator(), student, trial, "t2", "pre", 0, tmp_path / "res", init, cache=cache)
    assert CountingEvaluator.calls == 1 and a == b
    assert a["eval/pre/countdown3/accuracy"] == 0.25 and a["eval/pre/params/sparsity@1e-06"] == 1.0
    assert json.loads(cache.read_text()) == {
        "rows": [{"task": "countdown3", "metric": "accuracy", "value": 0.25, "n": 4}],
        "samples": [{"task": "countdown3", "prompt": "1 2 3 -> 6", "completion": "1+2+3", "reward": 1.0}]}
    # the LR does not change the key; the seed, the evaluation settings and the student do
    assert pre_eval_path(tmp_path, _trial(optimizer={"lr": 1e-2}), path) == pre_eval_path(tmp_path, trial, path)
    assert pre_eval_path(tmp_path, trial.model_copy(update={"seed": 7}), path) != pre_eval_path(tmp_path, trial, path)
    assert pre_eval_path(tmp_path, _trial(evaluation={"id_items": 5}), path) != pre_eval_path(tmp_path, trial, path)
    assert pre_eval_path(tmp_path, trial, tmp_path) != pre_eval_path(tmp_path, trial, path)
    # the student is evaluated in the trial's precision: a bf16 trial does not reuse a float32 evaluation
    assert pre_eval_path(tmp_path, trial.model_copy(update={"precision": "bf16"}), path) != pre_eval_path(
        tmp_path, trial, path)


def test_resolve_engine(monkeypatch) -> None:
    import distillab.rollout.actor as actor

    assert actor.resolve_engine("transformers", batched=True) == "transformers"
    assert actor.resolve_engine("vllm", batched=False) == "vllm"
    monkeypatch.setattr(actor, "vllm_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert actor.resolve_engine("auto", batched=True) == "vllm"  # a whole OffPD set in one call
    assert actor.resolve_engine("auto", batched=False) == "transformers"  # per-step sampling on CPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert actor.resolve_engine("auto", batched=False) == "vllm"
    monkeypatch.setattr(actor, "vllm_available", lambda: False)
    assert actor.resolve_engine("auto", batched=True) == "transformers"
    with pytest.raises(ValueError, match="rollout.engine must be 'auto', 'vllm' or 'transformers', got 'sglang'"):
        actor.resolve_engine("sglang", batched=True)
