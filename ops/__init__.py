"""distillab.ops: the divergence kernels, one definition of the math three ways.

- ``distillab.ops.kl``: the float64-safe PyTorch reference on (B, T, V) logits (ground
  truth of the tests), the sampled estimators, reductions and diagnostics, and the
  closed-form per-row math ``token_divergence_and_grad`` that the fused ops share.
- ``distillab.ops.chunked``: the chunked fused-linear loss from hidden states and lm_head
  weights (never more than chunk × V logits); ``pad_vocab`` for padded vocabularies.
- ``distillab.ops.triton_kl``: Triton kernels (import it directly; optional dependency,
  ``TRITON_INTERPRET=1`` must be set before its import to run on CPU).
"""

from distillab.ops.chunked import ChunkedOutput, chunked_distill_loss, pad_vocab
from distillab.ops.kl import (
    LOGPROB_FLOOR,
    STAT_NAMES,
    distill_loss,
    engine_mismatch_weights,
    entropy_and_cross_entropy,
    reduce_loss,
    sampled_token_loss,
    token_divergence,
    token_divergence_and_grad,
)

__all__ = [
    "LOGPROB_FLOOR",
    "STAT_NAMES",
    "ChunkedOutput",
    "chunked_distill_loss",
    "distill_loss",
    "engine_mismatch_weights",
    "entropy_and_cross_entropy",
    "pad_vocab",
    "reduce_loss",
    "sampled_token_loss",
    "token_divergence",
    "token_divergence_and_grad",
]
