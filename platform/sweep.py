"""The sweep: Ray Tune over the YAML's grid, one function trainable per trial
that builds and fits a Ray Train ``TorchTrainer`` (Train V2: Tune's report
callback propagates the workers' metrics; ``Tuner(TorchTrainer)`` is not used).

Results land under ``<storage_path>/<name>/``: the Tune experiment, the Train
runs (``train/<trial_id>``) and the Parquet tables (``trials``, ``metrics``,
``evals``) that `distillab.results.load` reads.

    distillab sweep search_spaces/micro.yaml
"""

from __future__ import annotations

import copy
import logging
import os
import time
import traceback
from pathlib import Path
from typing import Any

from distillab.config import SweepConfig, TrialConfig, expand_trials, set_dotted
from distillab.results import write_rows

log = logging.getLogger(__name__)


def trial_from_params(base: dict[str, Any], params: dict[str, Any]) -> TrialConfig:
    """Apply a Tune grid point (dotted keys) to the base trial dict and validate."""
    d = copy.deepcopy(base)
    for k, v in params.items():
        if k in ("base", "ctx"):
            continue
        set_dotted(d, k, v)
    return TrialConfig.model_validate(d)


def run_trial(params: dict[str, Any]) -> None:
    """Tune function trainable: one distillation trial as a ``TorchTrainer`` fit,
    plus its row in the ``trials`` table (status, times, checkpoint, config)."""
    import ray.train
    from ray.train.torch import TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    from distillab.distill import train_loop_per_worker

    ctx = params["ctx"]
    trial = trial_from_params(params["base"], params)
    trial_id = trial.trial_id
    root = Path(ctx["results_root"])
    res = ctx["resources"]
    start = time.time()
    row: dict[str, Any] = {"trial_id": trial_id, "start_time": start, "checkpoint": None, "error": None}
    row.update({k: (str(v) if isinstance(v, (list, dict)) else v) for k, v in trial.flat().items()})
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={
            "trial": trial.model_dump(mode="json"),
            "trial_id": trial_id,
            "teacher_path": ctx["teacher_path"],
            "student_path": ctx["student_path"],
            "results_root": str(root),
            "torch_threads": res["torch_threads"],
        },
        scaling_config=ray.train.ScalingConfig(
            num_workers=res["num_workers"],
            use_gpu=res["gpus_per_worker"] > 0,
            resources_per_worker={"CPU": res["cpus_per_worker"], **({"GPU": res["gpus_per_worker"]} if res["gpus_per_worker"] else {})},
        ),
        run_config=ray.train.RunConfig(
            name=trial_id,
            storage_path=str(root / "train"),
            callbacks=[TuneReportCallback()],
            failure_config=ray.train.FailureConfig(max_failures=ctx.get("max_failures", 0)),
        ),
    )
    try:
        result = trainer.fit()
        row.update(status="completed", checkpoint=result.checkpoint.path if result.checkpoint else None)
    except Exception as e:  # the row records the failure; Tune sees it too
        row.update(status="failed", error="".join(traceback.format_exception_only(type(e), e))[-4000:])
        raise
    finally:
        row["end_time"] = time.time()
        write_rows(root, "trials", [row], key=trial_id)


def init_ray(address: str | None, dashboard: bool, num_cpus: int | None = None) -> None:
    """Connect to ``address`` (or ``RAY_ADDRESS``, set by ``ray job submit``), else
    start a local Ray whose dashboard binds to 127.0.0.1."""
    import ray

    env = {"env_vars": {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}}
    if address or os.environ.get("RAY_ADDRESS"):
        ray.init(address=address, runtime_env=env)
    else:
        ray.init(
            address="local",
            num_cpus=num_cpus,
            include_dashboard=dashboard,
            dashboard_host="127.0.0.1",
            runtime_env=env,
        )


def run_sweep(sweep: SweepConfig, teacher_path: Path, student_path: Path, *, verbose: int = 1) -> Path:
    """Run every trial of the grid with Ray Tune (Ray must be initialised).
    Returns the sweep directory (results root)."""
    from ray import tune

    root = sweep.sweep_dir()
    root.mkdir(parents=True, exist_ok=True)
    trials = expand_trials(sweep)  # validated already; also gives the count
    r = sweep.resources
    ctx = {
        "teacher_path": str(Path(teacher_path).resolve()),
        "student_path": str(Path(student_path).resolve()),
        "results_root": str(root),
        "resources": r.model_dump(),
    }
    param_space: dict[str, Any] = {k: tune.grid_search(v) for k, v in sweep.search.grid.items()}
    param_space.update(base=sweep.trial.model_dump(mode="json"), ctx=ctx)
    reporter = tune.CLIReporter(
        parameter_columns=list(sweep.search.grid),
        metric_columns={"step": "step", "loss": "loss", "kl/forward": "fKL", "kl/reverse": "rKL"},
        max_report_frequency=30,
    )
    tuner = tune.Tuner(
        tune.with_resources(run_trial, {"CPU": r.trial_cpus}),
        param_space=param_space,
        tune_config=tune.TuneConfig(max_concurrent_trials=r.max_concurrent_trials),
        run_config=tune.RunConfig(
            name="tune", storage_path=str(root), progress_reporter=reporter, verbose=verbose,
            failure_config=tune.FailureConfig(max_failures=0),
        ),
    )
    t0 = time.perf_counter()
    grid = tuner.fit()
    errors = [res.error for res in grid if res.error]
    print(f"[sweep] {len(trials)} trials in {time.perf_counter() - t0:.0f} s, {len(errors)} failed", flush=True)
    return root
