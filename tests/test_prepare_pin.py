"""A short ``distillab prepare`` pinned to the values the code at 4651d62 gives (issue 44, item 0):
a code change that moves the prepared models (the tasks' data generation, the tokenisation, the
test-split exclusion, the model's architecture or initialisation, the SFT loss, batching, optimizer
or schedule, the evaluation's items, sampling settings or scoring) fails here instead of passing
unnoticed into a study, as the F1 flip between the findings runs at 7af142d and 264e19d could have
(docs/findings.md: those two commits prepare bitwise-identical models on one CPU).

The short prepare is tests/fixtures/record_prepare_pin.py's `short_prepare`: search_spaces/micro_findings.yaml's
architectures and data mix, 8 SFT steps, a small evaluation, trained in a fresh directory on one
thread (about 5 s on 2 cores). What is pinned, and how close:

- exactly (integers and strings, the same on every CPU): each model's prepare key, its number of
  SFT examples and the sha256 of their token ids in training order, and the sha256 of its
  evaluation's sampling requests (prompt token ids, temperature, top-p, max tokens, samples,
  seeds);
- each model's per-step SFT loss (float32), to the rounding bound of two float32 computations of it
  (`sft_loss_rounding`): float32 training differs between CPUs in its last bits (vector width,
  summation order, ``normal_``'s vectorised Box-Muller against the scalar one under
  ``ATEN_CPU_CAPABILITY=default``, MKL's kernels), so the weights and the losses are not bitwise
  CPU-independent;
- the evaluation rows (every accuracy and pass@k with its n) exactly: at 8 steps every score is 0,
  and the rows and the sampled completions themselves were identical under native AVX-512 (AMX
  CPU), ``ATEN_CPU_CAPABILITY=avx2`` (with and without ``MKL_ENABLE_INSTRUCTIONS=AVX2
  ONEDNN_MAX_CPU_ISA=AVX2``), ``=default`` (with ``MKL_CBWR=COMPATIBLE``) and ``MKL_CBWR=COMPATIBLE``
  alone, while the losses differed by at most 4.1e-6 (1.2e-6 relative) between those settings.

A failure means the prepared models moved. If the change is meant to move them, regenerate the pin
with the code that moves them and say so in the commit:

    . scripts/env.sh && .venv/bin/python tests/fixtures/record_prepare_pin.py tests/fixtures/prepare_pin.json
"""

from __future__ import annotations

import json
from pathlib import Path

import _tolerance as tol
import pytest
import torch
from fixtures.record_prepare_pin import SETS, SPACE, short_prepare

from distillab.config import load_sweep
from distillab.models import build_char_tokenizer

PIN = Path(__file__).resolve().parent / "fixtures" / "prepare_pin.json"
#: roundings of one weight's initialisation (Box-Muller: a log and a cosine at two each, a square root,
#: 2π times the uniform, the products with the radius and the standard deviation) and of one AdamW update
#: (the two moments, their bias corrections, the square root, + eps, the quotient, × lr, the subtraction)
INIT_ROUNDINGS, ADAM_ROUNDINGS = 12, 12


def forward_roundings(cfg, vocab: int, longest: int, tokens: int) -> int:
    """Roundings on the longest path from a weight to the SFT loss of one batch of the micro Llama
    ``cfg``: per layer the RMSNorm's and the q/k/v projections' sums of H terms, the scores' of
    head_dim, the softmax's and the attention-weighted sum's of T (``longest``, the padded length),
    the o-projection's, the second RMSNorm's and the gate/up projections' of H, the down projection's
    of I, and 12 elementwise roundings (rsqrt and SiLU at two each, RoPE, scaling, the residual
    additions); then the final RMSNorm's and the lm_head's H, the log-softmax row over V with its 16
    elementwise roundings (tests/_tolerance.py, ``row``), and the mean over the batch's completion
    ``tokens``."""
    H, I, L = cfg.hidden_size, cfg.intermediate_size, cfg.num_layers
    head_dim = H // cfg.num_heads
    return L * (4 * H + head_dim + 2 * longest + I + 12) + 2 * H + vocab + 16 + tokens


def sft_loss_rounding(step: int, cfg, vocab: int, longest: int, tokens: int) -> float:
    """Relative gap allowed between two float32 computations of the SFT loss at 0-based ``step``: each
    within γ_n (tests/_tolerance.py, ``gamma``) of exact, with n the initialisation's roundings, each
    earlier update's (its backward pass, as long as the forward path, and AdamW's) and this forward
    pass's (`forward_roundings`). The loss, a mean of positive per-token cross-entropies, is the sum of
    magnitudes the bound is relative to."""
    path = forward_roundings(cfg, vocab, longest, tokens)
    return 2 * tol.gamma(INIT_ROUNDINGS + step * (path + ADAM_ROUNDINGS) + path, torch.float32)


@pytest.fixture(scope="module")
def pinned_and_run(tmp_path_factory):
    threads = torch.get_num_threads()
    try:
        got = short_prepare(tmp_path_factory.mktemp("prepare_pin"))
    finally:
        torch.set_num_threads(threads)  # prepare sets one thread
    return json.loads(PIN.read_text()), got


@pytest.mark.parametrize("role", ["teacher", "student"])
def test_short_prepare_trains_on_and_evaluates_the_pinned_items(pinned_and_run, role) -> None:
    """Prepare key, SFT examples and evaluation requests: exactly the pinned ones."""
    want, got = (p[role] for p in pinned_and_run)
    for part in ("key", "examples", "data", "lengths", "requests"):
        assert got[part] == want[part], (role, part)


@pytest.mark.parametrize("role", ["teacher", "student"])
def test_short_prepare_losses_within_float32_rounding_of_the_pin(pinned_and_run, role) -> None:
    """Every SFT step's loss within `sft_loss_rounding` of the pinned one (about 1e-4 relative at the
    last step; any change to what or how the model trains moves them by far more)."""
    want, got = (p[role] for p in pinned_and_run)
    sweep = load_sweep(SPACE, SETS)
    mcfg = sweep.models.micro(role)
    longest, completion = want["lengths"]
    vocab = len(build_char_tokenizer())
    assert len(got["losses"]) == len(want["losses"]) == mcfg.sft_steps
    for step, (g, w) in enumerate(zip(got["losses"], want["losses"])):
        rel = sft_loss_rounding(step, mcfg, vocab, longest, mcfg.sft_batch_size * completion)
        assert rel < 2e-4  # the bound stays far below what a change of data, model or optimizer does
        assert g == pytest.approx(w, rel=rel), (role, step)
    assert got["losses"][-1] < got["losses"][0] - 1.0  # it trains: the pin is not of a flat curve


@pytest.mark.parametrize("role", ["teacher", "student"])
def test_short_prepare_scores_equal_the_pin(pinned_and_run, role) -> None:
    """The evaluation rows ``prepare.json`` records (task, metric, value, n): the pinned ones."""
    want, got = (p[role] for p in pinned_and_run)
    assert {r[0] for r in want["evals"]} >= {"countdown3", "countdown4e", "ood/add", "ood/sort", "ood"}
    assert got["evals"] == want["evals"]
