"""Residency floors and their resolution rule."""

from __future__ import annotations

import pytest

from reactantserver.worker.runtime.residency import Residency, resolve_residency


@pytest.mark.parametrize("cache_enabled", [True, False])
@pytest.mark.parametrize("explicit", list(Residency))
def test_configured_residency_wins(explicit: Residency, cache_enabled: bool) -> None:
    assert resolve_residency(explicit, cache_enabled=cache_enabled) is explicit


def test_default_follows_the_cache() -> None:
    assert resolve_residency(None, cache_enabled=True) is Residency.PINNED_SYSTEM
    assert resolve_residency(None, cache_enabled=False) is Residency.UNPINNED


def test_floor_properties() -> None:
    assert [r for r in Residency if r.keeps_host_copy] == [Residency.PINNED_SYSTEM]
    assert [r for r in Residency if not r.evictable] == [Residency.PINNED_DEVICE]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("unpinned", Residency.UNPINNED),
        ("system", Residency.PINNED_SYSTEM),
        ("device", Residency.PINNED_DEVICE),
        ("PINNED_SYSTEM", Residency.PINNED_SYSTEM),
        (" pinned_device ", Residency.PINNED_DEVICE),
    ],
)
def test_parse_accepts_config_and_proto_names(text: str, expected: Residency) -> None:
    assert Residency.parse(text) is expected


def test_parse_rejects_unknown() -> None:
    with pytest.raises(ValueError, match="unknown residency 'gpu'"):
        Residency.parse("gpu")


def test_names_match_the_control_proto() -> None:
    from reactantserver.core.protocol import control_pb2

    proto_names = {v.name for v in control_pb2.Residency.DESCRIPTOR.values if v.number != 0}
    assert proto_names == {r.name for r in Residency}
