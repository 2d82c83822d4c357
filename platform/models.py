"""Models and tokenizers: the locally built character-level tokenizer shared by
the micro teacher and student, micro Llama configs, and loading of any causal LM
directory (micro or a Llama/Qwen checkpoint) through ``from_pretrained``.

`trust_remote_code` is always off; weights are saved as safetensors.
"""

from __future__ import annotations

import logging
import os
import platform
import string
from contextlib import nullcontext
from pathlib import Path
from typing import ContextManager

import torch
import torch.nn.functional as F
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LlamaConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from distillab.checks import ENV_SWITCHES

log = logging.getLogger(__name__)

#: Special tokens (skipped when decoding with ``skip_special_tokens``).
SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>"]
#: Tag tokens: single ids, but kept when decoding (the verifier reads them).
TAG_TOKENS = ["<think>", "</think>", "<answer>", "</answer>"]
#: Chat template (jinja) of the micro tokenizer.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}"
    "{% if m['role'] == 'assistant' %}</s>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """Character-level tokenizer over printable ASCII plus the special and tag
    tokens; built locally, no download. Decoding joins characters verbatim."""
    chars = [c for c in string.printable if c not in "\r\x0b\x0c"]
    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS + TAG_TOKENS + chars)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    # "[\s\S]", not ".": Oniguruma's "." skips "\n", so "\n\n" became one piece and then <unk>
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        additional_special_tokens=SPECIAL_TOKENS[4:],
    )
    fast.add_tokens(TAG_TOKENS)
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"
    return fast


def micro_llama_config(
    vocab_size: int,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    intermediate_size: int,
    max_position_embeddings: int,
    tokenizer: PreTrainedTokenizerBase,
) -> LlamaConfig:
    """A tiny Llama-architecture config. head_dim = hidden/heads must be >= 32
    (vLLM's CPU attention backend refuses smaller heads).

    Raises:
        ValueError: hidden_size not divisible by num_heads, or head_dim < 32.
    """
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size {hidden_size} must be divisible by num_heads {num_heads}")
    if hidden_size // num_heads < 32:
        raise ValueError(f"head_dim = hidden_size/num_heads = {hidden_size // num_heads}; must be >= 32")
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """``AutoTokenizer.from_pretrained`` with remote code off, left padding."""
    tok = AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


#: The precision names of the config (``trial.precision``, ``trial.master_weights``,
#: ``evaluation.sparsity_dtype``) as torch dtypes.
DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16}


def cpu_has_native_bf16() -> bool:
    """Whether this machine's CPU multiplies bf16 matrices natively: oneDNN's bf16 kernels,
    which torch uses for CPU bf16 matrix products where the CPU has AVX-512 (BF16 or BW) or
    AMX (`torch.ops.mkldnn._is_mkldnn_bf16_supported`). Without them torch falls back to a
    generic kernel, 8.2-9.8x slower than float32 for the micro student's forward and
    backward on a 2-core AVX2 EPYC (``python benchmarks/bf16_matmul.py``, three runs, 2026-12-03)."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


#: The matrix products `Bf16MatmulsInFloat32` computes on float32 copies of bf16 operands.
BF16_MATMULS = frozenset({F.linear, torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.mm,
                          torch.Tensor.mm, torch.bmm, torch.Tensor.bmm, torch.addmm, torch.Tensor.addmm,
                          torch.baddbmm, torch.Tensor.baddbmm, F.scaled_dot_product_attention})


class Bf16MatmulsInFloat32(torch.overrides.TorchFunctionMode):
    """A torch function mode: every matrix product of `BF16_MATMULS` whose floating-point
    operands are all bf16 CPU tensors runs on float32 copies of them, and its result is
    rounded to bf16 (round to nearest even). Other calls run unchanged.

    This is the arithmetic of a bf16 GEMM as oneDNN and torch's generic CPU kernel do it
    (bf16 operands; their products are exact in float32, 8 + 8 significand bits; float32
    accumulation; the output rounded to bf16), so results equal the native kernel's up to
    the order of the float32 summation (``tests/test_bf16_matmuls.py``: equal elements or one
    bf16 ulp apart). Attention is softmax(QKᵀ/√d)V in float32 rounded once; torch's native
    bf16 attention also rounds the probabilities to bf16 before the product with V, so there
    the mode is the closer of the two to float64. Backward: autograd differentiates the
    float32 product and the casts, so the gradients are float32 products rounded to the
    operands' bf16, as natively.
    Why: on CPUs without native bf16 products (`cpu_has_native_bf16`) the float32 kernels
    are ~10x faster (micro student forward + backward: ``python benchmarks/bf16_matmul.py``).
    Calls with ``out=`` or mixed dtypes run natively (and raise where torch raises).
    Shapes and dtypes: as the wrapped function's; the result's dtype is bf16."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in BF16_MATMULS and "out" not in kwargs:
            floats = [t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor) and t.is_floating_point()]
            if floats and all(t.dtype == torch.bfloat16 and t.device.type == "cpu" for t in floats):
                up = [a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
                kw = {k: v.float() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                      for k, v in kwargs.items()}
                return func(*up, **kw).to(torch.bfloat16)
        return func(*args, **kwargs)


#: ``DISTILLAB_BF16_MATMULS``: where a bf16 trial's CPU matrix products run (`bf16_matmuls`).
BF16_MATMULS_ENV = "DISTILLAB_BF16_MATMULS"
BF16_MATMULS_CHOICES = ENV_SWITCHES[BF16_MATMULS_ENV]  # checked before anything starts (`checks.env_errors`)


def bf16_matmuls_choice() -> str:
    """``$DISTILLAB_BF16_MATMULS`` (default ``auto``): ``auto`` (float32 products where the CPU
    lacks native bf16 ones), ``native`` (torch's bf16 kernels always: the peer the mode is
    checked against), ``float32`` (`Bf16MatmulsInFloat32` on any CPU, e.g. to compare a
    native-bf16 machine's run with an AVX2 machine's).

    Raises:
        ValueError: another value (names the variable and the allowed values)."""
    choice = os.environ.get(BF16_MATMULS_ENV, "auto")
    if choice not in BF16_MATMULS_CHOICES:
        raise ValueError(f"{BF16_MATMULS_ENV}={choice!r}; allowed values: {', '.join(BF16_MATMULS_CHOICES)}")
    return choice


def bf16_in_float32(precision: str, device: torch.device | str = "cpu") -> str | None:
    """Why a trial of ``precision`` on ``device`` computes its bf16 products in float32
    (`Bf16MatmulsInFloat32`), or None where it does not: ``"auto"`` (bf16 on a CPU without
    native bf16 products, `cpu_has_native_bf16`) or ``"float32"`` (bf16 on any CPU, asked by
    ``DISTILLAB_BF16_MATMULS=float32``). None for float32, GPUs, CPUs with AVX-512/AMX under
    ``auto``, and ``native``.

    Raises:
        ValueError: a bad ``DISTILLAB_BF16_MATMULS`` (`bf16_matmuls_choice`)."""
    choice = bf16_matmuls_choice()
    if precision != "bf16" or torch.device(device).type != "cpu" or choice == "native":
        return None
    return choice if choice == "float32" or not cpu_has_native_bf16() else None


def cpu_model() -> str:
    """This machine's CPU model: the first ``model name`` of /proc/cpuinfo (Linux), else
    `platform.processor`, else "unknown"."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def arithmetic() -> dict[str, str]:
    """How this machine computes a bf16 trial's matrix products on the CPU, for a sweep's run
    record (`tables.record_run`; findings.md sets runs side by side by it, issue 33): ``{"cpu":
    `cpu_model`, "bf16_products": "native" | "float32 (DISTILLAB_BF16_MATMULS=float32)" |
    "float32 (no native bf16)"}`` (`bf16_in_float32` for a bf16 CPU trial).

    Raises:
        ValueError: a bad ``DISTILLAB_BF16_MATMULS`` (`bf16_matmuls_choice`)."""
    why = bf16_in_float32("bf16", "cpu")
    mode = {None: "native", "float32": f"float32 ({BF16_MATMULS_ENV}=float32)", "auto": "float32 (no native bf16)"}
    return {"cpu": cpu_model(), "bf16_products": mode[why]}


def bf16_matmuls(precision: str, device: torch.device | str = "cpu") -> ContextManager:
    """The context a trial's compute runs in: `Bf16MatmulsInFloat32` where `bf16_in_float32`
    gives a reason, a no-op context otherwise.

    Raises:
        ValueError: a bad ``DISTILLAB_BF16_MATMULS`` (`bf16_matmuls_choice`)."""
    return Bf16MatmulsInFloat32() if bf16_in_float32(precision, device) else nullcontext()


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
            if model is not None:  # None: a shared teacher that this worker does not hold (`distillab.teacher`)
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
