"""The driver: what runs on the machine that starts a sweep.

    cli        the ``distillab`` command
    sweep      Ray Tune over the validated trials (grid) or Optuna, faults, resume
    plan       ``sweep --dry-run``: checkpoint checks, placement, cost estimate
    raystart   connect to a cluster, or start a local Ray
    imports    importing transformers and DeepSpeed without the integrations never used
"""
