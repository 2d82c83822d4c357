"""Golden trial: 20 steps of the real per-worker distillation loop (OffPD and OnPD ×
forward and reverse KL; the reference implementation and the sampled estimator once
each) on random micro models give the per-step loss and grad-norm
sequences recorded on bd23b57, before the recipe refactor of issue 13
(tests/fixtures/golden_*.json, written by tests/fixtures/record_golden.py), to 1e-6."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from _helpers import one_gloo_rank
from distillab.analysis.results import load
from distillab.config import RuntimeContext, TrialConfig
from distillab.recipe.distill import run_worker
from distillab.registry import METRICS, find
from distillab.recipe.session import LocalSession
from fixtures.record_golden import CASES, case_name, golden_models, golden_trial, per_step

FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture(scope="module")
def one_rank():
    yield from one_gloo_rank()


@pytest.fixture(scope="module")
def models(one_rank, tmp_path_factory):
    return golden_models(tmp_path_factory.mktemp("golden_models"))


@pytest.mark.parametrize("policy, kind, variant", CASES)
def test_golden_loss_and_grad_norm(models, tmp_path, policy, kind, variant) -> None:
    """The recipe runs without Ray Train (`session.LocalSession`): the worker's reports
    and its metrics table hold the recorded sequences."""
    teacher, student = models
    trial_id = case_name(policy, kind, variant)
    ctx = RuntimeContext(teacher_path=str(teacher), student_path=str(student), results_root=str(tmp_path),
                         shared_cache=str(tmp_path / "shared"))
    session = LocalSession()
    final = run_worker(TrialConfig.model_validate(golden_trial(policy, kind, variant)), ctx, trial_id, session)
    got = per_step(tmp_path, trial_id)
    want = json.loads((FIXTURES / f"{trial_id}.json").read_text())
    for name in ("loss", "grad_norm"):
        assert got[name] == pytest.approx(want[name], rel=1e-6, abs=1e-6), name
    steps = [r["step"] for r in session.reports]
    assert steps == [10, 20, 20]  # two 10-step windows, then the final report
    assert session.reports[1]["loss"] == pytest.approx(want["loss"][-1], rel=1e-6)
    assert final["step"] == 20 and "eval/forgetting" in final and "eval/pre/countdown3/accuracy" in final
    # every key the trial reports (each step window, the final report with every evaluation) and writes
    # to its metrics table is declared in the registry (the RLVR stage's: tests/test_rlvr.py)
    table = set(load(tmp_path).metrics.select("name").unique().collect()["name"])
    reported = {k for r in session.reports for k in r} | table
    assert {"loss", "grad_norm", "kl/forward", "time/setup_s", "time/train_s", "eval/forgetting"} <= reported
    assert [k for k in sorted(reported) if find(k) is None] == []


def _producer(name: str):
    """The function, class or module ``distillab.<name>`` (``module.qualname``), as defined there
    (not a name another module imported)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module("distillab." + ".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        if parts[i:]:
            assert f"{obj.__module__}.{obj.__qualname__}" == f"distillab.{name}", (name, obj)
        return obj
    raise ModuleNotFoundError(name)


def test_every_producer_in_the_registry_exists() -> None:
    """Each `registry.Metric.producer` names a function, class or module of distillab where it is defined."""
    for m in METRICS.values():
        assert _producer(m.producer) is not None, m.key
    with pytest.raises(AssertionError):  # a name imported into another module is not where it is defined
        _producer("recipe.distill.evaluate_stage")
