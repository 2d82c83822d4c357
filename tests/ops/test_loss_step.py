"""distill.loss_step with each LossConfig.impl on tiny Llama/Qwen2 models: the chunked and
Triton paths (final hidden states + lm_head) give the reference path's loss, gradients
and diagnostics; vocab-size mismatches are errors unless LossConfig.pad_vocab."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from distillab.config import LossConfig, TrialConfig
from distillab.distill import loss_step
from distillab.rollout import Rollouts

V, PAD = 41, 0


class _Engine(torch.nn.Module):
    """Stands in for the DeepSpeed engine: ``engine(...)`` forwards, ``engine.module`` is the model."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, **kw):
        return self.module(**kw)


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
    g = torch.Generator().manual_seed(1)
    lens = [(3, 5), (6, 2), (2, 0), (4, 7)]  # (prompt, completion); one empty completion
    prompts = [torch.randint(1, V, (p,), generator=g).tolist() for p, _ in lens]
    comps = [torch.randint(1, V, (c,), generator=g).tolist() for _, c in lens]
    return Rollouts(prompts, comps, [[0.0] * len(c) for c in comps], ["stop"] * len(comps))


def _run(impl, kind="forward", teacher_vocab=V, student_vocab=V, pad=False):
    teacher, student = _models(teacher_vocab, student_vocab)
    trial = TrialConfig(loss=LossConfig(kind=kind, impl=impl, pad_vocab=pad))
    loss, diag = loss_step(trial, _Engine(student), teacher, _rollouts(), PAD, torch.Generator().manual_seed(0))
    loss.backward()
    grads = {n: p.grad.clone() for n, p in student.named_parameters() if p.grad is not None}
    return loss, diag, grads


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
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-5)
    assert diag.keys() == ref_diag.keys()
    for k in diag:
        assert diag[k] == pytest.approx(ref_diag[k], rel=1e-5), k
    assert grads.keys() == ref_grads.keys() and "lm_head.weight" in grads
    for n, g in grads.items():
        assert ((g - ref_grads[n]).norm() / ref_grads[n].norm()).item() <= 1e-4, n


def test_vocab_mismatch_is_an_error_unless_padded():
    for impl in ("reference", "chunked"):
        with pytest.raises(ValueError) as ei:
            _run(impl, teacher_vocab=V + 7)
        assert str(V) in str(ei.value) and str(V + 7) in str(ei.value)
    ref_loss, ref_diag, _ = _run("reference", teacher_vocab=V + 7, pad=True)
    loss, diag, grads = _run("chunked", teacher_vocab=V + 7, pad=True)
    assert torch.isfinite(loss) and loss.item() == pytest.approx(ref_loss.item(), rel=1e-5)
    assert diag["kl/reverse"] == pytest.approx(ref_diag["kl/reverse"], rel=1e-5)
    assert grads["lm_head.weight"].shape == (V, 32)


def test_sampled_estimator_stays_on_the_reference_path():
    teacher, student = _models()
    trial = TrialConfig(loss=LossConfig(estimator="sampled", impl="chunked"))
    loss, diag = loss_step(trial, _Engine(student), teacher, _rollouts(), PAD, torch.Generator().manual_seed(0))
    assert torch.isfinite(loss) and set(diag) >= {"kl/forward", "kl/reverse"}
