"""The character tokenizer, micro Llama configs, vocabulary check and safetensors
round trip (platform/models/)."""

from __future__ import annotations

import string
from pathlib import Path

import pytest
import torch
from transformers import LlamaForCausalLM

from distillab.models import (
    SPECIAL_TOKENS,
    TAG_TOKENS,
    build_char_tokenizer,
    check_same_vocab,
    load_model,
    load_tokenizer,
    micro_llama_config,
)

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def _ids(tok, s: str) -> list[int]:
    return tok(s, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize(
    "text",
    [
        "2+3=5,5*4=20",
        "  leading and trailing  ",
        "x , y . z ! ? 's n't",  # no clean-up of spaces before punctuation
        "a\tb\nc",
        "a\n\nb\n\n\n",  # runs of newlines
        "".join(c for c in string.printable if c not in "\r\x0b\x0c"),
        "{nums} -> {target} ~`|\\\"'",
    ],
)
def test_char_tokenizer_round_trip(tok, text: str) -> None:
    ids = _ids(tok, text)
    assert len(ids) == len(text)  # one id per character
    assert tok.unk_token_id not in ids
    assert tok.decode(ids) == text
    assert tok.decode(ids, skip_special_tokens=True) == text


def test_vocab_size(tok) -> None:
    # 7 special + 4 tag tokens + 100 printable characters minus \r \x0b \x0c
    assert len(tok) == 7 + 4 + 97 == 108
    assert len(tok.get_vocab()) == 108
    assert tok.pad_token_id == 0 and tok.bos_token_id == 1 and tok.eos_token_id == 2 and tok.unk_token_id == 3
    assert tok.padding_side == "left"


def test_tag_tokens_are_single_ids_and_survive_skip(tok) -> None:
    for t in TAG_TOKENS + SPECIAL_TOKENS:
        assert len(_ids(tok, t)) == 1, t
    text = "<think>hm</think><answer>2+3=5</answer>"
    ids = _ids(tok, text)
    assert len(ids) == 4 + len("hm") + len("2+3=5")
    assert tok.decode(ids, skip_special_tokens=True) == text


def test_special_tokens_dropped_by_skip(tok) -> None:
    text = "<|system|>S<|user|>U<|assistant|><answer>7</answer></s><pad><pad>"
    ids = _ids(tok, text)
    assert tok.decode(ids) == text
    assert tok.decode(ids, skip_special_tokens=True) == "SU<answer>7</answer>"


def test_save_and_load_tokenizer(tok, tmp_path: Path) -> None:
    tok.save_pretrained(tmp_path)
    micro_llama_config(len(tok), 64, 1, 2, 64, 64, tok).save_pretrained(tmp_path)
    loaded = load_tokenizer(tmp_path)
    text = "<|user|>10 7 3 -> 21<|assistant|><think>a\n\nb</think><answer>10+7=17,17*3=51</answer></s>"
    assert _ids(loaded, text) == _ids(tok, text)
    assert loaded.get_vocab() == tok.get_vocab()
    assert loaded.padding_side == "left"
    assert loaded.pad_token_id == tok.pad_token_id and loaded.eos_token_id == tok.eos_token_id
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    assert loaded.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == (
        "<|system|>S<|user|>U<|assistant|>"
    )
    check_same_vocab(tok, loaded)


def test_micro_llama_config(tok) -> None:
    cfg = micro_llama_config(len(tok), 96, 2, 3, 128, 64, tok)  # head_dim 32 is the minimum
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads) == (96, 2, 3)
    assert cfg.num_key_value_heads == 3 and cfg.intermediate_size == 128
    assert cfg.vocab_size == 108 and cfg.max_position_embeddings == 64
    assert (cfg.pad_token_id, cfg.bos_token_id, cfg.eos_token_id) == (0, 1, 2)
    assert cfg.tie_word_embeddings is False
    with pytest.raises(ValueError, match="head_dim"):
        micro_llama_config(len(tok), 64, 1, 4, 64, 64, tok)  # head_dim 16
    with pytest.raises(ValueError, match="divisible"):
        micro_llama_config(len(tok), 100, 1, 3, 64, 64, tok)


def test_check_same_vocab(tok) -> None:
    check_same_vocab(tok, build_char_tokenizer())
    bigger = build_char_tokenizer()
    bigger.add_tokens(["<extra>"])
    with pytest.raises(ValueError) as e:
        check_same_vocab(tok, bigger)
    assert "108" in str(e.value) and "109" in str(e.value)
    with pytest.raises(ValueError) as e:
        check_same_vocab(bigger, tok)
    assert "109" in str(e.value) and "108" in str(e.value)


def test_model_safetensors_round_trip(tok, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = LlamaForCausalLM(micro_llama_config(len(tok), 64, 1, 2, 64, 64, tok)).eval()
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    assert not list(tmp_path.glob("*.bin"))
    loaded = load_model(tmp_path)
    assert loaded.dtype == torch.float32
    assert not loaded.training
    ids = torch.tensor([_ids(tok, "10 7 3 -> 21")])
    with torch.no_grad():
        a = model(input_ids=ids).logits
        b = loaded(input_ids=ids).logits
    assert a.shape == (1, len("10 7 3 -> 21"), 108)
    assert torch.equal(a, b)
