"""distillab.ops: the divergence kernels, one definition of the math three ways.

- ``distillab.ops.kl``: the float64-safe PyTorch reference on (B, T, V) logits (ground
  truth of the tests), every estimator of the token-level divergence behind one switch
  (``estimator_loss``: full, sampled, top-k, the rollout-token k1/k2/k3), reductions and
  diagnostics, and the closed-form per-row math (``token_divergence_and_grad``,
  ``topk_divergence_and_grad``, ``rollout_token_estimate_and_grad``) that the fused ops share.
- ``distillab.ops.chunked``: the chunked fused-linear loss from hidden states and lm_head
  weights (never more than chunk × V logits; full, top-k and k1/k2/k3); ``pad_vocab`` for
  padded vocabularies.
- ``distillab.ops.oracle``: the full-vocabulary oracle of an estimator on a batch (its bias
  and gradient cosine against the exact divergence).
- ``distillab.ops.triton_kl``: Triton kernels (import it directly; optional dependency,
  ``TRITON_INTERPRET=1`` must be set before its import to run on CPU).
"""

from distillab.ops.chunked import ChunkedOutput, chunked_distill_loss, pad_vocab
from distillab.ops.kl import (
    ESTIMATORS,
    LOGPROB_FLOOR,
    STAT_NAMES,
    EstimatorLoss,
    distill_loss,
    engine_mismatch_weights,
    entropy_and_cross_entropy,
    estimator_loss,
    reduce_loss,
    rollout_token_loss,
    sampled_token_loss,
    token_divergence,
    token_divergence_and_grad,
    topk_divergence,
)

__all__ = [
    "ESTIMATORS",
    "LOGPROB_FLOOR",
    "STAT_NAMES",
    "ChunkedOutput",
    "EstimatorLoss",
    "chunked_distill_loss",
    "distill_loss",
    "engine_mismatch_weights",
    "entropy_and_cross_entropy",
    "estimator_loss",
    "pad_vocab",
    "reduce_loss",
    "rollout_token_loss",
    "sampled_token_loss",
    "token_divergence",
    "token_divergence_and_grad",
    "topk_divergence",
]
