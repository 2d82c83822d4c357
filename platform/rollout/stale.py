"""Asynchronous rollouts with bounded staleness (``rollout.max_staleness: k``; DESIGN.md
"Rollout engines", issue 35 item 1).

With k ≥ 1 the rollouts of step t + k are sampled while step t trains: a background
thread (a pool of one) runs the worker's `rollout.source.RolloutSource` in-process
(transformers engine; the λ-spectrum's pair sampler) over a COPY of the student, and
after each update the learner hands it a snapshot of its new weights. The schedule is
fixed, so a trial stays deterministic whatever the timing:

    before step 0      steps 0 … k are queued, all sampled by the initial weights (version 0)
    after update u     (u = 1, 2, …; the weights now hold u updates) step u + k is queued,
                       sampled by version u: the copy loads the snapshot first

Jobs run in order on the one thread, so the copy only changes between two generations.
Step t's rollouts come from version max(0, t − k) (a resumed trial: max(start, t − k)),
so their lag t − version is ``min(t, k)`` ≤ k; `Rollouts.staleness` carries it and
`distill.step_metrics` logs it as ``rollout/staleness``. Each step samples with the
synchronous trial's seed (`rollout.source.rollout_seed`), so only the weights differ,
and every token keeps its behaviour log-probability (``Rollouts.logprobs``), which
``rollout.staleness_correction: tis`` compares with the learner's (`loss.importance_weights`).

k = 0 keeps the synchronous trial (`stale_source` returns the source itself);
`StaleRollouts` with k = 0 (``force``) is the same trial bitwise, through the copy and
the thread (tests/rollout/test_staleness.py).

Threads: the sampler seeds the process-global RNG per chunk (`rollout.engine.sample_chunks`);
the learner's step draws only from its own generator, so the two do not interleave.
Torch function modes are per thread, so the producer enters `models.bf16_matmuls` itself.
Limits: ZeRO 3 (the student is partitioned) and the vLLM actor are refused when the config is
loaded (`config.rules`); a resumed trial restarts the queue at its step (its first k batches are
fresher than the uninterrupted trial's).
"""

from __future__ import annotations

import copy
import dataclasses
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Sequence

import torch

from distillab.config import TrialConfig
from distillab.models import bf16_matmuls
from distillab.rollout.source import RolloutSource, step_prompts
from distillab.rollout.types import Rollouts, load_named_tensors, model_device

__all__ = ["StaleRollouts", "stale_source"]


class StaleRollouts:
    """A `RolloutSource` run ahead of the learner by at most ``k`` updates (module docstring).
    Same interface as the source: `get`, `sync` (called after every update), ``syncs``,
    ``fresh``, `close`.

    Args:
        trial: the trial (``rollout``, ``optimizer.steps``, ``rollouts_per_prompt``, ``precision``).
        source: the worker's in-process source (no engine actor).
        module: the student (whole; its weights are the initial version ``start_step``).
        prompts: the rank's training prompts; ``per_worker``: prompts × rollouts per step on this rank.
        start_step: the first step (0-based; a resumed trial's step).
        k: the bound (≥ 0).

    Raises:
        ValueError: ``k`` < 0, or a source that holds an engine actor (vLLM).
    """

    def __init__(self, trial: TrialConfig, source: RolloutSource, module, prompts: Sequence[list[int]],
                 per_worker: int, start_step: int, k: int):
        if k < 0:
            raise ValueError(f"rollout.max_staleness must be >= 0, got {k}")
        if source.actor is not None:
            raise ValueError("rollout.max_staleness > 0 samples in a background thread with the transformers "
                             "engine; the vLLM actor path is not built: set rollout.engine 'transformers'")
        self.trial, self.source, self.prompts, self.per_worker, self.k = trial, source, prompts, per_worker, k
        self.copy = copy.deepcopy(module).requires_grad_(False)  # the behaviour policy's weights
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="distillab-stale-rollouts")
        self.pending: dict[int, Future] = {}
        for step in range(start_step, min(start_step + k + 1, trial.optimizer.steps)):
            self._submit(step, start_step, None)

    def _submit(self, step: int, version: int, snapshot: dict[str, torch.Tensor] | None) -> None:
        self.pending[step] = self.pool.submit(self._produce, step, version, snapshot)

    def _produce(self, step: int, version: int, snapshot: dict[str, torch.Tensor] | None) -> Rollouts:
        """On the producer thread: load ``snapshot`` (if any) into the copy, then sample step
        ``step`` with the source (its seed, its conditioning) from the copy."""
        o = self.trial.optimizer
        if snapshot is not None:
            load_named_tensors(self.copy, snapshot.items())
        prompts = step_prompts(self.prompts, step, self.per_worker, o.rollouts_per_prompt)
        with bf16_matmuls(self.trial.precision, model_device(self.copy).type):
            rollouts = self.source.get(step, prompts, self.copy)
        return dataclasses.replace(rollouts, staleness=step - version)

    def get(self, step: int, prompts: list[list[int]], module) -> Rollouts:
        """Step ``step``'s rollouts (0-based), waiting for the producer if it is behind.
        ``prompts`` and ``module`` are the loop's (the producer computed the same prompts
        with `rollout.source.step_prompts`; the weights are the queued version's).

        Raises:
            KeyError: a step that was never queued (out of order).
            Exception: whatever the producer raised."""
        return self.pending.pop(step).result()

    def sync(self, module, step: int = 0, force: bool = False) -> float:
        """After update ``step`` (1-based; the weights now hold ``step`` updates): queue step
        ``step + k`` with a snapshot of ``module``'s parameters. Returns the seconds spent
        on the learner's thread (the snapshot)."""
        t0 = time.perf_counter()
        nxt = step + self.k
        if step and nxt < self.trial.optimizer.steps and nxt not in self.pending:
            snapshot = {n: p.detach().clone() for n, p in module.named_parameters()}
            self._submit(nxt, step, snapshot)
        return time.perf_counter() - t0

    @property
    def syncs(self) -> bool:
        """True: `sync` moves the learner's weights to the producer after every update."""
        return True

    @property
    def fresh(self) -> bool:
        """True: rollouts are sampled during the trial."""
        return True

    def close(self) -> None:
        """Stop the producer (queued jobs are cancelled; a running one is waited for) and close the source."""
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.pending.clear()
        self.source.close()


def stale_source(trial: TrialConfig, source: RolloutSource, module, prompts: Sequence[list[int]], per_worker: int,
                 start_step: int, force: bool = False) -> RolloutSource | StaleRollouts:
    """The worker's rollout source for ``rollout.max_staleness``: ``source`` itself for k = 0
    (the synchronous trial) unless ``force``, else a `StaleRollouts` over it.

    ZeRO 3 (the student partitioned; the copy needs it whole) is refused when the config is
    loaded (`config.rules`), before anything starts.

    Raises:
        ValueError: k ≥ 1 with an engine actor (`StaleRollouts`)."""
    k = trial.rollout.max_staleness
    if k == 0 and not force:
        return source
    return StaleRollouts(trial, source, module, prompts, per_worker, start_step, k)
