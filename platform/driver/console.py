"""The sweep's console: Tune's progress table printed when something changed (`CalmReporter`),
the driver's Optuna and Tune loggers quieted (`driver_console`), and in a Tune trial actor the
console of a trial (`trial_actor_console`) without Ray's unraisable SIGTERM exits
(`drop_unraisable_sigterm_exits`). ``verbose`` 2 (``distillab sweep --verbose``) keeps all of
Ray's, Tune's and Optuna's own lines (`sweep.train_settings`)."""

from __future__ import annotations

import logging
import sys
import time

import optuna
from ray import tune


def drop_unraisable_sigterm_exits() -> None:
    """In this process (a Tune trial actor), drop every ``SystemExit`` that Python reports as
    unraisable ("Exception ignored in: <function WeakSet.__init__.<locals>._remove ...> ...
    SystemExit: 1") and hand every other unraisable exception to the hook that was there
    before. Installed once per process (Tune reuses its trial actors).

    Ray's SIGTERM handler in a worker raises ``SystemExit``; when Ray ends a trial actor after
    its trial has finished and the signal lands while a weakref or finaliser callback runs,
    Python cannot raise there and prints the exception with its traceback (seen on the micro
    study's console, from ``run_trial``). Nothing is wrong: the trial's results are written,
    and Ray ends the process. ``--verbose`` (``train_settings``) keeps these notes."""
    if getattr(sys.unraisablehook, "drops_sigterm_exits", False):
        return
    default = sys.unraisablehook

    def hook(unraisable) -> None:
        if not isinstance(unraisable.exc_value, SystemExit):
            default(unraisable)

    hook.drops_sigterm_exits = True
    sys.unraisablehook = hook


def trial_actor_console(level: str) -> None:
    """The console of a trial that runs in its Tune trial actor, as a Train worker's
    (Ray Train's ``LoggingConfig`` sets up a worker's): distillab's INFO lines (one per
    finished stage of the trial) plain on stderr, which Ray forwards to the driver, and
    Ray Tune's and Ray Train's own loggers at ``level`` (`train_settings`: ``WARNING``, so
    Tune's "Checkpoint successfully created" notes stay out; ``INFO`` with ``--verbose``).
    Once per process: a reused trial actor keeps its handler."""
    console = logging.getLogger("distillab")
    if not any(getattr(h, "distillab_console", False) for h in console.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler.distillab_console = True
        console.addHandler(handler)
        console.setLevel(logging.INFO)
        console.propagate = False
    for name in ("ray.tune", "ray.train"):
        logging.getLogger(name).setLevel(level)


#: what a calm driver console drops from Tune's own log (`driver_console`): on an interrupted
#: sweep Tune names ``Tuner.restore(...)`` as the way to resume, beside the sweep's own
#: ``distillab sweep --resume`` line (`_fit`), which also restores the trainable
TUNE_RESUME_HINT = "Resume experiment with:"


def driver_console(verbose: int) -> None:
    """The sweep driver's console below ``verbose`` 2: Optuna logs warnings only (not its
    "A new study created in memory" note), and Tune's interrupted-sweep warning loses its
    `TUNE_RESUME_HINT` (the sweep prints its own). Once per process."""
    if verbose >= 2:
        return
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    tune_log = logging.getLogger("ray.tune.tune")
    if not any(getattr(f, "distillab_hint", False) for f in tune_log.filters):
        def no_resume_hint(record: logging.LogRecord) -> bool:
            return TUNE_RESUME_HINT not in record.getMessage()

        no_resume_hint.distillab_hint = True
        tune_log.addFilter(no_resume_hint)


class CalmReporter(tune.CLIReporter):
    """Tune's ``CLIReporter``, printed once the first trial runs, when a trial ends
    (finished or failed) and otherwise at most every ``max_report_frequency`` seconds,
    instead of every ``max_report_frequency`` seconds whatever happened; without
    Tune's system lines (scheduler, logical resource usage).

    A change (the first trial running, a trial ending) is printed ``settle_s`` seconds
    after it, or at the end of the sweep, whichever comes first, so that trials which
    start or end together (a grid's concurrent trials) share one table instead of
    printing two near-identical ones a fraction of a second apart."""

    def __init__(self, *args, settle_s: float = 2.0, **kwargs):
        super().__init__(*args, **kwargs)
        self._ended: int | None = None
        self._changed_at: float | None = None
        self._settle_s = settle_s

    def should_report(self, trials, done: bool = False) -> bool:
        if all(t.status == "PENDING" for t in trials):  # nothing to show yet
            return False
        ended = sum(t.status in ("TERMINATED", "ERROR") for t in trials)
        now = time.time()
        if ended != self._ended:
            self._ended, self._changed_at = ended, now
        if self._changed_at is not None and (done or now - self._changed_at >= self._settle_s):
            self._changed_at, self._last_report_time = None, now
            return True
        # Tune's periodic print, counted from the last table (none before the first one)
        return not done and self._last_report_time > 0 and super().should_report(trials, done)

    def report(self, trials, done: bool, *sys_info: str) -> None:
        super().report(trials, done)
