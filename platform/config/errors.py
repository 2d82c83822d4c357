"""Validation errors in one line per field, unknown fields with the closest allowed name.
"""

from __future__ import annotations

import difflib
import typing
from typing import Any

from pydantic import BaseModel, ValidationError


def _errors(e: ValidationError, root: type[BaseModel] | None = None) -> str:
    """Each error as ``field.path: message`` (a model-level error, whose message names
    its fields itself, without the empty path), pydantic's "Value error, " dropped, a bad
    scalar value quoted after its message ("(got 'sideways')"; a boolean's allowed values after it). An
    unknown field of ``root`` (the validated model) or of a section below it is named with
    the closest allowed name and the allowed names of its section."""
    out = []
    for err in e.errors():
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden" and root is not None:
            msg = _unknown_field(root, err["loc"]) or msg
        elif err["loc"] and isinstance(err.get("input"), (str, int, float, bool)):  # a bad scalar: say what was given
            msg += f" (got {err['input']!r})"
            if err["type"].startswith("bool_"):  # pydantic names no allowed values for a boolean
                msg += "; allowed: true, false"
        loc = ".".join(map(str, err["loc"]))
        out.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(out)


def _unknown_field(root: type[BaseModel], loc: tuple) -> str | None:
    """The message for unknown field ``loc[-1]`` of the section ``loc[:-1]`` of ``root``:
    "unknown field (did you mean 'x'?); allowed: [...]", or None where the section is not
    a model (then pydantic's own message stands)."""
    model: Any = root
    for key in loc[:-1]:
        fields = getattr(model, "model_fields", None)
        model = _model_in(fields[key].annotation) if fields and key in fields else _model_in(model)
        if model is None:
            return None
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return None
    allowed = sorted(f.alias or name for name, f in model.model_fields.items())
    close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown field{hint}; allowed: {allowed}"


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model class inside a field annotation (``X``, ``X | None``, ``dict[str, X]``,
    ``list[X]``), or None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


class ConfigError(ValueError):
    """A sweep file that does not validate; the message names each bad field."""
