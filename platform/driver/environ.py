"""The process environment a sweep starts with (`env_defaults`): Hugging Face offline, the
tokenizers' threads, DeepSpeed's CPU accelerator where no GPU driver is loaded, Ray's token
authentication for a new local cluster, and the calm console's filters of Ray's worker logs
(`HARMLESS_RAY_LINES`, `NEVER_DEDUPLICATED_LINES`). The standard library only: ``distillab``
and `distillab.api` set it before ray is imported.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

#: Lines of Ray's forwarded worker logs that a calm console drops (``RAY_DEDUP_LOGS_SKIP_REGEX``, read
#: when ray is imported; Ray's session logs keep them). Each is known to be harmless:
HARMLESS_RAY_LINES = (
    # Ray Train's PlacementGroupCleaner asks the state API, which the dashboard serves, about its
    # controller every second; without a dashboard (--no-dashboard) it cannot, and says so each time
    r"Failed to query Ray Train Controller actor state",
    # the raylet's note that more worker processes started than it expects at once: every trial
    # starts several actors (Tune trial, Train controller and its helpers, workers)
    r"PYTHON worker processes have been started on node",
    # Ray core's note that an actor would not survive losing its constructor's arguments: Ray Train's
    # PreemptionWatcher (restarted with its run instead) and, with tracking.wandb, Ray's W&B logging actor
    r"Actor with class name: '(?:PreemptionWatcher|_WandbLoggingActor)' .*constructor arguments in the object store",
    # wandb's deprecation note on the `reinit=True` that Ray's WandbLoggerCallback passes
    r"wandb: WARNING Using a boolean value for 'reinit' is deprecated",
    # DeepSpeed's print after loading its CPU shared-memory collective (compiled once, loaded by every worker)
    r"DeepSpeed deepspeed\.ops\.comm\.deepspeed_shm_comm_op built successfully",
    # abseil's trace of a mutex wait in Ray's core worker (seen from Ray Train's PlacementGroupCleaner):
    # "[mutex.cc : 452] RAW: Lock blocking 0x... @": a debug note, not an error
    r"\[mutex\.cc : \d+\] RAW: Lock blocking",
)


#: Lines of Ray's forwarded worker logs that are never deduplicated (``RAY_DEDUP_LOGS_ALLOW_REGEX``, read
#: when ray is imported): a trial's stage line (`evals.suite.stage_line`). Ray's deduplicator keys a
#: line on its words without digits, so two trials' lines for one stage look alike: from a second
#: process within ``RAY_DEDUP_LOGS_AGG_WINDOW_S`` (5 s) it held the line back (it printed after the
#: sweep's end), and from a third it would print one "[repeated Nx across cluster]" line for them all
NEVER_DEDUPLICATED_LINES = (r"\[trial\] ",)


def any_of(patterns: tuple[str, ...]) -> str:
    """One regular expression matching any of ``patterns`` (Ray's ``RAY_DEDUP_LOGS_*_REGEX`` take one)."""
    return "|".join(f"(?:{p})" for p in patterns)



#: files that exist where a GPU driver is loaded (NVIDIA's; ROCm's kernel driver): without them torch sees no GPU
GPU_DRIVER_FILES = ("/proc/driver/nvidia/version", "/dev/kfd")


def env_defaults(verbose: bool = False, local_ray: bool = False) -> None:
    """Set what a sweep needs in ``os.environ`` where unset (``os.environ.setdefault``: a value the
    user exported wins): see the module docstring. ``verbose``: every worker line, undeduplicated;
    ``local_ray``: a new local Ray is to start (token authentication, said only before ray is imported)."""
    cache = Path(os.environ.get("DISTILLAB_CACHE", ".cache")).resolve()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(cache / "torch_extensions"))
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    if not any(Path(d).exists() for d in GPU_DRIVER_FILES):  # no GPU driver: DeepSpeed's CPU accelerator, said
        os.environ.setdefault("DS_ACCELERATOR", "cpu")      # before anything imports it (else it warns on each run)
    # token authentication, Ray's default for a new local cluster, said before ray is imported (so
    # without its "Token authentication is enabled"); once imported (main() called in-process, as in
    # the tests), Ray has read its mode and a new one would reach only the cluster's processes
    if local_ray and "ray" not in sys.modules:
        os.environ.setdefault("RAY_AUTH_MODE", "token")
    if not sys.stdout.isatty():  # a file or a pipe: Ray's worker-log prefixes without ANSI colour codes
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")
    if verbose:  # every line of every worker, undeduplicated
        os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    else:
        os.environ.setdefault("RAY_DEDUP_LOGS_SKIP_REGEX", any_of(HARMLESS_RAY_LINES))
        os.environ.setdefault("RAY_DEDUP_LOGS_ALLOW_REGEX", any_of(NEVER_DEDUPLICATED_LINES))
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # micro models load in milliseconds
        os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # tracking.mlflow: its store's set-up notes
        # Tune's "The `on_step_begin` operation took 0.697 s, which may be a performance bottleneck"
        # (its default threshold is 0.5 s; on a loaded machine the driver shares the cores with the
        # trials): said from 5 s on, where a driver stall is worth a line
        os.environ.setdefault("TUNE_WARN_THRESHOLD_S", "5")
