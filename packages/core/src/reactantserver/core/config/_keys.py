"""The key tree of the worker configuration: unknown and removed keys, and the settable leaves.

The walk runs on each raw block before merging, so an error names the block it is in
(``global.runtime.mem_frac``) and a removed key carries its migration hint.
"""

from __future__ import annotations

import difflib
import typing
from collections.abc import Iterator, Mapping
from typing import Any, Final

import attrs

from reactantserver.core.config._fields import ENV_ONLY_KEY
from reactantserver.core.config._schema import WorkerConfig
from reactantserver.core.config._structure import KeyPath, Origin, Problem, describe

__all__ = [
    "REMOVED_KEYS",
    "WORKER_KEY_RULES",
    "KeyRules",
    "check_keys",
    "file_fields",
    "iter_leaf_fields",
    "iter_leaves",
    "removed_hint",
]

#: Removed keys and their migration hints; ``*`` stands for any model name.
REMOVED_KEYS: Final[Mapping[tuple[str, ...], str]] = {
    ("batch_policy",): "use scheduler.models.<m>.max_batch_size",
    ("runtime", "residency_mode"): "use model_control_mode",
    ("scheduler", "dispatch_timeout_seconds"): "no execution watchdog exists",
    ("scheduler", "models", "*", "pin_to_gpu"): "use residency: device",
}


@attrs.frozen
class KeyRules:
    """How one file's key tree is checked beyond its schema.

    ``removed`` maps removed keys (``*``: any name) to migration hints. ``empty_sections``: a
    null section or map entry means its defaults (else it is an error). ``entry_names`` is
    what the keys of a map of sections are called in messages (``model names``).
    """

    removed: Mapping[tuple[str, ...], str] = attrs.field(factory=dict)
    empty_sections: bool = False
    entry_names: str = "keys"


#: The worker keys' rules.
WORKER_KEY_RULES: Final = KeyRules(REMOVED_KEYS, entry_names="model names")


def removed_hint(
    path: KeyPath, removed_keys: Mapping[tuple[str, ...], str] = REMOVED_KEYS
) -> str | None:
    """The migration hint when ``path`` is a removed key, else ``None``."""
    for removed, hint in removed_keys.items():
        if len(removed) == len(path) and all(
            want in ("*", got) for want, got in zip(removed, path, strict=True)
        ):
            return hint
    return None


def file_fields(cls: type) -> dict[str, attrs.Attribute[Any]]:
    """The fields of an attrs config class that a file may set, by key."""
    attrs.resolve_types(cls)
    return {f.name: f for f in attrs.fields(cls) if not f.metadata.get(ENV_ONLY_KEY)}


def _mapping_value_type(field_type: object) -> type | None:
    # Mapping[str, X] → X when X is an attrs class (scheduler.models).
    if typing.get_origin(field_type) in (Mapping, dict):
        args = typing.get_args(field_type)
        if len(args) == 2 and isinstance(args[1], type) and attrs.has(args[1]):
            return args[1]
    return None


def _unknown(key: str, known: Mapping[str, object]) -> str:
    close = difflib.get_close_matches(key, list(known), n=1)
    return "unknown key" + (f" (did you mean {close[0]}?)" if close else "")


def check_keys(
    data: Mapping[Any, Any],
    origin: Origin,
    cls: type = WorkerConfig,
    path: KeyPath = (),
    rules: KeyRules = WORKER_KEY_RULES,
) -> list[Problem]:
    """Every unknown key, removed key, non-string key and non-mapping section in ``data``."""
    problems: list[Problem] = []
    fields = file_fields(cls)
    for key, value in data.items():
        if not isinstance(key, str):
            problems.append(
                Problem((*path, str(key)), f"keys must be strings, got {describe(key)}", origin)
            )
            continue
        here = (*path, key)
        hint = removed_hint(here, rules.removed)
        if hint is not None:
            problems.append(Problem(here, f"removed key; {hint}", origin))
            continue
        field = fields.get(key)
        if field is None:
            problems.append(Problem(here, _unknown(key, fields), origin))
            continue
        if value is None and rules.empty_sections:
            continue
        if isinstance(field.type, type) and attrs.has(field.type):
            if not isinstance(value, Mapping):
                problems.append(Problem(here, f"expected a mapping, got {describe(value)}", origin))
            else:
                problems += check_keys(value, origin, field.type, here, rules)
            continue
        entry_type = _mapping_value_type(field.type)
        if entry_type is not None:
            problems += _check_entries(value, origin, entry_type, here, rules)
    return problems


def _check_entries(
    value: object, origin: Origin, entry_type: type, path: KeyPath, rules: KeyRules
) -> list[Problem]:
    if not isinstance(value, Mapping):
        return [
            Problem(
                path, f"expected a mapping of {rules.entry_names}, got {describe(value)}", origin
            )
        ]
    problems: list[Problem] = []
    for name, entry in value.items():
        if not isinstance(name, str) or not name:
            message = f"{rules.entry_names} must be non-empty strings, got {describe(name)}"
            if isinstance(name, bool):
                message += "; YAML reads unquoted yes/no/on/off as booleans, so quote it"
            problems.append(Problem((*path, str(name)), message, origin))
        elif entry is None and rules.empty_sections:
            continue
        elif not isinstance(entry, Mapping):
            problems.append(
                Problem((*path, name), f"expected a mapping, got {describe(entry)}", origin)
            )
        else:
            problems += check_keys(entry, origin, entry_type, (*path, name), rules)
    return problems


def iter_leaves(
    cls: type = WorkerConfig, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every scalar or list key of the file schema with its type, except per-model keys."""
    for here, field in iter_leaf_fields(cls, path):
        yield here, field.type


def iter_leaf_fields(
    cls: type, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], attrs.Attribute[Any]]]:
    """Every key of ``cls`` that is not a section or a map, with its attrs field, in order."""
    for name, field in file_fields(cls).items():
        if isinstance(field.type, type) and attrs.has(field.type):
            yield from iter_leaf_fields(field.type, (*path, name))
        elif typing.get_origin(field.type) not in (Mapping, dict):
            yield (*path, name), field
