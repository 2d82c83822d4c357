"""Every benchmark's ``--plumbing`` run (issue 42, item 5): each script's whole path on tiny random
models or shapes for a few steps, so that a benchmark cannot rot between the days it is measured
(the numbers mean nothing and are not checked, only that every row is printed). The sweeps of the
documented full-size commands are validated too (the peer benchmark once failed at once: its
8-step rounds inherited micro.yaml's 10 warm-up steps). gpu_check (on CPU), sweep_overhead and
async_teacher run real sweeps or Ray trials: their own tests cover them (slow where they must)."""

from __future__ import annotations

import argparse
import re

import pytest
from _helpers import REPO, load_script

#: a number as the benchmarks print them (float, exponent or "x"-suffixed ratio; nan where a tiny
#: plumbing run's memory peak is below what the counters see)
NUM = r"(?:[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?x?|nan)"


@pytest.fixture()
def gloo():
    from _helpers import one_gloo_rank

    yield from one_gloo_rank()


def test_jsd_precision(capsys) -> None:
    load_script("benchmarks/jsd_precision.py").main(["--plumbing"])
    out = capsys.readouterr().out
    assert "V=257, 2 rows" in out
    rows = [line for line in out.splitlines() if re.fullmatch(rf"\s*\d+ +0\.\d +{NUM}( +{NUM}){{2}}", line)]
    assert len(rows) == 9, out  # 3 stds x 3 betas, reference and torch-rows errors


def test_bf16_matmul(capsys) -> None:
    load_script("benchmarks/bf16_matmul.py").main(["--plumbing"])
    out = capsys.readouterr().out
    assert "16 tokens" in out
    for row in ("linear", "model"):
        assert re.search(rf"^{row} +{NUM} +{NUM} +{NUM} +{NUM} +{NUM}$", out, re.M), out


def test_decode_compiled(capsys) -> None:
    load_script("benchmarks/decode_compiled.py").main(["--plumbing"])
    out = capsys.readouterr().out
    assert "2 prompts x 3 tokens" in out and re.search(rf"compiled/eager {NUM}", out), out
    assert re.search(rf"max \|logit difference\| compiled vs eager {NUM}", out), out


def test_rollout(capsys) -> None:
    load_script("benchmarks/rollout.py").main(["--plumbing"])
    out = capsys.readouterr().out
    assert "transformers tok/s | transformers start s | sync s | train step s | sync/step" in out
    assert re.search(rf"^tiny student( \| {NUM}){{5}}$", out, re.M), out


def test_step_floor(capsys, gloo) -> None:
    load_script("benchmarks/step_floor.py").main(["--plumbing"])
    out = capsys.readouterr().out
    for policy in ("onpd", "offpd"):
        assert re.search(rf"^{policy} +wall +{NUM} +{NUM} \({NUM} \+ {NUM}\) +{NUM}$", out, re.M), out


def test_peer_trl(capsys, gloo) -> None:
    pytest.importorskip("trl")
    assert load_script("benchmarks/peer_trl.py").main(["--plumbing"]) == 0
    out = capsys.readouterr().out
    for policy in ("onpd", "offpd"):
        for kind in ("distillab", "trl"):
            assert re.search(rf"^{policy} +{kind} +{NUM} +{NUM} +{NUM} +{NUM} +{NUM}$", out, re.M), out
        assert re.search(rf"^{policy} +distillab/TRL completion tokens/s: {NUM} .* step memory distillab/TRL: {NUM}$",
                         out, re.M), out


def test_documented_configurations_validate() -> None:
    """The sweeps the full-size peer_trl and step_floor commands configure (their defaults: micro.yaml,
    8-step rounds; the whole 40-step run) validate before anything is trained or timed, with TRL's
    warm-up (0)."""
    from distillab.config import load_sweep

    peer = load_script("benchmarks/peer_trl.py")
    args = argparse.Namespace(config=str(REPO / "search_spaces" / "micro.yaml"), cache=str(REPO / ".cache" / "models"),
                              batch=16, max_tokens=32, steps=8, set=[], compile=False)
    for policy in ("onpd", "offpd"):
        sweep = load_sweep(args.config, peer.overrides(args, policy, args.steps))
        assert sweep.trial.optimizer.warmup_steps == 0 and sweep.trial.optimizer.steps == 8
    assert load_sweep(args.config, peer.whole_sets(args, "runs")).trial.optimizer.steps == peer.WHOLE_STEPS


def test_kl_ops(capsys) -> None:
    """Every implementation the CPU runs (the Triton ones are CUDA-only rows), in this process."""
    load_script("benchmarks/kl_ops.py").main(["--plumbing"])
    out = capsys.readouterr().out
    assert "V=101 H=24 tokens=37" in out
    for impl in ("naive", "reference", "chunked", "floor", "sampled", "topk", "topk_chunked", "topk_tail_chunked",
                 "k3", "k3_chunked"):
        assert re.search(rf"^{impl} +{NUM} +{NUM} +{NUM} +{NUM} +{NUM} +{NUM} +{NUM}$", out, re.M), (impl, out)
