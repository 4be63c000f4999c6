"""Strict cattrs structuring of config mappings and rendering of errors as ``<path>: <message>``.

YAML 1.1 turns ``yes``/``no``/``on``/``off`` into booleans, ``660`` into an int and ``1e-3`` into a
string; the hooks here never coerce across types, so each pitfall surfaces as an error with a hint.
"""

from __future__ import annotations

import ast
import enum
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, TypeVar

import attrs
import cattrs
from cattrs.errors import (
    ClassValidationError,
    ForbiddenExtraKeysError,
    IterableValidationError,
    IterableValidationNote,
)
from cattrs.gen import make_dict_structure_fn, override
from cattrs.v import format_exception as _cattrs_format_exception

from reactantserver.core.config._fields import (
    CHECK_KEY,
    EACH_KEY,
    ENV_ONLY_KEY,
    HAND_PARSED_KEY,
    PARSE_KEY,
    REQUIRED_HINT_KEY,
    STRUCTURE_KEY,
    Check,
    InvalidValue,
)
from reactantserver.core.config.rules import (
    describe,
    format_path,
    strict_bool,
    strict_float,
    strict_int,
    strict_str,
)
from reactantserver.core.errors import ConfigError

__all__ = [
    "KeyPath",
    "Origin",
    "Problem",
    "config_error",
    "describe",
    "format_path",
    "make_converter",
    "raise_problems",
    "schema_classes",
    "structure",
]

#: A key path inside one config mapping: keys, and list indices as ints.
KeyPath = tuple[str | int, ...]

_T = TypeVar("_T")


@attrs.frozen
class Origin:
    """Where a value came from, for error messages.

    ``prefix`` is the key path of the block that held it in the node file (``global``,
    ``workers[1]``); ``note`` is appended, e.g. ``from REACTANTSERVER_WORKER_RUNTIME_MEM_FRACTION``.
    """

    prefix: str = ""
    note: str = ""


@attrs.frozen
class Problem:
    """One configuration error at ``path``; ``origin`` overrides the origin lookup."""

    path: KeyPath
    message: str
    origin: Origin | None = None


_SCALARS: Final[Mapping[type, Callable[[object], object]]] = {
    bool: strict_bool,
    int: strict_int,
    float: strict_float,
    str: strict_str,
}


def _scalar_hook(parse: Callable[[object], object]) -> Callable[[object, object], object]:
    # cattrs passes the target type too; the strict parsers only need the value.
    return lambda value, _type: parse(value)


def _structure_choice(value: object, cls: type[enum.StrEnum]) -> enum.StrEnum:
    spellings = getattr(cls, "spellings", None)
    allowed = spellings() if callable(spellings) else ", ".join(m.value for m in cls)
    if isinstance(value, str):
        try:
            return cls(value)
        except ValueError:
            pass
    raise InvalidValue(f"must be one of {allowed}, got {describe(value)}")


def _structure_str_tuple(value: object, type_: object) -> tuple[str, ...]:
    if not isinstance(value, list | tuple):
        raise InvalidValue(f"expected a list of strings, got {describe(value)}")
    items: list[str] = []
    errors: list[Exception] = []
    for index, item in enumerate(value):
        try:
            items.append(strict_str(item))
        except InvalidValue as exc:
            exc.__notes__ = [IterableValidationNote(f"index {index}", index, str)]
            errors.append(exc)
    if errors:
        raise IterableValidationError("invalid list items", errors, tuple)
    return tuple(items)


def _each_errors(each: Check, value: object) -> list[Exception]:
    # One error per list item or mapping value that breaks ``each``, noted with its index/key.
    errors: list[Exception] = []
    if not isinstance(value, tuple | list | Mapping):
        return errors
    items = value.items() if isinstance(value, Mapping) else enumerate(value)
    for key, item in items:
        problem = each(item)
        if problem is not None:
            exc = InvalidValue(f"{problem}, got {describe(item)}")
            exc.__notes__ = [IterableValidationNote(f"item {key!r}", key, object)]
            errors.append(exc)
    return errors


def _field_hook(
    converter: cattrs.Converter, field: attrs.Attribute[Any]
) -> Callable[[object, object], object]:
    check: Check | None = field.metadata.get(CHECK_KEY)
    each: Check | None = field.metadata.get(EACH_KEY)
    pre: Callable[[object], object] | None = field.metadata.get(STRUCTURE_KEY)
    parse: Callable[[object], object] | None = field.metadata.get(PARSE_KEY)
    field_type: Any = field.type

    def hook(value: object, _type: object) -> object:
        if pre is not None:
            value = pre(value)
        result = parse(value) if parse is not None else converter.structure(value, field_type)
        errors = _each_errors(each, result) if each is not None else []
        problem = check(result) if check is not None else None
        if problem is not None:
            errors.append(InvalidValue(f"{problem}, got {describe(value)}"))
        if len(errors) == 1 and not hasattr(errors[0], "__notes__"):
            raise errors[0]
        if errors:
            raise IterableValidationError("invalid value", errors, field_type)
        return result

    return hook


def _is_optional(type_: object) -> bool:
    args = typing.get_args(type_)
    return (
        typing.get_origin(type_) in (typing.Union, types.UnionType)
        and len(args) == 2
        and type(None) in args
    )


def _is_mapping(type_: object) -> bool:
    return typing.get_origin(type_) in (Mapping, dict) and len(typing.get_args(type_)) == 2


def _mapping_hook(
    converter: cattrs.Converter, *, empty_sections: bool
) -> Callable[[object, Any], object]:
    def structure_mapping(value: object, type_: Any) -> object:
        if value is None and empty_sections:
            return {}
        if not isinstance(value, Mapping):
            raise InvalidValue(f"expected a mapping, got {describe(value)}")
        value_type = typing.get_args(type_)[1]
        result: dict[str, object] = {}
        errors: list[Exception] = []
        for key, item in value.items():
            exc: Exception
            if not isinstance(key, str) or not key:
                exc = InvalidValue(f"keys must be non-empty strings, got {describe(key)}")
            else:
                try:
                    result[key] = converter.structure(item, value_type)
                    continue
                except Exception as caught:  # reported with its key, as cattrs does
                    exc = caught
            exc.__notes__ = [
                *getattr(exc, "__notes__", []),
                IterableValidationNote(f"key {key!r}", str(key), value_type),
            ]
            errors.append(exc)
        if errors:
            raise IterableValidationError("invalid mapping", errors, dict)
        return result

    return structure_mapping


def schema_classes(root: type) -> list[type]:
    """``root`` and every attrs class below it, inner classes first (for :func:`make_converter`)."""
    order: list[type] = []

    def visit(cls: type) -> None:
        attrs.resolve_types(cls)
        for field in attrs.fields(cls):
            if field.metadata.get(ENV_ONLY_KEY) or field.metadata.get(HAND_PARSED_KEY):
                continue
            for inner in _nested_classes(field.type):
                visit(inner)
        if cls not in order:
            order.append(cls)

    visit(root)
    return order


def _nested_classes(type_: object) -> list[type]:
    if isinstance(type_, type) and attrs.has(type_):
        return [type_]
    return [inner for arg in typing.get_args(type_) for inner in _nested_classes(arg)]


def make_converter(classes: Sequence[type], *, empty_sections: bool = False) -> cattrs.Converter:
    """A strict converter for ``classes`` (inner classes first): no extra keys, no coercion.

    With ``empty_sections`` a null section or mapping (``health:`` with nothing under it)
    means its defaults, as an absent one does.
    """
    converter = cattrs.Converter(forbid_extra_keys=True)
    for scalar, parse in _SCALARS.items():
        converter.register_structure_hook(scalar, _scalar_hook(parse))
    converter.register_structure_hook_func(lambda t: t == tuple[str, ...], _structure_str_tuple)
    # Registered on the class: a StrEnum is a str, so the str hook would otherwise match.
    converter.register_structure_hook(enum.StrEnum, _structure_choice)

    def structure_optional(value: object, type_: object) -> object:
        # cattrs passes some optional values through unchecked; null means "unset" here.
        if value is None:
            return None
        (inner,) = (arg for arg in typing.get_args(type_) if arg is not type(None))
        return converter.structure(value, inner)

    converter.register_structure_hook_func(_is_optional, structure_optional)
    converter.register_structure_hook_func(
        _is_mapping, _mapping_hook(converter, empty_sections=empty_sections)
    )
    for cls in classes:
        attrs.resolve_types(cls)
        overrides: dict[str, Any] = {}
        for field in attrs.fields(cls):
            if field.metadata.get(ENV_ONLY_KEY) or field.metadata.get(HAND_PARSED_KEY):
                overrides[field.name] = override(omit=True)
            elif _HOOKED_KEYS & field.metadata.keys():
                overrides[field.name] = override(struct_hook=_field_hook(converter, field))
        hook: Callable[[Any, Any], Any] = make_dict_structure_fn(cls, converter, **overrides)
        converter.register_structure_hook(cls, _empty_is_default(hook) if empty_sections else hook)
    return converter


_HOOKED_KEYS: Final = frozenset({CHECK_KEY, EACH_KEY, STRUCTURE_KEY, PARSE_KEY})


def _empty_is_default(hook: Callable[[Any, Any], _T]) -> Callable[[Any, Any], _T]:
    return lambda value, type_: hook({} if value is None else value, type_)


def _format_exception(exc: BaseException, type_: type | None) -> str:
    if isinstance(exc, InvalidValue):
        return str(exc)
    if isinstance(exc, ConfigError):
        # Raised by a class's own rules across its fields: "<key>: <message>" lines.
        return _ACROSS_FIELDS + str(exc)
    if isinstance(exc, ForbiddenExtraKeysError):
        # Split back into one problem per key by structure(), so each key gets its own path.
        return _EXTRA_KEYS + _EXTRA_KEYS.join(sorted(map(str, exc.extra_fields)))
    if isinstance(exc, KeyError):
        return _MISSING
    return _cattrs_format_exception(exc, type_)


_EXTRA_KEYS: Final = "\x00unknown key\x00"
_ACROSS_FIELDS: Final = "\x00across fields\x00"
_MISSING: Final = "required key missing"
_PATH_PART = re.compile(
    r"\.([A-Za-z_][A-Za-z0-9_]*)"
    r"""|\[('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|-?[0-9]+)\]"""
)


def _parse_cattrs_path(text: str) -> KeyPath:
    # transform_error writes $.field, [index] and ['key']; keys are reprs.
    parts: list[str | int] = []
    for match in _PATH_PART.finditer(text.removeprefix("$")):
        name, bracket = match.groups()
        if name is not None:
            parts.append(name)
        else:
            key = ast.literal_eval(bracket)
            parts.append(key if isinstance(key, int) else str(key))
    return tuple(parts)


def structure(
    converter: cattrs.Converter, data: Mapping[str, Any], cls: type[_T], prefix: KeyPath = ()
) -> tuple[_T | None, list[Problem]]:
    """Structure ``data`` into ``cls``; on failure ``None`` and one problem per bad key path.

    A :class:`ConfigError` raised while building a class (a rule across its fields) gives one
    problem per ``<key>: <message>`` line, under that class's path.
    """
    try:
        return converter.structure(data, cls), []
    except (ClassValidationError, IterableValidationError, InvalidValue, ConfigError) as exc:
        problems = []
        for line in cattrs.transform_error(exc, path="$", format_exception=_format_exception):
            message, _, path = line.rpartition(" @ $")
            where = prefix + _parse_cattrs_path("$" + path)
            if message.startswith(_EXTRA_KEYS):
                problems += [
                    Problem((*where, key), "unknown key") for key in message.split(_EXTRA_KEYS)[1:]
                ]
            elif message.startswith(_ACROSS_FIELDS):
                for text in message.removeprefix(_ACROSS_FIELDS).splitlines():
                    key, sep, rest = text.partition(": ")
                    problems.append(Problem((*where, key), rest) if sep else Problem(where, text))
            else:
                if message == _MISSING:
                    hint = _field_at(cls, where[len(prefix) :], REQUIRED_HINT_KEY)
                    message += f"; {hint}" if hint else ""
                problems.append(Problem(where, message))
        return None, problems


def _field_at(cls: type, path: KeyPath, key: str) -> Any:
    # The metadata ``key`` of the field at ``path`` below ``cls`` (None when there is none).
    field: attrs.Attribute[Any] | None = None
    current: object = cls
    for part in path:
        if not (isinstance(current, type) and attrs.has(current)):
            return None
        field = attrs.fields_dict(current).get(str(part))
        if field is None:
            return None
        current = field.type
    return field.metadata.get(key) if field is not None else None


def _origin_of(path: KeyPath, origins: Mapping[KeyPath, Origin]) -> Origin:
    for end in range(len(path), -1, -1):
        origin = origins.get(path[:end])
        if origin is not None:
            return origin
    return Origin()


def raise_problems(
    problems: Sequence[Problem],
    origins: Mapping[KeyPath, Origin] | None = None,
    *,
    source: Path | None = None,
) -> None:
    """Raise :func:`config_error` of ``problems`` unless there are none."""
    if problems:
        raise config_error(problems, origins, source=source)


def config_error(
    problems: Sequence[Problem],
    origins: Mapping[KeyPath, Origin] | None = None,
    *,
    source: Path | None = None,
) -> ConfigError:
    """One :class:`ConfigError` listing every problem, one ``<path>: <message>`` per line.

    The path is prefixed with the block the value came from and the message names the
    environment variable when one set it; ``source`` (the file) ends the message.
    """
    lines = []
    for problem in problems:
        origin = problem.origin or _origin_of(problem.path, origins or {})
        path = format_path(problem.path)
        if origin.prefix:
            path = f"{origin.prefix}.{path}" if path else origin.prefix
        note = f" ({origin.note})" if origin.note else ""
        lines.append(f"{path or '<top level>'}: {problem.message}{note}")
    text = "\n".join(lines)
    if source is not None:
        text += f"\n(in {source})" if len(lines) > 1 else f" (in {source})"
    return ConfigError(text)
