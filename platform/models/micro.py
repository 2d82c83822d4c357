"""The micro models: the locally built character-level tokenizer shared by the micro teacher and
student (with its chat template), and the micro Llama configs `distillab prepare` builds from.
"""

from __future__ import annotations

import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    LlamaConfig,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

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
