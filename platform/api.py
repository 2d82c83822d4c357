"""The Python API of distillab: run a sweep, read its results and decide PROTOCOL.md §9's verdicts
from a notebook or a script, through the same functions the ``distillab`` command calls.

    >>> from distillab.api import findings, load_results, run_sweep
    >>> run = run_sweep("search_spaces/micro_own_data.yaml", {"search.grid.optimizer.lr": [1e-3, 3e-3]})
    >>> res = load_results(run.path)                      # trials, metrics, evals, samples (Polars LazyFrames)
    >>> findings("docs/data/micro_findings").table        # verdict, confidence and reason per finding

    run_sweep(config_or_path, overrides=None, *, dry_run=False, ...)   ``distillab sweep`` → `driver.api.SweepRun`
    load_results(path)                                                 what ``distillab report`` reads → `Results`
    findings(path, *, by=None, only=None, task="countdown3")           ``distillab findings`` → `driver.api.Findings`

It is ``distillab.api``, not ``distillab`` itself: ``distillab`` is a namespace package (``platform/``
has no ``__init__.py``, so that it never shadows the standard library's ``platform``), which holds
no functions of its own. The functions live in the driver layer (`distillab.driver.api`), where the
CLI calls them; this module, the one flat module of ``platform/`` above every layer, re-exports them.
Importing it is cheap (0.2 s): torch, Ray and the analysis load when a function first needs them.
"""

from __future__ import annotations

from distillab.driver.api import findings, load_results, run_sweep

__all__ = ["findings", "load_results", "run_sweep"]
