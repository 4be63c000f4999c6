"""SetModelPlacement semantics over per-model overrides."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from reactantserver.core.protocol import control_pb2
from reactantserver.gateway.policies.knobs import (
    INFLIGHT_HAZARD,
    KnobError,
    SchedulingKnobs,
    UnknownModelError,
)
from reactantserver.gateway.policies.lpt.overrides import (
    ModelOverride,
    PlacementResult,
    apply_placement_request,
    fill_quantum,
)

Request = control_pb2.SetModelPlacementRequest
NEXT_REPACK = "replica changes take effect at the next repack"


def place(
    request: control_pb2.SetModelPlacementRequest,
    overrides: Mapping[str, ModelOverride] | None = None,
    *,
    ready: int = 3,
    knobs: SchedulingKnobs | None = None,
) -> PlacementResult:
    return apply_placement_request(
        overrides or {}, request, known_models={"a", "b"}, ready_workers=ready, knobs=knobs
    )


def test_override_validation_and_inherit() -> None:
    assert ModelOverride(fill_mode="inherit") == ModelOverride()
    assert ModelOverride().is_default
    assert not ModelOverride(replicas="all").is_default
    with pytest.raises(KnobError) as caught:
        ModelOverride(replicas=0, fill_mode="fast", fill_factor=0.0)
    assert caught.value.fields == ("replicas", "fill_mode", "fill_factor")


def test_fill_quantum() -> None:
    assert fill_quantum(1.0, 32) == 32
    assert fill_quantum(0.5, 5) == 2  # round half to even, as Python rounds
    assert fill_quantum(0.01, 8) == 1
    assert fill_quantum(2.0, 0) == 1


def test_set_replicas_stores_an_override_and_warns_about_the_next_repack() -> None:
    got = place(Request(name="a", replicas=2))
    assert got.overrides == {"a": ModelOverride(replicas=2)}
    assert got.override == ModelOverride(replicas=2)
    assert (got.configured_replicas, got.effective_replicas) == (2, 2)
    assert (got.fill_mode, got.fill_factor) == ("run", 1.0)
    assert got.warnings == (NEXT_REPACK,)


def test_all_is_minus_one_and_clamps_to_the_ready_workers() -> None:
    got = place(Request(name="a", replicas=-1), ready=4)
    assert got.override == ModelOverride(replicas="all")
    assert (got.configured_replicas, got.effective_replicas) == (-1, 4)


def test_more_replicas_than_ready_workers_is_clamped_with_a_warning() -> None:
    got = place(Request(name="a", replicas=5), ready=2)
    assert (got.configured_replicas, got.effective_replicas) == (5, 2)
    assert "5 replicas configured but only 2 workers were ready" in got.warnings[1]
    none = place(Request(name="a", replicas=-1), ready=0)
    assert none.effective_replicas == 0
    assert "no worker was ready" in none.warnings[-1]


def test_replicas_zero_clears_and_an_all_default_override_is_deleted() -> None:
    got = place(
        Request(name="a", replicas=0),
        {"a": ModelOverride(replicas=2), "b": ModelOverride(replicas=3)},
    )
    assert got.overrides == {"b": ModelOverride(replicas=3)}
    assert got.override is None
    assert got.configured_replicas == 0
    assert got.effective_replicas == 1  # default_replicas
    assert got.warnings == (NEXT_REPACK,)
    wide = place(
        Request(name="a"),
        {"a": ModelOverride(replicas=2)},
        knobs=SchedulingKnobs(default_replicas="all"),
    )
    assert wide.effective_replicas == 3


def test_fill_mode_empty_keeps_inherit_clears_and_a_value_sets() -> None:
    old = {"a": ModelOverride(replicas=2, fill_mode="spread", fill_factor=0.5)}
    kept = place(Request(name="a", replicas=2, fill_factor=-1), old)
    assert kept.override == old["a"]
    assert kept.warnings == ()
    assert (kept.fill_mode, kept.fill_factor) == ("spread", 0.5)
    cleared = place(Request(name="a", replicas=2, fill_mode="inherit", fill_factor=-1), old)
    assert cleared.override == ModelOverride(replicas=2, fill_factor=0.5)
    assert cleared.fill_mode == "run"
    spread_default = SchedulingKnobs(routing_fill_mode="spread")
    inherited = place(Request(name="a", replicas=2, fill_mode="inherit"), old, knobs=spread_default)
    assert inherited.fill_mode == "spread"
    hazard = place(Request(name="a", replicas=2, fill_mode="inflight"), old)
    assert hazard.fill_mode == "inflight"
    assert hazard.warnings == (INFLIGHT_HAZARD,)


def test_fill_factor_negative_keeps_zero_clears_positive_sets() -> None:
    old = {"a": ModelOverride(replicas=2, fill_factor=0.5)}
    assert place(Request(name="a", replicas=2, fill_factor=-1), old).fill_factor == 0.5
    cleared = place(
        Request(name="a", replicas=2, fill_factor=0),
        old,
        knobs=SchedulingKnobs(routing_fill_factor=2.0),
    )
    assert cleared.override == ModelOverride(replicas=2)
    assert cleared.fill_factor == 2.0
    assert place(Request(name="a", replicas=2, fill_factor=4), old).fill_factor == 4.0


def test_proto_defaults_clear_replicas_and_fill_factor() -> None:
    # Spec: replicas 0 and fill_factor 0 clear, so a request carrying only a fill mode clears
    # both; only fill_mode has an "unchanged" default ("").
    old = {"a": ModelOverride(replicas=2, fill_factor=3.0)}
    got = place(Request(name="a", fill_mode="spread"), old)
    assert got.override == ModelOverride(fill_mode="spread")
    assert got.warnings == (NEXT_REPACK,)


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (Request(name=""), "name"),
        (Request(name="a", replicas=-2), "replicas"),
        (Request(name="a", fill_mode="fast"), "fill_mode"),
        (Request(name="a", fill_factor=float("nan")), "fill_factor"),
        (Request(name="zzz", replicas=-2), "replicas"),  # invalid before not found
    ],
)
def test_invalid_requests(request_: control_pb2.SetModelPlacementRequest, field: str) -> None:
    with pytest.raises(KnobError) as caught:
        place(request_)
    assert caught.value.fields == (field,)


def test_unknown_model_is_not_found_unless_allowed() -> None:
    with pytest.raises(UnknownModelError, match="allow_unknown_model"):
        place(Request(name="zzz", replicas=2))
    got = place(Request(name="zzz", replicas=2, allow_unknown_model=True))
    assert got.overrides == {"zzz": ModelOverride(replicas=2)}
    assert "not routed now" in got.warnings[0]


def test_the_input_map_is_left_untouched() -> None:
    old = {"a": ModelOverride(replicas=2)}
    got = place(Request(name="a", replicas=3), old)
    assert old == {"a": ModelOverride(replicas=2)}
    assert got.overrides == {"a": ModelOverride(replicas=3)}


def test_to_response() -> None:
    got = place(Request(name="a", replicas=2, fill_mode="spread", fill_factor=0.5))
    wire = got.to_response(fill_quantum(got.fill_factor, 16), ["memory: 12 GB over budget"])
    assert wire == control_pb2.SetModelPlacementResponse(
        name="a",
        configured_replicas=2,
        effective_replicas=2,
        fill_mode="spread",
        fill_quantum=8,
        warnings=[NEXT_REPACK, "memory: 12 GB over budget"],
        persisted=False,
    )
