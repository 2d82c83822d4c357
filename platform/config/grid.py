"""Search points: the trial at a point (grid or Optuna), a grid's fixed overrides, a trial's values at keys.
"""

from __future__ import annotations

import copy
from typing import Any

from distillab.config.base import _merge, set_dotted
from distillab.config.trial import TrialConfig


def _apply_set(base: dict[str, Any], overrides: dict[str, Any], where: str) -> dict[str, Any]:
    """A copy of ``base`` (a trial as JSON) with a grid's ``set`` overrides: each dotted path
    set, a mapping merged into the mapping already there (`_merge`).

    Raises:
        ValueError: a path runs through a value that is not a mapping (names it)."""
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        d, parts = out, key.split(".")
        for j, part in enumerate(parts[:-1]):
            d = d.setdefault(part, {})
            if d is None:
                d = {}
            if not isinstance(d, dict):
                raise ValueError(f"{where}.set[{key!r}]: trial field {'.'.join(parts[: j + 1])!r} is not a section")
        last = parts[-1]
        d[last] = _merge(d[last], value) if isinstance(value, dict) and isinstance(d.get(last), dict) else value
    return out


def apply_point(base: dict[str, Any], point: dict[str, Any]) -> TrialConfig:
    """The trial at a search point: ``point``'s dotted keys (`SEARCHABLE`) set on a copy of
    ``base`` (a trial dumped with ``model_dump(mode="json")``), validated. `expand_trials`
    uses it for every grid point, the sweep for every Optuna sample.

    Raises:
        pydantic.ValidationError: the point gives an invalid trial."""
    d = copy.deepcopy(base)
    for k, v in point.items():
        set_dotted(d, k, v)
    return TrialConfig.model_validate(d)


def point_of(trial: TrialConfig, keys: list[str]) -> dict[str, Any]:
    """The values of the dotted ``keys`` in ``trial`` (by YAML name: ``rollout.lambda``)."""
    out = {}
    for key in keys:
        v: Any = trial.model_dump(mode="json")
        for part in key.split("."):
            v = v[part]
        out[key] = v
    return out
