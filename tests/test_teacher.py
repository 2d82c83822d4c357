"""The shared teacher service (`distillab.recipe.teacher`, issue 35 item 2) against in-worker scoring,
in-process (no Ray): `loss.loss_step` with a `teacher.SharedTeacher` whose scorer is a
`teacher.TeacherScorer` loaded from a saved checkpoint, and whose lm_head is read from the
checkpoint's safetensors alone (`teacher.load_lm_head`).

- ``hidden``: the loss and every student gradient equal in-worker scoring to 1e-6 on every
  estimator (full, sampled, top-k over each support with and without the tail, k1/k2/k3), on the
  chunked and the reference paths;
- ``topk``: the loss is the divergence against π̂_T (top-k exact, tail spread uniformly) and the
  oracle's ``estimator/bias`` is that loss minus the exact one, both recomputed here in float64
  from the teacher's full logits;
- the lm_head read from the safetensors (untied and tied embeddings) is the model's.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import _tolerance as tol
import pytest
import torch
import torch.nn.functional as F
from _helpers import EngineStandIn, init_local_ray, random_rollouts
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from distillab.config import TrialConfig
from distillab.recipe.loss import loss_step, pack_batch
from distillab.ops.kl import reduce_loss, row_coefficients
from distillab.recipe.payload import payload_bytes_per_token
from distillab.recipe.teacher import (LocalTeacher, SharedTeacher, TeacherRequest, TeacherScorer, load_lm_head, topk_logits,
                               topk_payload)

V, PAD = 41, 0
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def teacher_path(tmp_path_factory):
    """A tiny Qwen2 teacher with a biased-free untied lm_head, saved as safetensors."""
    torch.manual_seed(0)
    teacher = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=V, hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, pad_token_id=PAD, tie_word_embeddings=False))
    path = tmp_path_factory.mktemp("teacher")
    teacher.save_pretrained(path)  # safetensors
    return path


def _student():
    torch.manual_seed(1)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, pad_token_id=PAD, tie_word_embeddings=False))


def _rollouts():
    return random_rollouts(V, 2)  # one empty completion among four


def _shared(trial: TrialConfig, path) -> SharedTeacher:
    w, b = load_lm_head(path, torch.float32)
    return SharedTeacher(trial.teacher, w, b, TeacherScorer(str(path)), "t")


def _run(trial: TrialConfig, teacher, step=None):
    student = _student()
    loss, diag = loss_step(trial, EngineStandIn(student), teacher, _rollouts(), PAD,
                           torch.Generator().manual_seed(0), step=step)
    loss.backward()
    return loss, diag, {n: p.grad.clone() for n, p in student.named_parameters() if p.grad is not None}


ESTIMATORS = [  # (loss section, impls): every estimator where it is valid (k1/k2/k3: reverse KL, OnPD)
    *[({"kind": k, "estimator": "full"}, ("chunked", "reference")) for k in ("forward", "reverse", "jsd")],
    *[({"kind": k, "estimator": "sampled"}, ("reference",)) for k in ("forward", "reverse")],
    *[({"kind": "forward", "estimator": "topk", "top_k": 4, "topk_source": src, "topk_tail": tail},
       ("chunked", "reference")) for src in ("teacher", "student", "union") for tail in (False, True)],
    *[({"kind": "reverse", "estimator": k}, ("chunked", "reference")) for k in ("k1", "k2", "k3")],
]


@pytest.mark.parametrize("loss, impls", ESTIMATORS, ids=lambda x: "-".join(map(str, x.values()))
                         if isinstance(x, dict) else "")
def test_hidden_payload_equals_in_worker_scoring(teacher_path, loss, impls) -> None:
    """``teacher.payload: hidden``: loss, diagnostics (the oracle's included) and every student
    gradient equal the in-worker teacher's to 1e-6; the payload's bytes per token are H·4."""
    from distillab.models import load_model

    in_worker = load_model(teacher_path).eval().requires_grad_(False)
    for impl in impls:
        cfg = {"rollout": {"policy": "onpd"}, "loss": {**loss, "impl": impl, "oracle_every": 1}}
        worker = TrialConfig.model_validate(cfg)
        shared = TrialConfig.model_validate({**cfg, "teacher": {"serve": "shared", "payload": "hidden"}})
        ref_loss, ref_diag, ref_grads = _run(worker, LocalTeacher(in_worker), step=1)
        got_loss, got_diag, got_grads = _run(shared, _shared(shared, teacher_path), step=1)
        assert got_loss.item() == pytest.approx(ref_loss.item(), rel=1e-6, abs=1e-6)
        assert got_diag["teacher/bytes_per_token"] == 48 * 4 and got_diag["teacher/request_ms"] > 0
        assert {k: v for k, v in got_diag.items() if not k.startswith("teacher/")} == pytest.approx(
            {k: v for k, v in ref_diag.items() if not k.startswith("teacher/")}, rel=1e-6, abs=1e-6, nan_ok=True)
        assert "estimator/bias" in got_diag and got_grads.keys() == ref_grads.keys()
        for n, g in got_grads.items():
            assert torch.allclose(g, ref_grads[n], rtol=1e-6, atol=1e-6), (impl, n)


def _f64_divergence(s_logits, t_logp, kind: str, tau_s: float) -> torch.Tensor:
    """(N,) float64 KL from its definition: forward Σ π_T (log π_T − log π_S), reverse Σ π_S (log π_S − log π_T)."""
    s_logp = torch.log_softmax(s_logits.double() / tau_s, -1)
    if kind == "forward":
        return (t_logp.exp() * (t_logp - s_logp)).sum(-1)
    return (s_logp.exp() * (s_logp - t_logp)).sum(-1)


@pytest.mark.parametrize("kind", ["forward", "reverse"])
@pytest.mark.parametrize("k", [2, 8])
def test_topk_payload_loss_and_oracle_bias_against_float64(teacher_path, kind, k) -> None:
    """``teacher.payload: topk``: the loss is KL against π̂_T (the teacher's k largest probabilities
    exact, the rest of the mass spread uniformly over the other V − k tokens) and, at an oracle
    step, ``estimator/bias`` = that loss − the exact KL against π_T: both recomputed in float64 from
    the teacher's full logits, to 1e-5 (the trial computes in float32)."""
    from distillab.models import load_model

    tau_t, tau_s = 0.5, 1.0
    trial = TrialConfig.model_validate({"rollout": {"policy": "onpd"},
                                        "loss": {"kind": kind, "oracle_every": 1, "tau_t": tau_t, "tau_s": tau_s},
                                        "teacher": {"serve": "shared", "payload": "topk", "top_k": k}})
    loss, diag, _ = _run(trial, _shared(trial, teacher_path), step=1)
    # the float64 reference, from the teacher's and the student's full logits
    student, teacher = _student(), load_model(teacher_path)
    batch = pack_batch(_rollouts(), PAD)
    with torch.no_grad():
        s_logits = student(**batch.inputs).logits.double()  # (B, T, V)
        t_logp = torch.log_softmax(teacher(**batch.teacher_inputs).logits.double() / tau_t, -1)
    top = t_logp.topk(k, -1)
    tail = torch.log1p(-top.values.exp().sum(-1))  # log of the mass off the top k
    hat = (tail - math.log(V - k)).unsqueeze(-1).expand_as(t_logp).scatter(-1, top.indices, top.values)
    assert ((hat.exp().sum(-1) - 1).abs() <= tol.gamma(V + 8)).all()  # float64: V exps summed, and a log1p
    trunc = reduce_loss(_f64_divergence(s_logits, hat, kind, tau_s), batch.cmask)
    exact = reduce_loss(_f64_divergence(s_logits, t_logp, kind, tau_s), batch.cmask)
    # the trial in float32 (tests/_tolerance.py): the rows' bound against π̂ (log-probabilities, so τ = 1 for it),
    # the payload's float32 values an error they carry in (u of their size); the bias adds the exact KL's bound
    rows = batch.cmask.nonzero(as_tuple=True)
    coef = row_coefficients(rows[0], batch.cmask.shape[0])
    dz = tol.u(torch.float32) * tol.logit_range((hat[rows], 1.0))
    kw = dict(kind=kind, tau_s=tau_s, dtype=torch.float32, dz=dz)
    v_trunc, _ = tol.loss_bounds(s_logits[rows], hat[rows], coef, tau_t=1.0, **kw)
    v_exact, _ = tol.loss_bounds(s_logits[rows], t_logp[rows], coef, tau_t=1.0, **kw)
    assert loss.item() == pytest.approx(trunc.item(), abs=v_trunc)
    assert diag["estimator/bias"] == pytest.approx((trunc - exact).item(), abs=v_trunc + v_exact)
    assert abs(diag["estimator/bias"]) > 1e-4  # the truncation costs something at k << V
    assert diag["teacher/bytes_per_token"] == payload_bytes_per_token("topk", vocab_size=V, hidden_size=48, top_k=k)
    assert diag["teacher/bytes_per_token"] == k * 8 + 4  # float32 values, int32 ids, one float32 tail
    no_oracle, _, _ = _run(trial, _shared(trial, teacher_path), step=2)  # oracle_every 1: step 2 too
    assert no_oracle.item() == loss.item()  # the same batch and student: the same float32 computation


def test_topk_payload_round_trip_by_hand() -> None:
    """`topk_payload` then `topk_logits` on a 5-token vocabulary, checked by hand: the 2 largest
    log-probs and ids, the tail log(1 − p1 − p2), and the rebuilt distribution (tail / 3 on the rest)."""
    p = torch.tensor([0.1, 0.4, 0.05, 0.3, 0.15])
    h = torch.log(p).view(1, 1, 5)  # hidden = log p, lm_head = identity, τ = 1: log π = log p
    vals, ids, tail = topk_payload(h, torch.eye(5), None, 2, 1.0)
    assert ids.tolist() == [[[1, 3]]] and ids.dtype == torch.int32
    # float32 log-softmax rows over 5 entries of logits log p (tests/_tolerance.py: ρ, each log-probability;
    # a probability from it within 2ρ relative, after one more softmax 2ρ more)
    rho = tol.row(5, torch.float32, tol.logit_range((h, 1.0)))
    assert ((vals - torch.log(torch.tensor([[[0.4, 0.3]]]))).abs() <= rho).all()
    assert tail.item() == pytest.approx(math.log(0.3), abs=rho + tol.gamma(4, torch.float32))  # and log1p of a sum
    z = topk_logits(vals, ids, tail, 5, tau_t=0.5)
    want = torch.tensor([0.1, 0.4, 0.1, 0.3, 0.1])  # 0.3 spread over the 3 others
    assert ((torch.softmax(z / 0.5, -1) - want.view(1, 1, 5)).abs() <= 4 * 2 * rho * want).all()
    full = topk_logits(*topk_payload(h, torch.eye(5), None, 5, 1.0), 5, tau_t=1.0)  # k = V: π̂ = π
    assert ((torch.softmax(full, -1) - p.view(1, 1, 5)).abs() <= 4 * rho * p).all()
    with pytest.raises(ValueError, match="teacher.top_k must be in \\[1, 5\\]"):
        topk_payload(h, torch.eye(5), None, 6, 1.0)


@pytest.mark.parametrize("tied", [False, True])
def test_lm_head_read_from_the_safetensors(tmp_path, tied) -> None:
    """`load_lm_head` returns the model's output embedding (tied: the input embedding the
    checkpoint stores under its own name), in the dtype asked for; it does not build the model's weights."""
    torch.manual_seed(3)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, tie_word_embeddings=tied))
    model.save_pretrained(tmp_path)
    w, b = load_lm_head(tmp_path, torch.bfloat16)
    assert b is None and w.dtype == torch.bfloat16
    assert torch.equal(w, model.get_output_embeddings().weight.detach().to(torch.bfloat16))
    h = torch.randn(3, 16)
    assert torch.equal(F.linear(h, w.float()), F.linear(h, model.lm_head.weight.detach().bfloat16().float()))


def _tiny_sets(tmp_path: Path) -> dict:
    """Overrides that make a sweep file smoke-sized: smoke.yaml's models (prepared once, under
    ``<repo>/.cache/models``, for both slow tests here), tasks and a tiny evaluation; 2 steps, the
    oracle at each, local mode."""
    from distillab.config import load_sweep

    smoke = load_sweep(REPO / "search_spaces" / "smoke.yaml")
    return {"storage_path": str(tmp_path), "models": {**smoke.models.model_dump(mode="json"),
                                                      "cache_dir": str(REPO / ".cache" / "models")},
            "trial.tasks": smoke.trial.tasks.model_dump(mode="json"), "trial.precision": "fp32",
            "trial.master_weights": "fp32", "trial.optimizer.steps": 2, "trial.optimizer.warmup_steps": 1,
            "trial.optimizer.prompts_per_step": 4, "trial.optimizer.train_prompts": 200,
            "trial.rollout.max_tokens": 12, "trial.loss.oracle_every": 1,
            "trial.evaluation": {"countdown_tasks": ["countdown3"], "id_items": 2, "pass_items": 1, "pass_n": 2,
                                 "pass_k": [1, 2], "ood_items": 1, "max_tokens": 12, "sparsity_touched": False},
            "resources.local_mode": True}


def test_which_workers_still_hold_the_teacher_to_sample() -> None:
    """With ``teacher.serve: shared`` a worker loads the whole teacher only where it samples from it
    in-process: OffPD without a reused set on the transformers engine, and the λ-spectrum; OnPD, a
    reused OffPD set and OffPD on a vLLM actor do not."""
    from distillab.recipe.teacher import samples_with_teacher

    def needs(**rollout) -> bool:
        return samples_with_teacher(TrialConfig.model_validate({"rollout": rollout}))

    assert needs(policy="offpd", engine="transformers") and needs(policy="spectrum", **{"lambda": 0.0})
    assert not needs(policy="onpd") and not needs(policy="offpd", offpd_reuse=True, engine="transformers")
    assert not needs(policy="offpd", engine="vllm")  # its rollout actor loads the teacher itself


@pytest.mark.slow
def test_sweep_shares_one_teacher_and_hidden_equals_the_worker(run_locally, tmp_path) -> None:
    """A smoke sweep of five trials, two at a time, on a local Ray (``resources.local_mode``, 2 steps):
    OnPD and OffPD (a reused OffPD set, which the driver generates before the trials: the shared
    OffPD worker holds no teacher at all) each with ``teacher.serve: worker`` and with ``shared`` +
    ``payload: hidden``, and one OnPD reverse-KL trial with ``payload: topk``, k = 2 (2·4 + 2·4 + 4 =
    20 bytes per token; its oracle reports the truncation's bias, non-zero and finite, and a gradient
    cosine below 1 at each step). One service actor answered
    every shared trial (its request counts: one per step each), the hidden trials report
    ``teacher/bytes_per_token`` = H_T · 4 and ``teacher/request_ms``, and every other per-step metric
    equals the worker trial's to 1e-6."""
    import json

    import polars as pl

    from distillab.analysis.results import load
    from distillab.config import load_sweep
    from distillab.driver.sweep import TEACHER_STATS_FILE

    sweep = load_sweep(REPO / "search_spaces" / "smoke.yaml", {
        **_tiny_sets(tmp_path), "search.grid": None, "search.grids": [
            {"grid": {"rollout.policy": ["onpd", "offpd"]}},
            {"set": {"teacher.serve": "shared", "teacher.payload": "hidden"}, "grid": {"rollout.policy": ["onpd", "offpd"]}},
            {"set": {"teacher.serve": "shared", "teacher.payload": "topk", "teacher.top_k": 2, "loss.kind": "reverse",
                     "rollout.policy": "onpd"}}],
        "trial.rollout.offpd_reuse": True, "trial.rollout.engine": "transformers"})
    root = run_locally(sweep)
    res = load(root)
    trials = res.trials.collect()
    assert trials.height == 5 and (trials["status"] == "completed").all(), trials["error"].to_list()
    topk = next(t.trial_id for t in sweep.trials if t.teacher.payload == "topk")
    shared = {t.trial_id: t.rollout.policy for t in sweep.trials if t.teacher.payload == "hidden"}
    worker = {t.rollout.policy: t.trial_id for t in sweep.trials if t.teacher.serve == "worker"}
    assert all("-hidden-" in tid for tid in shared)
    stats = json.loads((root / TEACHER_STATS_FILE).read_text())
    assert len(stats) == 1 and stats[0]["requests"] == {tid: 2 for tid in [*shared, topk]}  # one actor, 2 steps each
    m = res.metrics.filter(pl.col("stage") == "distill").collect()
    mine = m.filter(pl.col("trial_id") == topk)
    top = {(n, s): v for n, s, v in zip(mine["name"], mine["step"], mine["value"])}
    for step in (1, 2):  # the top-2 trial: 2 values + 2 ids + the tail, 4 bytes each; the truncation's oracle
        assert top[("teacher/bytes_per_token", step)] == 20.0
        assert 1e-6 < abs(top[("estimator/bias", step)]) < 10
        assert -1 <= top[("estimator/grad_cos", step)] < 1 - 1e-6
    hidden_size = load_sweep(REPO / "search_spaces" / "smoke.yaml").models.micro_teacher.hidden_size
    timed = pl.col("name").str.starts_with("time/") | pl.col("name").str.contains("tokens_per_s|_s$")
    for tid, policy in shared.items():
        mine = m.filter(pl.col("trial_id") == tid)
        sent = mine.filter(pl.col("name") == "teacher/bytes_per_token")["value"].to_list()
        assert sent == [hidden_size * 4.0] * 2  # float32 hidden states: H values of 4 bytes per token
        assert (mine.filter(pl.col("name") == "teacher/request_ms")["value"] > 0).all()
        got = mine.filter(~timed & ~pl.col("name").str.starts_with("teacher/request")
                          & (pl.col("name") != "teacher/bytes_per_token")).sort("step", "name")
        want = m.filter((pl.col("trial_id") == worker[policy]) & ~timed).sort("step", "name")
        assert got["name"].to_list() == want["name"].to_list() and got.height >= 2 * 8
        assert "estimator/bias" in got["name"].to_list()
        for name, a, b in zip(got["name"], got["value"], want["value"]):
            assert a == pytest.approx(b, rel=1e-6, abs=1e-6, nan_ok=True), (policy, name)


def test_micro_payload_file_lists_its_payload_grid() -> None:
    """search_spaces/micro_payload.yaml: 18 OnPD trials at LR 3e-4 on the shared teacher, hidden, top-8 and
    top-2 each for both KL directions and seeds 42-44 (its top-k trial runs in the sweep test above)."""
    from collections import Counter

    from distillab.config import load_sweep

    trials = load_sweep(REPO / "search_spaces" / "micro_payload.yaml").trials
    assert len(trials) == 18 and {(t.rollout.policy, t.optimizer.lr, t.teacher.serve) for t in trials} == {
        ("onpd", 3e-4, "shared")}
    assert Counter((t.teacher.label, t.loss.kind) for t in trials) == {
        (p, k): 3 for p in ("hidden", "topk8", "topk2") for k in ("forward", "reverse")}
    assert sorted({t.seed for t in trials}) == [42, 43, 44]


@pytest.mark.slow
def test_service_actor_restarts_after_it_dies(teacher_path) -> None:
    """The service on a local Ray: a trial's client (`teacher.connect_teacher` by the service's name)
    gets the in-process scorer's hidden states bitwise; the actor killed (as a crash would), Ray
    restarts it (``max_restarts=-1``) and the next request is answered the same, by a fresh process
    (its request count starts again); `teacher.stop_teacher_service` ends it for good."""
    import ray

    from distillab.recipe.teacher import connect_teacher, service_stats, start_teacher_service, stop_teacher_service

    trial = TrialConfig.model_validate({"teacher": {"serve": "shared", "payload": "hidden"}})
    inputs = pack_batch(_rollouts(), PAD).teacher_inputs
    want = TeacherScorer(str(teacher_path)).answer(TeacherRequest(inputs, "hidden", 0.5))["hidden"]
    init_local_ray(1)
    try:
        actors = start_teacher_service("teacher-test", teacher_path, models=[("fp32", None)])
        assert len(actors) == 1
        w, b = load_lm_head(teacher_path, torch.float32)
        client = SharedTeacher(trial.teacher, w, b, connect_teacher("teacher-test"), "trial-a")
        assert torch.equal(client.score(trial, inputs).h_t, want)
        first = service_stats(actors)[0]
        assert first["requests"] == {"trial-a": 1}
        ray.kill(actors[0], no_restart=False)  # dies; Ray starts it again
        deadline = time.time() + 60
        while service_stats(actors)[0]["pid"] == first["pid"] and time.time() < deadline:
            time.sleep(0.2)  # a call may still reach the old process while it is being killed
        assert torch.equal(client.score(trial, inputs).h_t, want)
        assert service_stats(actors)[0]["requests"] == {"trial-a": 1}  # a new process counts from 0
        stop_teacher_service(actors)
        with pytest.raises(RuntimeError, match="no actor of the teacher service 'teacher-test'"):
            for _ in range(50):  # the name is released once the actor is dead
                connect_teacher("teacher-test")
                time.sleep(0.1)
    finally:
        ray.shutdown()


def test_local_teacher_answers_as_the_model_and_holds_its_lm_head(teacher_path) -> None:
    """`LocalTeacher` (``teacher.serve: worker``): its answer is the model's last hidden state (the
    ``output_hidden_states`` of a full forward, bitwise), with no rebuilt logits and no request
    metrics; ``w_t`` is the model's lm_head weight itself and ``vocab_size`` its config's, the same
    as a `SharedTeacher` reads from the safetensors."""
    from distillab.models import load_model

    model = load_model(teacher_path).eval().requires_grad_(False)
    local, ro = LocalTeacher(model), _rollouts()
    batch = pack_batch(ro, PAD, torch.device("cpu"))
    answer = local.score(None, batch.teacher_inputs)
    with torch.no_grad():
        want = model(**batch.teacher_inputs, output_hidden_states=True).hidden_states[-1]
    assert answer.t_logits is None and answer.metrics == {}
    assert answer.h_t.shape == (*batch.teacher_inputs["input_ids"].shape, 48) and torch.equal(answer.h_t, want)
    assert local.w_t is model.lm_head.weight and local.b_t is None and local.vocab_size == V
    w, _ = load_lm_head(teacher_path, torch.float32)
    assert torch.equal(local.w_t, w)
    assert local.to("cpu") is local
