"""Reading a sweep YAML: safe loading without duplicate keys, ``extends:``, ``--set`` overrides.
"""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from distillab.config.base import _merge, set_dotted
from distillab.config.errors import ConfigError, _errors
from distillab.config.sweep import SweepConfig


class UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader refusing a mapping that gives a key twice (PyYAML keeps the
    last one silently: a grid key or ``trial:`` given twice would lose the first)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if isinstance(key, typing.Hashable) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first given on line {seen[key]})",
                    key_node.start_mark)
            if isinstance(key, typing.Hashable):
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str) -> Any:
    """``text`` read as YAML: safe loading (`UniqueKeyLoader`: no duplicate keys).

    Raises:
        yaml.YAMLError: a syntax error or a duplicate key (`yaml_error_line` says it in one line)."""
    return yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def yaml_error_line(e: yaml.YAMLError) -> str:
    """A YAML error in one line: the problem and where (``line L, column C``), without
    PyYAML's multi-line excerpt of the source."""
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    context = getattr(e, "context", None)
    return f"{where}{problem}" + (f" ({context})" if context and "duplicate key" not in problem else "")


def _read_yaml_mapping(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise FileNotFoundError(f"sweep file {path} does not exist") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot be read as a sweep YAML: {e.strerror if isinstance(e, OSError) else e}") \
            from None
    try:
        data = load_yaml(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {yaml_error_line(e)}") from None
    if data is None or data == {}:  # a sweep of every default is never what an empty file meant
        what = "is empty" if not text.strip() else "holds only comments" if data is None else "is an empty mapping"
        raise ConfigError(f"{path}: the sweep file {what}: give at least its name, or extends: <another sweep YAML>")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    return data


def _resolve_extends(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    path = path.resolve()
    if path in seen:
        chain = " -> ".join(str(p) for p in (*seen, path))
        raise ConfigError(f"{seen[0]}: extends: cycle {chain}")
    data = _read_yaml_mapping(path)
    parent = data.pop("extends", None)
    if parent is None:
        return data
    if not isinstance(parent, str) or not parent:
        raise ConfigError(f"{path}: extends: must be a path to another sweep YAML (relative to this file), "
                          f"got {parent!r}")
    base_path = path.parent / parent
    if not base_path.exists():
        raise ConfigError(f"{path}: extends: {base_path} does not exist")
    return _merge(_resolve_extends(base_path, (*seen, path)), data)


def load_sweep(path: str | Path, overrides: dict[str, Any] | None = None) -> SweepConfig:
    """Read a sweep YAML (safe loader) and validate it.

    A file may start from another with ``extends: <path relative to it>``: the
    base is read first (itself possibly extending another) and this file's keys go
    on top; mappings merge key by key, lists and scalars replace (so a ``search.grid``
    entry replaces that one dimension's values). ``search_spaces/micro_rlvr.yaml``
    extends ``micro.yaml`` this way.

    Args:
        path: the YAML file.
        overrides: dotted-key values applied on top (e.g. ``{"storage_path": "/tmp/x"}``).

    Raises:
        ConfigError: unreadable YAML, a missing or cyclic ``extends``, or any invalid
            field (named in the message).
        FileNotFoundError: no such file.
    """
    return _validated(_resolve_extends(Path(path)), overrides, str(path))


def with_overrides(sweep: SweepConfig, overrides: dict[str, Any] | None) -> SweepConfig:
    """``sweep`` with the dotted-key values ``overrides`` applied on top, validated again: what
    `load_sweep` does with them, on a config already built (``distillab.api.run_sweep``). Without
    overrides, ``sweep`` itself.

    Raises:
        ConfigError: an unknown key or a value a field does not allow (named in the message, with
            the sweep's name).
    """
    if not overrides:
        return sweep
    return _validated(sweep.model_dump(mode="json"), overrides, f"sweep {sweep.name!r}")


def _validated(data: dict[str, Any], overrides: dict[str, Any] | None, source: str) -> SweepConfig:
    """``data`` with ``overrides`` set (`set_dotted`) as a `SweepConfig`; a `ConfigError` names
    ``source`` and the overridden keys."""
    for k, v in (overrides or {}).items():
        set_dotted(data, k, v)
    try:
        return SweepConfig.model_validate(data)
    except ValidationError as e:
        given = f" (with --set {', '.join(overrides)})" if overrides else ""
        raise ConfigError(f"{source}{given}: {_errors(e, SweepConfig)}") from None
