"""The OOD suite's lm-eval-harness backend on local custom tasks (no hub downloads):
a scripted LM with a known accuracy, and a micro model against a float64 rescoring
of every choice; plus the config errors and the micro backend's rows."""

from __future__ import annotations

import json
from pathlib import Path

import _tolerance as tol
import pytest
import torch

from lm_eval.api.model import LM  # the eval extra (scripts/install.sh installs it)

from distillab.config import EvaluationConfig, LMEvalConfig, LMEvalTask, TasksConfig, TrialConfig
from distillab.evals.ood import LMEvalBackend, MicroSkillsBackend, lm_eval_rows, mean_row

#: float64 roundings (tests/_tolerance.py, approx64) of a share or a mean of at most 12 values
ROUNDINGS = 16

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "lm_eval"

QA_YAML = """task: distillab_qa_mini
dataset_path: json
dataset_kwargs:
  data_files:
    test: {path}
test_split: test
output_type: generate_until
doc_to_text: "Q: {{{{question}}}}\\nA:"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n"]
  do_sample: false
  max_gen_toks: 8
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""

MC_YAML = """task: distillab_mc_mini
dataset_path: json
dataset_kwargs:
  data_files:
    test: {path}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: gold
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""

TASKS = (LMEvalTask(task="distillab_qa_mini", metric="exact_match,none"),
         LMEvalTask(task="distillab_mc_mini", metric="acc,none"))


def _docs(name: str) -> list[dict]:
    return [json.loads(line) for line in (FIX / name).read_text().splitlines()]


@pytest.fixture
def include_path(tmp_path: Path) -> str:
    (tmp_path / "qa.yaml").write_text(QA_YAML.format(path=FIX / "qa_mini.jsonl"))
    (tmp_path / "mc.yaml").write_text(MC_YAML.format(path=FIX / "mc_mini.jsonl"))
    return str(tmp_path)


# Scripted answers: wrong on QA items 1, 4, 8 (7 of 10 right), wrong on MC items 2, 5, 10 (9 of 12 right).
QA_WRONG, MC_WRONG = {1, 4, 8}, {2, 5, 10}


class ScriptedLM(LM):
    """Answers from a script keyed by the prompt lm-eval renders; counts its calls."""

    def __init__(self) -> None:
        super().__init__()
        self.qa = {f"Q: {d['question']}\nA:": (d["answer"] if d["id"] not in QA_WRONG else d["answer"] + "0")
                   for d in _docs("qa_mini.jsonl")}
        self.mc = {f"{d['question']}\nAnswer:": d["choices"][(d["gold"] + (1 if d["id"] in MC_WRONG else 0)) % 4]
                   for d in _docs("mc_mini.jsonl")}
        self.calls = {"generate_until": 0, "loglikelihood": 0}

    def generate_until(self, requests, disable_tqdm: bool = False):
        self.calls["generate_until"] += len(requests)
        return [self.qa[r.args[0]] for r in requests]

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        self.calls["loglikelihood"] += len(requests)
        return [(0.0 if cont.strip() == self.mc[ctx] else -5.0, False) for ctx, cont in (r.args for r in requests)]

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError


def test_lm_eval_backend_returns_the_known_accuracy_of_a_scripted_answer_set(include_path: str) -> None:
    backend = LMEvalBackend(LMEvalConfig(tasks=TASKS, limit=None, include_path=include_path))
    lm = ScriptedLM()
    rows = lm_eval_rows(backend.run(lm, seed=0), TASKS)
    assert rows == [
        {"task": "ood/distillab_qa_mini", "metric": "exact_match", "value": tol.approx64(7 / 10, ROUNDINGS), "n": 10},
        {"task": "ood/distillab_mc_mini", "metric": "acc", "value": tol.approx64(9 / 12, ROUNDINGS), "n": 12},
    ]
    assert mean_row(rows) == {"task": "ood", "metric": "ood_mean", "value": tol.approx64((0.7 + 0.75) / 2, ROUNDINGS), "n": 2}
    assert lm.calls == {"generate_until": 10, "loglikelihood": 12 * 4}  # one request per item, per choice


def test_lm_eval_item_limit_is_per_task(include_path: str) -> None:
    backend = LMEvalBackend(LMEvalConfig(tasks=TASKS, limit=5, include_path=include_path))
    rows = lm_eval_rows(backend.run(ScriptedLM(), seed=0), TASKS)
    # the first 5 items: QA wrong on 1 and 4 (3/5), MC wrong on 2 (4/5)
    assert [(r["value"], r["n"]) for r in rows] == [(tol.approx64(0.6, ROUNDINGS), 5), (tol.approx64(0.8, ROUNDINGS), 5)]


def _micro_model_and_tokenizer():
    from transformers import LlamaForCausalLM

    from distillab.models import build_char_tokenizer, micro_llama_config

    tok = build_char_tokenizer()
    torch.manual_seed(3)
    model = LlamaForCausalLM(micro_llama_config(len(tok), 64, 2, 2, 128, 256, tok)).eval()
    return model, tok


def test_lm_eval_backend_on_a_micro_model_matches_a_float64_rescoring(include_path: str) -> None:
    model, tok = _micro_model_and_tokenizer()
    mc = (LMEvalTask(task="distillab_mc_mini", metric="acc,none"),)
    rows = LMEvalBackend(LMEvalConfig(tasks=mc, limit=None, include_path=include_path, batch_size=4)).evaluate(
        model, tok, seed=0)
    # reference: log p(" " + choice | question) summed over its tokens, in float64, argmax vs gold
    ref64 = model.to(torch.float64)
    correct = []
    for d in _docs("mc_mini.jsonl"):
        ctx = tok.encode(f"{d['question']}\nAnswer:")
        scores = []
        for choice in d["choices"]:
            whole = tok.encode(f"{d['question']}\nAnswer: {choice}")
            assert whole[: len(ctx)] == ctx
            ids = torch.tensor([whole])
            with torch.no_grad():
                logp = torch.log_softmax(ref64(input_ids=ids).logits[0], dim=-1)
            scores.append(sum(float(logp[t - 1, whole[t]]) for t in range(len(ctx), len(whole))))
        correct.append(max(range(4), key=scores.__getitem__) == d["gold"])
    expected = sum(correct) / len(correct)
    assert 0 < expected < 1  # the random micro model is right on some items and wrong on others
    assert rows == [
        {"task": "ood/distillab_mc_mini", "metric": "acc", "value": tol.approx64(expected, ROUNDINGS), "n": 12},
        {"task": "ood", "metric": "ood_mean", "value": tol.approx64(expected, ROUNDINGS), "n": 1},
    ]


def test_lm_eval_rows_name_a_missing_task_or_metric() -> None:
    results = {"results": {"distillab_mc_mini": {"acc,none": 0.5, "alias": "x"}}, "n-samples": {}}
    with pytest.raises(KeyError, match=r"no result for task 'distillab_qa_mini'"):
        lm_eval_rows(results, TASKS)
    with pytest.raises(KeyError, match=r"no metric 'acc_norm,none'; it has \['acc,none'\]"):
        lm_eval_rows(results, (LMEvalTask(task="distillab_mc_mini", metric="acc_norm,none"),))


def test_lm_eval_scale_maps_eq_bench_to_unit_interval() -> None:
    results = {"results": {"eq_bench": {"eqbench,none": 62.5}}, "n-samples": {"eq_bench": {"effective": 171}}}
    (row,) = lm_eval_rows(results, (LMEvalTask(task="eq_bench", metric="eqbench,none", scale=100.0),))
    assert row == {"task": "ood/eq_bench", "metric": "eqbench", "value": 0.625, "n": 171}


def test_ood_config_errors_name_the_field() -> None:
    from pydantic import ValidationError

    # the paper's suite has HumanEval-Instruct, which runs model-written code: opt in explicitly
    with pytest.raises(ValidationError, match=r"lm_eval.tasks \['humaneval_instruct'\] execute model-written code: "
                                              r"set lm_eval.allow_code_execution: true"):
        TrialConfig.model_validate({"evaluation": {"ood_backend": "lm_eval"}})
    ok = TrialConfig.model_validate({"evaluation": {"ood_backend": "lm_eval", "lm_eval": {"allow_code_execution": True}}})
    assert [t.task for t in ok.evaluation.lm_eval.tasks] == [
        "mmlu_pro", "truthfulqa_mc1", "ifeval", "humaneval_instruct", "eq_bench", "bbq", "toxigen"]
    with pytest.raises(ValidationError, match="ood_backend"):
        TrialConfig.model_validate({"evaluation": {"ood_backend": "helm"}})
    with pytest.raises(ValidationError, match=r"lm_eval.tasks.0.metric"):
        TrialConfig.model_validate({"evaluation": {"lm_eval": {"tasks": [{"task": "bbq", "metric": "acc"}]}}})
    with pytest.raises(ValidationError, match="must not repeat a task"):
        LMEvalConfig(tasks=[TASKS[0], TASKS[0]])


def test_micro_backend_rows_and_unweighted_mean() -> None:
    model, tok = _micro_model_and_tokenizer()
    cfg = EvaluationConfig(ood_items=4)
    rows = MicroSkillsBackend(TasksConfig(), cfg).evaluate(model, tok, seed=0)
    assert [r["task"] for r in rows] == ["ood/add", "ood/mul", "ood/reverse", "ood/sort", "ood"]
    assert all(r["n"] == 4 and r["metric"] == "accuracy" for r in rows[:4])
    assert rows[-1]["value"] == tol.approx64(sum(r["value"] for r in rows[:4]) / 4, ROUNDINGS)
