"""`distillab.recipe.payload.payload_bytes_per_token` (issue 35, item 4): hand-computed bytes and the errors."""

from __future__ import annotations

import pytest

from distillab.recipe.payload import payload_bytes_per_token


def test_bytes_per_token_by_hand() -> None:
    # Llama-3.1-8B in bf16: V = 128,256 rows, H = 4,096
    assert payload_bytes_per_token("logits", vocab_size=128256, hidden_size=4096, value_bytes=2) == 256512
    assert payload_bytes_per_token("hidden", vocab_size=128256, hidden_size=4096, value_bytes=2) == 8192
    # top-8: 8 bf16 log-probs (16 B) + 8 int32 ids (32 B) + the bf16 tail (2 B)
    assert payload_bytes_per_token("topk", vocab_size=128256, hidden_size=4096, top_k=8, value_bytes=2) == 50
    # the micro teacher in float32: V = 108, H = 128; top-1 = 4 + 4 + 4
    assert payload_bytes_per_token("logits", vocab_size=108, hidden_size=128) == 432
    assert payload_bytes_per_token("topk", vocab_size=108, hidden_size=128, top_k=1) == 12
    assert payload_bytes_per_token("topk", vocab_size=108, hidden_size=128, top_k=2, index_bytes=8) == 28


def test_bad_payloads_are_named() -> None:
    with pytest.raises(ValueError, match="teacher.payload must be one of logits, hidden, topk, got 'probs'"):
        payload_bytes_per_token("probs", vocab_size=10, hidden_size=4)
    with pytest.raises(ValueError, match=r"teacher.top_k must be in \[1, 10\].*got None"):
        payload_bytes_per_token("topk", vocab_size=10, hidden_size=4)
    with pytest.raises(ValueError, match=r"teacher.top_k must be in \[1, 10\].*got 11"):
        payload_bytes_per_token("topk", vocab_size=10, hidden_size=4, top_k=11)
    with pytest.raises(ValueError, match="hidden_size must be >= 1, got 0"):
        payload_bytes_per_token("hidden", vocab_size=10, hidden_size=0)
