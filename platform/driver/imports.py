"""Importing transformers and DeepSpeed without the integrations distillab never uses.

When they are installed, transformers imports scikit-learn (``sklearn.metrics.roc_curve``, for
assisted generation's confidence threshold) and SciPy (``scipy.optimize``, for the object-detection
losses' Hungarian matching) as it loads its model classes, and DeepSpeed imports MLflow (for its
autotuner) as it loads its runtime config. distillab uses none of these paths, yet each process
that builds a model paid for them: 1.2-1.4 s of a trial actor's 6.5 s of imports (``python -X
importtime -c "import distillab.driver.sweep, distillab.recipe.distill"``, 2026-12-04, this 2-core machine: MLflow
0.45 s, scikit-learn with SciPy 0.85 s), on the critical path of every trial's start.

`without_unused_integrations` hides them while the recipe's modules are imported: an entry of
``None`` in ``sys.modules`` makes ``import mlflow`` raise ``ImportError`` and
``importlib.util.find_spec`` answer None, which both libraries read as "not installed" and remember.
The entries are removed afterwards, so that whoever needs these packages later in the same process
(the MLflow tracker, lm-eval's metrics) imports them as usual.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator

#: top-level packages that transformers and DeepSpeed import when installed, for paths distillab never takes
UNUSED_INTEGRATIONS = ("sklearn", "scipy", "mlflow")


@contextlib.contextmanager
def without_unused_integrations(names: tuple[str, ...] = UNUSED_INTEGRATIONS,
                                forget: tuple[str, ...] = ()) -> Iterator[None]:
    """Within the block, the packages ``names`` read as not installed (module docstring);
    a package already imported is left as it is. Use it around the first import of
    transformers' model classes and of DeepSpeed in a process: both remember what they
    found (later imports of them find the answer cached). ``forget``: modules that remember
    what they found too and are dropped from ``sys.modules`` after the block when it first
    imported them, so that a later import in the process runs them again and finds the
    packages (`sweep.TUNE_TRACKER_MODULES`)."""
    hidden = [n for n in names if n not in sys.modules]
    loaded_before = {m for m in forget if m in sys.modules}
    for n in hidden:
        sys.modules[n] = None  # type: ignore[assignment]  # the import system's "not importable" marker
    try:
        yield
    finally:
        for n in hidden:
            if n in sys.modules and sys.modules[n] is None:
                del sys.modules[n]
        for m in forget:
            if m not in loaded_before:
                sys.modules.pop(m, None)
