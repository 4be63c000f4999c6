"""RoutingMeta, the EWMA clock and request weights."""

from __future__ import annotations

import math

import pytest

from reactantserver.core.protocol import control_pb2
from reactantserver.gateway.policies.routing_meta import (
    MetaSnapshot,
    RoutingMeta,
    WorkerMeta,
    ewma_alpha,
    request_weight,
)

Status = control_pb2.ModelStatus
Poll = control_pb2.ModelControlStatusResponse


def status(
    name: str,
    compute: float = 0.0,
    requests: int = 0,
    rows: int = 0,
    **fields: object,
) -> control_pb2.ModelStatus:
    """One model's report with its cumulative counters."""
    return Status(
        name=name,
        total_compute_seconds=compute,
        requests_served=requests,
        rows_served=rows,
        **fields,  # type: ignore[arg-type]
    )


def poll(
    *models: control_pb2.ModelStatus, **fields: object
) -> control_pb2.ModelControlStatusResponse:
    return Poll(models=list(models), discipline="fifo", **fields)  # type: ignore[arg-type]


# --- ewma_alpha -----------------------------------------------------------------------------------


def test_alpha_is_half_after_one_halflife() -> None:
    assert ewma_alpha(300.0, 300.0) == 0.5


def test_alpha_for_sixty_of_three_hundred() -> None:
    assert ewma_alpha(60.0, 300.0) == pytest.approx(1.0 - 2.0**-0.2, rel=1e-15)


def test_alpha_is_zero_without_elapsed_compute() -> None:
    assert ewma_alpha(0.0, 300.0) == 0.0
    assert ewma_alpha(-5.0, 300.0) == 0.0


def test_alpha_needs_a_positive_halflife() -> None:
    with pytest.raises(ValueError, match="halflife"):
        ewma_alpha(1.0, 0.0)


# --- aggregation ----------------------------------------------------------------------------------


def test_sums_maxima_and_first_locator_in_sorted_worker_order() -> None:
    meta = RoutingMeta()
    snap = meta.observe(
        {
            "w1": poll(
                status(
                    "m",
                    3.0,
                    30,
                    90,
                    weight_nbytes=5,
                    max_batch_size=16,
                    batch_input_name="B",
                    batch_axis=2,
                ),
            ),
            "w0": poll(
                status(
                    "m",
                    1.0,
                    10,
                    20,
                    weight_nbytes=7,
                    max_batch_size=8,
                    batch_input_name="A",
                    batch_axis=1,
                ),
                status("n", 2.0, 4, 4),
            ),
        }
    )
    m = snap.models["m"]
    assert (m.total_compute, m.requests, m.rows) == (4.0, 40, 110)
    assert (m.weight_nbytes, m.max_batch) == (7, 16)
    assert (m.batch_input_name, m.batch_axis) == ("A", 1)  # w0 sorts first
    assert m.workers == ("w0", "w1")
    assert snap.models["n"].workers == ("w0",)
    assert snap.fleet_compute == 6.0
    assert list(snap.models) == ["m", "n"]


def test_empty_locator_is_skipped_for_the_next_worker() -> None:
    snap = RoutingMeta().observe(
        {
            "w0": poll(status("m")),
            "w1": poll(status("m", batch_input_name="IN", batch_axis=1)),
        }
    )
    assert (snap.models["m"].batch_input_name, snap.models["m"].batch_axis) == ("IN", 1)


def test_worker_meta_from_the_poll() -> None:
    snap = RoutingMeta().observe(
        {
            "w0": poll(
                status("a", device_resident=True),
                status("b", residency=control_pb2.PINNED_DEVICE, device_resident=True),
                status("c", residency=control_pb2.PINNED_SYSTEM),
                weight_cache_max_bytes=10**9,
                weight_load_bytes_total=4096,
                weight_load_seconds_total=0.5,
                residency_mode="self_managed",
            )
        }
    )
    assert snap.workers["w0"] == WorkerMeta(
        url="w0",
        weight_cache_max_bytes=10**9,
        discipline="fifo",
        residency_mode="self_managed",
        models=("a", "b", "c"),
        device_resident=frozenset({"a", "b"}),
        pinned=frozenset({"b"}),
        weight_load_bytes_total=4096,
        weight_load_seconds_total=0.5,
    )
    assert snap.workers["w0"].resident == {"a", "b"}


def test_workers_hold_only_this_rounds_polls() -> None:
    meta = RoutingMeta()
    meta.observe({"w0": poll(status("m")), "w1": poll(status("m"))})
    assert list(meta.observe({"w1": poll(status("m"))}).workers) == ["w1"]


def test_snapshot_before_any_poll_is_empty_and_published_maps_are_read_only() -> None:
    meta = RoutingMeta()
    assert meta.snapshot == MetaSnapshot.empty()
    snap = meta.observe({"w0": poll(status("m"))})
    assert meta.snapshot is snap
    with pytest.raises(TypeError):
        snap.models["x"] = snap.models["m"]  # type: ignore[index]


# --- the EWMA on the compute clock ----------------------------------------------------------------


def test_first_poll_adopts_the_lifetime_sample() -> None:
    snap = RoutingMeta().observe({"w0": poll(status("m", 10.0, 100, 400))})
    assert snap.models["m"].cost_per_request == pytest.approx(0.1)
    assert snap.models["m"].cost_per_item == pytest.approx(0.025)
    assert snap.compute_delta == 10.0


def test_one_halflife_of_fleet_compute_moves_halfway() -> None:
    meta = RoutingMeta(rebalance_compute_seconds=100.0)
    meta.observe({"w0": poll(status("m", 100.0, 1000, 1000))})  # 0.1 s/request
    snap = meta.observe({"w0": poll(status("m", 200.0, 1500, 1250))})  # sample 0.2, dt = 100
    assert snap.models["m"].cost_per_request == pytest.approx(0.15)
    assert snap.models["m"].cost_per_item == pytest.approx((0.1 + 0.4) / 2)


def test_dt_is_fleet_compute_so_other_models_age_the_average() -> None:
    meta = RoutingMeta(rebalance_compute_seconds=300.0)
    meta.observe({"w0": poll(status("m", 1.0, 10), status("o", 0.0, 0))})
    # m consumes 10 s, o 50 s: dt = 60 of h = 300.
    snap = meta.observe({"w0": poll(status("m", 11.0, 60), status("o", 50.0, 5))})
    alpha = 1.0 - 2.0**-0.2
    assert snap.compute_delta == pytest.approx(60.0)
    assert snap.models["m"].cost_per_request == pytest.approx((1 - alpha) * 0.1 + alpha * 0.2)
    assert snap.models["o"].cost_per_request == pytest.approx(10.0)  # first sample adopted


def test_halflife_knob_wins_over_rebalance_and_can_change_between_polls() -> None:
    meta = RoutingMeta(rebalance_compute_seconds=1000.0, ema_halflife_compute_seconds=10.0)
    assert meta.halflife == 10.0
    meta.observe({"w0": poll(status("m", 10.0, 100))})
    snap = meta.observe({"w0": poll(status("m", 20.0, 200 - 50))})  # dt = 10 = h, sample 0.2
    assert snap.models["m"].cost_per_request == pytest.approx(0.15)
    snap = meta.observe(
        {"w0": poll(status("m", 30.0, 150 + 25))},  # dt = 10, sample 0.4
        ema_halflife_compute_seconds=0.0,
        rebalance_compute_seconds=20.0,
    )
    assert meta.halflife == 20.0
    alpha = 1.0 - 2.0**-0.5
    assert snap.models["m"].cost_per_request == pytest.approx((1 - alpha) * 0.15 + alpha * 0.4)


def test_no_elapsed_compute_leaves_the_average_unchanged() -> None:
    meta = RoutingMeta()
    meta.observe({"w0": poll(status("m", 10.0, 100))})
    snap = meta.observe({"w0": poll(status("m", 10.0, 200))})  # sample 0.0 but dt = 0
    assert snap.models["m"].cost_per_request == pytest.approx(0.1)


def test_no_new_requests_is_no_sample() -> None:
    meta = RoutingMeta(rebalance_compute_seconds=1.0)
    meta.observe({"w0": poll(status("m", 10.0, 100, 100), status("o", 1.0, 1, 1))})
    snap = meta.observe({"w0": poll(status("m", 10.0, 100, 100), status("o", 500.0, 2, 2))})
    assert snap.models["m"].cost_per_request == pytest.approx(0.1)
    assert snap.models["m"].cost_per_item == pytest.approx(0.1)


def test_restart_rebaselines_and_keeps_the_last_value() -> None:
    meta = RoutingMeta(rebalance_compute_seconds=100.0)
    meta.observe({"w0": poll(status("m", 100.0, 1000))})
    restarted = meta.observe({"w0": poll(status("m", 5.0, 10))})
    assert restarted.models["m"].cost_per_request == pytest.approx(0.1)
    assert restarted.compute_delta == 0.0
    snap = meta.observe({"w0": poll(status("m", 105.0, 510))})  # from the new baseline: 0.2
    assert snap.models["m"].cost_per_request == pytest.approx(0.15)


def test_restart_of_one_worker_does_not_hide_the_others_traffic() -> None:
    meta = RoutingMeta(rebalance_compute_seconds=100.0)
    meta.observe({"w0": poll(status("m", 100.0, 1000)), "w1": poll(status("m", 100.0, 1000))})
    snap = meta.observe(
        {"w0": poll(status("m", 200.0, 1500)), "w1": poll(status("m", 1.0, 1))}  # w1 restarted
    )
    assert snap.compute_delta == pytest.approx(100.0)
    assert snap.models["m"].cost_per_request == pytest.approx(0.15)
    assert snap.models["m"].total_compute == 201.0  # published sums are this round's


def test_absent_worker_is_not_a_restart_and_its_next_poll_covers_both_intervals() -> None:
    meta = RoutingMeta(rebalance_compute_seconds=100.0)
    meta.observe({"w0": poll(status("m", 50.0, 500)), "w1": poll(status("m", 50.0, 500))})
    gap = meta.observe({"w0": poll(status("m", 50.0, 500))})
    assert gap.models["m"].total_compute == 50.0
    assert gap.models["m"].workers == ("w0",)
    snap = meta.observe({"w0": poll(status("m", 50.0, 500)), "w1": poll(status("m", 150.0, 1000))})
    assert snap.compute_delta == pytest.approx(100.0)
    assert snap.models["m"].cost_per_request == pytest.approx(0.15)


def test_missing_model_keeps_its_data_and_missing_locator_keeps_the_last() -> None:
    meta = RoutingMeta()
    first = meta.observe(
        {
            "w0": poll(
                status(
                    "m",
                    1.0,
                    10,
                    10,
                    batch_input_name="IN",
                    batch_axis=2,
                    weight_nbytes=9,
                    max_batch_size=4,
                )
            )
        }
    )
    later = meta.observe({"w0": poll(status("o", 1.0, 1))})
    assert later.models["m"] == first.models["m"]
    again = meta.observe({"w0": poll(status("m", 1.0, 10, 10, max_batch_size=8))})
    m = again.models["m"]
    assert (m.batch_input_name, m.batch_axis, m.max_batch) == ("IN", 2, 8)


def test_fleet_means_cover_measured_models_only() -> None:
    snap = RoutingMeta().observe(
        {"w0": poll(status("a", 2.0, 10, 20), status("b", 6.0, 10, 20), status("cold"))}
    )
    assert snap.models["cold"].cost_per_request is None
    assert snap.fleet_cost_per_request == pytest.approx((0.2 + 0.6) / 2)
    assert snap.fleet_cost_per_item == pytest.approx((0.1 + 0.3) / 2)
    assert RoutingMeta().observe({"w0": poll(status("cold"))}).fleet_cost_per_item is None


@pytest.mark.parametrize(
    ("rebalance", "halflife"), [(0.0, 0.0), (-1.0, 0.0), (300.0, -1.0), (math.inf, 0.0)]
)
def test_knobs_are_validated(rebalance: float, halflife: float) -> None:
    with pytest.raises(ValueError, match="must be"):
        RoutingMeta(rebalance_compute_seconds=rebalance, ema_halflife_compute_seconds=halflife)


# --- request_weight -------------------------------------------------------------------------------


@pytest.fixture
def measured() -> MetaSnapshot:
    return RoutingMeta().observe(
        {"w0": poll(status("a", 2.0, 10, 20), status("b", 6.0, 10, 20), status("cold"))}
    )


def test_items_basis_weighs_units(measured: MetaSnapshot) -> None:
    assert request_weight("items", 5, "a", measured, {}) == 5.0
    assert request_weight("ITEMS", 0, "a", measured, {}) == 1.0


def test_compute_basis_uses_model_then_fleet_then_one(measured: MetaSnapshot) -> None:
    assert request_weight("compute", 4, "a", measured, {}) == pytest.approx(4 * 0.1)
    assert request_weight("compute", 4, "cold", measured, {}) == pytest.approx(4 * 0.2)
    assert request_weight("compute", 4, "unknown", measured, {}) == pytest.approx(4 * 0.2)
    assert request_weight("compute", 4, "a", MetaSnapshot.empty(), {}) == 4.0


def test_requests_basis_uses_repack_cost_then_fleet_then_one(measured: MetaSnapshot) -> None:
    repack = {"a": 0.05, "cold": 0.0}
    assert request_weight("requests", 1, "a", measured, repack) == 0.05
    assert request_weight("requests", 32, "a", measured, repack) == 0.05  # size does not matter
    assert request_weight("requests", 1, "cold", measured, repack) == pytest.approx(0.4)
    assert request_weight("requests", 7, "x", MetaSnapshot.empty(), {}) == 1.0


def test_unknown_basis_is_refused(measured: MetaSnapshot) -> None:
    with pytest.raises(ValueError, match="work basis"):
        request_weight("bytes", 1, "a", measured, {})
