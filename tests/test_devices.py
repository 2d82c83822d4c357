"""The trial's tensors follow the student's device (issue 16: on a GPU, DeepSpeed places the
student and the teacher, the packed batches, the sampler's prompts and the loss generator must
follow it). Without a GPU here, the ``meta`` device stands in for CUDA: a model moved there is
fed tensors there (shapes propagate, no data), so a tensor left on the CPU shows as a device
mismatch or a CPU result."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from distillab.recipe.loss import pack_batch
from distillab.recipe.optim import TorchStepper
from distillab.recipe.rlvr import _token_logprobs
from distillab.rollout.types import Rollouts, model_device, pack_rollouts

PROMPTS = [[5, 6, 7], [8, 9]]
COMPLETIONS = [[10, 11], [12, 13, 14]]


class DeviceCheckingLM(torch.nn.Module):
    """A causal LM stand-in on ``device`` that refuses inputs elsewhere (a real model on ``meta``
    stops at the attention mask's data-dependent check): logits = a (V, V) embedding of the ids."""

    def __init__(self, vocab: int, device: str):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, vocab, device=device)
        self.seen: list[str] = []

    def forward(self, input_ids, attention_mask, position_ids, **kw):
        self.seen = [t.device.type for t in (input_ids, attention_mask, position_ids)]
        assert set(self.seen) == {self.emb.weight.device.type}, self.seen
        return SimpleNamespace(logits=self.emb(input_ids))


def test_model_device_of_modules_and_wrappers() -> None:
    """`rollout.types.model_device`: a module's parameter device, a wrapper's ``module``'s (TorchStepper
    is not a module), CPU for a module without parameters."""
    assert model_device(torch.nn.Linear(2, 2)) == torch.device("cpu")
    meta = torch.nn.Linear(2, 2, device="meta")
    assert model_device(meta) == torch.device("meta")
    assert model_device(TorchStepper(meta, 1e-3, lambda s: 1.0)) == torch.device("meta")
    assert model_device(torch.nn.ReLU()) == torch.device("cpu")


def test_packs_land_on_the_requested_device_with_the_cpu_values() -> None:
    """`pack_rollouts` and `loss.pack_batch` on a device: the CPU pack's shapes there (and the
    CPU values when that device is the CPU)."""
    ids, attn, cmask = pack_rollouts(PROMPTS, COMPLETIONS, 0)
    for device in ("cpu", "meta"):
        packed = pack_rollouts(PROMPTS, COMPLETIONS, 0, device=device)
        assert [t.device.type for t in packed] == [device] * 3
        assert [t.shape for t in packed] == [ids.shape, attn.shape, cmask.shape]
        assert [t.dtype for t in packed] == [torch.long, torch.long, torch.bool]
    assert all(torch.equal(a, b) for a, b in zip(pack_rollouts(PROMPTS, COMPLETIONS, 0, device="cpu"), (ids, attn, cmask)))
    batch = pack_batch(Rollouts(PROMPTS, COMPLETIONS, [[0.0] * 2, [0.0] * 3], ["stop"] * 2), 0, "meta")
    tensors = [*batch.inputs.values(), *batch.teacher_inputs.values(), batch.cmask, batch.targets]
    assert {t.device.type for t in tensors} == {"meta"}


def test_rlvr_logprobs_run_on_the_models_device() -> None:
    """The RLVR stage's forward takes its inputs on the policy's device (the stand-in refuses a CPU
    pack) and returns its log-probabilities and completion mask there."""
    model = DeviceCheckingLM(16, "meta")
    rollouts = Rollouts(PROMPTS, COMPLETIONS, [[0.0] * 2, [0.0] * 3], ["stop"] * 2)
    logp, cmask = _token_logprobs(model, rollouts, 0, 1.0)
    assert model.seen == ["meta"] * 3
    assert logp.device.type == cmask.device.type == "meta" and logp.shape == cmask.shape == (2, 5)
