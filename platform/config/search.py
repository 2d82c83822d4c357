"""What varies across trials: grids, unions of grids, Bayesian (Optuna) domains, early stopping.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from distillab.config.base import _Strict, _StrictAliased
from distillab.registry import OFFPD, ONPD, SEARCHABLE, check_report_metric


class Domain(_StrictAliased):
    """One dimension of a Bayesian (Optuna) search space; exactly one of:
    ``uniform: [low, high]``, ``loguniform: [low, high]`` (low > 0), ``int: [low, high]``
    (inclusive) or ``choice: [v1, v2, ...]``."""

    #: ``[low, high]``: a float drawn uniformly
    uniform: tuple[float, float] | None = None
    #: ``[low, high]`` (low > 0): a float drawn log-uniformly
    loguniform: tuple[float, float] | None = None
    #: ``[low, high]``: an integer, bounds included; YAML key ``int``
    int_: tuple[int, int] | None = Field(default=None, alias="int")
    #: ``[v1, v2, ...]``: one of these values
    choice: list[Any] | None = None

    @model_validator(mode="after")
    def _one(self) -> "Domain":
        given = [k for k in ("uniform", "loguniform", "int_", "choice") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("a search-space domain needs exactly one of: uniform, loguniform, int, choice")
        if self.choice is not None and not self.choice:
            raise ValueError("choice must list at least one value")
        for name in ("uniform", "loguniform", "int_"):
            b = getattr(self, name)
            if b is not None and not b[0] < b[1]:
                raise ValueError(f"{name.rstrip('_')} bounds must satisfy low < high, got {list(b)}")
        if self.loguniform is not None and self.loguniform[0] <= 0:
            raise ValueError(f"loguniform bounds must be > 0, got {list(self.loguniform)}")
        return self

    def edge_values(self) -> list[Any]:
        """Values a trial must accept (both bounds, or every choice): checked before compute."""
        b = self.uniform or self.loguniform or self.int_
        return list(b) if b is not None else list(self.choice)


class SchedulerConfig(_Strict):
    """Early stopping (Ray Tune's ASHA) on a metric reported during training, with
    ``step`` (optimizer steps) as the time axis."""

    #: the scheduler (ASHA)
    kind: Literal["asha"] = "asha"
    #: the training metric ASHA compares (a ``step``-scope key of the metric reference)
    metric: str = "loss"
    #: whether a lower (``min``) or higher (``max``) metric is better
    mode: Literal["min", "max"] = "min"
    #: steps every trial runs before it can be stopped
    grace_period: int = Field(default=50, ge=1)
    #: the longest a trial runs (steps; null: ``trial.optimizer.steps``)
    max_t: int | None = Field(default=None, ge=1)
    #: ASHA's reduction factor between rungs
    reduction_factor: float = Field(default=3.0, gt=1)

    @field_validator("metric")
    @classmethod
    def _metric(cls, v: str) -> str:
        check_report_metric(v, "search.scheduler.metric", training_only=True)  # ASHA sees training reports
        return v


def _check_grid(v: dict[str, list[Any]], where: str) -> dict[str, list[Any]]:
    """``v`` when every key is `SEARCHABLE` and every value a non-empty list (``where``: the
    field's name in messages, ``search.grid`` or ``search.grids[i].grid``)."""
    for key, values in v.items():
        if key not in SEARCHABLE:
            raise ValueError(f"{where} key {key!r} is not searchable; allowed: {list(SEARCHABLE)}")
        if not isinstance(values, list) or not values:
            raise ValueError(f"{where}[{key!r}] must be a non-empty list")
    return v


class GridConfig(_StrictAliased):
    """One grid of a union of grids (``search.grids``): the cross product of ``grid``
    (`SEARCHABLE` keys, as in ``search.grid``) applied to the base trial with the fixed
    overrides ``set`` first (dotted paths into the trial, any field: ``rollout.policy:
    spectrum``, ``rlvr: {...}``, ``evaluation.countdown_tasks: [...]``; a mapping merges
    into the base's mapping key by key, like ``extends``, anything else replaces it).
    A key may not be both in ``set`` and in ``grid``."""

    #: fixed overrides of this grid (dotted path → value); YAML key ``set``
    set_: dict[str, Any] = Field(default={}, alias="set")
    #: the cross product this grid sweeps (searchable key → values)
    grid: dict[str, list[Any]] = {}

    @model_validator(mode="after")
    def _keys(self) -> "GridConfig":
        _check_grid(self.grid, "grid")
        both = sorted(set(self.set_) & set(self.grid))
        if both:
            raise ValueError(f"keys {both} are both in set and in grid (a key is fixed or swept, not both)")
        for key in self.set_:
            if not key or any(not part for part in key.split(".")):
                raise ValueError(f"set key {key!r} must be a dotted path into the trial (e.g. rollout.policy)")
        return self


class SearchConfig(_Strict):
    """The search: ``grid`` (full cross product of ``grid``), a union of grids
    (``grids``: a list of `GridConfig`, each with its own fixed overrides ``set``; the
    trials of all of them, each exactly once) or ``optuna`` (Ray Tune's
    ``OptunaSearch`` over ``space``, ``num_samples`` trials; one objective, or several
    for a Pareto front). ``metric`` names a key of a trial's final report (e.g.
    ``eval/distill/countdown3/accuracy``, ``eval/forgetting`` = OOD after − before).
    ``grid`` and ``grids`` are exclusive (a file that extends one with ``search.grid``
    writes ``grid: null`` beside its ``grids``)."""

    #: ``grid``: every point of ``grid`` (or of each of ``grids``); ``optuna``: Bayesian search over ``space``
    kind: Literal["grid", "optuna"] = "grid"
    #: the cross product swept: a searchable key to the list of its values
    grid: dict[str, list[Any]] = {"rollout.policy": [OFFPD, ONPD], "loss.kind": ["forward", "reverse"]}
    #: a union of grids, each with fixed overrides ``set`` (exclusive with ``grid``)
    grids: tuple[GridConfig, ...] | None = None
    #: ``kind: optuna``: a searchable key to its domain (uniform, loguniform, int or choice)
    space: dict[str, Domain] = {}
    #: the objective(s): key(s) of a trial's final report (a list for a Pareto front)
    metric: str | list[str] = "eval/distill/countdown3/accuracy"
    #: ``max`` or ``min`` per objective
    mode: Literal["min", "max"] | list[Literal["min", "max"]] = "max"
    #: ``kind: optuna``: the number of trials
    num_samples: int = Field(default=8, ge=1)
    #: ``kind: optuna``: Optuna's sampler (``nsga2`` for several objectives)
    sampler: Literal["tpe", "random", "nsga2"] = "tpe"
    #: ``kind: optuna``: the sampler's seed
    seed: int = 0
    #: early stopping (ASHA) on a training metric; null: none
    scheduler: SchedulerConfig | None = None

    @model_validator(mode="before")
    @classmethod
    def _one_grid_field(cls, data: Any) -> Any:
        """Optuna: no grid (the default one dropped); ``grids``: no ``grid`` (null or empty
        accepted, and stored as empty)."""
        if not isinstance(data, dict):
            return data
        if data.get("kind") == "optuna":
            for name in ("grid", "grids"):
                if data.get(name):
                    raise ValueError(f"search.{name} is not used when search.kind is 'optuna': put fixed values "
                                     "under trial and searched ones under search.space")
            return {**data, "grid": {}}
        if data.get("grids") is not None:
            if not data["grids"]:
                raise ValueError("search.grids must list at least one grid")
            if data.get("grid"):
                raise ValueError("search.grid and search.grids are exclusive: give one cross product (grid) or a "
                                 "union of grids (grids); a file extending one with search.grid writes grid: null")
            return {**data, "grid": {}}
        if "grid" in data and data["grid"] is None:
            raise ValueError("search.grid: null only goes with search.grids")
        if "grid" in data and isinstance(data["grid"], dict) and not data["grid"]:
            raise ValueError("search.grid is empty: give at least one searchable key with a list of values "
                             "(e.g. seed: [42]), or search.grids")
        return data

    @field_validator("grid")
    @classmethod
    def _grid(cls, v: dict[str, list[Any]]) -> dict[str, list[Any]]:
        return _check_grid(v, "search.grid")

    @field_validator("space")
    @classmethod
    def _space(cls, v: dict[str, Domain]) -> dict[str, Domain]:
        for key in v:
            if key not in SEARCHABLE:
                raise ValueError(f"search.space key {key!r} is not searchable; allowed: {list(SEARCHABLE)}")
        return v

    @model_validator(mode="after")
    def _kind(self) -> "SearchConfig":
        if self.kind == "optuna":
            if not self.space:
                raise ValueError("search.space must name at least one dimension when search.kind is 'optuna'")
        elif self.space:
            raise ValueError("search.space is only used when search.kind is 'optuna' (grid sweeps use search.grid)")
        metrics = [self.metric] if isinstance(self.metric, str) else list(self.metric)
        modes = [self.mode] if isinstance(self.mode, str) else list(self.mode)
        if len(metrics) != len(modes) or not metrics:
            raise ValueError(f"search.metric and search.mode must have the same length, got {metrics} and {modes}")
        for m in metrics:
            check_report_metric(m, "search.metric")
        return self

    @property
    def all_grids(self) -> tuple[GridConfig, ...]:
        """The grids of a grid search: ``grids``, or ``grid`` alone as one `GridConfig`."""
        return self.grids if self.grids is not None else (GridConfig(grid=self.grid),)

    @property
    def grid_keys(self) -> list[str]:
        """The searched keys of every grid, and the `SEARCHABLE` keys their ``set`` fixes, in
        order of first appearance: the values that tell a grid sweep's trials apart (the
        Tune point of each trial, the progress table's columns)."""
        keys: dict[str, None] = {}
        for g in self.all_grids:
            keys.update(dict.fromkeys(k for k in g.set_ if k in SEARCHABLE))
            keys.update(dict.fromkeys(g.grid))
        return list(keys)

    @property
    def objectives(self) -> list[tuple[str, str]]:
        """``[(metric, mode), ...]``: one for a single objective, several for a Pareto front."""
        metrics = [self.metric] if isinstance(self.metric, str) else list(self.metric)
        modes = [self.mode] if isinstance(self.mode, str) else list(self.mode)
        return list(zip(metrics, modes))
