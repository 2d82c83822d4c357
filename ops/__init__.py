"""distillab.ops: numerical building blocks (reference PyTorch implementations)."""

from distillab.ops.kl import (
    LOGPROB_FLOOR,
    distill_loss,
    engine_mismatch_weights,
    entropy_and_cross_entropy,
    reduce_loss,
    sampled_token_loss,
    token_divergence,
)

__all__ = [
    "LOGPROB_FLOOR",
    "distill_loss",
    "engine_mismatch_weights",
    "entropy_and_cross_entropy",
    "reduce_loss",
    "sampled_token_loss",
    "token_divergence",
]
