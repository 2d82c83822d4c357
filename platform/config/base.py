"""The strict pydantic bases of every config section, and the dotted-key helpers (flatten a
nested mapping into columns, set a dotted path, merge mappings key by key).
"""

from __future__ import annotations

import copy
import json
from typing import Any

from pydantic import BaseModel, ConfigDict


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _StrictAliased(_Strict):
    """A strict model with fields named in YAML by a Python keyword (``lambda``, ``int``):
    accepted by alias or name, dumped by alias."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, serialize_by_alias=True, validate_by_name=True, validate_by_alias=True
    )


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dict → dotted keys; lists/tuples/dicts of non-scalar leaves become JSON text."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v and all(isinstance(x, str) for x in v) and not _is_leaf_map(key):
            out.update(flatten(v, key + "."))
        elif isinstance(v, (list, tuple, dict)):
            out[key] = json.dumps(v)
        else:
            out[key] = v
    return out


def _is_leaf_map(key: str) -> bool:
    return key.endswith(("pass_temperature", "countdown_examples", "grid"))


def set_dotted(d: dict[str, Any], path: str, value: Any) -> None:
    """Set ``d[a][b][c] = value`` for ``path = "a.b.c"`` (creating dicts)."""
    parts = path.split(".")
    for p in parts[:-1]:
        d = d.setdefault(p, {})
    d[parts[-1]] = value


def _merge(base: dict[str, Any], child: dict[str, Any]) -> dict[str, Any]:
    """``child`` on top of ``base``: mappings merge key by key (recursively); any
    other value (scalars, lists) in ``child`` replaces the base's."""
    out = copy.deepcopy(base)
    for k, v in child.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out
