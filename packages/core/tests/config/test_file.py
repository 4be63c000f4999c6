"""The shared engine's one-pass entry point: a small schema checked, overridden and ordered."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import pytest

from reactantserver.core.config import (
    KeyRules,
    Override,
    config_error,
    setting,
    structure_file,
)
from reactantserver.core.config.rules import InvalidValue, between, non_empty
from reactantserver.core.errors import ConfigError


def _double(value: object) -> object:
    if isinstance(value, int) and not isinstance(value, bool):
        return value * 2
    raise InvalidValue("expected an integer")


@attrs.frozen
class Inner:
    rate: float = setting(1.0, check=between(0, lo_open=True))
    doubled: int = setting(1, parse=_double)


@attrs.frozen
class Outer:
    names: tuple[str, ...] = setting(check=non_empty, each=non_empty, required_hint="name one")
    inner: Inner = Inner()
    weights: Mapping[str, float] = setting(factory=dict, each=between(0))
    entries: Mapping[str, Inner] = setting(factory=dict)


RULES = KeyRules(empty_sections=True)


def _lines(data: dict[str, Any], overrides: list[Override] | None = None) -> list[str]:
    config, problems, origins = structure_file(Outer, data, overrides or [], rules=RULES)
    assert config is None
    return str(config_error(problems, origins)).splitlines()


def test_valid_file_with_empty_sections_and_an_override() -> None:
    data = {"names": ["a"], "inner": None, "entries": {"e": None, "f": {"doubled": 4}}}
    override = Override("X_INNER_RATE", ("inner", "rate"), 2.5)
    config, problems, _ = structure_file(Outer, data, [override], rules=RULES)
    assert problems == []
    assert config == Outer(
        names=("a",), inner=Inner(rate=2.5), entries={"e": Inner(), "f": Inner(doubled=8)}
    )


def test_problems_come_in_schema_order_with_their_variable() -> None:
    data = {
        "zz": 1,
        "names": ["", "b"],
        "inner": {"rate": 0, "typo": 1},
        "weights": {"w": -1},
        "entries": {"e": {"rate": "x"}},
    }
    override = Override("X_INNER_RATE", ("inner", "rate"), 0)
    assert _lines(data, [override]) == [
        "zz: unknown key",
        "names[0]: must not be empty, got string ''",
        "inner.typo: unknown key",
        "inner.rate: must be > 0, got integer 0 (from X_INNER_RATE)",
        "weights.w: must be >= 0, got number -1.0",
        "entries.e.rate: expected a number, got string 'x'",
    ]


def test_required_key_names_its_hint() -> None:
    assert _lines({}) == ["names: required key missing; name one"]


def test_direct_construction_runs_the_item_rule() -> None:
    with pytest.raises(ConfigError, match=r"names\[0\]: must not be empty"):
        Outer(names=("",))
