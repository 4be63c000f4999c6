"""SchedulingKnobs and SetSchedulingPolicy / Repack semantics of ``GatewayControl``."""

from __future__ import annotations

import math
import re

import attrs
import grpc
import pytest

from reactantserver.core.errors import status_of
from reactantserver.core.protocol import control_pb2
from reactantserver.gateway.policies.knobs import (
    INFLIGHT_HAZARD,
    MAX_REPACK_WAIT_SECONDS,
    KnobError,
    KnobModeError,
    SchedulingKnobs,
    UnknownModelError,
    apply_policy_request,
    apply_policy_update,
    check_mode,
    to_proto,
    validate_repack_wait,
)

Policy = control_pb2.SchedulingPolicy


def update(
    mask: list[str],
    policy: control_pb2.SchedulingPolicy | None,
    *,
    knobs: SchedulingKnobs | None = None,
    mode: str = "lpt_packing",
    accumulated: float = 0.0,
    first_done: bool = False,
) -> tuple[SchedulingKnobs, list[str]]:
    return apply_policy_update(
        knobs or SchedulingKnobs(),
        mask,
        policy,
        mode=mode,
        compute_accumulated=accumulated,
        first_repack_done=first_done,
    )


# --- the snapshot --------------------------------------------------------------------------------


def test_defaults_are_the_configuration_table() -> None:
    k = SchedulingKnobs()
    assert (k.rebalance_compute_seconds, k.first_rebalance_compute_seconds) == (300.0, 60.0)
    assert (k.hysteresis, k.ema_halflife_compute_seconds, k.default_replicas) == (0.0, 0.0, 1)
    assert (k.routing_policy, k.routing_fill_factor, k.routing_fill_mode) == (
        "fill_least",
        1.0,
        "run",
    )
    assert (k.compaction_mode, k.compaction_interval) == ("eager", 1)
    assert k.forbid_memory_oversubscription is True
    assert k.work_basis == "compute"
    assert (k.cold_load_penalty, k.default_load_bandwidth_bytes_per_second) == (1.0, 8e9)
    assert (k.load_overhead_seconds, k.generation) == (0.005, 0)


def test_halflife_tracks_rebalance_until_set() -> None:
    assert SchedulingKnobs(rebalance_compute_seconds=120).halflife == 120
    assert SchedulingKnobs(ema_halflife_compute_seconds=30).halflife == 30


def test_active_threshold_is_the_first_budget_until_the_first_tick_repack() -> None:
    k = SchedulingKnobs(rebalance_compute_seconds=300, first_rebalance_compute_seconds=60)
    assert k.active_threshold(first_repack_done=False) == 60
    assert k.active_threshold(first_repack_done=True) == 300
    zero_first = attrs.evolve(k, first_rebalance_compute_seconds=0.0)
    assert zero_first.active_threshold(first_repack_done=False) == 300


def test_to_proto_resolves_halflife_and_encodes_all_as_minus_one() -> None:
    wire = to_proto(SchedulingKnobs(rebalance_compute_seconds=90, default_replicas="all"))
    assert wire.ema_halflife_compute_seconds == 90
    assert wire.default_replicas == -1
    assert wire.routing_fill_mode == "run"
    assert wire.forbid_memory_oversubscription is True
    assert wire.default_load_bandwidth_bytes_per_second == 8e9
    assert to_proto(SchedulingKnobs(default_replicas=3)).default_replicas == 3


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("rebalance_compute_seconds", 0.0),
        ("rebalance_compute_seconds", math.inf),
        ("first_rebalance_compute_seconds", -1.0),
        ("hysteresis", 1.0),
        ("hysteresis", -0.1),
        ("ema_halflife_compute_seconds", -1.0),
        ("ema_halflife_compute_seconds", math.nan),
        ("default_replicas", 0),
        ("default_replicas", "some"),
        ("routing_policy", "least"),
        ("routing_fill_factor", 0.0),
        ("routing_fill_mode", "inherit"),
        ("compaction_mode", "lazy"),
        ("compaction_interval", -1),
        ("compaction_interval", 1.5),
        ("forbid_memory_oversubscription", 1),
        ("work_basis", "bytes"),
        ("cold_load_penalty", 0.9),
        ("default_load_bandwidth_bytes_per_second", 0.0),
        ("load_overhead_seconds", -0.001),
        ("generation", -1),
    ],
)
def test_construction_enforces_the_yaml_bounds(field: str, value: object) -> None:
    with pytest.raises(KnobError, match=field) as caught:
        SchedulingKnobs(**{field: value})  # type: ignore[arg-type]
    assert caught.value.fields == (field,)


def test_construction_reports_every_bad_field_at_once() -> None:
    with pytest.raises(KnobError) as caught:
        SchedulingKnobs(hysteresis=2.0, routing_fill_factor=-1.0)
    assert caught.value.fields == ("hysteresis", "routing_fill_factor")


def test_from_values_takes_yaml_and_env_spellings() -> None:
    k = SchedulingKnobs.from_values(
        {
            "rebalance_compute_seconds": 120,
            "hysteresis": "0.25",
            "default_replicas": "ALL",
            "work_basis": "Items",
            "forbid_memory_oversubscription": "false",
            "compaction_interval": "3",
            "routing_fill_mode": "spread",
        }
    )
    assert k.rebalance_compute_seconds == 120.0
    assert isinstance(k.rebalance_compute_seconds, float)
    assert (k.hysteresis, k.default_replicas, k.work_basis) == (0.25, "all", "items")
    assert (k.forbid_memory_oversubscription, k.compaction_interval) == (False, 3)
    assert k.routing_fill_mode == "spread"
    assert SchedulingKnobs.from_values({}) == SchedulingKnobs()
    assert SchedulingKnobs.from_values({"default_replicas": 2}).default_replicas == 2


def test_from_values_rejects_unknown_ill_typed_and_out_of_bounds() -> None:
    with pytest.raises(KnobError, match="unknown scheduling knobs: mode") as unknown:
        SchedulingKnobs.from_values({"mode": "lpt_packing"})
    assert unknown.value.fields == ("mode",)
    with pytest.raises(KnobError, match="ill-typed") as typed:
        SchedulingKnobs.from_values(
            {"hysteresis": "x", "forbid_memory_oversubscription": "maybe", "generation": True}
        )
    assert typed.value.fields == ("forbid_memory_oversubscription", "generation", "hysteresis")
    with pytest.raises(
        KnobError, match=re.escape("compaction_mode must be one of off|eager|scheduled")
    ):
        SchedulingKnobs.from_values({"compaction_mode": "EAGER"})


def test_errors_carry_their_grpc_status() -> None:
    assert status_of(KnobError("x")) is grpc.StatusCode.INVALID_ARGUMENT
    assert isinstance(KnobError("x"), ValueError)
    assert status_of(KnobModeError("x")) is grpc.StatusCode.FAILED_PRECONDITION
    assert status_of(UnknownModelError("x")) is grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize(
    ("rpc", "mode", "ok"),
    [
        ("SetSchedulingPolicy", "lpt_packing", True),
        ("SetSchedulingPolicy", "model_aware", True),
        ("SetSchedulingPolicy", "round_robin", False),
        ("SetModelPlacement", "lpt_packing", True),
        ("SetModelPlacement", "model_aware", False),
        ("Repack", "lpt_packing", True),
        ("Repack", "model_aware", False),
        ("Repack", "round_robin", False),
    ],
)
def test_check_mode_follows_the_rpc_table(rpc: str, mode: str, ok: bool) -> None:
    if ok:
        check_mode(rpc, mode)
    else:
        with pytest.raises(KnobModeError, match=f"the gateway runs {mode}"):
            check_mode(rpc, mode)


def test_check_mode_refuses_an_unknown_mode() -> None:
    with pytest.raises(ValueError, match="unknown scheduling mode"):
        check_mode("Repack", "random")


# --- SetSchedulingPolicy -------------------------------------------------------------------------


def test_accepted_update_sets_masked_fields_only_and_bumps_generation() -> None:
    policy = Policy(hysteresis=0.2, routing_fill_mode="spread", rebalance_compute_seconds=1.0)
    new, warnings = update(["hysteresis", "routing_fill_mode"], policy)
    assert new == SchedulingKnobs(hysteresis=0.2, routing_fill_mode="spread", generation=1)
    assert warnings == []
    again, _ = update(["hysteresis"], Policy(hysteresis=0.0), knobs=new)
    assert again.generation == 2


def test_default_replicas_minus_one_is_all_and_zero_is_invalid() -> None:
    new, _ = update(["default_replicas"], Policy(default_replicas=-1))
    assert new.default_replicas == "all"
    new, _ = update(["default_replicas"], Policy(default_replicas=4))
    assert new.default_replicas == 4
    for bad in (0, -2):
        with pytest.raises(KnobError, match="default_replicas must be"):
            update(["default_replicas"], Policy(default_replicas=bad))


def test_work_basis_is_case_insensitive_and_a_repeated_mask_entry_counts_once() -> None:
    new, _ = update(["work_basis", "work_basis"], Policy(work_basis="REQUESTS"))
    assert (new.work_basis, new.generation) == ("requests", 1)


def test_round_robin_is_a_failed_precondition() -> None:
    with pytest.raises(KnobModeError):
        update(["hysteresis"], Policy(hysteresis=0.1), mode="round_robin")


def test_unset_policy_and_empty_mask_are_invalid() -> None:
    with pytest.raises(KnobError, match="policy is not set"):
        update(["hysteresis"], None)
    with pytest.raises(KnobError, match="update_mask is empty"):
        update([], Policy(hysteresis=0.1))


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("mode", "start-up only"),
        ("scheduling_mode", "start-up only"),
        ("endpoints", "start-up only"),
        ("listen", "start-up only"),
        ("generation", "read only"),
        ("rebalance", "unknown field"),
        ("cold_load_penalty", "does not apply to scheduling mode lpt_packing"),
    ],
)
def test_mask_entries_refused_in_lpt(name: str, message: str) -> None:
    with pytest.raises(KnobError, match=message) as caught:
        update([name], Policy(cold_load_penalty=2.0))
    assert caught.value.fields == (name,)


def test_model_aware_takes_halflife_and_its_own_fields_only() -> None:
    policy = Policy(
        ema_halflife_compute_seconds=50,
        cold_load_penalty=2.0,
        default_load_bandwidth_bytes_per_second=1e9,
        load_overhead_seconds=0.0,
    )
    mask = [
        "ema_halflife_compute_seconds",
        "cold_load_penalty",
        "default_load_bandwidth_bytes_per_second",
        "load_overhead_seconds",
    ]
    new, _ = update(mask, policy, mode="model_aware")
    assert (new.halflife, new.cold_load_penalty) == (50, 2.0)
    assert (new.default_load_bandwidth_bytes_per_second, new.load_overhead_seconds) == (1e9, 0.0)
    for lpt_only in ("rebalance_compute_seconds", "work_basis", "default_replicas"):
        with pytest.raises(KnobError, match="does not apply to scheduling mode model_aware"):
            update([lpt_only], policy, mode="model_aware")


def test_validation_is_all_or_nothing() -> None:
    knobs = SchedulingKnobs(hysteresis=0.1)
    policy = Policy(hysteresis=0.3, routing_fill_factor=0.0, compaction_mode="never")
    mask = ["hysteresis", "routing_fill_factor", "compaction_mode"]
    with pytest.raises(KnobError) as caught:
        update(mask, policy, knobs=knobs)
    assert set(caught.value.fields) == {"routing_fill_factor", "compaction_mode"}
    assert knobs == SchedulingKnobs(hysteresis=0.1)
    with pytest.raises(KnobError) as mixed:
        update(["hysteresis", "generation", "endpoints"], policy)
    assert mixed.value.fields == ("generation", "endpoints")


def test_a_masked_but_unfilled_string_is_invalid() -> None:
    with pytest.raises(
        KnobError, match=re.escape("routing_policy must be one of fill_least|fill_rr")
    ):
        update(["routing_policy"], Policy())


def test_warns_when_accumulated_compute_already_reaches_the_new_budget() -> None:
    _, warnings = update(
        ["rebalance_compute_seconds"],
        Policy(rebalance_compute_seconds=100),
        accumulated=150.0,
        first_done=True,
    )
    assert any("150 s already reaches the new budget 100 s" in w for w in warnings)
    _, below = update(
        ["rebalance_compute_seconds"],
        Policy(rebalance_compute_seconds=400),
        accumulated=150.0,
        first_done=True,
    )
    assert not any("budget" in w for w in below)


def test_first_budget_warnings_before_and_after_the_first_tick_repack() -> None:
    mask = ["first_rebalance_compute_seconds"]
    _, before = update(mask, Policy(first_rebalance_compute_seconds=10), accumulated=20.0)
    assert any("reaches the new budget 10 s" in w for w in before)
    assert not any("already consumed" in w for w in before)
    _, after = update(mask, Policy(first_rebalance_compute_seconds=10), first_done=True)
    assert any("first-repack budget is already consumed" in w for w in after)


def test_halflife_change_warns_history_is_not_refolded() -> None:
    _, direct = update(
        ["ema_halflife_compute_seconds"],
        Policy(ema_halflife_compute_seconds=60),
        mode="model_aware",
    )
    assert any("300 -> 60" in w and "not re-folded" in w for w in direct)
    _, tracked = update(["rebalance_compute_seconds"], Policy(rebalance_compute_seconds=200))
    assert any("300 -> 200" in w for w in tracked)
    pinned = SchedulingKnobs(ema_halflife_compute_seconds=60)
    _, none = update(
        ["rebalance_compute_seconds"], Policy(rebalance_compute_seconds=200), knobs=pinned
    )
    assert not any("re-folded" in w for w in none)


def test_switching_to_inflight_warns_of_the_hazard() -> None:
    new, warnings = update(["routing_fill_mode"], Policy(routing_fill_mode="inflight"))
    assert new.routing_fill_mode == "inflight"
    assert warnings == [INFLIGHT_HAZARD]


def test_apply_policy_request_rejects_an_unset_policy_field() -> None:
    request = control_pb2.SetSchedulingPolicyRequest(update_mask=["hysteresis"])
    with pytest.raises(KnobError, match="policy is not set"):
        apply_policy_request(
            SchedulingKnobs(),
            request,
            mode="lpt_packing",
            compute_accumulated=0,
            first_repack_done=False,
        )
    # An explicitly set but all-zero policy is "set": 0.0 is a valid hysteresis.
    request.policy.SetInParent()
    new, _ = apply_policy_request(
        SchedulingKnobs(hysteresis=0.5),
        request,
        mode="lpt_packing",
        compute_accumulated=0,
        first_repack_done=False,
    )
    assert (new.hysteresis, new.generation) == (0.0, 1)


# --- Repack --------------------------------------------------------------------------------------


def test_repack_wait_bounds() -> None:
    assert validate_repack_wait(0.0) == (0.0, [])
    assert validate_repack_wait(5.5) == (5.5, [])
    assert validate_repack_wait(120.0) == (120.0, [])
    wait, warnings = validate_repack_wait(500.0)
    assert wait == MAX_REPACK_WAIT_SECONDS
    assert warnings == ["wait_seconds 500 clamped to 120"]
    for bad in (-0.1, math.nan):
        with pytest.raises(KnobError, match="wait_seconds must be >= 0"):
            validate_repack_wait(bad)
