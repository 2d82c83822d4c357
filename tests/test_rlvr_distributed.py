"""Data-parallel GRPO (`rlvr.run_rlvr` under ``torch.distributed``): two gloo ranks, each
with half the prompts, produce the gradient of the token-level DAPO loss over the whole
batch, i.e. what one process computes on all the prompts (issue 5; the RLVR stage with
``resources.num_workers`` > 1)."""

from __future__ import annotations

import os
import random

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from distillab.rollout.types import Rollouts
from distillab.tasks.countdown import CountdownProblem

PROBLEMS = [CountdownProblem((1, 2, 3), 6), CountdownProblem((2, 5, 4), 40), CountdownProblem((3, 3, 1), 9),
            CountdownProblem((7, 2, 5), 19)]


class FixedSampler:
    """Completions that depend only on the prompt (not on the rank's seed), of unequal
    lengths so the token counts of the two ranks differ."""

    def generate(self, prompts, sp) -> Rollouts:
        ids, comps = [], []
        for p in prompts:
            rng = random.Random(sum(p) * 131 + len(p))
            for _ in range(sp.n):
                ids.append(list(p))
                comps.append([rng.randrange(4, 100) for _ in range(rng.randrange(2, sp.max_tokens + 1))])
        return Rollouts(ids, comps, [[0.0] * len(c) for c in comps], ["length"] * len(comps))


class GradRecorder:
    """A stepper that averages gradients over ranks (as DeepSpeed does) and records them."""

    def __init__(self, module):
        self.module, self.grads = module, None

    def __call__(self, *a, **k):
        return self.module(*a, **k)

    def backward(self, loss):
        loss.backward()
        if dist.is_initialized():
            for p in self.module.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad)
                    p.grad /= dist.get_world_size()

    def step(self):
        self.grads = {n: p.grad.detach().clone() for n, p in self.module.named_parameters() if p.grad is not None}
        self.module.zero_grad(set_to_none=True)

    def get_lr(self):
        return [0.0]


def _run(problems, prompts_per_step: int, seed: int):
    from transformers import LlamaForCausalLM

    from distillab.config import RLVRConfig, TasksConfig
    from distillab.models import build_char_tokenizer, micro_llama_config
    from distillab.recipe.rlvr import run_rlvr

    tok = build_char_tokenizer()
    torch.manual_seed(0)
    model = LlamaForCausalLM(micro_llama_config(len(tok), 64, 1, 2, 64, 256, tok))
    cfg = RLVRConfig(task="countdown3", steps=1, prompts_per_step=prompts_per_step, samples_per_prompt=4,
                     max_tokens=9, clip=None)
    stepper = GradRecorder(model)
    hist = run_rlvr(cfg, stepper, tok, TasksConfig(), problems, seed, lambda step, m: None,
                    reward_fn=lambda text, problem: float(sum(map(ord, text)) % 3), sampler=FixedSampler())
    return stepper.grads, hist[0]


def _worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        grads, metrics = _run(PROBLEMS[rank * 2 : rank * 2 + 2], 2, seed=rank)
        if rank == 0:
            torch.save({"grads": grads, "metrics": metrics}, out)
    finally:
        dist.destroy_process_group()


def test_two_ranks_give_the_whole_batch_gradient(tmp_path) -> None:
    # run_rlvr takes each rank's prompts in order from its problem list (wrapping past the end):
    # rank r's one step uses PROBLEMS[2r : 2r + 2], the single process PROBLEMS[0:4]
    ref_grads, ref_metrics = _run(PROBLEMS, 4, seed=0)
    out = str(tmp_path / "rank0.pt")
    port = 29500 + os.getpid() % 1000
    mp.spawn(_worker, args=(2, port, out), nprocs=2, join=True)
    got = torch.load(out)
    assert set(got["grads"]) == set(ref_grads) and ref_grads
    worst = max(float((got["grads"][n] - g).abs().max() / g.abs().max().clamp(min=1e-12)) for n, g in ref_grads.items())
    assert worst < 1e-5, worst
    for k in ("rlvr/reward_mean", "rlvr/accuracy", "rlvr/loss"):  # reported over both ranks
        assert abs(got["metrics"][k] - ref_metrics[k]) < 1e-6, (k, got["metrics"][k], ref_metrics[k])
    assert ref_metrics["rlvr/reward_mean"] > 0 and ref_metrics["rlvr/loss"] != 0
