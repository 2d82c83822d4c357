"""The metric registry against what the platform really emits: the REAL `Evaluator` on a
smoke-size model in every domain (every Countdown task with the style metric, multiple
choice, long-reasoning math, the micro OOD suite, and lm-eval-harness on the local tasks of tests/fixtures/lm_eval),
the update-sparsity rows and ``eval/forgetting``: every key validates as a search objective
(issue 13: ``check_report_metric`` rejected eval/distill/mcq/accuracy, style_share and the
lm-eval per-task keys). And the readers of the registry: plots, the reporter, the gauges."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_ood import FIX, MC_YAML, QA_YAML, TASKS
from transformers import LlamaForCausalLM

from distillab.config import EvaluationConfig, LMEvalConfig, TasksConfig, TrialConfig, load_sweep
from distillab.evals.suite import Evaluator, evaluate_stage
from distillab.models import build_char_tokenizer, micro_llama_config
from distillab.registry import (
    METRICS,
    REPORTER_COLUMNS,
    check_report_metric,
    find,
    gauges,
    training_keys,
    with_forgetting,
)

REPO = Path(__file__).resolve().parents[2]
SMOKE_EVAL = dict(id_items=4, pass_items=2, pass_n=2, pass_k=(1, 2), ood_items=2, max_tokens=8,
                  countdown_tasks=("countdown3", "countdown4e", "countdown4", "countdown2"), mcq_items=4, math_items=3,
                  style={"kind": "regex", "pattern": r"\d \+ \d"})


@pytest.fixture(scope="module")
def tok_model():
    tok = build_char_tokenizer()
    torch.manual_seed(0)
    return tok, LlamaForCausalLM(micro_llama_config(len(tok), 64, 1, 2, 64, 256, tok)).eval()


def _keys(rows: list[dict], stage: str) -> set[str]:
    return {f"eval/{stage}/{r['task']}/{r['metric']}" for r in rows}


def _assert_objectives(keys: set[str]) -> None:
    for key in sorted(keys):
        check_report_metric(key, "search.metric")
    sweep = load_sweep(REPO / "search_spaces" / "smoke_optuna.yaml",
                       {"search.metric": sorted(keys), "search.mode": ["max"] * len(keys)})
    assert len(sweep.search.objectives) == len(keys)


def test_every_key_of_the_real_evaluator_is_an_objective(tok_model, tmp_path) -> None:
    tok, model = tok_model
    trial = TrialConfig(evaluation=EvaluationConfig(**SMOKE_EVAL))
    init = {k: v.detach().float().clone() for k, v in model.state_dict().items()}
    # one stage's evaluation: the suite's rows, update sparsity over all parameters and per tensor
    report = evaluate_stage(Evaluator(tok, trial.tasks, trial.evaluation, batch_size=64), model, trial, "t",
                            "distill", 4, tmp_path, init)
    keys = set(report)
    for task in SMOKE_EVAL["countdown_tasks"]:
        assert {f"eval/distill/{task}/accuracy", f"eval/distill/{task}/pass@2"} <= keys
    assert {"eval/distill/countdown3/style_share", "eval/distill/mcq/accuracy", "eval/distill/mcq/pass@1",
            "eval/distill/math/accuracy", "eval/distill/math/pass@2",
            "eval/distill/ood/add/accuracy", "eval/distill/ood/ood_mean", "eval/distill/params/sparsity@1e-06"} <= keys
    per_tensor = {k for k in keys if k.startswith("eval/distill/params/") and k.count("/") == 4}
    assert len(per_tensor) == 2 * len(init)  # two thresholds τ
    assert report["eval/distill/params/lm_head.weight/sparsity@1e-06"] == 1.0  # nothing moved
    # the final report adds forgetting
    pre = {k.replace("/distill/", "/pre/"): v for k, v in report.items()}
    final = with_forgetting({**pre, **report})
    assert final["eval/forgetting"] == 0.0
    _assert_objectives(set(final))


def test_every_key_of_the_lm_eval_backend_is_an_objective(tok_model, tmp_path) -> None:
    pytest.importorskip("lm_eval")
    (tmp_path / "qa.yaml").write_text(QA_YAML.format(path=FIX / "qa_mini.jsonl"))
    (tmp_path / "mc.yaml").write_text(MC_YAML.format(path=FIX / "mc_mini.jsonl"))
    tok, model = tok_model
    cfg = EvaluationConfig(id_items=2, pass_items=2, pass_n=2, pass_k=(1,), max_tokens=4,
                           countdown_tasks=("countdown3",), ood_backend="lm_eval",
                           lm_eval=LMEvalConfig(tasks=TASKS, limit=3, include_path=str(tmp_path), batch_size=4))
    rows = Evaluator(tok, TasksConfig(), cfg, batch_size=64).evaluate(model, seed=0)
    keys = _keys(rows, "rlvr")
    assert {"eval/rlvr/ood/distillab_qa_mini/exact_match", "eval/rlvr/ood/distillab_mc_mini/acc",
            "eval/rlvr/ood/ood_mean"} <= keys
    _assert_objectives(keys)
    check_report_metric("eval/distill/ood/truthfulqa_mc1/acc", "search.metric")  # the paper's suite, by name


def test_unknown_keys_and_asha_keys() -> None:
    for bad in ("eval/distill/countdown3/acc", "eval/final/countdown3/accuracy", "eval/distill/countdown5/accuracy",
                "eval/distill/mcq/style", "kl/fwd", "rlvr/reward"):
        with pytest.raises(ValueError, match="is not a reported metric"):
            check_report_metric(bad, "search.metric")
    for key in training_keys():  # every distillation step reports these: ASHA may stop on them
        check_report_metric(key, "search.scheduler.metric", training_only=True)
    for key in ("eval/distill/countdown3/accuracy", "rlvr/reward_mean", "time/train_s"):
        with pytest.raises(ValueError, match="not a reported metric"):
            check_report_metric(key, "search.scheduler.metric", training_only=True)
    check_report_metric("rlvr/reward_mean", "search.metric")  # reported during the RLVR stage


def test_readers_of_the_registry() -> None:
    from distillab.analysis import plots
    from distillab.recipe.telemetry import RayGauges  # noqa: F401  (reads registry.gauges)

    for key in REPORTER_COLUMNS:
        assert find(key) is not None
    assert gauges() == {"loss": "distillab_loss", "kl/forward": "distillab_kl_forward",
                        "kl/reverse": "distillab_kl_reverse", "rollout/tokens_per_s": "distillab_rollout_tokens_per_s",
                        "rlvr/reward_mean": "distillab_reward_mean"}
    for name in (plots.REWARD, plots.STUDENT_LOGLIK, plots.TEACHER_LOGLIK):
        assert find(name) is not None, name
    assert all(m.producer and m.doc for m in METRICS.values())


def test_the_oracle_metrics_are_registered() -> None:
    from distillab.ops.oracle import ORACLE_METRICS

    for name in ORACLE_METRICS:
        m = find(f"estimator/{name}")
        assert m is not None and m.scope == "step" and m.producer == "recipe.loss.oracle", name
