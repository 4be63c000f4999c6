"""Fill plans and route_replica (docs/reference/gateway-policies.md)."""

from __future__ import annotations

import collections
from collections.abc import Sequence

import attrs
import pytest

from reactantserver.gateway.policies.lpt.fill import (
    FillMode,
    FillPlan,
    ReplicaReservation,
    ReplicaRoute,
    ReplicaRouter,
    RoutingPolicy,
    resolve_fill_plan,
)
from reactantserver.gateway.policies.lpt.packing import ModelPlacement


def placed(*workers: str) -> ModelPlacement:
    return ModelPlacement(tuple(sorted(workers)), (1.0 / len(workers),) * len(workers))


def router(
    mode: FillMode = "run",
    quantum: int = 4,
    workers: Sequence[str] = ("w0", "w1", "w2"),
    policy: RoutingPolicy = "fill_least",
) -> ReplicaRouter:
    r = ReplicaRouter()
    r.install({"m": placed(*workers)}, {"m": FillPlan(mode, quantum)}, routing_policy=policy)
    return r


def send(r: ReplicaRouter, units: int = 1, weight: float = 0.0, model: str = "m") -> ReplicaRoute:
    route = r.route(model, units, weight, ["w0", "w1", "w2"])
    assert route is not None
    return route


def held(route: ReplicaRoute) -> ReplicaReservation:
    assert route.reservation is not None
    return route.reservation


def outs(r: ReplicaRouter, model: str = "m") -> list[int]:
    return [r.outstanding(model, w) for w in ("w0", "w1", "w2")]


# --- resolve_fill_plan ----------------------------------------------------------------------------


def resolve(**overrides: object) -> FillPlan:
    args: dict[str, object] = {
        "max_batch": 32,
        "default_mode": "run",
        "default_factor": 1.0,
        "override_mode": None,
        "override_factor": None,
    }
    args.update(overrides)
    return resolve_fill_plan("m", **args)  # type: ignore[arg-type]


def test_plan_defaults_to_the_global_knobs() -> None:
    assert resolve() == FillPlan("run", 32)
    assert resolve(default_mode="spread", default_factor=0.5) == FillPlan("spread", 16)


def test_plan_overrides_win_and_inherit_falls_back() -> None:
    assert resolve(override_mode="inflight", override_factor=2.0) == FillPlan("inflight", 64)
    assert resolve(override_mode="inherit", default_mode="spread").mode == "spread"


@pytest.mark.parametrize("factor", [0.0, -1.0, None])
def test_plan_factor_override_not_positive_inherits(factor: float | None) -> None:
    assert resolve(override_factor=factor, default_factor=0.25).quantum == 8


@pytest.mark.parametrize(
    ("max_batch", "factor", "quantum"),
    [(32, 0.01, 1), (None, 4.0, 1), (0, 4.0, 1), (5, 0.5, 2), (7, 0.5, 4), (3, 1.0, 3)],
)
def test_quantum_rounds_and_is_at_least_one(
    max_batch: int | None, factor: float, quantum: int
) -> None:
    assert resolve(max_batch=max_batch, default_factor=factor).quantum == quantum


def test_plan_carries_the_batch_locator() -> None:
    plan = resolve(batch_input_name="IN", batch_axis=2)
    assert (plan.batch_input_name, plan.batch_axis) == ("IN", 2)


def test_plan_refuses_bad_modes_and_factors() -> None:
    with pytest.raises(ValueError, match="m: fill mode"):
        resolve(override_mode="fast")
    with pytest.raises(ValueError, match="fill mode"):
        resolve(default_mode="inherit")
    with pytest.raises(ValueError, match="routing_fill_factor"):
        resolve(default_factor=0.0)
    with pytest.raises(ValueError, match="quantum"):
        FillPlan("run", 0)


# --- no placement, single replica ---------------------------------------------------------------


def test_unplaced_model_round_robins_over_discovered_untracked() -> None:
    r = ReplicaRouter()
    orders = [r.route("x", 1, 1.0, ["w2", "w0", "w1"]) for _ in range(4)]
    assert [o.order if o else None for o in orders] == [
        ("w0", "w1", "w2"),
        ("w1", "w2", "w0"),
        ("w2", "w0", "w1"),
        ("w0", "w1", "w2"),
    ]
    assert all(o is not None and o.reservation is None for o in orders)
    assert r.routed_total("x", "w0") == 0
    assert r.route("x", 1, 1.0, []) is None


def test_unknown_model_has_the_default_plan() -> None:
    assert ReplicaRouter().plan("x") == FillPlan("run", 1)


def test_single_replica_reserves_items_load_and_a_route() -> None:
    r = router(workers=("w1",))
    route = r.route("m", 5, 0.25, ["w0", "w1", "w2"])
    assert route is not None
    assert route.order == ("w1", "w0", "w2")  # then discovered replicas outside the placement
    assert held(route) == ReplicaReservation(1, "m", "w1", 5, 250_000_000)
    assert (r.outstanding("m", "w1"), r.routed_total("m", "w1"), r.worker_load("w1")) == (
        5,
        1,
        0.25,
    )


def test_weight_must_be_finite_and_not_negative() -> None:
    with pytest.raises(ValueError, match="weight"):
        router().route("m", 1, -1.0, [])
    with pytest.raises(ValueError, match="weight"):
        router().route("m", 1, float("nan"), [])


# --- run ------------------------------------------------------------------------------------------


def test_run_stays_on_its_target_until_it_has_taken_q_items() -> None:
    r = router("run", quantum=4)
    chosen = [send(r).order[0] for _ in range(9)]
    assert chosen == ["w0"] * 4 + ["w1"] * 4 + ["w2"]
    assert r.cursor("m") == "w2"


def test_one_32_item_request_closes_a_run_of_32() -> None:
    r = router("run", quantum=32)
    assert send(r, units=32).order[0] == "w0"
    assert send(r, units=1).order[0] == "w1"


def test_run_counts_items_not_requests() -> None:
    r = router("run", quantum=8)
    assert [send(r, units=3).order[0] for _ in range(4)] == ["w0", "w0", "w0", "w1"]


def test_run_reopens_when_everything_drained() -> None:
    r = router("run", quantum=4)
    first = send(r)
    r.release(held(first))
    assert send(r).order[0] == "w1"  # total = 0 opens a new run after the cursor


def test_run_leaves_a_target_that_fell_behind() -> None:
    r = router("run", quantum=2)
    early = [send(r) for _ in range(5)]  # w0 2, w1 2, w2 1 (open run on w2)
    assert outs(r) == [2, 2, 1]
    for route in early[:4]:  # w0, w1 drain: floor_q 0, w2 still at ⌊1/2⌋ = 0
        r.release(held(route))
    extra = send(r)  # the open run on w2 continues: w2 not behind, 1 < Q
    assert extra.order[0] == "w2"
    assert outs(r) == [0, 0, 2]
    assert send(r).order[0] == "w0"  # run full and w2 ahead: new run, w2 ranked last


def test_run_prefers_not_behind_then_rotation_under_fill_rr() -> None:
    r = router("run", quantum=1, policy="fill_rr")
    assert [send(r).order[0] for _ in range(4)] == ["w0", "w1", "w2", "w0"]


# --- spread, inflight, fill_least ---------------------------------------------------------------


def test_spread_takes_the_least_outstanding_then_rotation() -> None:
    r = router("spread", quantum=8)
    assert [send(r).order[0] for _ in range(4)] == ["w0", "w1", "w2", "w0"]
    assert send(r, units=5).order[0] == "w1"
    assert outs(r) == [2, 6, 1]
    assert send(r).order[0] == "w2"


def test_fill_least_breaks_ties_by_worker_load_fill_rr_by_rotation() -> None:
    least, rr = router("spread", policy="fill_least"), router("spread", policy="fill_rr")
    for r in (least, rr):
        r.install(
            {"m": placed("w0", "w1"), "other": placed("w0")},
            {"m": FillPlan("spread", 4)},
            routing_policy=r.routing_policy,
        )
        send(r, weight=2.0, model="other")  # loads w0 only
    assert send(least).order[0] == "w1"
    assert send(rr).order[0] == "w0"
    rr.set_routing_policy("fill_least")
    assert rr.routing_policy == "fill_least"
    with pytest.raises(ValueError, match="routing policy"):
        rr.set_routing_policy("least")


def test_inflight_fills_the_most_progressed_replica_below_q() -> None:
    r = router("inflight", quantum=4)
    assert [send(r).order[0] for _ in range(5)] == ["w0"] * 4 + ["w1"]
    # w0 at ⌊4/4⌋ = 1 now; w1 (0, -1) beats w2 (0, 0): stay on the replica that is filling
    assert send(r).order[0] == "w1"


def test_inflight_cursor_moves_only_on_ties() -> None:
    r = router("inflight", quantum=4)
    send(r)  # all tied at (0, 0): w0, cursor moves
    assert r.cursor("m") == "w0"
    send(r)  # w0 (0, -1) alone best: cursor stays
    assert r.cursor("m") == "w0"


def test_inflight_hazard_concurrency_between_2_and_q_stays_on_one_replica() -> None:
    r = router("inflight", quantum=8)
    window = collections.deque(send(r) for _ in range(3))
    for _ in range(100):
        r.release(held(window.popleft()))
        window.append(send(r))
    assert r.routed_total("m", "w0") == 103
    assert r.routed_total("m", "w1") == r.routed_total("m", "w2") == 0


# --- failover order, release, install ------------------------------------------------------------


def test_failover_order_is_chosen_then_progress_then_outs_then_url_then_outside() -> None:
    r = ReplicaRouter()
    r.install(
        {"m": placed("a", "b", "c", "d")}, {"m": FillPlan("spread", 2)}, routing_policy="fill_rr"
    )
    for worker, units in (("a", 3), ("b", 2), ("c", 1)):  # single-replica routes set outs
        r.install({"m": placed(worker)}, {"m": FillPlan("spread", 2)}, routing_policy="fill_rr")
        assert r.route("m", units, 0.0, []) is not None
    r.install(
        {"m": placed("a", "b", "c", "d")}, {"m": FillPlan("spread", 2)}, routing_policy="fill_rr"
    )
    route = r.route("m", 1, 0.0, ["z", "d", "a", "y"])
    assert route is not None
    # d chosen (outs 0); then c (0, 1), b (1, 2), a (1, 3); then y, z outside the placement
    assert route.order == ("d", "c", "b", "a", "y", "z")


def test_release_is_exact_and_idempotent() -> None:
    r = router("spread")
    weights = [0.1, 0.2, 0.3, 1e-10, 0.7]
    routes = [send(r, units=u, weight=w) for u, w in zip((1, 2, 3, 4, 5), weights, strict=True)]
    assert r.worker_load("w0") == pytest.approx(0.1 + 1e-10)
    for route in routes:
        assert r.release(held(route)) is True
        assert r.release(held(route)) is False
    assert outs(r) == [0, 0, 0]
    assert [r.worker_load(w) for w in ("w0", "w1", "w2")] == [0.0, 0.0, 0.0]
    assert sum(r.routed_total("m", w) for w in ("w0", "w1", "w2")) == 5


def test_install_carries_counters_ends_the_run_and_keeps_the_cursor() -> None:
    r = router("run", quantum=4)
    before = [send(r, weight=0.5) for _ in range(2)]  # open run on w0 with 2 items
    r.install({"m": placed("w0", "w1")}, {"m": FillPlan("run", 4)}, routing_policy="fill_rr")
    assert r.outstanding("m", "w0") == 2
    assert r.cursor("m") == "w0"
    assert send(r).order[0] == "w1"  # the run was ended; rotation continues after w0
    r.install({"m": placed("w2")}, {}, routing_policy="fill_least")
    for route in before:
        assert r.release(held(route))
    assert r.outstanding("m", "w0") == 0
    assert r.worker_load("w0") == 0.0
    assert r.routed_total("m", "w0") == 2
    assert r.replicas("m") == ("w2",)
    assert r.plan("m") == FillPlan("run", 1)


def test_set_plans_republishes_quanta_only() -> None:
    r = router("run", quantum=2)
    send(r)
    r.set_plans({"m": FillPlan("run", 3)})
    assert [send(r).order[0] for _ in range(3)] == ["w0", "w0", "w1"]
    assert r.replicas("m") == ("w0", "w1", "w2")


def test_install_refuses_an_unknown_policy() -> None:
    with pytest.raises(ValueError, match="routing policy"):
        ReplicaRouter().install({}, {}, routing_policy="fill_most")


def test_empty_placement_entry_falls_back_to_round_robin() -> None:
    r = ReplicaRouter()
    r.install({"m": ModelPlacement((), ())}, {}, routing_policy="fill_least")
    route = r.route("m", 1, 0.0, ["w1"])
    assert route == ReplicaRoute(("w1",), None)


# --- properties: closed-loop shares ------------------------------------------------------------


@pytest.mark.parametrize("mode", ["run", "spread"])
@pytest.mark.parametrize("policy", ["fill_least", "fill_rr"])
@pytest.mark.parametrize(
    "shape",  # (replicas, Q, concurrency C, items per request)
    [(2, 4, 3, 1), (3, 4, 8, 1), (3, 32, 5, 1), (4, 8, 64, 1), (3, 4, 1, 1), (5, 8, 13, 4)],
)
def test_closed_loop_shares_are_within_one_quantum(
    mode: FillMode, policy: RoutingPolicy, shape: tuple[int, int, int, int]
) -> None:
    n, quantum, concurrency, units = shape
    workers = tuple(f"w{i}" for i in range(n))
    r = ReplicaRouter()
    r.install({"m": placed(*workers)}, {"m": FillPlan(mode, quantum)}, routing_policy=policy)
    shares: collections.Counter[str] = collections.Counter()
    window: collections.deque[ReplicaReservation] = collections.deque()

    def admit() -> None:
        route = r.route("m", units, units * 0.0013, workers)
        assert route is not None
        shares[route.order[0]] += units
        window.append(held(route))

    for _ in range(concurrency):
        admit()
    for _ in range(3000):
        assert r.release(window.popleft())
        admit()
    while window:
        r.release(window.popleft())

    assert all(shares[w] > 0 for w in workers), dict(shares)
    mean = sum(shares.values()) / n
    assert all(abs(shares[w] - mean) <= quantum for w in workers), dict(shares)
    assert all(r.outstanding("m", w) == 0 for w in workers)
    assert all(r.worker_load(w) == 0.0 for w in workers)
    assert sum(r.routed_total("m", w) for w in workers) == concurrency + 3000


def test_reservation_is_frozen() -> None:
    reservation = held(send(router()))
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        reservation.units = 0  # type: ignore[misc]
