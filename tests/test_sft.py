"""SFT learning-rate schedule, completion-only targets and the training loop
(platform/recipe/sft.py)."""

from __future__ import annotations

import math

import _tolerance as tol
import pytest
import torch
from transformers import LlamaForCausalLM

from distillab.models import build_char_tokenizer, micro_llama_config
from distillab.recipe.sft import Example, completion_logits, lr_lambda, sft_train

#: float64 roundings (tests/_tolerance.py, approx64) of a learning-rate factor: a cosine (two) and a few
#: products and sums, and the literal's own
ROUNDINGS = 16

torch.set_num_threads(1)


def test_lr_lambda_warmup_then_constant() -> None:
    f = lr_lambda(10, 100, "constant")
    assert f(0) == tol.approx64(0.1, ROUNDINGS)
    assert f(4) == tol.approx64(0.5, ROUNDINGS)
    assert f(9) == tol.approx64(1.0, ROUNDINGS)
    assert f(10) == 1.0
    assert f(99) == 1.0
    assert f(500) == 1.0


def test_lr_lambda_cosine() -> None:
    f = lr_lambda(10, 110, "cosine")
    assert f(0) == tol.approx64(0.1, ROUNDINGS)
    assert f(9) == tol.approx64(1.0, ROUNDINGS)
    assert f(10) == tol.approx64(1.0, ROUNDINGS)  # decay starts at 1.0
    assert f(60) == tol.approx64(0.55, ROUNDINGS)  # halfway: 0.1 + 0.9 * 0.5 * (1 + cos(pi/2))
    assert f(35) == tol.approx64(0.1 + 0.45 * (1 + math.sqrt(0.5)), ROUNDINGS)  # a quarter: cos(pi/4)
    assert f(110) == tol.approx64(0.1, ROUNDINGS)  # reaches 10 % at total
    assert f(1000) == tol.approx64(0.1, ROUNDINGS)  # and stays there
    g = lr_lambda(0, 50, "cosine")
    assert g(0) == tol.approx64(1.0, ROUNDINGS)
    assert g(50) == tol.approx64(0.1, ROUNDINGS)


def test_lr_lambda_unknown_schedule() -> None:
    with pytest.raises(ValueError, match="linear"):
        lr_lambda(10, 100, "linear")


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def _model(tok) -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(micro_llama_config(len(tok), 64, 1, 2, 64, 64, tok))


def test_completion_logits_targets(tok) -> None:
    model = _model(tok).eval()
    with torch.no_grad():
        logits, targets = completion_logits(model, [[5, 6], [1, 2, 3]], [[7, 8], [4]], tok.pad_token_id)
    assert targets.tolist() == [7, 8, 4]
    assert logits.shape == (3, len(tok))
    # the first row's logits are the ones at prompt token 6 (predicting 7): same as an unpadded pass
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        ref = model(input_ids=ids).logits[0]
    # two float32 forwards of the same positions (a padded batch, an unpadded one): 4 E (tests/_tolerance.py)
    err = 4 * tol.forward_err(lambda m: m(input_ids=ids).logits, model)
    assert (logits[0] - ref[1]).abs().max() <= err and (logits[1] - ref[2]).abs().max() <= err


def test_sft_train_fits_two_examples(tok) -> None:
    def ex(prompt: str, completion: str) -> Example:
        p = tok(prompt, add_special_tokens=False)["input_ids"]
        c = tok(completion, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        return Example(tuple(p), tuple(c))

    examples = [ex("add 2 3", "<answer>5</answer>"), ex("rev abc", "<answer>cba</answer>")]
    model = _model(tok)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    seen: list[tuple[int, float]] = []
    losses = sft_train(
        model, examples, steps=60, batch_size=2, lr=1e-2, warmup=5, pad_id=tok.pad_token_id, seed=0,
        callback=lambda step, loss: seen.append((step, loss)), callback_every=20,
    )
    assert len(losses) == 60
    assert all(math.isfinite(x) for x in losses)
    assert losses[0] > 3.0  # about ln(108) = 4.68 for an untrained model
    assert losses[-1] < 0.5 * losses[0]
    assert [s for s, _ in seen] == [20, 40, 60]
    assert seen[-1][1] == tol.approx64(sum(losses[40:]) / 20, 2 * 21)  # a mean of 20 losses, computed twice
    assert not model.training
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_sft_train_errors(tok) -> None:
    model = _model(tok)
    with pytest.raises(ValueError, match="empty"):
        sft_train(model, [], steps=1, batch_size=1, lr=1e-3, warmup=0, pad_id=0, seed=0)
    ex = [Example((5,), (6, 2))]
    with pytest.raises(ValueError):
        sft_train(model, ex, steps=0, batch_size=1, lr=1e-3, warmup=0, pad_id=0, seed=0)
    with pytest.raises(ValueError):
        sft_train(model, ex, steps=1, batch_size=1, lr=0.0, warmup=0, pad_id=0, seed=0)
