"""The ``model_aware`` estimate, choice, reservations, residency mirror and bandwidth."""

from __future__ import annotations

import random

import pytest

from reactantserver.gateway.policies.model_aware.estimate import (
    BANDWIDTH_EWMA_ALPHA,
    DEFAULT_COST_PER_ITEM_SECONDS,
    DISPLACEMENT_HORIZON_SECONDS,
    LoadBandwidth,
    ModelAwareKnobs,
    ModelAwareRouter,
    ModelResidency,
    ResidencyMirror,
    inference_seconds,
)

GB = 1_000_000_000
# Default knobs: a cold 8 GB model costs L = 1.0 * (0.005 + 8e9 / 8e9) = 1.005 s.
L_8GB = 1.005
T_I = 0.1  # one item at 0.1 s per item


def warm(router: ModelAwareRouter, worker: str, *models: str, cap: int = 0) -> None:
    """Tell the router that ``models`` (8 GB each) are resident on ``worker``."""
    router.observe_worker(
        worker,
        [ModelResidency(m, 8 * GB, device_resident=True) for m in models],
        cache_max_bytes=cap,
        load_bytes_total=0,
        load_seconds_total=0.0,
    )


def backlog(router: ModelAwareRouter, worker: str, model: str, n: int) -> None:
    """Put ``n`` in-flight requests of ``model`` (T_I each) on ``worker``."""
    for _ in range(n):
        route = router.route(model, [worker], weight_nbytes=8 * GB, cost_per_item=T_I)
        assert route is not None


# --- the formula -------------------------------------------------------------------------------


def test_inference_seconds_falls_back_model_then_fleet_then_default() -> None:
    assert inference_seconds(3, 0.1, 0.5) == pytest.approx(0.3)
    assert inference_seconds(3, None, 0.5) == pytest.approx(1.5)
    assert inference_seconds(3, 0.0, 0.5) == pytest.approx(1.5)  # not > 0: unmeasured
    assert inference_seconds(3, None, None) == pytest.approx(3 * DEFAULT_COST_PER_ITEM_SECONDS)
    assert inference_seconds(0, None, None) == pytest.approx(0.01)  # units below 1 count as 1


def test_estimate_by_hand() -> None:
    knobs = ModelAwareKnobs(
        cold_load_penalty=2.0,
        default_load_bandwidth_bytes_per_second=1000.0,
        load_overhead_seconds=0.5,
        network_seconds={"b": 0.25},
    )
    router = ModelAwareRouter(knobs)
    router.observe_worker(
        "a",
        [ModelResidency("m", 500, device_resident=True)],
        cache_max_bytes=0,
        load_bytes_total=0,
        load_seconds_total=0.0,
    )
    backlog(router, "a", "other", 2)  # Q(a) = 2 * 0.1 (other is cold: + its load)
    q_a = router.inflight_seconds("a")
    assert q_a == pytest.approx(2 * 0.1 + 2.0 * (0.5 + 8 * GB / 1000.0))

    ea = router.estimate("m", "a", weight_nbytes=500, inference_s=0.3)
    eb = router.estimate("m", "b", weight_nbytes=500, inference_s=0.3)
    # a: resident, E = Q + T_I.  b: cold, E = N + penalty * (overhead + bytes / bw) + T_I.
    assert (ea.network_ns, ea.load_ns, ea.resident) == (0, 0, True)
    assert ea.seconds == pytest.approx(q_a + 0.3)
    assert (eb.network_ns, eb.queue_ns, eb.resident) == (250_000_000, 0, False)
    assert eb.load_ns == 2_000_000_000  # 2.0 * (0.5 + 500 / 1000)
    assert eb.seconds == pytest.approx(0.25 + 2.0 + 0.3)

    # A measured bandwidth replaces the default: 2000 B/s → L = 2.0 * (0.5 + 0.25) = 1.5.
    router.observe_worker("b", [], cache_max_bytes=0, load_bytes_total=2000, load_seconds_total=1)
    eb = router.estimate("m", "b", weight_nbytes=500, inference_s=0.3)
    assert eb.load_ns == 1_500_000_000
    assert eb.seconds == pytest.approx(0.25 + 1.5 + 0.3)


def test_route_uses_units_and_costs_for_t_i() -> None:
    router = ModelAwareRouter(ModelAwareKnobs())
    warm(router, "a", "m")
    route = router.route("m", ["a"], units=4, cost_per_item=None, fleet_cost_per_item=0.02)
    assert route is not None
    assert route.estimates[0].inference_ns == 80_000_000
    assert route.reservation.nanoseconds == 80_000_000


# --- the thesis regimes ------------------------------------------------------------------------


def test_colocation_with_queuing_waits_for_the_warm_worker() -> None:
    router = ModelAwareRouter(ModelAwareKnobs())
    warm(router, "warm", "m")
    n = 5  # Q(warm) = 0.5 s < Q(cold) + L = 1.005 s
    backlog(router, "warm", "m", n)
    route = router.route("m", ["cold", "warm"], weight_nbytes=8 * GB, cost_per_item=T_I)
    assert route is not None
    assert route.order == ("warm", "cold")
    assert route.placement == "resident"
    # E(warm) = (n + 1)·T̄_I (T_P is the same everywhere and left out).
    assert route.estimates[0].seconds == pytest.approx((n + 1) * T_I)
    assert route.estimates[1].seconds == pytest.approx(L_8GB + T_I)


def test_colocation_without_queuing_warms_the_cold_worker() -> None:
    router = ModelAwareRouter(ModelAwareKnobs())
    warm(router, "warm", "m")
    n = 15  # Q(warm) = 1.5 s > L = 1.005 s
    backlog(router, "warm", "m", n)
    route = router.route("m", ["cold", "warm"], weight_nbytes=8 * GB, cost_per_item=T_I)
    assert route is not None
    assert route.order == ("cold", "warm")
    assert route.placement == "cold"
    # E(cold) = T_CS + T_I with T_CS = L; the load occupies the device, so it is reserved too.
    assert route.estimates[0].seconds == pytest.approx(L_8GB + T_I)
    assert route.reservation.nanoseconds == round((L_8GB + T_I) * GB)
    assert router.inflight_seconds("cold") == pytest.approx(L_8GB + T_I)
    # The cold worker is now warm in the mirror: the next request pays no load there.
    assert router.mirror.is_resident("cold", "m")
    nxt = router.route("m", ["cold", "warm"], weight_nbytes=8 * GB, cost_per_item=T_I)
    assert nxt is not None
    assert nxt.order[0] == "cold"
    assert nxt.placement == "resident"
    assert nxt.estimates[0].seconds == pytest.approx(L_8GB + T_I + T_I)


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _displacing(clock: Clock, *, cap: int) -> ModelAwareRouter:
    """ "m" warm on "warm" behind 12 requests (Q = 1.2 s: L + T_I = 1.105 s < Q + T_I = 1.3 s
    < 2L + T_I = 2.11 s); "x" routed to "other" (budget ``cap``) at the clock's time."""
    router = ModelAwareRouter(ModelAwareKnobs(), clock=clock)
    warm(router, "warm", "m")
    warm(router, "other", "x", cap=cap)
    routed = router.route("x", ["other"], weight_nbytes=8 * GB, cost_per_item=T_I)
    assert routed is not None
    router.release(routed.reservation)  # answered: only its recency stays
    backlog(router, "warm", "m", 12)
    return router


def test_a_cold_load_that_evicts_a_model_in_use_pays_for_its_reload() -> None:
    # Going cold on "other" is faster for this request (E = L + T_I < Q + T_I), but it evicts
    # "x", routed there a moment ago, whose next request then pays a load: with D(other) = L
    # the warm worker is the cheaper choice, and "x" stays.
    clock = Clock()
    router = _displacing(clock, cap=8 * GB)
    clock.now += 1.0
    route = router.route("m", ["other", "warm"], weight_nbytes=8 * GB, cost_per_item=T_I)
    assert route is not None
    assert route.order == ("warm", "other")
    cold = route.estimates[1]
    assert cold.seconds == pytest.approx(L_8GB + T_I)  # E(w) is still the request's latency
    assert cold.displacement_ns == round(L_8GB * GB)
    assert router.mirror.is_resident("other", "x")


def test_evicting_an_idle_model_displaces_nothing() -> None:
    # The same, but "x" was last routed longer ago than the horizon: it goes cold on "other".
    clock = Clock()
    router = _displacing(clock, cap=8 * GB)
    clock.now += DISPLACEMENT_HORIZON_SECONDS + 0.5
    route = router.route("m", ["other", "warm"], weight_nbytes=8 * GB, cost_per_item=T_I)
    assert route is not None
    assert route.order == ("other", "warm")
    assert route.estimates[0].displacement_ns == 0
    assert not router.mirror.is_resident("other", "x")


def test_a_cold_load_with_room_displaces_nothing() -> None:
    # "other" has room for "m" next to "x": no displacement, so it goes cold.
    clock = Clock()
    router = _displacing(clock, cap=16 * GB)
    route = router.route("m", ["other", "warm"], weight_nbytes=8 * GB, cost_per_item=T_I)
    assert route is not None
    assert route.order == ("other", "warm")
    assert route.estimates[0].displacement_ns == 0
    assert router.mirror.resident_models("other") == ["m", "x"]


def test_mirror_victims_are_what_routing_evicts() -> None:
    mirror = ResidencyMirror()
    mirror.observe(
        "w",
        [ModelResidency(n, 4, device_resident=True) for n in ("a", "b", "c")],
        cache_max_bytes=12,
    )
    mirror.mark_routed("w", "b", 4)
    mirror.mark_routed("w", "a", 4)
    assert mirror.victims("w", "a", 4) == []  # resident: no load, no victim
    assert mirror.victims("w", "d", 8) == [("c", 4), ("b", 4)]  # never routed, then oldest
    assert mirror.mark_routed("w", "d", 8) == ["c", "b"]


def test_centralized_registry_pays_the_network_to_a_remote_warm_worker() -> None:
    knobs = ModelAwareKnobs(network_seconds={"remote": 0.2})
    router = ModelAwareRouter(knobs)
    warm(router, "remote", "m")
    n = 3
    backlog(router, "remote", "m", n)
    route = router.route("m", ["local", "remote"], weight_nbytes=8 * GB, cost_per_item=T_I)
    assert route is not None
    assert route.order == ("remote", "local")
    # E(remote) = T_N + T_I + n·T̄_I, below the local cold load L + T_I.
    assert route.estimates[0].seconds == pytest.approx(0.2 + T_I + n * T_I)
    assert route.estimates[1].seconds == pytest.approx(L_8GB + T_I)

    # With a slow network the local cold load wins instead.
    far = ModelAwareRouter(ModelAwareKnobs(network_seconds={"remote": 2.0}))
    warm(far, "remote", "m")
    route = far.route("m", ["local", "remote"], weight_nbytes=8 * GB, cost_per_item=T_I)
    assert route is not None
    assert route.order == ("local", "remote")


# --- ties and failover ---------------------------------------------------------------------------


def test_tie_prefers_the_resident_worker() -> None:
    # z resident with N = L; a cold with N = 0: equal E, and URL order would prefer a.
    router = ModelAwareRouter(ModelAwareKnobs(network_seconds={"z": L_8GB}))
    warm(router, "z", "m")
    route = router.route("m", ["a", "z"], weight_nbytes=8 * GB, cost_per_item=T_I)
    assert route is not None
    assert route.estimates[0].total_ns == route.estimates[1].total_ns
    assert route.order == ("z", "a")


def test_tie_prefers_the_smaller_queue() -> None:
    # w2: N = 0.3, Q = 0.  w1: N = 0, Q = 3 * 0.1.  Both resident, equal E; the backlog is of
    # another model, so m has no cursor and rotation and URL order would both prefer w1.
    router = ModelAwareRouter(ModelAwareKnobs(network_seconds={"w2": 0.3}))
    warm(router, "w1", "m", "other")
    warm(router, "w2", "m")
    backlog(router, "w1", "other", 3)
    route = router.route("m", ["w1", "w2"], weight_nbytes=8 * GB, cost_per_item=T_I)
    assert route is not None
    assert route.estimates[0].total_ns == route.estimates[1].total_ns
    assert route.order == ("w2", "w1")


def test_tie_rotates_after_the_cursor_then_url() -> None:
    router = ModelAwareRouter(ModelAwareKnobs())
    for w in ("w0", "w1", "w2"):
        warm(router, w, "m", "n")
    chosen = []
    for _ in range(4):
        route = router.route("m", ["w2", "w0", "w1"], cost_per_item=T_I)
        assert route is not None
        chosen.append(route.order)
        router.release(route.reservation)
    # No cursor: URL order; then each choice starts just after the previous one.
    assert chosen == [
        ("w0", "w1", "w2"),
        ("w1", "w2", "w0"),
        ("w2", "w0", "w1"),
        ("w0", "w1", "w2"),
    ]
    # Cursors are per model.
    other = router.route("n", ["w0", "w1", "w2"], cost_per_item=T_I)
    assert other is not None
    assert other.order[0] == "w0"
    # A cursor that is no longer a candidate still rotates from its place in URL order.
    route = router.route("m", ["w1", "w2"], cost_per_item=T_I)  # cursor w0 → w1 first
    assert route is not None
    assert route.order == ("w1", "w2")


def test_failover_order_is_ascending_estimate() -> None:
    router = ModelAwareRouter(ModelAwareKnobs(network_seconds={"a": 0.4, "b": 0.1, "c": 0.0}))
    for w in ("a", "b", "c", "d"):
        warm(router, w, "m")
    backlog(router, "c", "m", 3)  # E(c) = 0.3 + 0.1
    backlog(router, "d", "m", 1)  # E(d) = 0.1 + 0.1
    route = router.route("m", ["a", "b", "c", "d", "b"], cost_per_item=T_I)
    assert route is not None
    assert route.order == ("b", "d", "c", "a")  # b 0.2 (Q smaller than d), d 0.2, c 0.4, a 0.5
    totals = [e.total_ns for e in route.estimates]
    assert totals == sorted(totals)
    assert [e.worker for e in route.estimates] == list(route.order)


def test_no_candidates_is_no_route() -> None:
    router = ModelAwareRouter(ModelAwareKnobs())
    assert router.route("m", []) is None


# --- reservations ------------------------------------------------------------------------------


def test_reservation_is_t_i_plus_load_when_cold() -> None:
    router = ModelAwareRouter(ModelAwareKnobs())
    warm(router, "a", "m")
    resident = router.route("m", ["a"], weight_nbytes=8 * GB, cost_per_item=T_I)
    cold = router.route("m", ["b"], weight_nbytes=8 * GB, cost_per_item=T_I)
    assert resident is not None
    assert cold is not None
    assert (resident.reservation.nanoseconds, resident.reservation.cold) == (100_000_000, False)
    assert (cold.reservation.nanoseconds, cold.reservation.cold) == (1_105_000_000, True)


def test_reservations_return_to_exactly_zero() -> None:
    rng = random.Random(7)
    router = ModelAwareRouter(ModelAwareKnobs(network_seconds={"w1": 1 / 3}))
    warm(router, "w0", "m0", cap=20 * GB)
    reservations = []
    for i in range(500):
        route = router.route(
            f"m{i % 5}",
            ["w0", "w1", "w2"],
            units=rng.randint(1, 32),
            weight_nbytes=rng.randint(1, 8 * GB),
            cost_per_item=rng.choice([None, 1 / 3, 0.0123456789, 1e-7]),
            fleet_cost_per_item=rng.choice([None, 1 / 7]),
        )
        assert route is not None
        reservations.append(route.reservation)
    assert sum(router.inflight_seconds(w) for w in ("w0", "w1", "w2")) > 0
    rng.shuffle(reservations)
    for r in reservations:
        assert router.release(r)
    for w in ("w0", "w1", "w2"):
        assert router.inflight_seconds(w) == 0.0
    # A second release changes nothing.
    assert not router.release(reservations[0])
    assert router.inflight_seconds(reservations[0].worker) == 0.0


# --- residency mirror --------------------------------------------------------------------------


def test_poll_truth_replaces_the_mirror_and_pinned_is_resident() -> None:
    mirror = ResidencyMirror()
    mirror.observe(
        "w",
        [
            ModelResidency("a", 4, device_resident=True),
            ModelResidency("b", 4, device_resident=False),
            ModelResidency("p", 4, device_resident=False, pinned=True),
        ],
        cache_max_bytes=10,
    )
    assert mirror.resident_models("w") == ["a", "p"]
    assert mirror.budget_bytes("w") == 4  # pinned models are outside the budget
    mirror.mark_routed("w", "b", 4)
    assert mirror.is_resident("w", "b")
    mirror.observe("w", [ModelResidency("b", 4, device_resident=False)], cache_max_bytes=10)
    assert mirror.resident_models("w") == []  # the truth wins; a is no longer reported
    assert not mirror.is_resident("unknown", "a")


def test_mirror_evicts_least_recently_routed_first() -> None:
    mirror = ResidencyMirror()
    mirror.observe("w", [], cache_max_bytes=10)
    assert mirror.mark_routed("w", "a", 4) == []
    assert mirror.mark_routed("w", "b", 4) == []
    assert mirror.mark_routed("w", "a", 4) == []  # resident: only refreshes recency
    assert mirror.mark_routed("w", "c", 4) == ["b"]  # 12 > 10: b is least recently routed
    assert mirror.resident_models("w") == ["a", "c"]
    assert mirror.mark_routed("w", "b", 4) == ["a"]
    assert mirror.resident_models("w") == ["b", "c"]


def test_mirror_evicts_never_routed_first_by_name_and_keeps_pinned() -> None:
    mirror = ResidencyMirror()
    mirror.observe(
        "w",
        [
            ModelResidency("y", 3, device_resident=True),
            ModelResidency("x", 3, device_resident=True),
            ModelResidency("p", 50, device_resident=True, pinned=True),
        ],
        cache_max_bytes=10,
    )
    assert mirror.mark_routed("w", "m", 6) == ["x"]  # 12 > 10; never-routed, by name
    assert mirror.mark_routed("w", "big", 20) == ["y", "m"]  # alone over budget: all evictable
    assert mirror.resident_models("w") == ["big", "p"]
    assert mirror.is_resident("w", "p")


def test_mirror_without_a_cache_never_evicts() -> None:
    mirror = ResidencyMirror()
    mirror.observe("w", [ModelResidency("a", 100, device_resident=True)], cache_max_bytes=0)
    assert mirror.mark_routed("w", "b", 100) == []
    assert mirror.mark_routed("new-worker", "c", 100) == []
    assert mirror.resident_models("w") == ["a", "b"]


def test_router_marks_the_choice_resident_and_evicts_in_the_mirror() -> None:
    router = ModelAwareRouter(ModelAwareKnobs())
    warm(router, "w", "a", cap=10 * GB)
    route = router.route("b", ["w"], weight_nbytes=8 * GB, cost_per_item=T_I)
    assert route is not None
    assert route.placement == "cold"
    assert router.mirror.resident_models("w") == ["b"]
    again = router.route("a", ["w"], weight_nbytes=8 * GB, cost_per_item=T_I)
    assert again is not None
    assert again.placement == "cold"  # a was evicted by b in the mirror


# --- load bandwidth ------------------------------------------------------------------------------


def test_bandwidth_default_until_sampled() -> None:
    bw = LoadBandwidth(8e9)
    assert bw.bandwidth("w") == 8e9
    assert bw.measured("w") is None
    assert bw.observe("w", 0, 0.0) == 8e9  # no load yet: no sample


def test_bandwidth_ewma_from_counter_deltas() -> None:
    assert BANDWIDTH_EWMA_ALPHA == 0.5
    bw = LoadBandwidth(8e9)
    assert bw.observe("w", 8 * GB, 2.0) == pytest.approx(4e9)  # first sample adopted
    # Δ = 2 GB in 1 s → sample 2e9; (1 - 0.5)·4e9 + 0.5·2e9 = 3e9.
    assert bw.observe("w", 10 * GB, 3.0) == pytest.approx(3e9)
    assert bw.observe("w", 10 * GB, 3.0) == pytest.approx(3e9)  # no load since: unchanged
    # Restart: counters went backwards; they now measure from the worker's zero.
    assert bw.observe("w", 1 * GB, 1.0) == pytest.approx(0.5 * 3e9 + 0.5 * 1e9)
    assert bw.bandwidth("other") == 8e9


def test_bandwidth_alpha_is_a_parameter() -> None:
    bw = LoadBandwidth(1.0, alpha=0.25)
    bw.observe("w", 100, 1.0)
    assert bw.observe("w", 300, 2.0) == pytest.approx(0.75 * 100 + 0.25 * 200)
    with pytest.raises(ValueError, match="alpha"):
        LoadBandwidth(1.0, alpha=0.0)
    with pytest.raises(ValueError, match="bandwidth"):
        LoadBandwidth(0.0)


# --- knobs ---------------------------------------------------------------------------------------


def test_knob_defaults_and_validation() -> None:
    knobs = ModelAwareKnobs()
    assert (knobs.cold_load_penalty, knobs.default_load_bandwidth_bytes_per_second) == (1.0, 8e9)
    assert (knobs.load_overhead_seconds, dict(knobs.network_seconds)) == (0.005, {})
    with pytest.raises(ValueError, match="cold_load_penalty"):
        ModelAwareKnobs(cold_load_penalty=0.9)
    with pytest.raises(ValueError, match="default_load_bandwidth"):
        ModelAwareKnobs(default_load_bandwidth_bytes_per_second=0.0)
    with pytest.raises(ValueError, match="load_overhead_seconds"):
        ModelAwareKnobs(load_overhead_seconds=-1.0)
    with pytest.raises(ValueError, match="network_seconds"):
        ModelAwareKnobs(network_seconds={"w": -0.1})
    source = {"w": 0.1}
    knobs = ModelAwareKnobs(network_seconds=source)
    source["w"] = 9.0
    assert knobs.network_seconds["w"] == 0.1  # copied, read-only
