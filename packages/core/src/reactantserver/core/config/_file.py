"""One file's mapping and its environment overrides, checked and structured in one pass.

For files whose every problem is reported at once (the gateway's): unknown keys, bad values and
rules across fields come back together, in the order of the schema (a section's unknown keys
before its keys; keys in declaration order; map entries as written), each naming the variable
that set its value. The worker's layered pipeline (``_worker``) uses the same key check and
converter in stages instead.
"""

from __future__ import annotations

import functools
import typing
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import cattrs

from reactantserver.core.config._env import PendingOverride
from reactantserver.core.config._keys import KeyRules, check_keys, file_fields
from reactantserver.core.config._structure import (
    KeyPath,
    Origin,
    Problem,
    make_converter,
    schema_classes,
    structure,
)

__all__ = ["Origins", "structure_file"]

Origins = dict[KeyPath, Origin]


@functools.cache
def _converter(schema: type, empty_sections: bool) -> cattrs.Converter:
    return make_converter(schema_classes(schema), empty_sections=empty_sections)


def _plain(value: object) -> object:
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def _set_existing(raw: dict[Any, Any], path: tuple[str, ...], value: object) -> None:
    # Sections on the way are created when absent or null; a non-mapping one is left for the
    # structuring to report ("expected a mapping"), not overwritten.
    node = raw
    for key in path[:-1]:
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        if not isinstance(child, dict):
            return
        node = child
    node[path[-1]] = value


def _position(schema: type, raw: object, path: KeyPath) -> tuple[tuple[int, int], ...]:
    # Sort key of a problem: per level, unknown keys (0, as written) before schema keys
    # (1, declared); map entries and list items as written; a key's own problems after those
    # of its items (2).
    key: list[tuple[int, int]] = []
    current: object = schema
    for part in path:
        written = [str(name) for name in raw] if isinstance(raw, Mapping) else []
        order = written.index(str(part)) if str(part) in written else len(written)
        if isinstance(current, type) and attrs.has(current):
            names = list(file_fields(current))
            if part not in names:
                key.append((0, order))
                break
            key.append((1, names.index(str(part))))
            current = file_fields(current)[str(part)].type
        elif typing.get_origin(current) in (Mapping, dict):
            key.append((1, order))
            current = typing.get_args(current)[1]
        else:
            key.append((1, part if isinstance(part, int) else order))
        raw = raw.get(part) if isinstance(raw, Mapping) else None
    return (*key, (2, 0))


def structure_file(
    schema: type,
    data: Mapping[str, Any],
    overrides: Sequence[PendingOverride],
    *,
    rules: KeyRules,
) -> tuple[Any | None, list[Problem], Origins]:
    """``data`` with ``overrides`` applied, structured into ``schema`` in one pass.

    Returns the configuration (``None`` on any problem), every problem in schema order, and
    where the overridden values came from (for :func:`config_error`).
    """
    raw: dict[Any, Any] = _plain(data)  # type: ignore[assignment]
    origins: Origins = {}
    for pending in overrides:
        _set_existing(raw, pending.path, pending.value)
        origins[pending.path] = pending.origin
    problems = check_keys(raw, Origin(), schema, (), rules)
    config, found = structure(_converter(schema, rules.empty_sections), raw, schema)
    # A bad key or section is reported once, by the key check.
    reported = [problem.path for problem in problems]
    problems += [p for p in found if not any(p.path[: len(bad)] == bad for bad in reported)]
    problems.sort(key=lambda problem: _position(schema, raw, problem.path))
    return (None if problems else config), problems, origins
