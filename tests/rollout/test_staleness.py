"""Asynchronous rollouts with bounded staleness (``rollout.max_staleness``, `rollout.stale`;
issue 35 item 1): the config's rules; k = 0 through the producer thread and the weight
copy is the synchronous trial bitwise (OnPD, OffPD, a λ-spectrum); a slow learner's
logged lag stays within k and reaches it, the producer really runs ahead, and the
trial is the same whatever the timing; the truncated importance weight on a hand-made
case. The real recipe in-process (`session.LocalSession`), as tests/test_golden.py."""

from __future__ import annotations

import math
import threading
import time
from functools import partial

import _tolerance as tol
import pytest
import torch
from pydantic import ValidationError

import distillab.recipe.distill as distill
from _helpers import one_gloo_rank
from distillab.config import RuntimeContext, TrialConfig
from distillab.recipe.loss import importance_weights
from distillab.registry import find
from distillab.rollout.stale import StaleRollouts, stale_source
from distillab.rollout.types import Rollouts, pack_rollouts
from distillab.recipe.session import LocalSession
from fixtures.record_golden import golden_models

STEPS = 4


@pytest.fixture(scope="module")
def one_rank():
    yield from one_gloo_rank()


@pytest.fixture(scope="module")
def models(one_rank, tmp_path_factory):
    return golden_models(tmp_path_factory.mktemp("staleness_models"))


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    return tmp_path_factory.mktemp("shared")  # the pre-training evaluation, computed once per student


def _trial(policy: str, **rollout) -> TrialConfig:
    return TrialConfig.model_validate({
        "seed": 42,
        "optimizer": {"lr": 1.0e-2, "steps": STEPS, "prompts_per_step": 4, "warmup_steps": 1, "train_prompts": 100},
        "rollout": {"policy": policy, "max_tokens": 10, "engine": "transformers", **rollout},
        "evaluation": {"id_items": 2, "pass_items": 1, "pass_n": 2, "pass_k": [1, 2], "ood_items": 2,
                       "max_tokens": 6},
    })


def _run(models, shared, tmp_path, monkeypatch, trial: TrialConfig, name: str):
    """Run the recipe without its final evaluation; returns (per-step metrics, final student state)."""
    teacher, student = models
    ctx = RuntimeContext(teacher_path=str(teacher), student_path=str(student), results_root=str(tmp_path / name),
                         shared_cache=str(shared))
    steps, final = [], {}
    real_log_step = distill.log_step

    def log_step(w, step, metrics):
        steps.append(dict(metrics))
        real_log_step(w, step, metrics)

    def finish(w):
        w.source.close()
        final.update({k: v.detach().clone() for k, v in w.engine.module.state_dict().items()})
        return {}

    with monkeypatch.context() as m:
        m.setattr(distill, "log_step", log_step)
        m.setattr(distill, "finish", finish)
        distill.run_worker(trial, ctx, name, LocalSession())
    assert len(steps) == STEPS
    return steps, final


def _assert_same_trial(a, b) -> None:
    (steps_a, final_a), (steps_b, final_b) = a, b
    assert [s["loss"] for s in steps_a] == [s["loss"] for s in steps_b]
    assert [s["grad_norm"] for s in steps_a] == [s["grad_norm"] for s in steps_b]
    assert final_a.keys() == final_b.keys()
    assert all(torch.equal(final_a[k], final_b[k]) for k in final_a)


def test_staleness_config_defaults_and_errors() -> None:
    r = _trial("onpd").rollout
    assert (r.max_staleness, r.staleness_correction, r.tis_cap) == (0, "none", 2.0)
    assert _trial("onpd", max_staleness=2, staleness_correction="tis", tis_cap=1.5).rollout.max_staleness == 2
    assert _trial("spectrum", **{"lambda": 0.5, "max_staleness": 1}).rollout.max_staleness == 1
    with pytest.raises(ValidationError, match="rollout.max_staleness > 0 needs a student that samples"):
        _trial("offpd", max_staleness=1)
    with pytest.raises(ValidationError, match="rollout.staleness_correction 'tis' needs rollout.policy 'onpd'"):
        _trial("spectrum", **{"lambda": 0.5, "staleness_correction": "tis"})
    with pytest.raises(ValidationError, match="vLLM actor path is not built"):
        _trial("onpd", max_staleness=1, engine="vllm")
    with pytest.raises(ValidationError, match="greater than or equal to 0"):
        _trial("onpd", max_staleness=-1)
    with pytest.raises(ValidationError, match="greater than 0"):
        _trial("onpd", tis_cap=0.0)
    assert find("rollout/staleness").producer == "recipe.distill.step_metrics"


@pytest.mark.parametrize("policy, extra, precision", [("onpd", {}, "fp32"), ("offpd", {}, "fp32"),
                                                       ("spectrum", {"lambda": 0.5}, "fp32"), ("onpd", {}, "bf16")])
def test_k0_through_the_producer_is_the_synchronous_trial_bitwise(models, shared, tmp_path, monkeypatch, policy,
                                                                    extra, precision) -> None:
    """bf16 with its products in float32 (`models.Bf16MatmulsInFloat32`, a per-thread torch
    function mode): the producer thread enters the mode itself."""
    monkeypatch.setenv("DISTILLAB_BF16_MATMULS", "float32")
    trial = _trial(policy, **extra).model_copy(update={"precision": precision})
    sync = _run(models, shared, tmp_path, monkeypatch, trial, f"sync-{policy}-{precision}")
    monkeypatch.setattr(distill, "stale_source", partial(stale_source, force=True))
    produced = []
    real_produce = StaleRollouts._produce
    monkeypatch.setattr(StaleRollouts, "_produce", lambda self, step, version, snap: produced.append(
        (step, version, threading.current_thread().name)) or real_produce(self, step, version, snap))
    forced = _run(models, shared, tmp_path, monkeypatch, trial, f"forced-{policy}-{precision}")
    assert [(s, v) for s, v, _ in produced] == [(t, t) for t in range(STEPS)]  # each step by its own weights
    assert all(name.startswith("distillab-stale-rollouts") for _, _, name in produced)  # on the producer thread
    _assert_same_trial(sync, forced)
    assert sync[1]["lm_head.weight"].dtype == (torch.bfloat16 if precision == "bf16" else torch.float32)
    assert [s["rollout/staleness"] for s in sync[0]] == [s["rollout/staleness"] for s in forced[0]] == [0.0] * STEPS


@pytest.mark.parametrize("k", [1, 2])
def test_a_slow_learner_never_sees_a_lag_above_k(models, shared, tmp_path, monkeypatch, k) -> None:
    """The learner sleeps 0.3 s in every update: the producer samples step t + k meanwhile
    (it starts before the update of step t ends), the logged lag is min(t, k), and the
    trial equals the same trial without the sleep (the schedule, not the timing, decides)."""
    trial = _trial("onpd", max_staleness=k)
    fast = _run(models, shared, tmp_path, monkeypatch, trial, f"fast-k{k}")
    starts, update_ends = {}, []
    real_produce, real_update = StaleRollouts._produce, distill.optimizer_step

    def produce(self, step, version, snapshot):
        starts[step] = time.perf_counter()
        return real_produce(self, step, version, snapshot)

    def slow_update(*args, **kwargs):
        time.sleep(0.3)
        out = real_update(*args, **kwargs)
        update_ends.append(time.perf_counter())
        return out

    monkeypatch.setattr(StaleRollouts, "_produce", produce)
    monkeypatch.setattr(distill, "optimizer_step", slow_update)
    slow = _run(models, shared, tmp_path, monkeypatch, trial, f"slow-k{k}")
    lags = [s["rollout/staleness"] for s in slow[0]]
    assert lags == [float(min(t, k)) for t in range(STEPS)]
    assert max(lags) == k and all(0 <= lag <= k for lag in lags)
    assert all(starts[t + k] < update_ends[t] for t in range(STEPS - k))  # generated while step t trained
    _assert_same_trial(fast, slow)


def test_stale_rollouts_differ_from_synchronous_and_tis_weights_them(models, shared, tmp_path, monkeypatch) -> None:
    """k = 1 trains on other rollouts than the synchronous trial from step 1 on (step 0 is
    the same batch); with ``tis`` the loss is weighted and logs the mean weight, ≤ the cap."""
    sync = _run(models, shared, tmp_path, monkeypatch, _trial("onpd"), "sync-onpd-tis")
    stale = _run(models, shared, tmp_path, monkeypatch, _trial("onpd", max_staleness=1), "stale-onpd")
    assert sync[0][0]["loss"] == stale[0][0]["loss"] and sync[0][1]["loss"] != stale[0][1]["loss"]
    tis = _run(models, shared, tmp_path, monkeypatch,
               _trial("onpd", max_staleness=1, staleness_correction="tis", tis_cap=1.5), "stale-onpd-tis")
    weights = [s["is/weight_mean"] for s in tis[0]]
    assert all(0 < w <= 1.5 for w in weights) and any(w != 1.0 for w in weights)
    assert "is/weight_mean" not in stale[0][0]


def test_tis_weight_on_a_hand_made_case() -> None:
    """w_b = (1/|y_b|) Σ_t min(c, exp(log p_θ − log q)) with c = rollout.tis_cap = 1.5."""
    trial = _trial("onpd", max_staleness=1, staleness_correction="tis", tis_cap=1.5)
    q = [[-1.0, -2.0], [-0.5, -1.5, -3.0]]
    rollouts = Rollouts([[5, 6], [7]], [[8, 9], [10, 11, 12]], q, ["stop", "length"])
    _, _, cmask = pack_rollouts(rollouts.prompt_ids, rollouts.completion_ids, 0)
    diffs = [[0.1, 1.0], [-0.5, 0.0, 0.3]]  # log p_θ − log q
    policy = torch.zeros(cmask.shape)
    policy[cmask] = torch.tensor([qi + d for qs, ds in zip(q, diffs) for qi, d in zip(qs, ds)])
    w = importance_weights(trial, rollouts, cmask, policy)
    want = [(math.exp(0.1) + 1.5) / 2, (math.exp(-0.5) + 1.0 + math.exp(0.3)) / 3]  # e^1 capped at 1.5
    # float32 (tests/_tolerance.py): each ratio e^(log p − log q) errs by 2u (exp) and the roundings of q + d and of
    # the difference back (u each of |q| + |d| <= 4), relative; then the mean of at most 3 (γ_3)
    rel = tol.u(torch.float32) * (2 + 2 * 4) + tol.gamma(3, torch.float32)
    assert w.tolist() == pytest.approx(want, rel=rel)
    for got, lit in zip(w.tolist(), [1.3025855, 0.9854634]):  # 7 decimals: and half a unit of the last
        assert abs(got - lit) <= rel * lit + 0.5e-7
    assert not w.requires_grad
    untruncated = importance_weights(_trial("onpd", max_staleness=1, staleness_correction="tis", tis_cap=10.0),
                                     rollouts, cmask, policy)
    assert untruncated[0].item() == pytest.approx((math.exp(0.1) + math.exp(1.0)) / 2, rel=rel)
