"""Batched sampling of an evaluation's requests (`sample_batched`): the suite's tasks
(`evals.suite.Evaluator`: accuracy and pass@k of every Countdown and multiple-choice
task; `evals.ood.MicroSkillsBackend`: the prior-skill tasks) ask for completions
of their prompts at a few sampling settings; the requests that share a setting
are sampled in one ``generate`` call instead of one call each. A call's cost on a
micro model is mostly per decoded position (the decode loop, not the batch), so
merging the calls of equal settings cuts the evaluation's time.

Seeds: the merged call is seeded with its first request's seed. A request that is
alone at its setting is sampled exactly as ``engine.generate(prompts, sampling)``
samples it; the samples of merged requests depend on the other requests of the
call (their rows share the sampler's random stream).
"""

from __future__ import annotations

from typing import Sequence

from tqdm.auto import tqdm

from distillab.rollout.types import RolloutEngine, SamplingParams

__all__ = ["Request", "sample_batched"]

#: One request: prompts (token ids) and how to sample them (``n`` completions per prompt).
Request = tuple[Sequence[Sequence[int]], SamplingParams]


def sample_batched(engine: RolloutEngine, requests: Sequence[Request], desc: str = "evaluation"
                   ) -> list[list[list[int]]]:
    """The completion ids of each request ``(prompts, sampling)``: ``len(prompts) ×
    sampling.n`` lists of ids, prompt-major (prompt i's samples are rows i·n … i·n+n−1),
    as ``engine.generate(prompts, sampling).completion_ids`` orders them.

    Requests with equal ``(temperature, top_p, max_tokens)`` are sampled in one
    ``engine.generate`` call, in request order, over their prompts each repeated
    ``n`` times (one sample each), seeded with the first request's seed (module
    docstring). A progress bar over the calls (``desc``) shows on a terminal only
    (tqdm's ``disable=None``; Ray workers' output is not one).

    Raises:
        ValueError: a request without prompts.
    """
    groups: dict[tuple[float, float, int], list[int]] = {}
    for i, (prompts, sp) in enumerate(requests):
        if not prompts:
            raise ValueError(f"request {i} has no prompts")
        groups.setdefault((sp.temperature, sp.top_p, sp.max_tokens), []).append(i)
    out: list[list[list[int]]] = [[] for _ in requests]
    for (temperature, top_p, max_tokens), members in tqdm(groups.items(), desc=desc, unit="call", disable=None,
                                                         leave=False):
        expanded = [list(p) for i in members for p in requests[i][0] for _ in range(requests[i][1].n)]
        seed = requests[members[0]][1].seed
        done = engine.generate(expanded, SamplingParams(temperature, top_p, max_tokens, 1, seed)).completion_ids
        at = 0
        for i in members:
            k = len(requests[i][0]) * requests[i][1].n
            out[i], at = done[at:at + k], at + k
    return out
