"""Trace settings as Triton's ``TraceSetting`` shows and changes them, without OpenTelemetry.

Three settings change behaviour: ``trace_level`` (``OFF`` or ``TIMESTAMPS``), ``trace_rate``
(one request in N starts a trace; ``0``: none without a sampled parent) and ``trace_count``
(traces left to record, ``-1``: no limit). ``trace_mode`` is always ``opentelemetry``;
``trace_file`` and ``log_frequency`` belong to Triton's own trace files and are shown with
their empty values, and refused when changed. A model may override any of the three
(``/v2/models/{m}/trace/setting``); a setting sent with no value goes back to the global one
(for a model) or to the configured one (globally), as Triton does::

    book = SettingsBook(TraceSettings(level=TraceLevel.TIMESTAMPS, rate=1.0, count=-1))
    book.update("", {"trace_rate": ["100"]})        # one request in 100
    book.answer("mlp")                               # {"trace_level": ["TIMESTAMPS"], ...}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from reactantserver.core.config import TraceLevel
from reactantserver.core.errors import InvalidArgumentError

__all__ = ["SettingsBook", "TraceSettings"]

_MODE = "opentelemetry"
#: Shown and accepted unchanged only: Triton's trace-file keys have no meaning here.
_FIXED = {"trace_mode": _MODE, "trace_file": "", "log_frequency": "0"}
_LEVELS = {"OFF": TraceLevel.OFF, "TIMESTAMPS": TraceLevel.TIMESTAMPS}


@attrs.define
class TraceSettings:
    """The settings in force for one scope (the process, or one model)."""

    level: TraceLevel
    rate: float
    """Share of requests without a sampled parent that start a trace, in [0, 1]."""
    count: int
    """Traces still to record; -1: no limit."""

    @property
    def tracing(self) -> bool:
        """Whether a request under these settings may be traced at all."""
        return self.level is TraceLevel.TIMESTAMPS and self.count != 0

    def take(self) -> None:
        """One trace recorded: count it down (the lock is the caller's)."""
        if self.count > 0:
            self.count -= 1


def _rate_text(rate: float) -> str:
    return "0" if rate <= 0 else str(max(1, round(1 / rate)))


def _parse_rate(values: Sequence[str]) -> float:
    text = _one("trace_rate", values)
    try:
        number = float(text)
    except ValueError:
        raise InvalidArgumentError(
            f"trace_rate must be a whole number N (trace one request in N), got {text!r}"
        ) from None
    if "." in text:
        if not 0 <= number <= 1:
            raise InvalidArgumentError(f"trace_rate as a fraction must be in [0, 1], got {text}")
        return number
    if number < 0:
        raise InvalidArgumentError(f"trace_rate must be >= 0, got {text}")
    return 0.0 if number == 0 else 1 / number


def _parse_count(values: Sequence[str]) -> int:
    text = _one("trace_count", values)
    try:
        count = int(text)
    except ValueError:
        raise InvalidArgumentError(f"trace_count must be an integer, got {text!r}") from None
    if count < -1:
        raise InvalidArgumentError(f"trace_count must be >= -1, got {count}")
    return count


def _parse_level(values: Sequence[str]) -> TraceLevel:
    levels = set()
    for value in values:
        level = _LEVELS.get(value.upper())
        if level is None:
            raise InvalidArgumentError(
                f"trace_level {value!r} is not supported (use OFF or TIMESTAMPS)"
            )
        levels.add(level)
    if TraceLevel.TIMESTAMPS in levels:
        return TraceLevel.TIMESTAMPS
    return TraceLevel.OFF


def _one(key: str, values: Sequence[str]) -> str:
    if len(values) != 1:
        raise InvalidArgumentError(f"{key} takes one value, got {len(values)}")
    return values[0].strip()


def _overrides(updates: Mapping[str, Sequence[str]]) -> dict[str, object | None]:
    """``updates`` read and checked; ``None`` for a key sent without a value (a reset)."""
    read: dict[str, object | None] = {}
    for key, values in updates.items():
        if key in _FIXED:
            if values and list(values) != [_FIXED[key]]:
                raise InvalidArgumentError(
                    f"{key} cannot be changed: trace_mode is {_MODE} (spans go to the "
                    "configured exporter)"
                )
            continue
        if not values:
            read[key] = None
        elif key == "trace_level":
            read[key] = _parse_level(values)
        elif key == "trace_rate":
            read[key] = _parse_rate(values)
        elif key == "trace_count":
            read[key] = _parse_count(values)
        else:
            known = ", ".join(sorted([*_FIXED, "trace_count", "trace_level", "trace_rate"]))
            raise InvalidArgumentError(f"unknown trace setting {key!r} (known: {known})")
    return read


_FIELDS = {"trace_level": "level", "trace_rate": "rate", "trace_count": "count"}


class SettingsBook:
    """The global settings, each model's overrides and the configured start-up values.

    Not thread-safe by itself: its owner serializes updates (the event loop) and count-downs.
    """

    def __init__(self, configured: TraceSettings) -> None:
        self._configured = attrs.evolve(configured)
        self.global_settings = attrs.evolve(configured)
        #: Per model: the keys it overrides (field name -> value).
        self._model_keys: dict[str, dict[str, object]] = {}
        #: Per model with overrides: its own settings (the others share the global one).
        self.models: dict[str, TraceSettings] = {}

    def for_model(self, model: str) -> TraceSettings:
        """The settings a request for ``model`` follows."""
        return self.models.get(model, self.global_settings)

    @property
    def any_tracing(self) -> bool:
        """Whether any scope may trace a request now."""
        return self.global_settings.tracing or any(s.tracing for s in self.models.values())

    def update(self, model: str, updates: Mapping[str, Sequence[str]]) -> None:
        """Apply ``updates`` (Triton keys -> values) to ``model``'s scope, or the global one.

        Raises :class:`InvalidArgumentError` before changing anything when one is refused.
        """
        read = _overrides(updates)
        if not model:
            for key, value in read.items():
                field = _FIELDS[key]
                chosen = getattr(self._configured, field) if value is None else value
                setattr(self.global_settings, field, chosen)
        else:
            keys = self._model_keys.setdefault(model, {})
            for key, value in read.items():
                if value is None:
                    keys.pop(_FIELDS[key], None)
                else:
                    keys[_FIELDS[key]] = value
            if not keys:
                del self._model_keys[model]
                self.models.pop(model, None)
        self._rebuild(model if "trace_count" in read else None)

    def _rebuild(self, recount: str | None) -> None:
        models: dict[str, TraceSettings] = {}
        for model, keys in self._model_keys.items():
            current = self.models.get(model)
            settings = attrs.evolve(self.global_settings)
            for field, value in keys.items():
                setattr(settings, field, value)
            if current is not None and "count" in keys and model != recount:
                settings.count = current.count  # what it counted down since it was set
            models[model] = settings
        self.models = models

    def answer(self, model: str) -> dict[str, list[str]]:
        """The settings of ``model``'s scope (or the global ones) under Triton's keys."""
        settings = self.for_model(model)
        return {
            "trace_level": [settings.level.value.upper()],
            "trace_rate": [_rate_text(settings.rate)],
            "trace_count": [str(settings.count)],
            **{key: [value] for key, value in _FIXED.items()},
        }
