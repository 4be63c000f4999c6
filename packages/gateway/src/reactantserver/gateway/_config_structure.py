"""Strict structuring of a config mapping into the attrs classes, one problem per bad key path.

YAML 1.1 turns ``yes``/``no`` into booleans and ``1e-3`` into a string; nothing here coerces
across types, so each pitfall surfaces as an error with a hint instead of a surprise.
"""

from __future__ import annotations

import difflib
import enum
import functools
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs

from reactantserver.core.config.rules import strict_bool, strict_float, strict_int, strict_str
from reactantserver.core.errors import ConfigError
from reactantserver.gateway._config_rules import (
    CHECK_KEY,
    EACH_KEY,
    PARSE_KEY,
    PRE_KEY,
    REQUIRED_HINT_KEY,
    InvalidValue,
    KeyPath,
    describe,
    format_path,
)

__all__ = [
    "Problem",
    "config_error",
    "resolved_fields",
    "structure",
    "structure_class",
]


@attrs.frozen
class Problem:
    """One configuration error at ``path``; ``variable`` names the env variable that set it."""

    path: KeyPath
    message: str
    variable: str = ""


class _Invalid:
    """Marks a value that failed; its problems are already recorded."""


_INVALID: Final = _Invalid()


@functools.cache
def resolved_fields(cls: type) -> tuple[attrs.Attribute[Any], ...]:
    """The attrs fields of ``cls`` with their annotations resolved to types."""
    attrs.resolve_types(cls)
    return tuple(attrs.fields(cls))


def _choice(value: object, cls: type[enum.StrEnum]) -> enum.StrEnum:
    if isinstance(value, str):
        try:
            return cls(value)
        except ValueError:
            pass
    spellings = ", ".join(member.value for member in cls)
    raise InvalidValue(f"must be one of {spellings}, got {describe(value)}")


_SCALARS: Final[Mapping[object, Any]] = {
    bool: strict_bool,
    int: strict_int,
    float: strict_float,
    str: strict_str,
}


def _optional_inner(tp: object) -> object | None:
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in args:
        inner: object = next(arg for arg in args if arg is not type(None))
        return inner
    return None


def _attempt(tp: object, raw: object, path: KeyPath, problems: list[Problem]) -> object:
    try:
        return _structure_type(tp, raw, path, problems)
    except InvalidValue as exc:
        problems.append(Problem(path, str(exc)))
        return _INVALID


def _structure_list(raw: object, path: KeyPath, problems: list[Problem]) -> object:
    if not isinstance(raw, list | tuple):
        raise InvalidValue(f"expected a list of strings, got {describe(raw)}")
    items = [_attempt(str, item, (*path, index), problems) for index, item in enumerate(raw)]
    return _INVALID if any(item is _INVALID for item in items) else tuple(items)


def _structure_mapping(
    value_type: object, raw: object, path: KeyPath, problems: list[Problem]
) -> object:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise InvalidValue(f"expected a mapping, got {describe(raw)}")
    result: dict[str, object] = {}
    bad = False
    for key, item in raw.items():
        if not isinstance(key, str) or not key:
            problems.append(
                Problem((*path, str(key)), f"keys must be non-empty strings, got {describe(key)}")
            )
            bad = True
            continue
        value = _attempt(value_type, item, (*path, key), problems)
        bad = bad or value is _INVALID
        result[key] = value
    return _INVALID if bad else result


def _structure_type(tp: Any, raw: object, path: KeyPath, problems: list[Problem]) -> object:
    if isinstance(tp, type) and attrs.has(tp):
        return structure_class(tp, raw, path, problems)
    inner = _optional_inner(tp)
    if inner is not None:
        return None if raw is None else _structure_type(inner, raw, path, problems)
    scalar = _SCALARS.get(tp)
    if scalar is not None:
        return scalar(raw)
    if isinstance(tp, type) and issubclass(tp, enum.StrEnum):
        return _choice(raw, tp)
    origin = typing.get_origin(tp)
    if origin is tuple:
        return _structure_list(raw, path, problems)
    if origin is Mapping:
        return _structure_mapping(typing.get_args(tp)[1], raw, path, problems)
    raise TypeError(f"no structuring rule for {tp!r}")  # pragma: no cover - schema bug


def _checked(
    field: attrs.Attribute[Any], raw: object, value: object, path: KeyPath
) -> list[Problem]:
    problems = []
    each = field.metadata.get(EACH_KEY)
    if each is not None and isinstance(value, tuple | Mapping):
        items = value.items() if isinstance(value, Mapping) else enumerate(value)
        for key, item in items:
            problem = each(item)
            if problem is not None:
                problems.append(Problem((*path, key), f"{problem}, got {describe(item)}"))
    check = field.metadata.get(CHECK_KEY)
    problem = check(value) if check is not None else None
    if problem is not None:
        problems.append(Problem(path, f"{problem}, got {describe(raw)}"))
    return problems


def _structure_field(
    field: attrs.Attribute[Any], raw: object, path: KeyPath, problems: list[Problem]
) -> object:
    pre = field.metadata.get(PRE_KEY)
    if pre is not None:
        raw = pre(raw)
    parse = field.metadata.get(PARSE_KEY)
    try:
        value = (
            parse(raw) if parse is not None else _structure_type(field.type, raw, path, problems)
        )
    except InvalidValue as exc:
        problems.append(Problem(path, str(exc)))
        return _INVALID
    if value is _INVALID:
        return _INVALID
    found = _checked(field, raw, value, path)
    problems += found
    return _INVALID if found else value


def structure_class(cls: type, raw: object, path: KeyPath, problems: list[Problem]) -> object:
    """Build ``cls`` from ``raw`` (``None`` = all defaults), recording problems under ``path``."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        problems.append(Problem(path, f"expected a mapping, got {describe(raw)}"))
        return _INVALID
    fields = {field.name: field for field in resolved_fields(cls)}
    bad = False
    for key in raw:
        if not isinstance(key, str) or key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            problems.append(Problem((*path, str(key)), f"unknown key{hint}"))
            bad = True
    kwargs: dict[str, object] = {}
    for name, field in fields.items():
        where = (*path, name)
        if name not in raw:
            if field.default is attrs.NOTHING:
                required = field.metadata.get(REQUIRED_HINT_KEY)
                problems.append(
                    Problem(where, "required key missing" + (f"; {required}" if required else ""))
                )
                bad = True
            continue
        value = _structure_field(field, raw[name], where, problems)
        bad = bad or value is _INVALID
        kwargs[name] = value
    if bad:
        return _INVALID
    try:
        return cls(**kwargs)
    except ConfigError as exc:  # rules that span fields (field rules already passed)
        for line in str(exc).splitlines():
            key, sep, message = line.partition(": ")
            problems.append(Problem((*path, key), message) if sep else Problem(path, line))
        return _INVALID


def structure(cls: type, data: Mapping[str, Any]) -> tuple[Any, list[Problem]]:
    """``cls`` built from ``data``; on failure ``None`` and every problem found."""
    problems: list[Problem] = []
    result = structure_class(cls, data, (), problems)
    return (None if result is _INVALID else result), problems


def config_error(problems: Sequence[Problem], *, source: Path | None = None) -> ConfigError:
    """One :class:`ConfigError` listing every problem, one ``<path>: <message>`` per line.

    A value set from the environment names its variable; ``source`` (the file) ends the message.
    """
    lines = []
    for problem in problems:
        note = f" (from {problem.variable})" if problem.variable else ""
        lines.append(f"{format_path(problem.path) or '<top level>'}: {problem.message}{note}")
    text = "\n".join(lines)
    if source is not None:
        text += f"\n(in {source})" if len(lines) > 1 else f" (in {source})"
    return ConfigError(text)
