"""The Task protocol (issue 42, item 2; `distillab.tasks.base`): every built-in task keeps its
contract, and a task added in this file alone (`EchoTask`: the worked example of docs/layout.md,
executed and registered at test time, removed after) is found by the config, the seeds, the task
data, prepare's SFT data and key, the OffPD key, the dry-run estimate and the evaluation, and
(slow) runs through a smoke trial of the real recipe (`session.LocalSession`, the random micro
models of tests/test_golden.py) into the evals table and ``distillab report``. Nothing outside
this file and the docs' example changes for it."""

from __future__ import annotations

import contextlib
import io
import textwrap
import time
from pathlib import Path

import polars as pl
import pytest
from pydantic import ValidationError

from distillab.config import EvaluationConfig, SeedsConfig, TaskEntry, TasksConfig, TrialConfig, load_sweep
from distillab.models import build_char_tokenizer
from distillab.registry import find
from distillab.tasks.base import Prompt, register, unregister
from distillab.tasks.data import TaskData
from distillab.tasks.registry import get, registered, scored
from distillab.tasks.taskio import render

REPO = Path(__file__).resolve().parents[2]


def _worked_example() -> dict:
    """The worked example of docs/layout.md ("Adding a task": the module ``platform/tasks/echo.py``),
    executed here without its last line, ``register(EchoTask())``: ``{name: object}`` of the module."""
    text = (REPO / "docs" / "layout.md").read_text()
    block = text.split("# platform/tasks/echo.py\n", 1)[1].split("```", 1)[0]
    source = textwrap.dedent(block).rstrip()
    assert source.endswith("register(EchoTask())"), source[-80:]
    namespace: dict = {"__name__": "echo_example"}
    exec(compile(source.removesuffix("register(EchoTask())"), "docs/layout.md (echo.py)", "exec"), namespace)
    return namespace


ECHO = _worked_example()
EchoSettings, EchoTask = ECHO["EchoSettings"], ECHO["EchoTask"]


@pytest.fixture
def echo_task():
    task = register(EchoTask())
    yield task
    unregister("echo")


def _trial(**kw) -> TrialConfig:
    base = {"domain": "echo", "tasks": {"echo": {"length": 4}},
            "evaluation": {"id_items": 4, "pass_items": 2, "pass_n": 2, "pass_k": [1, 2], "ood_items": 2,
                           "max_tokens": 8, "countdown_tasks": ["countdown3"], "task_items": {"echo": 6},
                           "pass_temperature": {"echo": 0.7}}}
    return TrialConfig.model_validate({**base, **kw})


# ------------------------------------------------------------------------------------ the built-in tasks


@pytest.mark.parametrize("name", ["countdown2", "countdown3", "countdown4e", "countdown4", "ood", "mcq", "math"])
def test_each_built_in_task_keeps_the_contract(name: str) -> None:
    """Its test split is fixed, its training items avoid its exclusion, a demonstration passes its own
    verifier (and a wrong answer does not), its prompt renders, and its metric keys are registered."""
    task, tasks, ev = get(name), TasksConfig(), EvaluationConfig(mcq_items=5, math_items=5)
    test = task.test_items(tasks, 5)
    assert test == task.test_items(tasks, 5) and len(test) >= 5
    exclude = task.exclusion(tasks, ev)
    train = task.train_items(tasks, 300, seed=3, exclude=exclude)
    assert train and not {task.item_key(it) for it in train} & exclude
    for it in test[:3]:
        assert task.score(task.demonstration(tasks, it), it)
        assert not task.score("<answer></answer>", it)
        p = task.prompt(tasks, it)
        assert isinstance(p, Prompt) and p.user and render(build_char_tokenizer(), p)
    for key, _ in task.metrics():
        assert find(key.replace("<stage>", "pre").replace("<k>", "1").replace("<skill>", "add")) is not None, key


def test_the_registry_lists_the_built_in_tasks_in_their_order() -> None:
    assert [t.name for t in registered()] == ["countdown2", "countdown3", "countdown4e", "countdown4", "ood", "mcq",
                                              "math", "files"]
    ev = EvaluationConfig(countdown_tasks=("countdown4", "countdown3"), mcq_items=3, math_items=2)
    assert [(t.name, i) for t, i in scored(TasksConfig(), ev)] == [("countdown4", 0), ("countdown3", 1), ("mcq", 0),
                                                                   ("math", 0)]


def test_a_task_whose_seed_streams_are_taken_is_refused() -> None:
    for entry, taken in ((TaskEntry("x", EchoSettings, test_split_offset=11), "test_split_offset 11 is task 'mcq'"),
                         (TaskEntry("x", EchoSettings, sft_streams={"x": 23}), "SFT stream 'x' \\(23\\) is taken"),
                         (TaskEntry("x", EchoSettings, domain="mcq"), "domain 'mcq' is task 'mcq'"),
                         (TaskEntry("copy", EchoSettings), "key 'copy' is taken"),  # pydantic's model.copy
                         (TaskEntry("mcq", EchoSettings), "task 'mcq' is registered already")):
        task = EchoTask(entry)
        with pytest.raises(ValueError, match=taken):
            register(task)
    with pytest.raises(KeyError, match="no task 'x'"):
        get("x")


# ------------------------------------------------------------------------------------ a task added here


def test_the_config_finds_the_added_task(echo_task) -> None:
    default = "offpd-forward-lr1e-05-s42-06fc67f7"
    assert TrialConfig().trial_id == default  # registering a task changes no recorded config
    trial = _trial()
    assert trial.tasks["echo"] == EchoSettings(length=4) and trial.tasks.echo.length == 4
    dump = trial.model_dump(mode="json")
    assert dump["tasks"]["echo"] == {"length": 4, "system_prompt": "Echo."}
    assert dump["evaluation"]["task_items"] == {"echo": 6}
    assert TrialConfig.model_validate(dump) == trial and trial.trial_id != default
    assert TasksConfig()["echo"] == EchoSettings()  # absent: the entry's default, and not in the dump
    assert "echo" not in TasksConfig().model_dump() and "task_items" not in EvaluationConfig().model_dump()
    assert TasksConfig().inputs(teacher=False, uses=["echo"])["echo"] == {"length": 3, "system_prompt": "Echo."}
    with pytest.raises(ValidationError, match=r"domain 'echo' needs evaluation.task_items.echo > 0"):
        _trial(evaluation={"id_items": 4})
    with pytest.raises(ValidationError, match=r"echo\.lenght"):
        _trial(tasks={"echo": {"lenght": 2}})
    with pytest.raises(ValidationError, match=r"'mcq' is no task registered by a module"):
        EvaluationConfig(task_items={"mcq": 3})
    with pytest.raises(ValidationError, match="tasks.teacher_system_prompt .* do not apply to domain 'echo'"):
        _trial(tasks={"teacher_system_prompt": "Be brief."})


def test_seeds_data_and_evaluation_plan_of_the_added_task(echo_task) -> None:
    trial = _trial()
    assert SeedsConfig.test_split_seed(1000, "echo") == 1101 and SeedsConfig.sft_seed(5, "echo") == 5041
    assert SeedsConfig().eval_task_seed(42, "echo", 0) == 42 + 404
    data = TaskData.of(trial)
    test = data.test_split("echo")
    assert len(test) == 6 and all(len(w) == 4 for w in test)  # max(task_items 6, pass_items 2)
    tok = build_char_tokenizer()
    prompts = data.train_prompts(tok, rank=0)
    drawn = echo_task._words(trial.tasks, trial.optimizer.train_prompts, trial.seeds.train_problems_seed(42))
    assert len(prompts) == len([w for w in drawn if w not in set(test)])
    assert not {tuple(render(tok, Prompt("Echo.", f"echo {w}"))) for w in test} & {tuple(p) for p in prompts[:500]}
    plan = echo_task.evaluation(trial.tasks, trial.evaluation)
    assert (plan.items, plan.test_items, plan.pass_items, plan.pass_n, plan.pass_temperature) == (6, 6, 2, 2, 0.7)
    assert [t.name for t, _ in scored(trial.tasks, trial.evaluation)] == ["countdown3", "echo"]
    assert find("eval/distill/echo/accuracy") is not None and find("eval/rlvr/echo/pass@2") is not None


def test_prepare_keys_offpd_key_and_estimate_of_the_added_task(echo_task, tmp_path) -> None:
    from distillab.driver.plan import estimate
    from distillab.recipe.prepare import _examples, prepare_key
    from distillab.rollout.source import offpd_rollout_path

    yaml = tmp_path / "echo.yaml"
    yaml.write_text("extends: {}\nname: echo\ntrial: {{domain: echo, evaluation: {{task_items: {{echo: 6}}}}}}\n"
                    .format(REPO / "search_spaces" / "smoke.yaml"))
    base = load_sweep(yaml)
    sweep = load_sweep(yaml, {"models.micro_teacher.task_examples": {"echo": 20}})
    assert prepare_key(sweep, "teacher") != prepare_key(base, "teacher")
    assert prepare_key(sweep, "student") == prepare_key(base, "student")
    tok = build_char_tokenizer()
    ex = _examples(tok, sweep, "teacher", 0)
    echoes = [e for e in ex if "echo " in tok.decode(e.prompt_ids)]
    test = set(TaskData.of(sweep.trial).test_split("echo"))  # 6 of the 1,000 words: rarely one of the 20 drawn
    drawn = echo_task._words(sweep.trial.tasks, 20, SeedsConfig.sft_seed(0, "echo"))
    want = [w for w in drawn if w not in test]
    assert len(ex) == len(_examples(tok, base, "teacher", 0)) + len(want) and ex[-len(want):] == echoes
    for e, word in zip(echoes, want, strict=True):  # after every Countdown demonstration (sft_order 50 > 0)
        assert tok.decode(e.prompt_ids).split("echo ")[1][:3] == word
        assert tok.decode(e.completion_ids) == f"<answer>{word}</answer></s>"
    t, t5 = sweep.trial, sweep.trial.model_copy(update={"tasks": TasksConfig(echo={"length": 5})})
    assert offpd_rollout_path("/c", t, "/t", 0, 1) != offpd_rollout_path("/c", t5, "/t", 0, 1)
    est = estimate(t, tok, n_teacher=30, n_student=7)
    p = len(render(tok, Prompt("Echo.", "echo abc")))
    assert est.prompt_tokens["echo"] == p
    ev = t.evaluation
    p3, ood = est.prompt_tokens["countdown3"], est.prompt_tokens["ood"]
    stage = ((8 + 4 * 2) * (p3 + 12) + (8 + 4 * 2) * (est.prompt_tokens["countdown4e"] + 12)
             + (6 + 4 * 2) * (p + 12) + 4 * 4 * (ood + 12))  # + 4 items of each of 4 prior skills
    assert ev.max_tokens == 12 and est.pre_eval_tokens == pytest.approx(stage)
    o = t.optimizer  # steps x prompts x rollouts x (echo prompt + rollout.max_tokens)
    assert (o.steps, o.prompts_per_step) == (4, 4) and est.tokens["distill"] == 16 * o.rollouts_per_prompt * (p + 12)


@pytest.fixture(scope="module")
def one_rank():
    from _helpers import one_gloo_rank

    yield from one_gloo_rank()


@pytest.mark.slow
def test_the_added_task_runs_through_a_smoke_trial_and_shows_in_report(one_rank, echo_task, tmp_path) -> None:
    """One OffPD trial of the real recipe distilling on the echo task (random micro models, 2 steps):
    its prompts are echo prompts, it is scored at pre and distill, and `distillab report --full`
    prints its rows."""
    from fixtures.record_golden import golden_models

    from distillab.config import RuntimeContext
    from distillab.driver.cli import main
    from distillab.recipe.distill import run_worker
    from distillab.recipe.session import LocalSession
    from distillab.tables import write_rows

    teacher, student = golden_models(tmp_path / "models")
    trial = _trial(optimizer={"lr": 1e-3, "steps": 2, "prompts_per_step": 4, "warmup_steps": 1, "train_prompts": 50},
                   rollout={"max_tokens": 8})
    root, trial_id = tmp_path / "runs", trial.trial_id
    ctx = RuntimeContext(teacher_path=str(teacher), student_path=str(student), results_root=str(root),
                         shared_cache=str(tmp_path / "shared"))
    t0 = time.time()
    final = run_worker(trial, ctx, trial_id, LocalSession())
    assert {"eval/pre/echo/accuracy", "eval/distill/echo/pass@2", "eval/distill/countdown3/accuracy"} <= set(final)
    write_rows(root, "trials", [{"trial_id": trial_id, "status": "completed", "start_time": t0,
                                 "end_time": time.time(), **trial.flat()}], key=trial_id)
    evals = pl.read_parquet(root / "evals").filter(pl.col("task") == "echo")
    assert sorted(set(zip(evals["stage"], evals["metric"]))) == [
        (s, m) for s in ("distill", "pre") for m in ("accuracy", "pass@1", "pass@2")]
    assert set(evals.filter(pl.col("metric") == "accuracy")["n"]) == {6}
    samples = pl.read_parquet(root / "samples").filter(pl.col("task") == "echo")
    assert samples.height == 2 * 6 and all(p.split("echo ")[1][:4].isalpha() for p in samples["prompt"])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["report", str(root), "--full"]) == 0
    lines = [line for line in out.getvalue().splitlines() if "echo" in line]
    assert any("accuracy" in line for line in lines) and any("pass@2" in line for line in lines), out.getvalue()
