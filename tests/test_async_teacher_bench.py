"""benchmarks/async_teacher.py's computed parts (issue 35, item 4): the paper teachers' parameter
counts against the architecture's sum written out by hand, and (slow) the memory and payload
tables on the smoke models."""

from __future__ import annotations

import pytest
from _helpers import load_script


def _by_hand(V: int, H: int, I: int, L: int, heads: int, kv: int, qkv_bias: bool) -> int:
    """Untied embedding + lm_head, per layer q/k/v/o (+ biases), gate/up/down, two RMSNorms, a final norm."""
    kv_dim = H // heads * kv
    attn = H * H + 2 * H * kv_dim + H * H + ((H + 2 * kv_dim) if qkv_bias else 0)
    return 2 * V * H + L * (attn + 3 * H * I + 2 * H) + H


def test_paper_teacher_counts() -> None:
    mod = load_script("benchmarks/async_teacher.py")
    llama, qwen = (mod.PAPER_TEACHERS[f][1] for f in ("paper_llama.yaml", "paper_qwen.yaml"))
    assert mod.count_params(llama) == _by_hand(128256, 4096, 14336, 32, 32, 8, False) == 8_030_261_248
    assert mod.count_params(qwen) == _by_hand(152064, 3584, 18944, 28, 28, 4, True) == 7_615_616_512


@pytest.mark.slow
def test_memory_and_payload_tables(capsys) -> None:
    mod = load_script("benchmarks/async_teacher.py")
    assert mod.main(["--config", "search_spaces/smoke.yaml", "--parts", "memory,payload", "--top-k", "1,8"]) == 0
    out = capsys.readouterr().out
    # 8,030,261,248 bf16 parameters = 14.96 GiB; 8 trials on a node: 8 copies against one
    assert ("| Llama-3.1-8B (paper_llama.yaml) | 8,030,261,248 (525,336,576) | bf16 | 15 GiB | 8 | 120 GiB | "
            "15 GiB (8x less) |") in out
    # per token: logits 128,256 x 2 B; hidden 4,096 x 2 B; top-1 2 + 4 + 2 B; top-8 8 x 6 + 2 B
    assert "| Llama-3.1-8B | 128,256 | 4,096 | 2 | 256,512 | 8,192 (31.3x) | 8 (3.21e+04x) | 50 (5.13e+03x) |" in out
