"""distillab.ops: the divergence kernels, one definition of the math three ways.

- ``distillab.ops.divergence``: the math of the forward KL, reverse KL and JSD(β) and the
  float64-safe PyTorch reference (``token_divergence``, ground truth of the tests and of every
  other path), with the closed-form per-row math the fused ops share (``token_divergence_and_grad``).
- ``distillab.ops.kl``: the loss on (B, T, V) logits (``distill_loss``) and every estimator of the
  token-level divergence behind one switch (``estimator_loss``: full, sampled, top-k, the
  rollout-token k1/k2/k3); it re-exports every op below, the import path the docs use.
- ``distillab.ops.reduction`` (``reduce_loss``, ``row_coefficients``), ``distillab.ops.sampled``,
  ``distillab.ops.topk``, ``distillab.ops.rollout_token`` (the estimators and their row math),
  ``distillab.ops.weights`` (``token_logprobs``, engine-mismatch weights),
  ``distillab.ops.diagnostics`` (the per-token statistics).
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
