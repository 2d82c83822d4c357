"""The ``samples`` table (DESIGN.md: generated texts with their rewards, for inspection):
`Evaluator.samples` on hand-made completions, and `evaluate_stage` writing it, also from
the shared pre-distillation cache."""

from __future__ import annotations

import polars as pl
import torch
from _helpers import AlwaysEngine
from transformers import LlamaForCausalLM

from distillab.analysis.results import load
from distillab.config import EvaluationConfig, TasksConfig, TrialConfig
from distillab.evals.sampling import sample_batched
from distillab.evals.suite import SAMPLES_PER_TASK, Evaluator, evaluate_stage
from distillab.models import build_char_tokenizer, micro_llama_config
from distillab.tasks.countdown import countdown_prompt_ids, render_solution, score_countdown, solve

EVAL = dict(id_items=12, pass_items=2, pass_n=2, pass_k=(1, 2), ood_items=2, max_tokens=8,
            countdown_tasks=("countdown3",))


def test_samples_hold_the_first_prompts_their_completions_and_rewards() -> None:
    tok = build_char_tokenizer()
    ev = Evaluator(tok, TasksConfig(), EvaluationConfig(**EVAL))
    problems = ev.data.test_split("countdown3")[:12]
    prompts = [countdown_prompt_ids(tok, ev.tasks, p) for p in problems]
    score = lambda t, j: score_countdown(t, problems[j])  # noqa: E731
    first = f"<answer>{render_solution(solve(problems[0].operands, problems[0].target))}</answer>"
    done = sample_batched(AlwaysEngine(tok, first), ev.requests("countdown3", prompts, seed=0))
    rows = ev.samples("countdown3", prompts, done[0], score)
    assert len(rows) == SAMPLES_PER_TASK == 8  # of 12 prompts
    assert [r["completion"] for r in rows] == [first] * 8
    assert [r["prompt"] for r in rows] == [tok.decode(p, skip_special_tokens=False) for p in prompts[:8]]
    assert rows[0]["reward"] == 1.0  # the first problem's own solution
    # the same answer to another problem is right only where it reaches that problem's target with its numbers
    same = [p.target == problems[0].target and sorted(p.operands) == sorted(problems[0].operands) for p in problems[:8]]
    assert [r["reward"] for r in rows] == [float(s) for s in same] and sum(same) < 8
    wrong = sample_batched(AlwaysEngine(tok, "<answer>no</answer>"), ev.requests("countdown3", prompts[:3], seed=0))
    assert [r["reward"] for r in ev.samples("countdown3", prompts[:3], wrong[0], score)] == [0.0] * 3


def test_evaluate_stage_writes_the_samples_also_from_the_cache(tmp_path) -> None:
    tok = build_char_tokenizer()
    torch.manual_seed(0)
    model = LlamaForCausalLM(micro_llama_config(len(tok), 64, 1, 2, 64, 256, tok)).eval()
    trial = TrialConfig(evaluation=EvaluationConfig(**EVAL))
    ev = Evaluator(tok, trial.tasks, trial.evaluation, batch_size=64)
    cache = tmp_path / "shared" / "pre-eval.json"
    a = evaluate_stage(ev, model, trial, "a", "pre", 0, tmp_path / "runs", cache=cache)
    b = evaluate_stage(ev, model, trial, "b", "pre", 0, tmp_path / "runs", cache=cache)  # read from the cache
    assert a == b
    s = load(tmp_path / "runs").samples.sort("trial_id", maintain_order=True).collect()
    assert s["trial_id"].to_list() == ["a"] * 8 + ["b"] * 8 and set(s["stage"]) == {"pre"} and set(s["step"]) == {0}
    sa, sb = (s.filter(pl.col("trial_id") == t).drop("trial_id") for t in ("a", "b"))
    assert sa.equals(sb)
    # the rewards are the accuracy request's scores: their mean over all 12 items is the accuracy row's
    problems = ev.data.test_split("countdown3")
    assert sa["reward"].to_list() == [float(score_countdown(c, p)) for c, p in zip(sa["completion"], problems)]
    assert (sa["reward"].sum() <= a["eval/pre/countdown3/accuracy"] * 12 <= sa["reward"].sum() + 4)
