"""The sweep's trackers: Ray Tune's W&B and MLflow logger callbacks when the YAML's ``tracking``
section asks (`tracker_callbacks`), one run per trial named by its trial id (`trial_name`), with
the trial's fields as its config (`tracked_config`)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from distillab.config import SweepConfig
from distillab.driver.search import search_trials, trial_of


def tracked_config(sweep: SweepConfig):
    """``params → config``: what a tracker logs for the Tune trial of ``params`` (its Tune
    config): the trial's fields as dotted keys (`config.TrialConfig.flat`) and ``trial_id``."""
    trials, base = search_trials(sweep)

    def config(params: dict[str, Any]) -> dict[str, Any]:
        trial = trial_of(params, trials, base)
        return {"trial_id": trial.trial_id, **trial.flat()}

    return config


#: What Tune adds to every report about the process that ran it (Ray's ``WandbLoggerCallback.AUTO_CONFIG_KEYS``):
#: neither tracker logs them (Tune's ``trial_id`` would otherwise replace distillab's in W&B's config).
TUNE_PROCESS_KEYS = ("trial_id", "experiment_tag", "node_ip", "experiment_id", "hostname", "pid", "date")


def _wandb_callback(sweep: SweepConfig):
    """Ray Tune's ``WandbLoggerCallback`` whose runs' config is `tracked_config` alone. Ray's
    callback logs ``trial.config`` (Tune's parameters: a grid point, or an Optuna sample);
    it writes `TUNE_PROCESS_KEYS` into the config, over `tracked_config`'s ``trial_id``
    (distillab's); and its logging actor merges each report's ``config`` into the run's config
    even with ``log_config=False``. None of the three here."""
    from ray.air.integrations.wandb import WandbLoggerCallback  # optional dependency

    config = tracked_config(sweep)

    class WandbCallback(WandbLoggerCallback):
        AUTO_CONFIG_KEYS: list[str] = []
        _exclude_results = [*WandbLoggerCallback._exclude_results, *TUNE_PROCESS_KEYS]

        def log_trial_start(self, trial) -> None:
            params, trial.config = trial.config, config(trial.config)
            try:
                super().log_trial_start(trial)
            finally:
                trial.config = params

        def log_trial_result(self, iteration: int, trial, result: dict) -> None:
            super().log_trial_result(iteration, trial, {k: v for k, v in result.items() if k != "config"})

    return WandbCallback


def tracker_callbacks(sweep: SweepConfig, quiet: bool = True) -> list:
    """Ray Tune's W&B and MLflow logger callbacks for ``sweep.tracking`` (none unless it
    asks): one run per trial, named by the trial id (`trial_name`), with `tracked_config`
    as its config and every report (training metrics every 10 steps, the final
    evaluations). MLflow names may not contain ``@``: its metric keys read ``_at_``
    there (``eval/distill/countdown3/pass_at_1``), at the report's ``step``. ``quiet``:
    W&B's own console lines off (``wandb.Settings(silent=True)``)."""
    t, root, out = sweep.tracking, sweep.sweep_dir(), []
    if t.wandb is not None:
        import wandb  # optional dependency

        w = t.wandb
        if w.mode:  # Ray's callback reads the mode from the environment (offline: no API key asked for)
            os.environ["WANDB_MODE"] = w.mode
        wandb_dir = Path(w.dir).expanduser().resolve() if w.dir else root / "wandb"
        wandb_dir.mkdir(parents=True, exist_ok=True)  # W&B writes its runs under <dir>/wandb/
        out.append(_wandb_callback(sweep)(
            project=w.project, group=w.group or sweep.name, entity=w.entity, tags=list(w.tags),
            upload_checkpoints=False, log_config=False, dir=str(wandb_dir),
            **({"mode": w.mode} if w.mode else {}), **({"settings": wandb.Settings(silent=True)} if quiet else {})))
    if t.mlflow is not None:
        m = t.mlflow
        out.append(_mlflow_callback(sweep)(tracking_uri=m.tracking_uri or f"sqlite:///{root / 'mlflow.db'}",
                                           experiment_name=m.experiment_name or sweep.name, tags=dict(m.tags)))
    return out


def _mlflow_callback(sweep: SweepConfig):
    """Ray Tune's ``MLflowLoggerCallback`` logging `tracked_config` as the run's
    parameters and each report's numbers (not `TUNE_PROCESS_KEYS`) as metrics at its ``step`` (``@`` → ``_at_``),
    each in one ``log_batch`` call: Ray's callback writes one key per call, and a
    final report's ~200 keys then held the driver 8–20 s per result (SQLite store,
    2 busy cores), long enough for Ray 2.60's report relay to deadlock (`_await_tune_reports`)."""
    from mlflow.entities import Metric, Param  # optional dependency
    from mlflow.tracking import MlflowClient
    from ray.air.integrations.mlflow import MLflowLoggerCallback

    config = tracked_config(sweep)

    class MLflowCallback(MLflowLoggerCallback):
        def _batch(self, run_id: str, items: list, kind: str) -> None:
            if getattr(self, "_client", None) is None:  # one client: each new one opens the store again
                self._client = MlflowClient(tracking_uri=self.tracking_uri)
            size = 100 if kind == "params" else 1000
            for i in range(0, len(items), size):  # MLflow's per-call limits: 100 params, 1000 metrics
                self._client.log_batch(run_id, **{kind: items[i:i + size]})

        def log_trial_start(self, trial) -> None:
            if trial not in self._trial_runs:
                run = self.mlflow_util.start_run(tags={**self.tags, "trial_name": str(trial)}, run_name=str(trial))
                self._trial_runs[trial] = run.info.run_id
                self._batch(self._trial_runs[trial], [Param(k, str(v)) for k, v in config(trial.config).items()],
                            "params")

        def log_trial_result(self, iteration: int, trial, result: dict) -> None:
            step, now = int(result.get("step", iteration)), int(time.time() * 1000)
            metrics = [Metric(k.replace("@", "_at_"), float(v), now, step) for k, v in result.items()
                       if k != "config" and k not in TUNE_PROCESS_KEYS and isinstance(v, (int, float))
                       and not isinstance(v, bool)]
            self._batch(self._trial_runs[trial], metrics, "metrics")

    return MLflowCallback


def trial_name(sweep: SweepConfig):
    """Tune's ``trial_name_creator``: a trial is named by its distillab trial id (the
    progress table, W&B and MLflow runs)."""
    config = tracked_config(sweep)
    return lambda trial: config(trial.config)["trial_id"]
