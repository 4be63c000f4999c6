"""compute_assignment and placement_change of ``lpt_packing``
(docs/reference/gateway-policies.md)."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from reactantserver.gateway.policies.lpt.packing import (
    Assignment,
    ModelDemand,
    ModelPlacement,
    PlacementChange,
    PlacementInputError,
    Replicas,
    WorkerBudget,
    compute_assignment,
    placement_change,
)

GB = 10**9


def fleet(n: int, cap: int = 0) -> list[WorkerBudget]:
    return [WorkerBudget(f"w{i}", cap) for i in range(n)]


def demands(u: Mapping[str, float], mem: Mapping[str, int] | None = None) -> list[ModelDemand]:
    return [ModelDemand(name, u=share, mem=(mem or {}).get(name, 0)) for name, share in u.items()]


def where(assignment: Assignment) -> dict[str, tuple[str, ...]]:
    return {name: p.workers for name, p in assignment.placement.items()}


# --- the documented example table, one test per row
# -------------------------------------------------


def test_row1_compute_only_lpt() -> None:
    got = compute_assignment(demands({"a": 0.5, "b": 0.4, "c": 0.1}), fleet(2))
    assert where(got) == {"a": ("w0",), "b": ("w1",), "c": ("w1",)}
    assert got.compute_load == pytest.approx({"w0": 0.5, "w1": 0.5})
    assert got.memory_load == {"w0": 0, "w1": 0}
    assert got.held == 0
    assert got.max_improvement == 0.0


def test_row2_hot_model_stays_on_one_worker_by_default() -> None:
    got = compute_assignment(demands({"hot": 1.5}), fleet(3))
    assert got.placement == {"hot": ModelPlacement(("w0",), (1.0,))}
    assert got.compute_load == {"w0": 1.5, "w1": 0.0, "w2": 0.0}  # load never changes k


def test_row2_two_replicas_weigh_half_each() -> None:
    got = compute_assignment(demands({"hot": 1.5}), fleet(3), replicas={"hot": 2})
    assert got.placement == {"hot": ModelPlacement(("w0", "w1"), (0.5, 0.5))}
    assert got.compute_load == {"w0": 0.75, "w1": 0.75, "w2": 0.0}


def test_row2_nine_replicas_on_three_workers_clamp_to_three() -> None:
    got = compute_assignment(demands({"hot": 1.5}), fleet(3), replicas={"hot": 9})
    assert got.placement["hot"].workers == ("w0", "w1", "w2")
    assert got.placement["hot"].weights == pytest.approx((1 / 3, 1 / 3, 1 / 3))


def test_row3_memory_pulls_the_small_model_onto_the_lighter_footprint() -> None:
    models = demands({"a": 0.6, "b": 0.5, "c": 0.1}, {"a": 1 * GB, "b": 9 * GB, "c": 9 * GB})
    expected = {"a": ("w0",), "b": ("w1",), "c": ("w0",)}
    assert where(compute_assignment(models, fleet(2, 10 * GB))) == expected
    soft = compute_assignment(models, fleet(2, 10 * GB), forbid_memory_oversubscription=False)
    assert where(soft) == expected
    assert soft.memory_load == {"w0": 10 * GB, "w1": 9 * GB}
    compute_only = compute_assignment(models, fleet(2))
    assert where(compute_only)["c"] == ("w1",)


@pytest.mark.parametrize("forbid", [True, False])
def test_row4_two_cold_models_split_by_memory(forbid: bool) -> None:
    models = demands({"x": 0.0, "y": 0.0}, {"x": 6 * GB, "y": 6 * GB})
    got = compute_assignment(models, fleet(2, 10 * GB), forbid_memory_oversubscription=forbid)
    assert where(got) == {"x": ("w0",), "y": ("w1",)}


def test_row5_hysteresis_keeps_the_hot_model_and_moves_the_other() -> None:
    got = compute_assignment(
        demands({"hot": 0.7, "a": 0.3}),
        fleet(2),
        hysteresis=0.1,
        previous={"hot": ["w1"], "a": ["w1"]},
    )
    assert where(got) == {"hot": ("w1",), "a": ("w0",)}
    assert got.held == 1  # hot: best was w0 (tie, smaller URL), kept on w1
    assert got.max_improvement == pytest.approx(1.0 / 0.3 - 1.0)  # a: 1.0 on w1 vs 0.3 on w0


def _row6(forbid: bool) -> Assignment:
    # p fills w0 to 4.5 GB, q makes w1 compute-heavy: m scores 1.05 on w0 (10.5/10 GB) and
    # 1.0 on w1, within hysteresis 0.1 of its previous worker w0.
    models = demands({"p": 0.95, "q": 0.9, "m": 0.1}, {"p": 4_500_000_000, "m": 6 * GB})
    return compute_assignment(
        models,
        fleet(2, 10 * GB),
        forbid_memory_oversubscription=forbid,
        hysteresis=0.1,
        previous={"m": ["w0"]},
    )


def test_row6_soft_mode_holds_an_oversubscribed_model() -> None:
    got = _row6(forbid=False)
    assert where(got) == {"p": ("w0",), "q": ("w1",), "m": ("w0",)}
    assert got.memory_load["w0"] == 10_500_000_000
    assert got.held == 1
    assert got.max_improvement == pytest.approx(0.05)


def test_row6_forbid_moves_it_to_a_worker_where_it_fits() -> None:
    got = _row6(forbid=True)
    assert where(got) == {"p": ("w0",), "q": ("w1",), "m": ("w1",)}
    assert got.held == 0
    assert got.max_improvement == 0.0  # w0 was no candidate, so nothing was compared


# --- edge cases ---------------------------------------------------------------------------------


def test_no_workers_is_an_error() -> None:
    with pytest.raises(PlacementInputError, match="at least one worker"):
        compute_assignment(demands({"a": 0.1}), [])
    with pytest.raises(PlacementInputError):
        compute_assignment([], [])


def test_duplicates_are_errors() -> None:
    with pytest.raises(PlacementInputError, match="worker URLs"):
        compute_assignment([], [WorkerBudget("w0", 0), WorkerBudget("w0", 0)])
    with pytest.raises(PlacementInputError, match="model names"):
        compute_assignment([ModelDemand("a", 0.1, 0), ModelDemand("a", 0.2, 0)], fleet(1))


def test_negative_demand_is_rejected() -> None:
    with pytest.raises(ValueError, match="u"):
        ModelDemand("a", u=-0.1, mem=0)
    with pytest.raises(ValueError, match="mem"):
        ModelDemand("a", u=0.1, mem=-1)


def test_no_models_gives_empty_placement_and_zero_loads() -> None:
    got = compute_assignment([], fleet(2))
    assert got == Assignment({}, {"w0": 0.0, "w1": 0.0}, {"w0": 0, "w1": 0}, 0, 0.0)


def test_one_worker_takes_everything_whatever_the_replicas() -> None:
    models = demands({"a": 0.5, "b": 0.7}, {"a": 3 * GB, "b": 9 * GB})
    got = compute_assignment(models, fleet(1, 10 * GB), default_replicas="all")
    assert got.placement == {
        "a": ModelPlacement(("w0",), (1.0,)),
        "b": ModelPlacement(("w0",), (1.0,)),
    }
    assert got.compute_load == {"w0": pytest.approx(1.2)}
    assert got.memory_load == {"w0": 12 * GB}  # oversubscribed, still placed


def test_equal_models_are_visited_by_name() -> None:
    got = compute_assignment(demands({"b": 0.3, "a": 0.3}), fleet(2))
    assert where(got) == {"a": ("w0",), "b": ("w1",)}
    assert list(got.placement) == ["a", "b"]


def test_equal_u_visits_the_bigger_footprint_first() -> None:
    models = demands({"a": 0.3, "z": 0.3}, {"a": 1 * GB, "z": 2 * GB})
    got = compute_assignment(models, fleet(2, 0))
    assert where(got) == {"z": ("w0",), "a": ("w1",)}


def test_workers_are_ordered_by_url_and_ties_go_to_the_smallest() -> None:
    workers = [WorkerBudget("b:1", 0), WorkerBudget("c:1", 0), WorkerBudget("a:1", 0)]
    got = compute_assignment(demands({"m": 0.2}), workers)
    assert where(got) == {"m": ("a:1",)}
    assert list(got.compute_load) == ["a:1", "b:1", "c:1"]
    multi = compute_assignment(demands({"m": 0.2}), workers, replicas={"m": 2})
    assert where(multi) == {"m": ("a:1", "b:1")}


@pytest.mark.parametrize(
    ("default", "override", "expected"),
    [(1, 0, 1), (1, -3, 1), (1, 2, 2), (1, "all", 4), ("all", None, 4), (3, None, 3), (7, 1, 1)],
)
def test_replica_count_clamps(default: Replicas, override: Replicas | None, expected: int) -> None:
    overrides = {} if override is None else {"m": override}
    got = compute_assignment(
        demands({"m": 1.0}),
        fleet(4),
        default_replicas=default,
        replicas=overrides,
    )
    assert len(got.placement["m"].workers) == expected
    assert got.placement["m"].weights == pytest.approx((1.0 / expected,) * expected)
    assert sum(got.compute_load.values()) == pytest.approx(1.0)


def test_overrides_for_absent_models_are_ignored() -> None:
    got = compute_assignment(demands({"m": 0.5}), fleet(2), replicas={"ghost": "all"})
    assert where(got) == {"m": ("w0",)}


def test_multi_replica_charges_a_share_of_compute_and_the_full_footprint() -> None:
    got = compute_assignment(
        demands({"m": 0.9}, {"m": 2 * GB}), fleet(3, 10 * GB), replicas={"m": 3}
    )
    assert got.compute_load == pytest.approx({"w0": 0.3, "w1": 0.3, "w2": 0.3})
    assert got.memory_load == {"w0": 2 * GB, "w1": 2 * GB, "w2": 2 * GB}


def test_multi_replica_ranks_by_score_then_previous_member_then_url() -> None:
    # a (single) loads w0; m with 2 replicas goes to the two idle workers, preferring its
    # previous member w3 over w1 at equal score, and w1 over w2 by URL.
    got = compute_assignment(
        demands({"a": 0.9, "m": 0.4}),
        fleet(4),
        replicas={"m": 2},
        previous={"m": ["w3", "w0"]},
    )
    assert where(got) == {"a": ("w0",), "m": ("w1", "w3")}
    assert got.placement["m"].weights == (0.5, 0.5)


def test_multi_replica_ranks_workers_it_does_not_fit_last_only_when_forbidden() -> None:
    # big lands on w0 (compute 1.5). m (2 replicas, share 0.1, 6 GB) scores 0.3 on w1,
    # 1.6 on w0 and 1.2 on w2 (6 GB of 5 GB): by score alone w2 beats w0.
    workers = [WorkerBudget("w0", 20 * GB), WorkerBudget("w1", 20 * GB), WorkerBudget("w2", 5 * GB)]
    models = demands({"big": 1.5, "m": 0.2}, {"big": 1 * GB, "m": 6 * GB})
    forbid = compute_assignment(models, workers, replicas={"m": 2})
    assert where(forbid)["m"] == ("w0", "w1")
    soft = compute_assignment(
        models, workers, replicas={"m": 2}, forbid_memory_oversubscription=False
    )
    assert where(soft)["m"] == ("w1", "w2")
    assert soft.memory_load == {"w0": 1 * GB, "w1": 6 * GB, "w2": 6 * GB}


def test_multi_replica_with_no_fitting_worker_is_still_placed() -> None:
    got = compute_assignment(
        demands({"m": 0.4}, {"m": 50 * GB}), fleet(3, 10 * GB), replicas={"m": 2}
    )
    assert where(got) == {"m": ("w0", "w1")}


def test_infeasible_single_model_is_still_placed() -> None:
    models = demands({"huge": 0.1, "small": 0.05}, {"huge": 50 * GB, "small": 1 * GB})
    got = compute_assignment(models, fleet(2, 10 * GB))
    assert where(got) == {"huge": ("w0",), "small": ("w1",)}
    assert got.memory_load == {"w0": 50 * GB, "w1": 1 * GB}


def test_forbid_falls_back_to_all_workers_when_none_fits() -> None:
    # Nothing fits m; all workers are candidates and the lowest score (w1, less memory) wins.
    models = demands({"a": 0.5, "b": 0.4, "m": 0.1}, {"a": 8 * GB, "b": 2 * GB, "m": 9 * GB})
    got = compute_assignment(models, fleet(2, 10 * GB))
    assert where(got) == {"a": ("w0",), "b": ("w1",), "m": ("w1",)}


# --- hysteresis ---------------------------------------------------------------------------------


def test_hysteresis_zero_still_holds_an_exact_tie() -> None:
    got = compute_assignment(demands({"a": 0.4}), fleet(2), previous={"a": ["w1"]})
    assert where(got) == {"a": ("w1",)}
    assert got.held == 1
    assert got.max_improvement == 0.0


def test_previous_on_the_best_worker_is_not_counted_as_held() -> None:
    got = compute_assignment(demands({"a": 0.4}), fleet(2), hysteresis=0.5, previous={"a": ["w0"]})
    assert where(got) == {"a": ("w0",)}
    assert got.held == 0


def test_hysteresis_band_edge() -> None:
    # x (0.5) lands on w0, y (0.3) on w1; b (0.2) was on w0.
    models = demands({"x": 0.5, "y": 0.3, "b": 0.2})
    previous = {"b": ["w0"]}  # w0 would be 0.7, best w1 is 0.5: improvement 0.4
    held = compute_assignment(models, fleet(2), hysteresis=0.45, previous=previous)
    assert where(held)["b"] == ("w0",)
    assert held.held == 1
    assert held.max_improvement == pytest.approx(0.4)
    moved = compute_assignment(models, fleet(2), hysteresis=0.35, previous=previous)
    assert where(moved)["b"] == ("w1",)
    assert moved.held == 0
    assert moved.max_improvement == pytest.approx(0.4)


def test_previous_worker_that_left_the_fleet_is_ignored() -> None:
    got = compute_assignment(
        demands({"a": 0.4}), fleet(2), hysteresis=0.9, previous={"a": ["gone"]}
    )
    assert where(got) == {"a": ("w0",)}
    assert got.held == 0


def test_previous_multi_worker_placement_gets_no_hysteresis_at_k1() -> None:
    got = compute_assignment(
        demands({"a": 0.4}), fleet(2), hysteresis=0.9, previous={"a": ["w1", "w0"]}
    )
    assert where(got) == {"a": ("w0",)}
    assert got.held == 0


def test_weightless_model_off_an_empty_worker_reports_no_improvement() -> None:
    got = compute_assignment(
        demands({"busy": 0.5, "cold": 0.0}), fleet(2), previous={"cold": ["w0"]}
    )
    assert where(got) == {"busy": ("w0",), "cold": ("w1",)}
    assert got.max_improvement == 0.0


def test_worker_sets_feed_the_next_repack() -> None:
    first = compute_assignment(demands({"a": 0.5, "b": 0.4}), fleet(2), replicas={"b": 2})
    assert first.worker_sets == {"a": frozenset({"w0"}), "b": frozenset({"w0", "w1"})}
    again = compute_assignment(
        demands({"a": 0.5, "b": 0.4}), fleet(2), replicas={"b": 2}, previous=first.worker_sets
    )
    assert again == first


# --- moved / changed_workers (Repack step 7) ----------------------------------------------------


def test_unchanged_placement_changes_nothing() -> None:
    sets = {"a": ["w0"], "b": ["w1", "w0"]}
    assert placement_change(sets, {"a": ("w0",), "b": ("w0", "w1")}) == PlacementChange((), ())


def test_moved_models_touch_the_symmetric_difference() -> None:
    before = {"a": ["w0"], "b": ["w0", "w1"], "c": ["w2"]}
    after = {"a": ["w1"], "b": ["w1", "w2"], "c": ["w2"]}
    assert placement_change(before, after) == PlacementChange(
        moved=("a", "b"), changed_workers=("w0", "w1", "w2")
    )


def test_new_models_are_not_moves_and_touch_nothing() -> None:
    assert placement_change({"a": ["w0"]}, {"a": ["w0"], "new": ["w3"]}) == PlacementChange((), ())


def test_dropped_models_touch_every_worker_they_were_on() -> None:
    before = {"a": ["w0"], "gone": ["w1", "w2"]}
    assert placement_change(before, {"a": ["w0"]}) == PlacementChange(
        moved=(), changed_workers=("w1", "w2")
    )


def test_placement_change_between_two_assignments() -> None:
    workers = fleet(2)
    old = compute_assignment(demands({"a": 0.6, "b": 0.3}), workers)
    new = compute_assignment(demands({"a": 0.2, "b": 0.3, "c": 0.4}), workers)
    assert where(old) == {"a": ("w0",), "b": ("w1",)}
    assert where(new) == {"a": ("w1",), "b": ("w1",), "c": ("w0",)}
    assert placement_change(old.worker_sets, new.worker_sets) == PlacementChange(
        moved=("a",), changed_workers=("w0", "w1")
    )
