"""Building blocks of the gateway config classes: value rules, field helpers, closed choices.

A field's rule (``check``) runs twice: as an attrs validator when a class is built directly, and
in the loader's structuring pass, so that errors name the full key path. Rules return ``None``
when a value is fine, else what it must be (``"must be > 0"``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, Literal, TypeAlias

import attrs

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

#: Largest TCP port.
MAX_PORT: Final = 65535
#: gRPC takes message limits as C ints.
MAX_GRPC_MESSAGE_BYTES: Final = (1 << 31) - 1
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
#: A value rule: ``None`` when the value is fine, else what it must be.
Check: TypeAlias = Callable[[Any], str | None]


class InvalidValue(ValueError):
    """A value breaks its key's rule; the message says what it must be and what it got."""


def format_path(path: Iterable[str | int]) -> str:
    """``("scheduling", "models", "m", "replicas")`` → ``scheduling.models.m.replicas``."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else part
    return text


def describe(value: object) -> str:
    """What a YAML value is, for messages: ``boolean true``, ``string 'yes'``, ``integer 3``."""
    if value is None:
        text = "null"
    elif isinstance(value, bool):
        text = f"boolean {'true' if value else 'false'}"
    elif isinstance(value, enum.Enum):
        text = repr(value.value)
    elif isinstance(value, int):
        text = f"integer {value}"
    elif isinstance(value, float):
        text = f"number {value!r}"
    elif isinstance(value, str):
        text = f"string {value!r}"
    elif isinstance(value, Mapping):
        text = "a mapping"
    elif isinstance(value, list | tuple):
        text = "a list"
    else:
        text = type(value).__name__
    return text


def _num(bound: float | None) -> str:
    return str(bound) if isinstance(bound, int) else f"{bound:g}"


def between(
    lo: float | None = None,
    hi: float | None = None,
    *,
    lo_open: bool = False,
    hi_open: bool = False,
) -> Check:
    """A range rule; ``None`` values (unset optional keys) always pass."""
    if lo is not None and hi is not None:
        text = (
            f"must be in {'(' if lo_open else '['}{_num(lo)}, {_num(hi)}{')' if hi_open else ']'}"
        )
    elif lo is not None:
        text = f"must be {'>' if lo_open else '>='} {_num(lo)}"
    else:
        text = f"must be {'<' if hi_open else '<='} {_num(hi)}"

    def check(value: Any) -> str | None:
        if value is None:
            return None
        if lo is not None and (value <= lo if lo_open else value < lo):
            return text
        if hi is not None and (value >= hi if hi_open else value > hi):
            return text
        return None

    return check


def non_empty(value: Any) -> str | None:
    """Rule of strings and lists that must not be empty."""
    return "must not be empty" if len(value) == 0 else None


def unique(value: Any) -> str | None:
    """Rule of lists whose items must not repeat."""
    seen: set[object] = set()
    for item in value:
        if item in seen:
            return f"must not repeat {item!r}"
        seen.add(item)
    return None


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
