"""The sweep: resources, faults, trackers, the validated trials, and what crosses a process
boundary with each trial (runtime context and launch record).
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
from pathlib import Path
from typing import Literal

from pydantic import Field, PrivateAttr, ValidationError, model_validator

from distillab.config.base import _Strict
from distillab.config.errors import ConfigError, _errors
from distillab.config.grid import _apply_set, apply_point
from distillab.config.identity import config_hash
from distillab.config.models import ModelsConfig
from distillab.config.rules import check
from distillab.config.search import SearchConfig
from distillab.config.trial import TrialConfig


class ResourcesConfig(_Strict):
    """Ray resources: per trial (the Tune function trainable) and per Train worker.

    ``local_mode``: Ray Train's local mode for one-worker trials: the trial runs in its
    Tune trial actor (which then holds ``trial_cpus + cpus_per_worker`` CPUs and the
    worker's GPUs), with no Train controller or worker group to start, and a reused
    trial actor has the recipe's imports already; reports and checkpoints go to Tune
    (`session.RaySession`). A failed trial is retried by Tune (``fault_tolerance.trial_retries``,
    from its latest checkpoint); there is no worker group to restart. Needs ``num_workers: 1``.
    The numbers equal the worker group's (tests/test_sweep.py).

    ``compile``: ``torch.compile`` the student's and the teacher's transformer for the
    loss's forward and backward passes (`models.configure_passes`; sampling stays eager):
    one compile per process (its cost and the step's speed-up: README, "Compiled training
    passes"); the losses equal the eager ones to float32 rounding, not bitwise. Not with
    ZeRO 3 (``trial.optimizer.zero_stage: 3``)."""

    #: Ray Train workers per trial (data-parallel ranks)
    num_workers: int = Field(default=1, ge=1)
    #: CPUs each Train worker holds
    cpus_per_worker: float = Field(default=0.99, gt=0)
    #: GPUs each Train worker holds (fractions share a GPU)
    gpus_per_worker: float = Field(default=0.0, ge=0)
    #: CPUs the Tune trial actor (the driver of the trial's Train run) holds
    trial_cpus: float = Field(default=0.01, ge=0)
    #: trials running at once
    max_concurrent_trials: int = Field(default=2, ge=1)
    #: torch intra-op threads per worker
    torch_threads: int = Field(default=1, ge=1)
    #: run a one-worker trial in its Tune trial actor (Ray Train's local mode; no worker group)
    local_mode: bool = False
    #: ``torch.compile`` the student's and teacher's transformer for the loss's passes
    compile: bool = False

    @model_validator(mode="after")
    def _rules(self) -> "ResourcesConfig":
        check("resources", self)  # local_mode with one worker (config.rules)
        return self

    def trial_actor(self) -> dict[str, float]:
        """The Tune trial actor's resources: ``trial_cpus``, or with ``local_mode`` the
        worker's too (CPU and GPU), since the trial runs there."""
        if not self.local_mode:
            return {"CPU": self.trial_cpus}
        gpus = {"GPU": self.gpus_per_worker} if self.gpus_per_worker else {}
        return {"CPU": self.trial_cpus + self.cpus_per_worker, **gpus}


class FaultToleranceConfig(_Strict):
    """Retries: ``worker_restarts`` of a trial's Train worker group (it resumes from
    the latest checkpoint; set ``trial.optimizer.checkpoint_every``), and
    ``trial_retries`` of a whole Tune trial (its Train run resumes from the same
    storage). Ray Train's and Tune's ``FailureConfig(max_failures)``. With
    ``resources.local_mode`` a trial has no worker group: only ``trial_retries`` applies.

    The progress watchdog (`driver.watchdog`): when no trial has reported a step for
    ``stall_warn_s`` seconds while trials wait for their worker group's resources, the
    sweep prints one line (which trials wait, for what, held by whom); when that stall and a
    trial's wait reach ``stall_fail_s``, the waiting trials fail with that line (not retried
    in that run; ``distillab sweep --resume`` runs them again). A trial whose workers started
    but which has reported no step for ``silent_fail_s`` seconds, while no trial progressed for
    as long, is failed the same way: its workers hold their resources but are stuck (a stage
    that legitimately runs longer without a step report, such as a long evaluation at scale,
    needs a higher limit or null)."""

    #: restarts of a trial's Train worker group (from its latest checkpoint)
    worker_restarts: int = Field(default=2, ge=0)
    #: retries of a whole Tune trial
    trial_retries: int = Field(default=1, ge=0)
    #: seconds with no step reported by any trial while trials wait for resources before the sweep
    #: says which wait, for what, held by whom (one line; `driver.watchdog`); null: never
    stall_warn_s: float | None = Field(default=600.0, gt=0)
    #: seconds of that stall (and of a trial's wait) before the waiting trials fail with that line
    #: (``distillab sweep --resume`` runs them again); null: never
    stall_fail_s: float | None = Field(default=1800.0, gt=0)
    #: seconds a trial whose workers started reports no step, while no trial progresses, before it
    #: fails with a line that says so (``distillab sweep --resume`` runs it again); null: never
    silent_fail_s: float | None = Field(default=3600.0, gt=0)


def _tracker_installed(section, package: str):
    """``section`` if ``package`` can be imported; else a ValueError naming ``tracking.<package>``."""
    if importlib.util.find_spec(package) is None:
        raise ValueError(f"tracking.{package} needs the {package} package, which is not installed "
                         f"(pip install -e '.[tracking]', or remove tracking.{package})")
    return section


class WandbTracking(_Strict):
    """Weights & Biases through Ray Tune's ``WandbLoggerCallback`` (one run per trial,
    named by its trial id, in ``group`` (default: the sweep's name) of ``project``):
    the trial's config, every report (per-10-step training metrics, the final
    evaluations). ``mode``: W&B's ``online``, ``offline`` (files under ``dir``, synced
    later with ``wandb sync``) or ``disabled``; None leaves it to ``WANDB_MODE``.
    ``dir``: where W&B writes (default ``<sweep dir>/wandb``).

    Raises (validation): ValueError when the ``wandb`` package is not installed."""

    #: the W&B project
    project: str = "distillab"
    #: the W&B entity (user or team; null: the default)
    entity: str | None = None
    #: the W&B group (null: the sweep's name)
    group: str | None = None
    #: ``online``, ``offline`` or ``disabled`` (null: ``WANDB_MODE``)
    mode: Literal["online", "offline", "disabled"] | None = None
    #: where W&B writes (null: ``<sweep dir>/wandb``)
    dir: str | None = None
    #: tags of every run
    tags: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _installed(self) -> "WandbTracking":
        return _tracker_installed(self, "wandb")


class MLflowTracking(_Strict):
    """MLflow through Ray Tune's ``MLflowLoggerCallback`` (one run per trial, named by
    its trial id, in experiment ``experiment_name``, default the sweep's name): the
    trial's config as parameters, every report's numbers as metrics at its ``step``.
    ``tracking_uri``: an MLflow server or store (default: a local SQLite store, one
    file ``<sweep dir>/mlflow.db``; MLflow 3 refuses its old ``./mlruns`` directory
    store unless ``MLFLOW_ALLOW_FILE_STORE=true``); ``tags`` are set on every run.

    Raises (validation): ValueError when the ``mlflow`` package is not installed."""

    #: the MLflow server or store (null: ``<sweep dir>/mlflow.db``)
    tracking_uri: str | None = None
    #: the MLflow experiment (null: the sweep's name)
    experiment_name: str | None = None
    #: tags set on every run
    tags: dict[str, str] = {}

    @model_validator(mode="after")
    def _installed(self) -> "MLflowTracking":
        return _tracker_installed(self, "mlflow")


class TrackingConfig(_Strict):
    """Experiment trackers a sweep logs to besides its own Parquet tables (none by
    default): ``wandb`` and/or ``mlflow`` (`sweep.tracker_callbacks`)."""

    #: log to Weights & Biases (null: off)
    wandb: WandbTracking | None = None
    #: log to MLflow (null: off)
    mlflow: MLflowTracking | None = None


#: The file in a sweep directory that holds its validated config (`SweepConfig.save`).
SWEEP_FILE = "sweep.json"


def expand_trials(sweep: SweepConfig) -> list[TrialConfig]:
    """The trials of a grid sweep: for each grid of ``search.all_grids`` (``search.grid``
    alone, or each of ``search.grids``), its ``set`` overrides applied to ``sweep.trial``,
    then its cross product, each point validated; in grid order. An Optuna sweep: the
    base trial, and every bound or choice of ``search.space`` is validated too.

    Raises:
        ValueError: a grid point gives an invalid trial, a ``set`` path that does not
            exist in the trial, or two grid points give the same trial (the same trial
            id); the message names the grid, the point and the field.
    """
    base = sweep.trial.model_dump(mode="json")
    union = sweep.search.grids is not None
    trials: list[TrialConfig] = []
    where_of: dict[str, str] = {}
    for i, g in enumerate(sweep.search.all_grids):
        where = f"search.grids[{i}]" if union else "search.grid"
        grid_base = _apply_set(base, g.set_, where)
        keys = list(g.grid)
        for values in itertools.product(*(g.grid[k] for k in keys)):
            point = dict(zip(keys, values))
            try:
                trial = apply_point(grid_base, point)
            except ValidationError as e:
                fixed = f" (with set {g.set_})" if g.set_ else ""
                raise ValueError(f"{where} point {point}{fixed} is invalid: {_errors(e, TrialConfig)}") from None
            if trial.trial_id in where_of:
                raise ValueError(f"{where} point {point} gives trial {trial.trial_id}, which "
                                 f"{where_of[trial.trial_id]} gives already (each trial once)")
            where_of[trial.trial_id] = f"{where} point {point}"
            trials.append(trial)
    for key, domain in sweep.search.space.items():  # Bayesian: every bound / choice must give a valid trial
        for v in domain.edge_values():
            try:
                apply_point(base, {key: v})
            except ValidationError as e:
                raise ValueError(f"search.space[{key!r}] value {v!r} is invalid: {_errors(e, TrialConfig)}") from None
    return trials


class SweepConfig(_Strict):
    """A sweep YAML, validated. Validation expands the grid once (`expand_trials`):
    `trials` is that list, which the sweep runs."""

    #: the sweep's name: its results go to ``<storage_path>/<name>``; letters, digits, ``_``, ``.``, ``-``
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    #: root folder of the results (a local path, or shared storage on a cluster)
    storage_path: str = "runs"
    #: teacher and student: checkpoint directories, or the micro models ``prepare`` trains
    models: ModelsConfig = ModelsConfig()
    #: the base trial: every grid point (or Optuna sample) is applied to it
    trial: TrialConfig = TrialConfig()
    #: what varies across trials: a grid, a union of grids, or an Optuna search
    search: SearchConfig = SearchConfig()
    #: Ray resources of each trial and of its Train workers
    resources: ResourcesConfig = ResourcesConfig()
    #: retries of failed workers and trials
    fault_tolerance: FaultToleranceConfig = FaultToleranceConfig()
    #: experiment trackers (W&B, MLflow) fed by Ray Tune's logger callbacks; none by default
    tracking: TrackingConfig = TrackingConfig()
    _trials: list[TrialConfig] = PrivateAttr(default_factory=list)

    @model_validator(mode="after")
    def _validate_grid(self) -> "SweepConfig":
        check("sweep", self)  # the micro models' demonstrations against the tasks (config.rules)
        self._trials = expand_trials(self)  # every grid point (and every edge of a Bayesian domain) validates first
        check("sweep trials", self)  # RLVR stages against the workers, warm-ups, compile (config.rules)
        return self

    @property
    def trials(self) -> list[TrialConfig]:
        """The validated trials of the grid (one, the base trial, for an Optuna sweep)."""
        return list(self._trials)

    def sweep_dir(self) -> Path:
        """``<storage_path>/<name>``, absolute."""
        return (Path(self.storage_path).expanduser() / self.name).resolve()

    def save(self, root: str | Path) -> None:
        """Write the validated config into the sweep directory ``root`` (`SWEEP_FILE`, JSON):
        what ``distillab sweep --resume`` and `saved` read back."""
        target = Path(root) / SWEEP_FILE
        tmp = target.with_name(f".{SWEEP_FILE}.tmp")  # then renamed: a crash or Ctrl-C leaves no half-written file
        tmp.write_text(json.dumps(self.model_dump(mode="json"), indent=1))
        os.replace(tmp, target)

    @classmethod
    def saved(cls, root: str | Path) -> "SweepConfig":
        """The config `save` wrote into the sweep directory ``root``, validated again.

        Raises:
            ConfigError: no `SWEEP_FILE` there, or it does not validate (bad JSON included).
        """
        f = Path(root) / SWEEP_FILE
        if not f.exists():
            raise ConfigError(f"{root}: no {SWEEP_FILE} there (not a sweep directory written by distillab sweep)")
        try:
            return cls.model_validate(json.loads(f.read_text()))
        except ValidationError as e:
            raise ConfigError(f"{root}: {SWEEP_FILE} does not validate: {_errors(e, cls)}") from None
        except ValueError as e:  # bad JSON (json.JSONDecodeError's message is one line)
            raise ConfigError(f"{root}: {SWEEP_FILE} is not valid JSON: {e}") from None

    @property
    def teacher_service(self) -> str | None:
        """The name of the sweep's teacher service (`teacher.start_teacher_service`): ``teacher-<name>-<hash
        of the sweep directory>`` where a trial has ``teacher.serve: shared`` (or an Optuna search samples
        ``teacher.serve``), else None."""
        if not any(t.teacher.serve == "shared" for t in self._trials) and "teacher.serve" not in self.search.space:
            return None
        return f"teacher-{self.name}-{config_hash(str(self.sweep_dir()))[:8]}"

    def shared_cache_dir(self) -> Path:
        """What trials share lives beside the prepared models, ``<models.cache_dir>/shared``:
        reusable OffPD rollout sets and the evaluation of the untrained student."""
        return Path(self.models.cache_dir).expanduser().resolve() / "shared"


class RuntimeContext(_Strict):
    """What a trial needs beyond its `TrialConfig`: the prepared teacher and student
    checkpoints, the sweep's results root, the one shared-cache directory
    (`SweepConfig.shared_cache_dir`), and the sweep's resources and fault tolerance."""

    teacher_path: str
    student_path: str
    results_root: str
    shared_cache: str
    #: the sweep's teacher service (`teacher.start_teacher_service`), None where no trial has teacher.serve shared
    teacher_service: str | None = None
    resources: ResourcesConfig = ResourcesConfig()
    fault_tolerance: FaultToleranceConfig = FaultToleranceConfig()

    @classmethod
    def for_sweep(cls, sweep: SweepConfig, teacher_path: str | Path, student_path: str | Path) -> "RuntimeContext":
        """The context of every trial of ``sweep`` (paths made absolute)."""
        return cls(teacher_path=str(Path(teacher_path).resolve()), student_path=str(Path(student_path).resolve()),
                   results_root=str(sweep.sweep_dir()), shared_cache=str(sweep.shared_cache_dir()),
                   teacher_service=sweep.teacher_service, resources=sweep.resources,
                   fault_tolerance=sweep.fault_tolerance)

    @property
    def torch_threads(self) -> int:
        """Torch threads per Train worker (``resources.torch_threads``)."""
        return self.resources.torch_threads


class TrialLaunch(_Strict):
    """One trial as it crosses its process boundaries: driver → Tune trial actor
    (`sweep.run_trial`), trial actor → Ray Train workers (``train_loop_config`` of
    `sweep.run_trial`'s ``TorchTrainer``, read by `distill.train_loop_per_worker`), or the
    trial actor itself (``resources.local_mode``, `sweep.train_in_trial_actor`). Ray pickles
    it as it is: the trial and its context arrive typed, never as JSON to validate again.

    ``trial``: the validated trial; ``ctx``: its runtime context; ``trial_id``: the trial's
    id, computed once (`of`); ``times``: what the Tune trainable measured at its first line
    (`telemetry.TrialTimes.launch_info`: ``t_trial`` unix seconds, ``trainable_import_s``
    seconds), None outside Tune."""

    trial: TrialConfig
    ctx: RuntimeContext
    trial_id: str
    times: dict[str, float] | None = None

    @classmethod
    def of(cls, trial: TrialConfig, ctx: RuntimeContext, times: dict[str, float] | None = None) -> "TrialLaunch":
        """The launch record of ``trial`` in ``ctx``, its ``trial_id`` computed here (`TrialConfig.trial_id`)."""
        return cls(trial=trial, ctx=ctx, trial_id=trial.trial_id, times=times)
