"""What a teacher answer costs on the wire, per scored token (issue 35, items 2 and 4): the
one formula that the teacher service's ``teacher/*`` byte metrics, ``--dry-run`` and
benchmarks/async_teacher.py share. No torch: plain arithmetic on sizes.

Payloads (``teacher.payload``; ``logits`` is the in-worker reference, never sent):

    logits   the full next-token logits                 V values
    hidden   the teacher's final hidden state           H values (the trial applies its own
                                                        copy of the teacher's lm_head: exact KL)
    topk     the k largest log-probs, their token ids,  k values + k ids + 1 value
             and the tail's log-mass (1 − Σ top-k)      (TRL's server distillation, NeMo-RL's MOPD)

V: the teacher's lm_head rows; H: its hidden size; values in ``value_bytes`` (2 for bf16,
4 for float32), token ids in ``index_bytes`` (4: int32 holds any vocabulary below 2**31).
"""

from __future__ import annotations

__all__ = ["PAYLOADS", "payload_bytes_per_token"]

#: the payloads `payload_bytes_per_token` knows
PAYLOADS = ("logits", "hidden", "topk")


def payload_bytes_per_token(payload: str, *, vocab_size: int, hidden_size: int, top_k: int | None = None,
                            value_bytes: int = 4, index_bytes: int = 4) -> int:
    """Bytes of one token's teacher answer (module docstring's table).

    Args:
        payload: ``logits``, ``hidden`` or ``topk``.
        vocab_size: V, the teacher's lm_head rows (≥ 1).
        hidden_size: H, the teacher's final hidden size (≥ 1).
        top_k: k of ``topk`` (1 ≤ k ≤ V); ignored by the other payloads.
        value_bytes: bytes per value (bf16 2, float32 4).
        index_bytes: bytes per token id of ``topk``.

    Returns:
        ``logits``: V·b; ``hidden``: H·b; ``topk``: k·b + k·i + b (b = ``value_bytes``, i = ``index_bytes``).

    Raises:
        ValueError: an unknown ``payload`` (the allowed ones named), a size below 1, or
            ``topk`` without a ``top_k`` in [1, V].
    """
    if payload not in PAYLOADS:
        raise ValueError(f"teacher.payload must be one of {', '.join(PAYLOADS)}, got {payload!r}")
    for name, v in (("vocab_size", vocab_size), ("hidden_size", hidden_size), ("value_bytes", value_bytes),
                    ("index_bytes", index_bytes)):
        if v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    if payload == "logits":
        return vocab_size * value_bytes
    if payload == "hidden":
        return hidden_size * value_bytes
    if top_k is None or not 1 <= top_k <= vocab_size:
        raise ValueError(f"teacher.top_k must be in [1, {vocab_size}] (the vocabulary) for payload 'topk', got {top_k}")
    return top_k * (value_bytes + index_bytes) + value_bytes
