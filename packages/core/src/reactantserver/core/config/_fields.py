"""Building blocks of the config classes: value rules, field helpers, closed choices.

A field's rule (``check``) runs twice: as an attrs validator when a class is built directly, and
as a per-field cattrs hook when a file is structured, so that errors name the full key path.
"""

import enum
import re
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar

import attrs

from reactantserver.core.config.rules import (
    MAX_GRPC_MESSAGE_BYTES,
    MAX_PORT,
    Check,
    InvalidValue,
    between,
    non_empty,
)
from reactantserver.core.errors import ConfigError

__all__ = [
    "CHECK_KEY",
    "ENV_ONLY_KEY",
    "FILE_KEY",
    "GIB",
    "HAND_PARSED_KEY",
    "HOOK_THREADS_CAP",
    "MAX_GRPC_MESSAGE_BYTES",
    "MAX_PORT",
    "STRUCTURE_KEY",
    "Check",
    "Choice",
    "InvalidValue",
    "between",
    "check_octal_mode",
    "env_only",
    "non_empty",
    "required_setting",
    "setting",
]

GIB: Final = 1 << 30
#: Upper bound of the default hook-pool size, ``min(cpu_count, 16)`` (04 §Threads).
HOOK_THREADS_CAP: Final = 16

#: attrs metadata keys read by the structuring, key-walking and env code.
CHECK_KEY: Final = "reactantserver.check"
STRUCTURE_KEY: Final = "reactantserver.structure"
ENV_ONLY_KEY: Final = "reactantserver.env_only"
#: A field that cattrs leaves alone because the loader parses it by hand.
HAND_PARSED_KEY: Final = "reactantserver.hand_parsed"
#: How a field is spelled in the file when that is not its name; ``None``: not a file key.
FILE_KEY: Final = "reactantserver.file_key"

_T = TypeVar("_T")

_OCTAL_MODE = re.compile(r"[0-7]{1,4}")
_MAX_MODE: Final = 0o777


def check_octal_mode(value: Any) -> str | None:
    """Rule of ``runtime.shared_host_weights_mode``: an octal permission string up to ``777``."""
    if not isinstance(value, str) or not _OCTAL_MODE.fullmatch(value):
        return 'must be an octal permission string such as "660"'
    if int(value, 8) > _MAX_MODE:
        return "must be <= 777 (no setuid, setgid or sticky bits)"
    return None


def _validator(check: Check) -> Callable[[Any, "attrs.Attribute[Any]", Any], None]:
    def validate(_instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
        problem = check(value)
        if problem is not None:
            raise ConfigError(f"{attribute.name}: {problem}, got {value!r}")

    return validate


def setting(
    default: _T,
    *,
    check: Check | None = None,
    structure: Callable[[object], object] | None = None,
) -> _T:
    """A config key with its default, its rule and, rarely, a pre-structuring hook."""
    metadata: dict[str, object] = {}
    if check is not None:
        metadata[CHECK_KEY] = check
    if structure is not None:
        metadata[STRUCTURE_KEY] = structure
    validator = _validator(check) if check is not None else None
    return attrs.field(default=default, validator=validator, metadata=metadata)


def required_setting(check: Check) -> Any:
    """A config key without a default (``model_repo``, a worker entry's ``name``)."""
    return attrs.field(validator=_validator(check), metadata={CHECK_KEY: check})


def env_only(default: _T, *, eq: bool = True) -> _T:
    """A field set from the process environment by the loader, never a file key."""
    return attrs.field(default=default, eq=eq, metadata={ENV_ONLY_KEY: True})


# Alias spellings accepted on input and normalised to the canonical value.
_ALIASES: Final[Mapping[str, Mapping[str, str]]] = {
    "Backend": {"gpu": "cuda"},
    "Residency": {"pinned_system": "system", "pinned_device": "device"},
}


class Choice(enum.StrEnum):
    """A closed set of spellings; unknown spellings are resolved through ``_ALIASES``."""

    @classmethod
    def _missing_(cls, value: object) -> Any:
        if isinstance(value, str):
            canonical = _ALIASES.get(cls.__name__, {}).get(value)
            if canonical is not None:
                return cls(canonical)
        return None

    @classmethod
    def spellings(cls) -> str:
        """Every accepted spelling, for error messages: ``cpu, cuda (alias gpu)``."""
        aliases = _ALIASES.get(cls.__name__, {})
        parts = []
        for member in cls:
            extra = [alias for alias, target in aliases.items() if target == member.value]
            parts.append(member.value + (f" (alias {', '.join(extra)})" if extra else ""))
        return ", ".join(parts)
