"""Building blocks of the gateway config classes: value rules, field helpers, closed choices.

A field's rule (``check``) runs twice: as an attrs validator when a class is built directly, and
in the loader's structuring pass, so that errors name the full key path. Rules return ``None``
when a value is fine, else what it must be (``"must be > 0"``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final, Literal, TypeAlias

import attrs

from reactantserver.core.config.rules import (
    MAX_GRPC_MESSAGE_BYTES,
    MAX_PORT,
    Check,
    InvalidValue,
    between,
    describe,
    format_path,
    non_empty,
    unique,
)
from reactantserver.core.errors import ConfigError

__all__ = [
    "ALL_REPLICAS",
    "CHECK_KEY",
    "EACH_KEY",
    "MAX_GRPC_MESSAGE_BYTES",
    "MAX_PORT",
    "PARSE_KEY",
    "PRE_KEY",
    "REQUIRED_HINT_KEY",
    "Check",
    "InvalidValue",
    "KeyPath",
    "Replicas",
    "address",
    "between",
    "describe",
    "format_path",
    "non_empty",
    "parse_replicas",
    "setting",
    "unique",
]

ALL_REPLICAS: Final = "all"

Replicas: TypeAlias = int | Literal["all"]
"""A replica count: an int >= 1 or ``"all"`` (every worker)."""

#: attrs metadata keys read by the structuring and env code.
CHECK_KEY: Final = "reactantserver.gateway.check"
EACH_KEY: Final = "reactantserver.gateway.each"
PARSE_KEY: Final = "reactantserver.gateway.parse"
PRE_KEY: Final = "reactantserver.gateway.pre"
REQUIRED_HINT_KEY: Final = "reactantserver.gateway.required_hint"

#: A key path inside the config mapping: keys, and list indices as ints.
KeyPath: TypeAlias = tuple[str | int, ...]


def _port_text(lo: int) -> str:
    return f'must be "host:port" (IPv6 as "[::1]:port") with a port in [{lo}, {MAX_PORT}]'


def address(*, min_port: int) -> Check:
    """Rule of ``host:port`` strings; IPv6 hosts in brackets; ports from ``min_port``."""
    text = _port_text(min_port)

    def check(value: Any) -> str | None:
        if not isinstance(value, str) or any(c.isspace() for c in value):
            return text
        host, _, port = value.rpartition(":")
        if host.startswith("["):
            host_ok = host.endswith("]") and len(host) > 2 and "]" not in host[1:-1]
        else:
            host_ok = bool(host) and not any(c in host for c in ":[]")
        if host_ok and port.isascii() and port.isdigit() and min_port <= int(port) <= MAX_PORT:
            return None
        return text

    return check


def parse_replicas(value: object) -> Replicas | None:
    """A replica count from a file or env value: an int >= 1 or ``all``; ``None`` = inherit."""
    if value is None or value == ALL_REPLICAS:
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    raise InvalidValue(f"must be an integer >= 1 or {ALL_REPLICAS}, got {describe(value)}")


def _validator(
    check: Check, each: Check | None
) -> Callable[[Any, attrs.Attribute[Any], Any], None]:
    def validate(_instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        problems = []
        if each is not None:
            items = value.items() if isinstance(value, Mapping) else enumerate(value)
            for key, item in items:
                problem = each(item)
                if problem is not None:
                    where = f"[{key}]" if isinstance(key, int) else f".{key}"
                    problems.append(f"{attribute.name}{where}: {problem}, got {item!r}")
        problem = check(value)
        if problem is not None:
            problems.append(f"{attribute.name}: {problem}, got {value!r}")
        if problems:
            raise ConfigError("\n".join(problems))

    return validate


def _no_check(_value: Any) -> str | None:
    return None


def setting(
    default: Any = attrs.NOTHING,
    *,
    check: Check | None = None,
    each: Check | None = None,
    parse: Callable[[object], object] | None = None,
    pre: Callable[[object], object] | None = None,
    converter: Callable[[Any], Any] | None = None,
    factory: Callable[[], Any] | None = None,
    required_hint: str = "",
) -> Any:
    """A config key with its default, its rule (``each``: per list item or mapping value).

    ``parse`` replaces type-driven structuring (values that are not one plain type); ``pre``
    rewrites a raw value before structuring; ``required_hint`` extends "required key missing".
    """
    metadata: dict[str, object] = {}
    for key, value in (
        (CHECK_KEY, check),
        (EACH_KEY, each),
        (PARSE_KEY, parse),
        (PRE_KEY, pre),
        (REQUIRED_HINT_KEY, required_hint or None),
    ):
        if value is not None:
            metadata[key] = value
    validator = (
        _validator(check or _no_check, each) if check is not None or each is not None else None
    )
    mapping = factory is not None
    return attrs.field(
        default=attrs.Factory(factory) if factory is not None else default,
        validator=validator,
        converter=converter,
        metadata=metadata,
        hash=False if mapping else None,
    )
