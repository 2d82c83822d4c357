"""Loading any causal LM directory (micro or a Llama/Qwen checkpoint) through ``from_pretrained``,
how its training passes run, and the tokenizer and lm_head checks of a teacher/student pair.

`trust_remote_code` is always off; weights are saved as safetensors.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

log = logging.getLogger(__name__)

def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """``AutoTokenizer.from_pretrained`` with remote code off, left padding."""
    tok = AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(path: str | Path, dtype: torch.dtype = torch.float32,
               attn_implementation: str | None = None) -> PreTrainedModel:
    """``AutoModelForCausalLM.from_pretrained`` (remote code off) in ``dtype`` (weights
    stored in another dtype are cast, round to nearest even), with the attention
    implementation ``attn_implementation`` (``eager``, ``sdpa``, ``flash_attention_2``;
    None: the model's default) and the checkpoint's sampling defaults dropped
    (`neutral_generation_config`). transformers raises for an implementation this
    machine lacks (flash_attention_2 without the package or a GPU)."""
    extra = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, trust_remote_code=False, **extra)
    model.generation_config = neutral_generation_config(model.config)
    return model


def configure_passes(student: PreTrainedModel, teacher: PreTrainedModel | None, *, gradient_checkpointing: bool,
                     compile: bool) -> None:
    """How a trial's training passes run, set in place on the two models.

    - ``gradient_checkpointing``: activation checkpointing of the student (transformers'
      ``gradient_checkpointing_enable``, non-reentrant);
    - ``compile`` (``resources.compile``): ``torch.compile`` (inductor, dynamic shapes) of
      each model's transformer, ``base_model``, through ``nn.Module.compile``: parameter
      names, state dicts and checkpoints are unchanged. The loss's teacher forward and
      student forward and backward call these modules (`loss.forward`); sampling with
      `rollout.decode.StaticKVDecoder` reads the weights and stays eager (models it does not take,
      `rollout.decode.static_decode_supported`, sample with ``generate()``, which then calls the
      compiled transformer). A process compiles once, at its first training steps (dynamo
      reuses the graphs for the next trial's models in a reused process; one line on the
      console says so); the values equal the eager passes to float32 rounding
      (tests/test_compile.py), not bitwise.
    """
    if gradient_checkpointing:
        student.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if compile:
        log.info("[trial] training passes compiled (resources.compile): the first steps of a process compile them")
        for model in (student, teacher):
            if model is not None:  # None: a shared teacher that this worker does not hold (`distillab.recipe.teacher`)
                model.base_model.compile(dynamic=True)


def neutral_generation_config(config) -> GenerationConfig:
    """A ``GenerationConfig`` with only the special-token ids of the model ``config``.

    A checkpoint's ``generation_config.json`` holds sampling defaults that
    ``model.generate`` applies wherever the caller does not override them: Qwen2.5-Instruct
    ships ``repetition_penalty: 1.05``, ``top_k: 20``, ``top_p: 0.8``, ``temperature: 0.7``.
    The platform samples with exactly its configured temperature and top-p (and reports
    logprobs under softmax(z/τ)), so no other processor may run: every loaded model gets
    this neutral configuration instead."""
    return GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                            pad_token_id=config.pad_token_id)


def check_lm_heads(teacher_rows: int, student_rows: int, tokens: int, pad_vocab: bool, spectrum: bool = False) -> None:
    """The lm_heads of a teacher/student pair against their shared tokenizer.

    Both heads must cover the tokenizer (``rows >= tokens``); their sizes may differ only
    with ``loss.pad_vocab`` (Qwen2.5-7B has 152,064 rows and Qwen2.5-1.5B 151,936 for a
    tokenizer of 151,665: the extra rows are unused padding, and `distillab.ops.chunked.pad_vocab`
    pads the smaller head with −inf rows).

    Args:
        teacher_rows, student_rows: rows of each lm_head (``config.vocab_size``).
        tokens: the tokenizer's size (``len(tokenizer)``).
        pad_vocab: ``trial.loss.pad_vocab``.
        spectrum: ``rollout.policy`` is ``spectrum``: its pair sampler (`rollout`) scores both
            models over one vocabulary and does not pad, so the sizes must be equal.

    Raises:
        ValueError: a head smaller than the tokenizer, or different sizes without
            ``pad_vocab`` or with ``spectrum`` (both sizes and the field named).
    """
    for role, rows in (("teacher", teacher_rows), ("student", student_rows)):
        if rows < tokens:
            raise ValueError(f"the {role}'s lm_head has {rows} rows but the tokenizer has {tokens} tokens: "
                             "some token ids have no logit")
    if teacher_rows != student_rows and spectrum:
        raise ValueError(f"rollout.policy 'spectrum' needs lm_heads of one size (its pair sampler does not pad): "
                         f"the teacher's has {teacher_rows} rows, the student's {student_rows}")
    if teacher_rows != student_rows and not pad_vocab:
        raise ValueError(
            f"the teacher's lm_head has {teacher_rows} rows and the student's {student_rows} (tokenizer: {tokens} "
            "tokens): set trial.loss.pad_vocab: true to pad the smaller one with -inf rows, when the extra rows "
            "are unused padding (as in Qwen2.5-7B vs 1.5B: 152,064 vs 151,936)")


def check_same_vocab(teacher_tok: PreTrainedTokenizerBase, student_tok: PreTrainedTokenizerBase) -> None:
    """Teacher and student must share a tokenizer (PROTOCOL.md §1).

    Raises:
        ValueError: sizes differ (both named) or some token maps to different ids.
    """
    vt, vs = teacher_tok.get_vocab(), student_tok.get_vocab()
    if len(vt) != len(vs):
        raise ValueError(f"teacher tokenizer has {len(vt)} tokens, student has {len(vs)}: they must match")
    diff = [t for t, i in vt.items() if vs.get(t) != i]
    if diff:
        raise ValueError(f"teacher and student map {len(diff)} tokens to different ids, e.g. {diff[:5]}")
