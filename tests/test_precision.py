"""Training precision (issue 16 item 3): ``trial.precision``, ``trial.master_weights``,
``trial.gradient_checkpointing`` and ``trial.attn_implementation`` in the real
per-worker loop (`session.LocalSession`, the random micro models of tests/test_golden.py)
and in one DeepSpeed optimizer step on a hand-made parameter."""

from __future__ import annotations

import _tolerance as tol
import polars as pl
import pytest
import torch
from _helpers import one_gloo_rank
from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer
from fixtures.record_golden import golden_models, golden_trial

from distillab.models import precision as models_module
from distillab.analysis.results import load
from distillab.config import OptimizerConfig, ResourcesConfig, RuntimeContext, TrialConfig
from distillab.recipe.distill import run_worker, setup_trial
from distillab.recipe.session import LocalSession
from distillab.recipe.optim import optimizer_step, setup_engine

#: bf16 keeps 8 significand bits: its unit roundoff is u = 2^-8 (0.39 %; tests/_tolerance.py). Rounding
#: every weight of both models and every activation of their layers to bf16 (relative error up
#: to u each) moves each logit, hence the KL built from them, by a few u; the first-step loss
#: may differ from float32 by 4u = 2^-6 = 1.6 % (measured: 0.21 %).
BF16_LOSS_RTOL = 4 * tol.u(torch.bfloat16)


@pytest.fixture(scope="module")
def one_rank():
    yield from one_gloo_rank()


@pytest.fixture(scope="module")
def models(one_rank, tmp_path_factory):
    return golden_models(tmp_path_factory.mktemp("precision_models"))


def _trial(steps: int = 2, rlvr: bool = False, **fields) -> TrialConfig:
    t = golden_trial("offpd", "forward")
    t["optimizer"]["steps"] = steps
    if rlvr:  # a two-step RLVR stage on the distilled student (countdown3 is evaluated at every stage)
        t["rlvr"] = {"task": "countdown3", "steps": 2, "prompts_per_step": 2, "samples_per_prompt": 2,
                     "max_tokens": 8, "train_prompts": 20, "lr": 1e-4}
    return TrialConfig.model_validate({**t, **fields})


def _run(models, root, name: str, trial: TrialConfig, **resources) -> tuple[dict, dict[str, list[float]]]:
    """The trial's final report and its per-step ``loss`` / ``grad_norm`` / ``rollout/length``
    (and ``rlvr/loss`` of an RLVR stage) from the metrics table; ``resources``: fields of
    ``ResourcesConfig``."""
    teacher, student = models
    ctx = RuntimeContext(teacher_path=str(teacher), student_path=str(student), results_root=str(root / name),
                         shared_cache=str(root / name / "shared"), resources=ResourcesConfig(**resources))
    final = run_worker(trial, ctx, name, LocalSession())
    m = load(root / name).metrics.collect()
    return final, {k: m.filter(pl.col("name") == k).sort("step")["value"].to_list()
                   for k in ("loss", "grad_norm", "rollout/length", "rlvr/loss")}


@pytest.fixture(scope="module")
def fp32_run(models, tmp_path_factory):
    return _run(models, tmp_path_factory.mktemp("fp32"), "fp32", _trial())


@pytest.mark.parametrize("master", ["fp32", "bf16"])
def test_bf16_trial_first_step_loss_matches_fp32(models, fp32_run, tmp_path, master) -> None:
    """A bf16 trial (teacher and student in bf16, the ops computing in float32 from
    them) runs distillation, both evaluations and an RLVR stage on the bf16 student; its
    first-step loss is the float32 trial's within `BF16_LOSS_RTOL`, and not equal to it
    (the bf16 path really ran). Same rollouts: equal lengths at every step."""
    _, ref = fp32_run
    final, got = _run(models, tmp_path, f"bf16-{master}", _trial(rlvr=True, precision="bf16", master_weights=master))
    assert got["rollout/length"] == ref["rollout/length"]
    print(f"first-step loss: fp32 {ref['loss'][0]:.6f}, bf16 ({master} masters) {got['loss'][0]:.6f}, "
          f"relative difference {abs(got['loss'][0] / ref['loss'][0] - 1):.2e}")
    assert got["loss"][0] == pytest.approx(ref["loss"][0], rel=BF16_LOSS_RTOL)
    assert got["loss"][0] != ref["loss"][0]
    assert all(torch.isfinite(torch.tensor(got["loss"] + got["grad_norm"])))
    for stage in ("pre", "distill", "rlvr"):
        assert 0 <= final[f"eval/{stage}/countdown3/accuracy"] <= 1
    assert 0 <= final["eval/distill/params/sparsity@1e-06"] < 1  # the weights moved
    assert len(got["rlvr/loss"]) == 2 and all(torch.isfinite(torch.tensor(got["rlvr/loss"])))


def test_bf16_trial_in_float32_products_matches_the_native_bf16_trial(models, tmp_path, monkeypatch) -> None:
    """The same bf16 trial (bf16 masters) with its matrix products in float32 rounded to bf16
    (`models.Bf16MatmulsInFloat32`, as on a CPU without native bf16) and with torch's native
    bf16 kernels: the mode really ran (it saw the products), the rollouts are the same, and
    each step's loss and grad norm agree within 2^-7 relative (the two differ by the order of
    float32 sums inside each product, and by the native attention's bf16 probabilities)."""
    calls = []

    class Counting(models_module.Bf16MatmulsInFloat32):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func in models_module.BF16_MATMULS:
                calls.append(func)
            return super().__torch_function__(func, types, args, kwargs)

    trial = _trial(precision="bf16", master_weights="bf16")
    monkeypatch.setattr(models_module, "cpu_has_native_bf16", lambda: True)
    _, native = _run(models, tmp_path, "native", trial)
    assert not calls
    monkeypatch.setattr(models_module, "cpu_has_native_bf16", lambda: False)
    monkeypatch.setattr(models_module, "Bf16MatmulsInFloat32", Counting)
    _, got = _run(models, tmp_path, "float32-products", trial)
    assert len(calls) > 100
    assert got["rollout/length"] == native["rollout/length"]
    for key in ("loss", "grad_norm"):
        assert got[key] == pytest.approx(native[key], rel=2 * tol.u(torch.bfloat16)), key  # 2u = 2^-7


@pytest.mark.parametrize("master", ["fp32", "bf16"])
def test_bf16_setup_holds_the_models_in_bf16(models, tmp_path, master) -> None:
    """Teacher and student parameters are bf16; with fp32 master weights DeepSpeed's bf16
    optimizer holds a float32 copy of every student parameter, with bf16 ones torch AdamW
    updates the bf16 parameters themselves."""
    teacher, student = models
    ctx = RuntimeContext(teacher_path=str(teacher), student_path=str(student), results_root=str(tmp_path),
                         shared_cache=str(tmp_path / "shared"))
    w = setup_trial(_trial(precision="bf16", master_weights=master), ctx, "setup", LocalSession())
    params = list(w.engine.module.parameters())
    assert {p.dtype for p in params} == {torch.bfloat16}
    assert {p.dtype for p in w.teacher.model.parameters()} == {torch.bfloat16}
    if master == "fp32":
        assert isinstance(w.engine.optimizer, FP16_UnfusedOptimizer)
        masters = [m for g in w.engine.optimizer.fp32_groups for m in g]
        assert [m.dtype for m in masters] == [torch.float32] * len(params)
        assert all(torch.equal(m, p.float()) for m, p in zip(masters, params))
        assert not w.engine.optimizer.optimizer.state  # DeepSpeed's zero-gradient AdamW step at build is undone
    else:
        assert isinstance(w.engine.optimizer, torch.optim.AdamW)
        assert [p for g in w.engine.optimizer.param_groups for p in g["params"]] == params
    w.source.close()


def test_gradient_checkpointing_and_eager_attention_keep_the_losses(models, fp32_run, tmp_path) -> None:
    """Activation checkpointing recomputes the same float32 activations and eager attention
    computes what SDPA computes: the per-step losses and gradient norms of the float32 trial
    to 1e-5 (measured: 1e-6)."""
    _, ref = fp32_run
    _, got = _run(models, tmp_path, "gc", _trial(gradient_checkpointing=True, attn_implementation="eager"))
    for name in ("loss", "grad_norm"):
        assert got[name] == pytest.approx(ref[name], rel=1e-5), name


def test_compiled_training_passes_keep_the_losses(models, fp32_run, tmp_path) -> None:
    """``resources.compile`` through the whole trial (DeepSpeed's engine calls the compiled
    transformer): the per-step losses and gradient norms of the eager float32 trial to 1e-5.
    tests/test_compile.py compares the passes themselves."""
    _, ref = fp32_run
    _, got = _run(models, tmp_path, "compiled", _trial(), compile=True)
    for name in ("loss", "grad_norm"):
        assert got[name] == pytest.approx(ref[name], rel=1e-5), name


class _Weights(torch.nn.Module):
    """Four weights equal to 1; the loss Σ w has gradient 1 for each."""

    def __init__(self, dtype: torch.dtype):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(4, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.w.float() * x).sum()


def _steps(precision: str, master: str, zero: int, lr: float, n: int):
    """``n`` AdamW steps of constant gradient 1 at ``lr`` (no warm-up, no clipping):
    the module's weights and the optimizer's (master) weights, as floats."""
    o = OptimizerConfig(lr=lr, warmup_steps=0, clip=None, steps=n, prompts_per_step=1, zero_stage=zero)
    engine, _, _ = setup_engine(_Weights(torch.bfloat16 if precision == "bf16" else torch.float32), o, 1,
                                precision=precision, master_weights=master)
    for _ in range(n):
        optimizer_step(engine, engine(torch.ones(4)), o)
    inner = getattr(engine.optimizer, "optimizer", engine.optimizer)
    opt_w = torch.cat([p.detach().float().flatten() for g in inner.param_groups for p in g["params"]])
    return engine.module.w.detach().float(), opt_w


@pytest.mark.parametrize("zero", [0, 1])
def test_bf16_master_weights_lose_an_update_below_half_a_bf16_step(one_rank, zero) -> None:
    """With gradient 1 every step, AdamW's update is lr · m̂/(√v̂ + ε) = lr/(1 + 1e-8) ≈ 1e-3.
    Below 1.0 the bf16 step is 2^-8, so an update of 1e-3 < 2^-9 (half a step) rounds back
    to 1.0: with bf16 master weights the weight stays exactly 1.0 after 5 steps. With
    float32 masters the master reaches 1 − 5e-3 = 0.995 and the bf16 weight is its nearest
    bf16 value, 0.99609375 (0.995 lies 0.0011 from it, 0.0030 from 0.9921875). An update
    above half a step (lr 3e-3) moves a bf16 master too: 0.997 → 0.99609375."""
    module_w, master_w = _steps("bf16", "bf16", zero, 1e-3, 5)
    assert module_w.tolist() == [1.0] * 4 and master_w.tolist() == [1.0] * 4
    module_w, master_w = _steps("bf16", "fp32", zero, 1e-3, 5)
    # float32 AdamW, 5 steps: each w − Δ rounds (u of w ≈ 1), each Δ ≈ lr within its 10 roundings (tests/_tolerance.py)
    adam_err = 5 * (tol.u(torch.float32) + tol.gamma(10, torch.float32) * 1e-3)
    assert master_w.tolist() == pytest.approx([0.995] * 4, abs=adam_err)
    assert module_w.tolist() == [0.99609375] * 4
    module_w, _ = _steps("bf16", "bf16", zero, 3e-3, 1)
    assert module_w.tolist() == [0.99609375] * 4
    module_w, _ = _steps("fp32", "fp32", zero, 1e-3, 5)  # float32 training: 0.995 itself
    assert module_w.tolist() == pytest.approx([0.995] * 4, abs=adam_err)
