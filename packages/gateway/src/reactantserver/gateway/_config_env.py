"""``REACTANT_GATEWAY_*`` overrides of gateway keys.

Every scalar key has a variable named after its dotted path (``scheduling.routing_fill_mode`` →
``REACTANT_GATEWAY_SCHEDULING_ROUTING_FILL_MODE``); the worker lists and the wedge exit have
the names of the configuration reference. Per-model and per-endpoint maps have none. Everything
here reads
a ``Mapping[str, str]`` handed in by the caller, never ``os.environ``.
"""

from __future__ import annotations

import enum
import math
import typing
from collections.abc import Iterator, Mapping
from typing import Any, Final

import attrs

from reactantserver.gateway._config_rules import PARSE_KEY, InvalidValue
from reactantserver.gateway._config_schema import GatewayConfig
from reactantserver.gateway._config_structure import Problem, resolved_fields

__all__ = [
    "ALIAS_VARIABLES",
    "ENV_KEYS",
    "ENV_PREFIX",
    "FILE_VARIABLE",
    "LIST_VARIABLES",
    "EnvOverride",
    "env_name",
    "parse_env_value",
    "scan_env",
]

ENV_PREFIX: Final = "REACTANT_GATEWAY_"
#: Names the config file; not a key.
FILE_VARIABLE: Final = "REACTANT_GATEWAY_FILE"
#: Comma lists that replace a whole list key.
LIST_VARIABLES: Final[Mapping[str, tuple[str, ...]]] = {
    "REACTANT_GATEWAY_WORKERS": ("endpoints",),
    "REACTANT_GATEWAY_WORKER_METRICS": ("metrics_endpoints",),
    "REACTANT_GATEWAY_WORKER_NAMES": ("worker_names",),
}
#: Short names kept beside the dotted-path variable; the dotted-path one wins when both are set.
ALIAS_VARIABLES: Final[Mapping[str, tuple[str, ...]]] = {
    "REACTANT_GATEWAY_WEDGE_EXIT_ROUNDS": ("health", "wedge_exit_rounds"),
}

_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off"})


def env_name(path: tuple[str, ...]) -> str:
    """The variable of a key: ``listen.grpc`` → ``REACTANT_GATEWAY_LISTEN_GRPC``."""
    return ENV_PREFIX + "_".join(path).upper()


def _leaves(cls: type, prefix: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Any]]:
    for field in resolved_fields(cls):
        path = (*prefix, field.name)
        if isinstance(field.type, type) and attrs.has(field.type):
            yield from _leaves(field.type, path)
        elif not _is_container(field.type):
            yield path, field


def _is_container(tp: object) -> bool:
    return typing.get_origin(tp) in (tuple, Mapping)


def _build_keys() -> dict[str, tuple[tuple[str, ...], Any]]:
    table: dict[str, tuple[tuple[str, ...], Any]] = {}
    for path, field in _leaves(GatewayConfig, ()):
        name = env_name(path)
        if name in table or name in LIST_VARIABLES or name == FILE_VARIABLE:
            raise RuntimeError(f"{name} names two keys")  # pragma: no cover - schema bug
        table[name] = (path, field)
    return table


#: Variable → (key path, attrs field) for every scalar key.
ENV_KEYS: Final[Mapping[str, tuple[tuple[str, ...], Any]]] = _build_keys()


@attrs.frozen
class EnvOverride:
    """One parsed variable: ``variable`` sets the key at ``path`` to ``value``."""

    variable: str
    path: tuple[str, ...]
    value: object


def _number_or_word(raw: str) -> object:
    # Keys with their own parser (replicas, startup wait) take ints, floats and words.
    text = raw.strip()
    try:
        return int(text, 10)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def parse_env_value(raw: str, field: attrs.Attribute[Any]) -> object:
    """A variable's text as a value of ``field``'s type; :class:`InvalidValue` says why not."""
    text = raw.strip()
    tp = field.type
    if PARSE_KEY in field.metadata:
        return _number_or_word(text)
    if tp is bool:
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise InvalidValue(f"cannot parse {raw!r} as a boolean (1/true/yes/on or 0/false/no/off)")
    if tp is int:
        try:
            return int(text, 10)
        except ValueError:
            raise InvalidValue(f"cannot parse {raw!r} as an integer") from None
    if tp is float:
        try:
            number = float(text)
        except ValueError:
            raise InvalidValue(f"cannot parse {raw!r} as a number") from None
        if not math.isfinite(number):
            raise InvalidValue(f"cannot parse {raw!r} as a finite number")
        return number
    if tp is str or (isinstance(tp, type) and issubclass(tp, enum.StrEnum)):
        return text  # choices are checked when structured, with the variable named
    raise TypeError(f"no environment parser for {tp!r}")  # pragma: no cover - schema bug


def _comma_list(raw: str) -> list[str]:
    return [part.strip() for part in raw.split(",") if part.strip()]


def scan_env(env: Mapping[str, str]) -> tuple[list[EnvOverride], list[Problem]]:
    """The overrides ``env`` asks for, in the order to apply them, and unparsable values.

    Unknown ``REACTANT_GATEWAY_*`` variables are ignored (other programs share the prefix);
    an empty value counts as unset.
    """
    overrides: list[EnvOverride] = []
    problems: list[Problem] = []
    for variable, path in LIST_VARIABLES.items():
        if env.get(variable, "").strip():
            overrides.append(EnvOverride(variable, path, _comma_list(env[variable])))
    names = [v for v in ALIAS_VARIABLES if v in env] + sorted(v for v in env if v in ENV_KEYS)
    for variable in names:
        raw = env[variable]
        if not raw.strip():
            continue
        path = ALIAS_VARIABLES.get(variable) or ENV_KEYS[variable][0]
        field = ENV_KEYS[env_name(path)][1]
        try:
            value = parse_env_value(raw, field)
        except InvalidValue as exc:
            problems.append(Problem(path, str(exc), variable))
            continue
        overrides.append(EnvOverride(variable, path, value))
    return overrides, problems
