"""The driver: what runs on the machine that starts a sweep.

    cli        the ``distillab`` command
    sweep      Ray Tune over the validated trials (grid) or Optuna, faults, resume
    search     the grid or Optuna search, the trial of a Tune config, the search's summary
    console    the sweep's calm console (Tune's progress table, quiet loggers)
    trackers   W&B and MLflow through Tune's logger callbacks
    watchdog   placement groups of dead Train controllers removed; the progress watchdog
    plan       ``sweep --dry-run``: checkpoint checks, placement, cost estimate
    raystart   connect to a cluster, or start a local Ray
    imports    importing transformers and DeepSpeed without the integrations never used
"""
