"""Small helpers shared by test modules (tests/ is on sys.path through its conftest.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import torch

from distillab.rollout.types import Rollouts

REPO = Path(__file__).resolve().parents[1]


def init_local_ray(num_cpus: int, **kw) -> None:
    """``ray.init`` of a local Ray of ``num_cpus`` CPUs without the dashboard, with the settings
    `distillab.driver.raystart` starts a sweep's local Ray with (``LOCAL_SYSTEM_CONFIG``: no
    Python worker started ahead per CPU, which no trial or actor of a test takes: each cost
    a few CPU-seconds of imports, two per Ray start)."""
    import ray

    from distillab.driver.raystart import LOCAL_SYSTEM_CONFIG

    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, _system_config=LOCAL_SYSTEM_CONFIG, **kw)


def load_script(path: str) -> ModuleType:
    """The repository's script ``path`` (e.g. ``"benchmarks/kl_ops.py"``) imported as a module
    named after its file, registered in ``sys.modules`` (dataclasses look their module up there)."""
    name = Path(path).stem
    spec = importlib.util.spec_from_file_location(name, REPO / path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def random_rollouts(vocab: int, seed: int) -> Rollouts:
    """Four rollouts of random token ids in [1, ``vocab``) drawn with ``seed``, of (prompt, completion)
    lengths (3, 5), (6, 2), (2, 0) (an empty completion) and (4, 7); logprobs 0."""
    g = torch.Generator().manual_seed(seed)
    lens = [(3, 5), (6, 2), (2, 0), (4, 7)]
    prompts = [torch.randint(1, vocab, (p,), generator=g).tolist() for p, _ in lens]
    comps = [torch.randint(1, vocab, (c,), generator=g).tolist() for _, c in lens]
    return Rollouts(prompts, comps, [[0.0] * len(c) for c in comps], ["stop"] * len(comps))


class AlwaysEngine:
    """A generation engine (``generate(prompts, sampling_params) -> rollout.types.Rollouts``) that writes
    the same completion ``text`` for every sample (hand-countable evaluation rows)."""

    def __init__(self, tok, text: str):
        self.ids = tok(text, add_special_tokens=False)["input_ids"]

    def generate(self, prompts, sp) -> Rollouts:
        n = len(prompts) * sp.n
        return Rollouts([p for p in prompts for _ in range(sp.n)], [list(self.ids)] * n, [[0.0] * len(self.ids)] * n,
                        ["stop"] * n)


class EngineStandIn(torch.nn.Module):
    """Stands in for the DeepSpeed engine in `loss.loss_step`: ``engine(...)``
    forwards, ``engine.module`` is the model."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, **kw):
        return self.module(**kw)


def one_gloo_rank():
    """Body of a module fixture (``yield from one_gloo_rank()``): one gloo process group
    (DeepSpeed needs torch.distributed), ended by ``deepspeed.comm.destroy_process_group``.
    It first drops DeepSpeed's cached process groups: a module that ended its group with
    ``torch.distributed.destroy_process_group`` (tests/test_golden.py) leaves them pointing
    at the destroyed group, and the next engine would fail ("Group ... is not registered")."""
    import deepspeed.comm as ds_comm
    import torch.distributed as dist
    from deepspeed.utils import groups
    from fixtures.record_golden import init_one_rank

    groups._release_process_group_references()
    init_one_rank()
    yield
    if ds_comm.cdb is None:
        dist.destroy_process_group()
    else:
        ds_comm.destroy_process_group()


def spectrum_rescored(student, teacher, ro, pad_id: int, lam: float, tau_s: float,
                      tau_t: float) -> tuple[list[torch.Tensor], float]:
    """log π_λ (float64) of each rollout's completion tokens of ``ro``, from full teacher-forced
    passes of both models (no KV cache) at their temperatures: the reference a
    `rollout.spectrum.SpectrumEngine`'s recorded logprobs are checked against; and the bound on
    their gap (nats). log π_λ combines both models' log-probabilities with weights of total at most
    1 + |λ| (the extrapolation's clipped term included), then takes its own log-softmax: each model's
    float32 gap (`_tolerance.logprob_gap`) times 1 + |λ|, and one more row bound (`_tolerance.row`)."""
    import _tolerance as tol

    from distillab.rollout.spectrum import spectrum_logits
    from distillab.rollout.types import left_pad, pack_rollouts, position_ids

    ids, attn, cmask = pack_rollouts(ro.prompt_ids, ro.completion_ids, pad_id)
    with torch.no_grad():
        kw = dict(input_ids=ids, attention_mask=attn, position_ids=position_ids(attn))
        ls = torch.log_softmax(student(**kw).logits.double() / tau_s, -1)
        lt = torch.log_softmax(teacher(**kw).logits.double() / tau_t, -1)
    lz = torch.log_softmax(spectrum_logits(ls, lt, lam), -1).gather(-1, torch.roll(ids, -1, 1).unsqueeze(-1)).squeeze(-1)
    seqs, sattn = left_pad([p + c for p, c in zip(ro.prompt_ids, ro.completion_ids)], pad_id)
    gaps = tol.logprob_gap(student, seqs, sattn, tau_s) + tol.logprob_gap(teacher, seqs, sattn, tau_t)
    bound = (1 + abs(lam)) * gaps + tol.row(ls.shape[-1], torch.float32, tol.logit_range((ls, 1.0), (lt, 1.0)))
    return [lz[b][cmask[b]] for b in range(ids.shape[0])], bound
