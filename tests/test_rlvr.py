"""GRPO/DAPO pieces of the RLVR stage (platform/recipe/rlvr.py) against hand computations."""

from __future__ import annotations

import math

import _tolerance as tol
import pytest
import torch

from distillab.registry import find
from distillab.recipe.rlvr import countdown_reward, dapo_loss, group_advantages
from distillab.tasks.countdown import CountdownProblem


def test_group_advantages_equal_rewards_are_zero_not_nan() -> None:
    a = group_advantages(torch.tensor([2.0, 2.0, 2.0, 2.0, 0.0, 0.0, 0.0, 0.0]), 4)
    assert torch.equal(a, torch.zeros(8))


def test_group_advantages_mixed_groups_by_hand() -> None:
    a = group_advantages(torch.tensor([2.0, 0.0, 0.0, 2.0, 2.0, 0.0, 0.0, 0.0], dtype=torch.float64), 4)
    # group 1: mean 1, deviations ±1, Bessel std sqrt(4/3) = 2/sqrt(3)
    s1 = 1.0 / (2.0 / math.sqrt(3.0) + 1e-4)
    # group 2: mean 0.5, deviations (1.5, -0.5, -0.5, -0.5), variance (2.25 + 3 * 0.25) / 3 = 1
    s2 = 1.0 / (1.0 + 1e-4)
    expected = [s1, -s1, -s1, s1, 1.5 * s2, -0.5 * s2, -0.5 * s2, -0.5 * s2]
    # float64: a mean of 4, deviations, a Bessel variance (4 squares, a sum, /3), a square root, + 1e-4, a quotient
    assert a.tolist() == tol.approx64(expected, 16, scale=2.0)
    assert group_advantages(torch.tensor([2.0, 0.0]), 2, scale=False).tolist() == [1.0, -1.0]


@pytest.mark.parametrize("bad, fragment", [
    (dict(rewards=torch.zeros(4), group_size=1), "group_size"),
    (dict(rewards=torch.zeros(5), group_size=2), "multiple of group_size 2"),
    (dict(rewards=torch.zeros(2, 2), group_size=2), "rewards must be"),
])
def test_group_advantages_errors(bad, fragment) -> None:
    with pytest.raises(ValueError, match=fragment):
        group_advantages(**bad)


def _batch():
    """Two sequences: A = +1 with ratios (1.5, 0.9); A = -2 with ratios (0.5, 1.1) and a pad."""
    old = torch.zeros(2, 3, dtype=torch.float64)
    diff = torch.tensor([[math.log(1.5), math.log(0.9), 0.0], [math.log(0.5), math.log(1.1), 7.0]],
                        dtype=torch.float64)
    logp = (old + diff).requires_grad_()
    mask = torch.tensor([[True, True, False], [True, True, False]])
    return logp, old, torch.tensor([1.0, -2.0], dtype=torch.float64), mask


def test_dapo_loss_by_hand() -> None:
    logp, old, adv, mask = _batch()
    loss, stats = dapo_loss(logp, old, adv, mask)
    # min(ρA, clip(ρ, 0.8, 1.28)A): 1.28 (clipped), 0.9, -1.6 (clipped: 0.8 * -2), -2.2; / 4 tokens. float64: the
    # ratios' log, sum and exp, a product and a clip each, a sum of 4 and a quotient: 16 roundings on values <= 2.2
    assert float(loss.detach()) == tol.approx64(-(1.28 + 0.9 - 1.6 - 2.2) / 4, 16, scale=2.2)
    assert stats["clip_frac"] == 0.5 and stats["ratio_mean"] == tol.approx64(1.0, 16, scale=1.5)
    assert stats["kl"] == 0.0
    loss.backward()
    # clipped tokens get no gradient; others d/dlogp = -A ρ / 4; the pad none
    expected = torch.tensor([[0.0, -0.9 / 4, 0.0], [0.0, 2.0 * 1.1 / 4, 0.0]], dtype=torch.float64)
    assert ((logp.grad - expected).abs() <= tol.gamma(16) * expected.abs()).all()  # the same 16 roundings


def test_dapo_loss_reference_kl_by_hand() -> None:
    logp, old, adv, mask = _batch()
    ref = logp.detach() + math.log(2.0)  # k3: exp(log 2) - log 2 - 1 = 1 - log 2 per token
    loss, stats = dapo_loss(logp, old, adv, mask, beta=0.1, ref_logp=ref)
    # float64: the clipped surrogate's 16 roundings, and k3's exp, log and sums (8 more)
    assert float(loss.detach()) == tol.approx64(0.405 + 0.1 * (1.0 - math.log(2.0)), 24, scale=2.2)
    assert stats["kl"] == tol.approx64(1.0 - math.log(2.0), 24, scale=2.0)


def test_dapo_loss_errors() -> None:
    logp, old, adv, mask = _batch()
    with pytest.raises(TypeError, match="mask must be bool"):
        dapo_loss(logp, old, adv, mask.long())
    with pytest.raises(ValueError, match="beta > 0 needs ref_logp"):
        dapo_loss(logp, old, adv, mask, beta=0.1)
    with pytest.raises(ValueError, match="advantages must be"):
        dapo_loss(logp, old, adv[:1], mask)
    with pytest.raises(ValueError, match="share one"):
        dapo_loss(logp, old[:, :2], adv, mask)


def test_countdown_reward() -> None:
    p = CountdownProblem(operands=(7, 3, 10), target=100)
    assert countdown_reward("<answer>7+3=10, 10*10=100</answer>", p) == 2.0
    assert countdown_reward("<answer>7+3=10, 10*10=101</answer>", p) == 0.0
    assert countdown_reward("<answer>7+3=10, 10*10=100</answer>", p, format_reward=0.5) == 2.5
    assert countdown_reward("<answer>nonsense</answer>", p, format_reward=0.5) == 0.5
    assert countdown_reward("<answer>a</answer><answer>b</answer>", p, format_reward=0.5) == 0.0
    assert countdown_reward("<answer>__import__('os').system('true')</answer>", p, format_reward=0.5) == 0.5
    with pytest.raises(ValueError, match="format_reward"):
        countdown_reward("", p, format_reward=0.6)


def test_run_rlvr_with_lora_trains_only_the_adapters_and_merges_them() -> None:
    """GRPO steps on a LoRA-wrapped micro model (`TorchStepper`, as `prepare`'s teacher
    refinement runs it): the base weights stay put during training, the adapters move,
    and merging gives W + (α/r)·B·A in the base model's own modules."""
    from transformers import LlamaForCausalLM

    from distillab.config import LoRAConfig, RLVRConfig, TasksConfig
    from distillab.models import build_char_tokenizer, micro_llama_config
    from distillab.recipe.optim import TorchStepper, rlvr_schedule
    from distillab.recipe.rlvr import apply_lora, merge_lora, run_rlvr
    from distillab.tasks.countdown import CountdownProblem

    tok = build_char_tokenizer()
    torch.manual_seed(0)
    model = LlamaForCausalLM(micro_llama_config(len(tok), 64, 1, 2, 64, 256, tok))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = RLVRConfig(task="countdown3", steps=3, prompts_per_step=2, samples_per_prompt=4, lr=1e-2, max_tokens=8,
                     format_reward=0.5, lora=LoRAConfig(r=4, alpha=8.0, target_modules=("q_proj", "v_proj")))
    peft_model = apply_lora(model, cfg.lora)
    trainable = {n for n, p in peft_model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    problems = [CountdownProblem((1, 2, 3), 6), CountdownProblem((2, 5, 4), 40)]
    # a random model never writes a correct answer: a reward on the parity of the sample's character codes makes
    # the rewards in each group differ, so the advantages are non-zero and the adapters must move
    history = run_rlvr(cfg, TorchStepper(peft_model, cfg.lr, rlvr_schedule(cfg)), tok, TasksConfig(), problems, 0,
                       lambda step, m: None, reward_fn=lambda text, problem: float(sum(map(ord, text)) % 2))
    assert len(history) == 3 and all(h["rlvr/grad_norm"] > 0 for h in history)
    keys = {k for h in history for k in h}  # every key the stage emits is registered, as an RLVR key
    assert [k for k in sorted(keys) if find(k) is None] == [] and {find(k).scope for k in keys} == {"rlvr"}
    # π_old is the sampling weights at τ (not the sampler's top-p-renormalised logprobs): the trainer's log π_θ
    # detached, so every ratio is exp(0) = 1 and their float32 mean exactly 1
    assert cfg.top_p == 0.95 and all(h["rlvr/ratio_mean"] == 1.0 for h in history)
    base_now = {k.replace("base_model.model.", "").replace(".base_layer", ""): v
                for k, v in peft_model.state_dict().items() if "lora_" not in k}
    assert all(torch.equal(base_now[k], before[k]) for k in before)  # frozen base during training
    lora = {k: v.clone() for k, v in peft_model.state_dict().items() if "lora_" in k}
    merged = merge_lora(peft_model)
    assert merged is model
    q = "model.layers.0.self_attn.q_proj"
    a = lora[f"base_model.model.{q}.lora_A.default.weight"].double()  # (r, H)
    b = lora[f"base_model.model.{q}.lora_B.default.weight"].double()  # (H, r)
    assert b.abs().max() > 1e-4  # lora_B starts at 0: the GRPO steps moved it
    expected = before[f"{q}.weight"].double() + (8.0 / 4) * b @ a
    # the float32 merge W + (α/r)·(B A): the product of r terms, the scale and the sum (Higham eq. (3.13))
    err = tol.gamma(4 + 2, torch.float32) * (before[f"{q}.weight"].double().abs() + 2 * b.abs() @ a.abs())
    assert ((model.state_dict()[f"{q}.weight"].double() - expected).abs() <= err).all()
    assert set(model.state_dict()) == set(before)  # a plain model again


def _micro_lora_model(seed: int = 0, lora: bool = True):
    from transformers import LlamaForCausalLM

    from distillab.config import LoRAConfig
    from distillab.models import build_char_tokenizer, micro_llama_config
    from distillab.recipe.rlvr import apply_lora

    tok = build_char_tokenizer()
    torch.manual_seed(seed)
    model = LlamaForCausalLM(micro_llama_config(len(tok), 64, 1, 2, 64, 256, tok))
    plain = {k: v.clone() for k, v in model.state_dict().items()}
    if not lora:
        return tok, plain, model
    peft_model = apply_lora(model, LoRAConfig(r=4, alpha=8.0, target_modules=("q_proj", "v_proj")))
    return tok, plain, peft_model


def test_policy_weights_of_a_lora_model_are_merged_under_plain_names_and_training_stays_unmerged() -> None:
    """What the vLLM engine gets in a LoRA RLVR stage: W + (α/r)·B·A for every wrapped
    projection under the plain model's names (float64 reference), the other weights
    as they are; afterwards the peft model computes what it computed before."""
    from distillab.rollout.actor import policy_weights

    tok, plain, peft_model = _micro_lora_model()
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:  # lora_B starts at 0 (merged = base); give it values
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    ids = torch.tensor([[1, 5, 9, 13, 7]])
    with torch.no_grad():
        out_before = peft_model(input_ids=ids).logits.clone()
    sd = peft_model.state_dict()
    weights = dict(policy_weights(peft_model))
    assert set(weights) == set(plain)  # plain names, no adapter tensors
    for q in ("model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.v_proj"):
        a = sd[f"base_model.model.{q}.lora_A.default.weight"].double()
        b = sd[f"base_model.model.{q}.lora_B.default.weight"].double()
        expected = plain[f"{q}.weight"].double() + (8.0 / 4) * b @ a
        assert (expected - plain[f"{q}.weight"].double()).abs().max() > 1e-3  # the delta is visible
        # the float32 W + (α/r)·(B A): r = 4 terms, the scale and the sum (Higham eq. (3.13))
        err = tol.gamma(4 + 2, torch.float32) * (plain[f"{q}.weight"].double().abs() + 2 * b.abs() @ a.abs())
        assert ((weights[f"{q}.weight"].double() - expected).abs() <= err).all()
    k = "model.layers.0.self_attn.k_proj.weight"  # not wrapped: unchanged
    assert torch.equal(weights[k], plain[k])
    with torch.no_grad():
        assert torch.equal(peft_model(input_ids=ids).logits, out_before)  # unmerged again
    assert all(torch.equal(peft_model.state_dict()[n], v) for n, v in sd.items())


class _CopySampler:
    """A sampler over a separate copy of the policy (as the vLLM engine is): ``sync``
    loads `policy_weights` into the copy, or does nothing when ``stale``."""

    def __init__(self, model, tok, stale: bool):
        import copy

        from distillab.rollout.engine import TransformersEngine

        self.copy = copy.deepcopy(model).eval()
        if hasattr(self.copy, "merge_and_unload"):  # the engine holds a plain model
            self.copy = self.copy.merge_and_unload()
        self.engine = TransformersEngine(self.copy, tok.eos_token_id, tok.pad_token_id)
        self.stale, self.syncs, self.rollouts = stale, 0, []

    def sync(self, module) -> None:
        from distillab.rollout.actor import policy_weights

        self.syncs += 1
        if not self.stale:
            self.copy.load_state_dict(dict(policy_weights(module)))

    def generate(self, prompts, sp):
        self.rollouts.append(self.engine.generate(prompts, sp))
        return self.rollouts[-1]

    def logprob_gap(self, tok, tau: float) -> float:
        """The gap allowed between two float32 log-probabilities of the sampled tokens (tests/_tolerance.py):
        the engine's (a cached decode of the copy) against the trainer's (a full pass), on every rollout."""
        from distillab.rollout.types import left_pad

        seqs = [p + c for ro in self.rollouts for p, c in zip(ro.prompt_ids, ro.completion_ids)]
        return tol.logprob_gap(self.copy, *left_pad(seqs, tok.pad_token_id), tau)


@pytest.mark.parametrize("lora", [False, True])
def test_run_rlvr_samples_from_a_synced_engine_and_a_stale_one_shows_in_the_logp_gap(lora) -> None:
    """``rlvr/sampler_logp_gap`` (top-p 1): 0 while the sampler holds the trained
    weights (synced before each step, merged LoRA weights included), non-zero from the
    second step on when it keeps the initial ones."""
    from distillab.config import RLVRConfig, TasksConfig
    from distillab.recipe.optim import TorchStepper, rlvr_schedule
    from distillab.recipe.rlvr import run_rlvr

    problems = [CountdownProblem((1, 2, 3), 6), CountdownProblem((2, 5, 4), 40)]
    gaps = {}
    for stale in (False, True):
        tok, _, model = _micro_lora_model(lora=lora)
        cfg = RLVRConfig(task="countdown3", steps=3, prompts_per_step=2, samples_per_prompt=4, lr=3e-2, top_p=1.0,
                         max_tokens=8, warmup_ratio=0.0)
        sampler = _CopySampler(model, tok, stale)
        history = run_rlvr(cfg, TorchStepper(model, cfg.lr, rlvr_schedule(cfg)), tok, TasksConfig(), problems, 0,
                           lambda step, m: None, reward_fn=lambda text, problem: float(sum(map(ord, text)) % 2),
                           sampler=sampler)
        assert sampler.syncs == 3 and all(h["rlvr/grad_norm"] > 0 for h in history)
        gaps[stale] = [abs(h["rlvr/sampler_logp_gap"]) for h in history]
        bound = sampler.logprob_gap(tok, cfg.temperature)  # a mean of per-token gaps, each within it
    assert max(gaps[False]) <= bound, (gaps, bound)
    assert gaps[True][0] <= bound and min(gaps[True][1:]) > 1e-3, (gaps, bound)  # stale: the step's change shows


def test_qlora_trains_adapters_on_a_4bit_base_and_writes_the_trained_policy_back() -> None:
    """``lora.load_in_4bit``: the adapters train on a bitsandbytes nf4 copy (its packed
    weights never change), a sampler synced with `policy_weights` samples from exactly
    the trained policy (dequantised base + adapters: sampler_logp_gap ~0 at top-p 1),
    and `merge_into` leaves the full-precision model computing what the 4-bit LoRA
    model computes."""
    pytest.importorskip("bitsandbytes")
    from transformers import LlamaForCausalLM

    from distillab.config import LoRAConfig, RLVRConfig, TasksConfig
    from distillab.models import build_char_tokenizer, micro_llama_config
    from distillab.recipe.optim import TorchStepper, rlvr_schedule
    from distillab.recipe.rlvr import merge_into, quantized_lora, run_rlvr
    from distillab.rollout.actor import policy_weights

    tok = build_char_tokenizer()
    torch.manual_seed(0)
    model = LlamaForCausalLM(micro_llama_config(len(tok), 64, 1, 2, 64, 256, tok)).eval()
    fp = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = RLVRConfig(task="countdown3", steps=3, prompts_per_step=2, samples_per_prompt=4, lr=3e-2, top_p=1.0,
                     max_tokens=8, warmup_ratio=0.0,
                     lora=LoRAConfig(r=4, alpha=8.0, target_modules=("q_proj", "v_proj"), load_in_4bit=True))
    peft4 = quantized_lora(model, cfg.lora)
    q = "model.layers.0.self_attn.q_proj"
    layer = peft4.get_submodule(f"base_model.model.{q}")
    assert type(layer.base_layer).__name__ == "Linear4bit"
    packed = layer.base_layer.weight.data.clone()
    deq = dict(policy_weights(peft4))[f"{q}.weight"]  # B = 0 so far: the dequantised base
    err = (deq - fp[f"{q}.weight"]).abs().max()
    assert 1e-4 < err < 0.2 * fp[f"{q}.weight"].abs().max()  # nf4 rounding: close to, not equal to, the fp weight
    sampler = _CopySampler(model, tok, stale=False)  # a full-precision engine, synced every step
    history = run_rlvr(cfg, TorchStepper(peft4, cfg.lr, rlvr_schedule(cfg)), tok, TasksConfig(),
                       [CountdownProblem((1, 2, 3), 6), CountdownProblem((2, 5, 4), 40)], 0, lambda step, m: None,
                       reward_fn=lambda text, problem: float(sum(map(ord, text)) % 2), sampler=sampler)
    assert all(h["rlvr/grad_norm"] > 0 for h in history)
    assert max(abs(h["rlvr/sampler_logp_gap"]) for h in history) < 1e-4, history
    assert torch.equal(layer.base_layer.weight.data, packed)  # the 4-bit base is frozen
    assert all(torch.equal(model.state_dict()[k], fp[k]) for k in fp)  # training never touched the fp model
    b = peft4.state_dict()[f"base_model.model.{q}.lora_B.default.weight"]
    assert b.abs().max() > 1e-4  # the adapters moved
    ids = torch.tensor([[1, 5, 9, 13, 7, 22]])
    naive = LlamaForCausalLM(model.config).eval()  # the full-precision base + the adapters' deltas
    naive.load_state_dict(fp)
    for name in (q, "model.layers.0.self_attn.v_proj"):
        delta = peft4.get_submodule(f"base_model.model.{name}").get_delta_weight("default").detach()
        naive.get_submodule(name).weight.data += delta
    with torch.no_grad():
        want = peft4(input_ids=ids).logits
        merge_into(model, peft4)
        got = model(input_ids=ids).logits
        far = (naive(input_ids=ids).logits - want).abs().max()
    assert model.model.layers[0].self_attn.q_proj.weight.dtype == torch.float32
    # bitsandbytes' CPU 4-bit matmul is not bit-identical to a dense one (~2e-3 here); skipping the dequantisation
    # (merging into the original weights) is off by the quantisation error, several times more
    near = (got - want).abs().max()
    assert near < 5e-3 and far > 4 * near, (float(near), float(far))


def test_load_in_4bit_without_bitsandbytes_is_a_named_error(monkeypatch) -> None:
    import importlib.util

    from pydantic import ValidationError

    from distillab.config import RLVRConfig

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "bitsandbytes" else real(name, *a))
    with pytest.raises(ValidationError, match=r"lora\n.*load_in_4bit: true needs bitsandbytes"):
        RLVRConfig.model_validate({"lora": {"load_in_4bit": True}})
    assert RLVRConfig.model_validate({"lora": {}}).lora.load_in_4bit is False
