"""Countdown verifier, answer extraction, generator, solver, specs, prior skills and
prompts (PROTOCOL.md §5). Expected values are worked out by hand."""

from __future__ import annotations

import random

import pytest

from distillab.config import PAPER_POOL, SMALL_POOL, TrialConfig
from distillab.models import build_char_tokenizer
from distillab.tasks.countdown import (
    SKILLS,
    CountdownProblem,
    CountdownSpec,
    SkillItem,
    apply_op,
    countdown_user_text,
    extract_answer,
    generate_problems,
    generate_skill_items,
    render_solution,
    score_countdown,
    score_skill,
    skill_user_text,
    solve,
    verify_countdown,
)
from distillab.tasks.data import RenderedOnUse, TaskData, countdown_prompt_ids
from distillab.tasks.taskio import render_prompt

# --------------------------------------------------------------------------------------
# verifier
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "answer, operands, target",
    [
        ("2+3=5,5*4=20", (2, 3, 4), 20),
        ("3+2=5,4*5=20", (2, 3, 4), 20),  # operand order inside a step does not matter
        ("4*3=12,12+2=14", (2, 3, 4), 14),  # steps in any order of the operands
        (" 2 + 3 = 5 , 5 * 4 = 20 ", (2, 3, 4), 20),  # spaces around tokens
        # intermediate 3 used alongside the operand 3 (a legitimate duplicate value)
        ("1+2=3,3*3=9,9+4=13", (1, 2, 3, 4), 13),
        # two intermediates combined, exact division
        ("2+3=5,4*5=20,20/5=4", (2, 3, 4, 5), 4),
        ("75-25=50,50/2=25", (75, 25, 2), 25),
        ("9*9=81", (9, 9), 81),
    ],
)
def test_verifier_accepts_valid(answer: str, operands: tuple[int, ...], target: int) -> None:
    assert verify_countdown(answer, operands, target) is True


@pytest.mark.parametrize(
    "answer, operands, target",
    [
        ("3+3=6,6*4=24", (2, 3, 4), 24),  # operand 3 used twice, 2 never
        ("2+3=5,5*6=30", (2, 3, 4), 30),  # 6 is not in the pool
        ("7/2=3,3*3=9", (7, 2, 3), 9),  # 7/2 is not exact (floor would give 3)
        ("2+3=6,6*4=24", (2, 3, 4), 24),  # wrong arithmetic
        ("2+3=5,5*4=20", (2, 3, 4), 21),  # right steps, wrong final value
        ("2+3=5", (2, 3, 4), 5),  # operand 4 unused (too few steps)
        ("2+3=5,5*4=20,20*1=20", (2, 3, 4), 20),  # too many steps
        ("2-3=-1,5+-1=4", (2, 3, 5), 4),  # negative intermediate
        ("2-3=1,5-1=4", (2, 3, 5), 4),  # 2-3 is not 1 (nor allowed)
        ("3-3=0,5/0=5", (3, 3, 5), 5),  # division by zero
        ("", (2, 3, 4), 20),
        ("", (2, 3), 5),  # one step expected: the empty step does not parse
        (None, (2, 3, 4), 20),
        ("2+3=5 apples,5*4=20", (2, 3, 4), 20),
        ("2+3=5,5*4=20.", (2, 3, 4), 20),
        ("2+3=5,5*4=20,", (2, 3, 4), 20),
        ("2+3=5;5*4=20", (2, 3, 4), 20),
        ("(2+3)*4=20", (2, 3, 4), 20),  # an expression, not steps
        ("2+3+0=5,5*4=20", (2, 3, 4), 20),
        ("2^3=8,8*4=32", (2, 3, 4), 32),
        ("2.0+3=5,5*4=20", (2, 3, 4), 20),
        ("20", (2, 3, 4), 20),
    ],
)
def test_verifier_rejects_invalid(answer: str | None, operands: tuple[int, ...], target: int) -> None:
    assert verify_countdown(answer, operands, target) is False


def test_verifier_never_evaluates_code(tmp_path) -> None:
    marker = tmp_path / "pwned"
    attacks = [
        f"__import__('os').system('touch {marker}')",
        f"2+3=5,5*4=20;import os; open('{marker}', 'w')",
        "2+3=5,5*4=20;import os",
        f"2+3=5,__import__('os').system('touch {marker}')",
        f"exec(\"open('{marker}','w')\")",
    ]
    for a in attacks:
        assert verify_countdown(a, (2, 3, 4), 20) is False
        assert score_countdown(f"<answer>{a}</answer>", CountdownProblem((2, 3, 4), 20)) is False
    assert not marker.exists()


def test_apply_op_by_hand() -> None:
    assert apply_op(7, "+", 5) == 12
    assert apply_op(7, "-", 5) == 2
    assert apply_op(5, "-", 7) is None
    assert apply_op(7, "*", 5) == 35
    assert apply_op(12, "/", 4) == 3
    assert apply_op(7, "/", 2) is None
    assert apply_op(7, "/", 0) is None
    with pytest.raises(ValueError):
        apply_op(2, "^", 3)


# --------------------------------------------------------------------------------------
# answer extraction and scoring
# --------------------------------------------------------------------------------------


def test_extract_answer() -> None:
    assert extract_answer("<think>x</think><answer>1+2=3</answer> and <answer>9</answer>") == "1+2=3"
    assert extract_answer("no tags here: 2+3=5") is None
    assert extract_answer("<answer>2+3=5") is None
    assert extract_answer("2+3=5</answer>") is None
    assert extract_answer("<answer>\n  2+3=5,5*4=20 \t</answer>") == "2+3=5,5*4=20"
    assert extract_answer("<answer>a\nb</answer>") == "a\nb"  # spans lines
    assert extract_answer("<answer></answer>") == ""


def test_score_countdown_end_to_end() -> None:
    p = CountdownProblem((2, 3, 4), 20)
    assert score_countdown("<think>add then multiply</think>\n<answer> 2+3=5,5*4=20 </answer>", p) is True
    assert score_countdown("<answer>2+3=5,5*4=20</answer><answer>garbage</answer>", p) is True
    assert score_countdown("<answer>garbage</answer><answer>2+3=5,5*4=20</answer>", p) is False
    assert score_countdown("2+3=5,5*4=20", p) is False  # no tags
    assert score_countdown("<answer>2+3=5,5*4=21</answer>", p) is False
    assert score_countdown("<answer>2+3=5,5*4=20</answer>", CountdownProblem((2, 3, 4), 24)) is False


# --------------------------------------------------------------------------------------
# generator and solver
# --------------------------------------------------------------------------------------

SPECS = [
    (CountdownSpec.countdown3(), PAPER_POOL, 3, 1, 1000),
    (CountdownSpec.countdown4e(), tuple(range(1, 11)), 4, 1, 1000),
    (CountdownSpec.countdown4(), PAPER_POOL, 4, 1, 10_000),
]
SPEC_IDS = ["countdown3", "countdown4e", "countdown4"]


def test_spec_constructors_match_protocol() -> None:
    assert PAPER_POOL == (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 15, 20, 25, 50, 75)
    assert SMALL_POOL == (1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
    for spec, pool, n_ops, tmin, tmax in SPECS:
        assert (spec.pool, spec.n_operands, spec.target_min, spec.target_max) == (pool, n_ops, tmin, tmax)


@pytest.mark.parametrize("spec, pool, n_ops, tmin, tmax", SPECS, ids=SPEC_IDS)
def test_generator_deterministic_and_in_range(spec, pool, n_ops, tmin, tmax) -> None:
    a = generate_problems(spec, n=50, seed=3)
    b = generate_problems(spec, n=50, seed=3)
    c = generate_problems(spec, n=50, seed=4)
    assert a == b
    assert a != c
    assert len(a) == 50
    for p in a + c:
        assert isinstance(p, CountdownProblem)
        assert len(p.operands) == n_ops
        assert all(v in pool for v in p.operands)
        assert tmin <= p.target <= tmax
    # a prefix of a longer draw with the same seed is the shorter draw
    assert generate_problems(spec, n=10, seed=3) == a[:10]


@pytest.mark.parametrize("spec", [s[0] for s in SPECS], ids=SPEC_IDS)
def test_solver_solves_every_generated_problem(spec: CountdownSpec) -> None:
    for p in generate_problems(spec, n=200, seed=11):
        steps = solve(p.operands, p.target)
        assert steps is not None, p
        assert len(steps) == len(p.operands) - 1
        assert steps[-1][3] == p.target
        assert verify_countdown(render_solution(steps), p.operands, p.target) is True


def test_solver_by_hand() -> None:
    assert solve((1, 1, 1), 100) is None  # at most 3 from three 1s
    assert solve((2, 3), 7) is None  # 5, 1, 6 are the only reachable values (3/2 inexact)
    assert solve((3, 3), 3) is None  # 6, 0 (not allowed), 9, 1
    steps = solve((2, 3), 6)
    assert steps == [(3, "*", 2, 6)]
    assert render_solution(steps) == "3*2=6"
    assert render_solution([(2, "+", 3, 5), (5, "*", 4, 20)]) == "2+3=5,5*4=20"
    steps = solve((75, 50, 25), 1)  # e.g. 75-50=25, 25/25=1
    assert steps is not None and verify_countdown(render_solution(steps), (75, 50, 25), 1)


# --------------------------------------------------------------------------------------
# spec validation
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, fragment",
    [
        (("x", (), 3, 1, 10), "pool"),
        (("x", (1, 0, 2), 3, 1, 10), "pool"),
        (("x", (1, 2), 1, 1, 10), "n_operands"),
        (("x", (1, 2), 3, 11, 10), "target_min"),
        (("x", (1, 2), 3, 0, 10), "target_min"),
    ],
)
def test_spec_value_errors(args, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        CountdownSpec(*args)


# --------------------------------------------------------------------------------------
# prior skills
# --------------------------------------------------------------------------------------


def test_skill_items_deterministic() -> None:
    for task in SKILLS:
        a = generate_skill_items(task, 20, seed=5)
        assert a == generate_skill_items(task, 20, seed=5)
        assert a != generate_skill_items(task, 20, seed=6)
        assert len(a) == 20 and all(it.task == task for it in a)


def test_skill_items_answers_are_right() -> None:
    for it in generate_skill_items("add", 30, seed=0):
        op, a, b = it.prompt.split()
        assert op == "add" and 1 <= int(a) <= 99 and 1 <= int(b) <= 99
        assert it.answer == str(int(a) + int(b))
    for it in generate_skill_items("mul", 30, seed=0):
        op, a, b = it.prompt.split()
        assert op == "mul" and int(a) in PAPER_POOL and 1 <= int(b) <= 12
        assert it.answer == str(int(a) * int(b))
    for it in generate_skill_items("reverse", 30, seed=0):
        op, s = it.prompt.split()
        assert op == "rev" and 3 <= len(s) <= 6
        assert it.answer == "".join(reversed(s))
    for it in generate_skill_items("sort", 30, seed=0):
        op, s = it.prompt.split()
        assert op == "sort" and 3 <= len(s) <= 6
        assert it.answer == "".join(sorted(s))


def test_score_skill_by_hand() -> None:
    add = SkillItem("add", "add 12 30", "42")
    assert score_skill("<answer>42</answer>", add) is True
    assert score_skill("<think>12+30</think><answer> 42 </answer>", add) is True
    assert score_skill("<answer>41</answer>", add) is False
    assert score_skill("<answer>042</answer>", add) is False
    assert score_skill("42", add) is False
    rev = SkillItem("reverse", "rev abcd", "dcba")
    assert score_skill("<answer>dcba</answer>", rev) is True
    assert score_skill("<answer>abcd</answer>", rev) is False
    srt = SkillItem("sort", "sort 3121", "1123")
    assert score_skill("<answer>1123</answer>", srt) is True
    assert skill_user_text(srt) == "sort 3121"


def test_unknown_skill_task() -> None:
    with pytest.raises(ValueError) as e:
        generate_skill_items("divide", 3, seed=0)
    msg = str(e.value)
    assert "divide" in msg
    for name in ("add", "mul", "reverse", "sort"):
        assert name in msg


# --------------------------------------------------------------------------------------
# prompts
# --------------------------------------------------------------------------------------


def test_render_prompt_chat_template() -> None:
    tok = build_char_tokenizer()
    ids = render_prompt(tok, "S", "U")
    assert tok.decode(ids) == "<|system|>S<|user|>U<|assistant|>"
    assert len(ids) == 5  # three role tokens, two characters
    assert ids[0] == tok.convert_tokens_to_ids("<|system|>")
    assert ids[-1] == tok.convert_tokens_to_ids("<|assistant|>")
    no_system = render_prompt(tok, "", "10 7 3 -> 21")
    assert tok.decode(no_system) == "<|user|>10 7 3 -> 21<|assistant|>"
    assert len(no_system) == 2 + len("10 7 3 -> 21")


def test_render_prompt_without_template() -> None:
    tok = build_char_tokenizer()
    tok.chat_template = None
    assert tok.decode(render_prompt(tok, "Sys", "Usr")) == "Sys\n\nUsr\n"
    assert tok.decode(render_prompt(tok, "", "Usr")) == "Usr\n"


def test_countdown_user_text() -> None:
    p = CountdownProblem((3, 10, 7), 21)
    assert countdown_user_text(p, "{nums} -> {target}", sort_operands=True) == "10 7 3 -> 21"
    assert countdown_user_text(p, "{nums} -> {target}", sort_operands=False) == "3 10 7 -> 21"
    assert countdown_user_text(p, "Use {nums} to make {target}.", True) == "Use 10 7 3 to make 21."


def test_solver_agrees_with_brute_force_on_small_random_instances() -> None:
    """Cross-check solvability on 3-operand instances against an independent enumeration."""

    def reachable(pool: tuple[int, ...]) -> set[int]:
        if len(pool) == 1:
            return {pool[0]}
        out: set[int] = set()
        for i in range(len(pool)):
            for j in range(len(pool)):
                if i == j:
                    continue
                a, b = pool[i], pool[j]
                rest = tuple(v for k, v in enumerate(pool) if k not in (i, j))
                for r in (a + b, a - b, a * b, a // b if b and a % b == 0 else None):
                    if r is not None and r > 0:
                        out |= reachable(rest + (r,))
        return out

    rng = random.Random(2)
    for _ in range(30):
        ops = tuple(rng.choice(SMALL_POOL) for _ in range(3))
        target = rng.randint(1, 60)
        assert (solve(ops, target) is not None) == (target in reachable(ops)), (ops, target)


def test_training_prompts_are_rendered_when_first_read() -> None:
    """`tasks.data.RenderedOnUse`: each entry rendered once, on its first read; a slice is the
    list of the same entries; ``len``, iteration and ``==`` as on the rendered list."""
    calls: list[int] = []

    def render(x: int) -> list[int]:
        calls.append(x)
        return [x, x * x]

    lazy = RenderedOnUse([3, 1, 4, 1, 5], render)
    eager = [render(x) for x in [3, 1, 4, 1, 5]]
    calls.clear()
    assert len(lazy) == 5 and calls == []
    assert lazy[2] == [4, 16] and lazy[-1] == [5, 25] and calls == [4, 5]
    assert lazy[1:4] == eager[1:4] and calls == [4, 5, 1, 1]  # entry 2 kept, 1 and 3 rendered now
    assert lazy[2] is lazy[2] and calls == [4, 5, 1, 1]
    assert lazy[::-2] == eager[::-2] and lazy == eager and eager == lazy and list(lazy) == eager
    assert lazy != eager[:4] and lazy != [[0]] * 5 and calls == [4, 5, 1, 1, 3]


def test_a_trials_training_prompts_are_its_problems_rendered_in_order() -> None:
    """`TaskData.train_prompts` renders rank ``rank``'s shuffled training problems, test items
    removed, through `countdown_prompt_ids`: the same ids as rendering them all up front."""
    trial = TrialConfig(optimizer={"train_prompts": 60})
    tok = build_char_tokenizer()
    data = TaskData.of(trial)
    problems = data.train_problems("countdown3", data.train_items, trial.seeds.train_problems + trial.seed)
    random.Random(trial.seed * trial.seeds.shuffle + 1).shuffle(problems)
    prompts = data.train_prompts(tok, 1)
    assert len(prompts) == len(problems) > 40
    assert prompts[7:12] == [countdown_prompt_ids(tok, trial.tasks, p) for p in problems[7:12]]
    assert prompts == [countdown_prompt_ids(tok, trial.tasks, p) for p in problems]
    assert prompts != data.train_prompts(tok, 0)  # each rank its own order


def test_the_registrys_skill_names_are_the_generated_skills() -> None:
    """`registry.SKILL_NAMES` (what config and the metric keys accept) names `countdown.SKILLS`, in order."""
    from distillab.registry import SKILL_NAMES
    from distillab.tasks.countdown import SKILLS

    assert tuple(SKILLS) == SKILL_NAMES == ("add", "mul", "reverse", "sort")
