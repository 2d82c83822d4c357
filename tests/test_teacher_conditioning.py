"""Teacher conditioning (the style-transfer experiment): the teacher sees its own
prompt before the same completions. The training loss against a float64 reference
that runs each sequence alone (no padding), the prompt maps, OffPD sampling from the
teacher's prompts, config errors, the cache keys, and the style metric."""

from __future__ import annotations

import _tolerance as tol
import pytest
import torch
from _helpers import EngineStandIn
from pydantic import ValidationError
from transformers import LlamaConfig, LlamaForCausalLM

from distillab.config import LossConfig, StyleConfig, TasksConfig, TrialConfig
from distillab.evals.style import in_style, style_share
from distillab.recipe.loss import loss_step, pack_batch
from distillab.rollout.source import TeacherPrompts, offpd_rollout_set, step_prompts
from distillab.rollout.types import Rollouts
from distillab.tasks.data import train_prompts
from distillab.recipe.teacher import LocalTeacher

#: float64 roundings (tests/_tolerance.py, approx64) of a share: one division each side
ROUNDINGS = 2

V, PAD = 37, 0


def _model(seed: int, hidden: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(vocab_size=V, hidden_size=hidden, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=4, pad_token_id=PAD,
                                        tie_word_embeddings=False))


def _conditioned_rollouts() -> Rollouts:
    g = torch.Generator().manual_seed(5)
    # (student prompt, teacher prompt, completion) lengths: teacher prompts longer, shorter and equal
    lens = [(3, 7, 5), (6, 2, 4), (4, 4, 1), (2, 9, 6)]
    r = lambda n: torch.randint(1, V, (n,), generator=g).tolist()  # noqa: E731
    s, t, c = zip(*[(r(a), r(b), r(n)) for a, b, n in lens])
    return Rollouts(list(s), list(c), [[0.0] * len(x) for x in c], ["stop"] * 4, teacher_prompt_ids=list(t))


def _reference_loss(teacher, student, ro: Rollouts, kind: str, tau_s: float, tau_t: float,
                    dz: float = 0.0) -> tuple[float, float]:
    """Each sequence alone in float64: teacher on (teacher prompt + completion), student on
    (student prompt + completion), the per-token KL over the completion, seq_mean; and the bound on a
    float32 computation of it whose logits err by ``dz`` (Σ over the pair of max|δz|/τ): ρ S per row,
    seq_mean'd, and the mean over 4 sequences (tests/_tolerance.py)."""
    t64, s64 = teacher.double(), student.double()
    per_seq, bound = [], []
    for sp, tp, c in zip(ro.prompt_ids, ro.teacher_prompt_ids, ro.completion_ids):
        with torch.no_grad():
            zt = t64(input_ids=torch.tensor([tp + c])).logits[0, len(tp) - 1 : len(tp) + len(c) - 1]
            zs = s64(input_ids=torch.tensor([sp + c])).logits[0, len(sp) - 1 : len(sp) + len(c) - 1]
        lt, ls = torch.log_softmax(zt / tau_t, -1), torch.log_softmax(zs / tau_s, -1)
        kl = (lt.exp() * (lt - ls)).sum(-1) if kind == "forward" else (ls.exp() * (ls - lt)).sum(-1)
        per_seq.append(float(kl.mean()))
        _, S, _ = tol.divergence_scale(zs, zt, kind=kind, tau_s=tau_s, tau_t=tau_t)
        A = tol.logit_range((zs, tau_s), (zt, tau_t), rows=True)
        rho = tol.row(V, torch.float32, A, dz) + tol.gamma(len(c) + 6, torch.float32)
        bound.append(float((rho * S).mean()))
    teacher.float(), student.float()
    return sum(per_seq) / len(per_seq), sum(bound) / len(bound)


@pytest.mark.parametrize("impl", ["reference", "chunked"])
@pytest.mark.parametrize("kind", ["forward", "reverse"])
def test_conditioned_loss_matches_per_sequence_float64(impl, kind):
    teacher, student = _model(0, 48).eval(), _model(1, 32)
    ro = _conditioned_rollouts()
    trial = TrialConfig(loss=LossConfig(kind=kind, impl=impl, tau_t=0.5, tau_s=1.0))
    loss, diag = loss_step(trial, EngineStandIn(student), LocalTeacher(teacher), ro, PAD, torch.Generator().manual_seed(0))
    # the batch's float32 logits err by E (measured against the models in float64, tests/_tolerance.py), a
    # sequence alone in float32 by as much: 2E each against the float64 reference
    batch = pack_batch(ro, PAD)
    E = {m: tol.forward_err(lambda x, kw=kw: x(**kw).logits, m)
         for m, kw in ((student, batch.inputs), (teacher, batch.teacher_inputs))}
    ref, bound = _reference_loss(teacher, student, ro, kind, 1.0, 0.5, dz=2 * E[student] / 1.0 + 2 * E[teacher] / 0.5)
    assert abs(loss.item() - ref) <= bound
    # and it is not the unconditioned loss (the teacher's prompt matters)
    plain = Rollouts(ro.prompt_ids, ro.completion_ids, ro.logprobs, ro.finish_reasons)
    other, _ = loss_step(trial, EngineStandIn(student), LocalTeacher(teacher), plain, PAD, torch.Generator().manual_seed(0))
    assert abs(other.item() - ref) > 1e-3


def test_teacher_prompts_map_both_ways():
    tp = TeacherPrompts([[1, 2], [3, 4]], [[9, 1, 2], [9, 3, 4]])
    assert tp.sampling_prompts(TrialConfig(rollout={"policy": "offpd"}), [[3, 4]]) == [[9, 3, 4]]
    assert tp.sampling_prompts(TrialConfig(rollout={"policy": "onpd"}), [[3, 4]]) == [[3, 4]]
    off = tp.condition(TrialConfig(rollout={"policy": "offpd"}),
                       Rollouts([[9, 3, 4], [9, 1, 2]], [[5], [6]], [[0.0], [0.0]], ["stop", "stop"]))
    assert (off.prompt_ids, off.teacher_prompt_ids, off.completion_ids) == ([[3, 4], [1, 2]], [[9, 3, 4], [9, 1, 2]],
                                                                            [[5], [6]])
    on = tp.condition(TrialConfig(rollout={"policy": "onpd"}), Rollouts([[1, 2]], [[7]], [[0.0]], ["stop"]))
    assert (on.prompt_ids, on.teacher_prompt_ids) == ([[1, 2]], [[9, 1, 2]])
    with pytest.raises(ValueError, match="share a prompt"):
        TeacherPrompts([[1], [2]], [[9], [9]])


COND = {"teacher_system_prompt": "Countdown. Explain in German."}


def test_offpd_set_samples_from_the_teacher_prompts(tmp_path):
    from distillab.models import build_char_tokenizer

    tok = build_char_tokenizer()
    trial = TrialConfig(tasks=COND, optimizer={"steps": 2, "prompts_per_step": 3, "train_prompts": 50},
                        rollout={"offpd_reuse": True})
    seen = []

    def generate(prompts, sp):
        seen.append(prompts)
        return Rollouts(prompts, [[5]] * len(prompts), [[0.0]] * len(prompts), ["stop"] * len(prompts))

    offpd_rollout_set(trial, tmp_path, tok, 0, 1, tmp_path, generate=generate)
    teacher = train_prompts(trial, tok, 0, role="teacher")
    assert seen == [step_prompts(teacher, s, 3, 1) for s in range(2)]
    assert tok.decode(seen[0][0]).startswith("<|system|>Countdown. Explain in German.<|user|>")
    student = train_prompts(trial, tok, 0)
    assert len(student) == len(teacher) and all(s != t for s, t in zip(student, teacher))


def test_conditioning_config_and_cache_keys():
    with pytest.raises(ValidationError, match="teacher conditioning.*spectrum"):
        TrialConfig(tasks=COND, rollout={"policy": "spectrum", "lambda": 0.5})
    with pytest.raises(ValidationError, match=r"teacher_user_template must contain \{target\}"):
        TasksConfig(teacher_user_template="{nums} ->")
    assert not TasksConfig().teacher_conditioned
    assert not TasksConfig(teacher_system_prompt="Countdown.").teacher_conditioned  # same as the student's
    assert TasksConfig(**COND).teacher_conditioned
    # a job's cache key hashes the conditioning only when it renders teacher prompts (issue 13: no
    # compatibility branch keeps old keys when the fields are unset)
    plain = TasksConfig().model_dump(mode="json")
    for k in ("teacher_system_prompt", "teacher_user_template", "mcq", "math"):
        plain.pop(k)
    assert TasksConfig().inputs(teacher=False) == plain == TasksConfig(**COND).inputs(teacher=False)
    assert TasksConfig().inputs(teacher=True)["teacher_system_prompt"] is None
    assert TasksConfig(**COND).inputs(teacher=True)["teacher_system_prompt"] == COND["teacher_system_prompt"]
    assert TasksConfig().inputs(teacher=False, uses=["mcq"])["mcq"]["source"] == "synthetic"
    assert TasksConfig().inputs(teacher=False, uses=["math"])["math"]["source"] == "synthetic"


def test_style_metric_language_and_regex():
    de = StyleConfig(kind="language", language="de")
    assert in_style("Die Zahlen werden addiert und dann durch zwei geteilt, das ergibt die Antwort.", de)
    assert not in_style("The numbers are added and then divided by two, which gives the answer.", de)
    assert not in_style("2+3=5,5*4=20", de)  # no letters: in no language
    texts = ["Wir nehmen die größte Zahl und multiplizieren sie mit der kleinsten.",
             "We take the largest number and multiply it by the smallest one.",
             "Nous prenons le plus grand nombre et le multiplions par le plus petit.",
             "<answer>2+3=5</answer>"]
    assert style_share(texts, de) == tol.approx64(1 / 4, ROUNDINGS)
    spaced = StyleConfig(kind="regex", pattern=r"\d \+ \d")
    assert style_share(["2 + 3=5", "2+3=5", "7 + 1=8, 8*2=16"], spaced) == tol.approx64(2 / 3, ROUNDINGS)
    with pytest.raises(ValueError, match="at least one text"):
        style_share([], spaced)
    with pytest.raises(ValidationError, match="needs language"):
        StyleConfig(kind="language")
    with pytest.raises(ValidationError, match="not a valid regular expression"):
        StyleConfig(kind="regex", pattern="(")
    with pytest.raises(ValidationError, match="language"):
        StyleConfig(kind="language", language="German")


def test_styled_teacher_demonstrations(tmp_path):
    """models.*.styled_examples: Countdown-3 demonstrations under the teacher's prompt,
    written spaced, that the verifier accepts; keyed into the prepared model's hash."""
    from pathlib import Path

    from distillab.config import ConfigError, load_sweep
    from distillab.models import build_char_tokenizer
    from distillab.recipe.prepare import _examples, prepare_key
    from distillab.tasks.countdown import CountdownProblem, score_countdown

    repo = Path(__file__).resolve().parents[1]
    tok = build_char_tokenizer()
    style = load_sweep(repo / "search_spaces" / "micro_style.yaml")
    micro = load_sweep(repo / "search_spaces" / "micro.yaml")
    assert prepare_key(style, "teacher") != prepare_key(micro, "teacher")
    assert prepare_key(style, "student") == prepare_key(micro, "student")  # the student is the study's
    small = load_sweep(repo / "search_spaces" / "micro_style.yaml", {
        "models.micro_teacher.styled_examples": 30, "models.micro_teacher.countdown_examples": {"countdown3": 20}})
    ex = _examples(tok, small, "teacher", 0)
    plain = [e for e in ex if tok.decode(e.prompt_ids).startswith("<|system|>Countdown.<|user|>")]
    spaced = [e for e in ex if tok.decode(e.prompt_ids).startswith("<|system|>Countdown. Spaced.<|user|>")]
    assert len(plain) + len(spaced) == len(ex) and 0 < len(plain) <= 20 and 0 < len(spaced) <= 30
    for e in spaced:
        text = tok.decode(e.completion_ids)
        assert style_share([text], style.trial.evaluation.style) == 1.0, text
    assert style_share([tok.decode(e.completion_ids) for e in plain], style.trial.evaluation.style) == 0.0
    # the verifier accepts the spaced style
    assert score_countdown("<answer>25 + 25 = 50, 50 + 12 = 62</answer>", CountdownProblem((25, 25, 12), 62))
    with pytest.raises(ConfigError, match="styled_examples needs trial.tasks.teacher_system_prompt"):
        load_sweep(repo / "search_spaces" / "micro.yaml", {"models.micro_teacher.styled_examples": 10})
