"""Batch planning against its table, pad-up (step 8) included."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import pytest

from reactantserver.worker.scheduler.planning import Plan, fit_batch, plan_batch, take_count

from ._builders import pending, queue_of, scheduled

INF = None  # C = max_batch_size unset


@pytest.mark.parametrize(
    ("rows", "sizes", "cap", "batch", "taken"),
    [
        pytest.param([2, 2, 2], (1, 4, 8), INF, 4, 2, id="2,2,2 [1,4,8] -> 4 x2"),
        pytest.param([1], (4, 8), INF, 4, 1, id="1 [4,8] -> 4 padded"),
        pytest.param([6, 1], (1, 4, 8), INF, 8, 2, id="6,1 [1,4,8] -> 8 x2"),
        pytest.param([2, 2, 2, 2], (1, 4, 8), 4, 4, 2, id="2,2,2,2 [1,4,8] C4 -> 4 x2"),
        pytest.param([1, 1, 1], (4, 8), 2, 4, 2, id="1,1,1 [4,8] C2 -> 4 padded x2"),
        pytest.param([6], (1, 4, 8), 2, 8, 1, id="6 [1,4,8] C2 -> 8 padded x1"),
        pytest.param([1] * 5, (1, 8), INF, 1, 1, id="1x5 [1,8] -> 1 x1 (no pad-up)"),
        pytest.param([1] * 4, (1, 4), INF, 4, 4, id="1x4 [1,4] -> 4 x4"),
        # Variants A, A, B: the window of A stops at B, so A plans over [1, 1] ...
        pytest.param([1, 1], (1, 2), INF, 2, 2, id="variants: A,A -> 2"),
        # ... then B's window is B alone.
        pytest.param([1], (1, 2), INF, 1, 1, id="variants: then B alone at 1"),
    ],
)
def test_spec_table(
    rows: list[int], sizes: tuple[int, ...], cap: int | None, batch: int, taken: int
) -> None:
    assert plan_batch(rows, sizes, cap=cap) == Plan(batch, taken)


def test_spec_table_no_batch_axis() -> None:
    # "any (no batch axis)": a lone model.mlir, never coalesced -> B = 0, one request.
    assert plan_batch([1, 1, 1], (0,), coalescable=False) == Plan(0, 1)


def test_not_coalescable_takes_the_head_alone_at_the_smallest_fitting_size() -> None:
    assert plan_batch([3, 1, 1], (1, 4, 8), coalescable=False) == Plan(4, 1)
    assert plan_batch([1, 1, 1], (1, 4, 8), coalescable=False) == Plan(1, 1)


def test_variants_row_through_the_queue_window() -> None:
    model = scheduled(sizes=(1, 2), variants=(0, 1))
    a1, a2, b = (pending(model, variant=v) for v in (0, 0, 1))
    queue = queue_of(a1, a2, b)

    window = queue.window(queue[0], math.inf)
    assert window == [a1, a2]
    first = plan_batch([r.rows for r in window], model.sizes[0])
    assert first == Plan(2, 2)
    queue.remove_all(window[: first.count])

    window = queue.window(queue[0], math.inf)
    assert window == [b]
    assert plan_batch([r.rows for r in window], model.sizes[1]) == Plan(1, 1)


def test_empty_window_is_rejected() -> None:
    with pytest.raises(ValueError, match="empty window"):
        plan_batch([], (1, 2))


def test_head_larger_than_any_fill_gets_its_own_size() -> None:
    # Step 6: R = 3 gives B = 2, but the head has 3 rows -> B = 4, and it fits alone.
    assert plan_batch([3], (1, 2, 4)) == Plan(4, 1)


def test_no_skipping_behind_a_request_that_does_not_fit() -> None:
    # B = 4; 1 + 2 fit, the 3 does not, and the trailing 1 is not taken past it.
    assert plan_batch([1, 2, 3, 1], (1, 4)) == Plan(4, 2)


# -- helpers -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sizes", "rows", "expected"),
    [((1, 4, 8), 1, 1), ((1, 4, 8), 2, 4), ((1, 4, 8), 8, 8), ((1, 4, 8), 9, 8), ((0,), 3, 0)],
)
def test_fit_batch(sizes: tuple[int, ...], rows: int, expected: int) -> None:
    assert fit_batch(sizes, rows) == expected


@pytest.mark.parametrize(
    ("rows", "limit", "expected"),
    [([1, 1, 1], 2, 2), ([2, 2], 4, 2), ([5, 1], 4, 1), ([1, 3, 1], 3, 1), ([1], math.inf, 1)],
)
def test_take_count(rows: list[int], limit: float, expected: int) -> None:
    assert take_count(rows, limit) == expected


# -- step 8: pad up when cheaper ---------------------------------------------------------------


def _costs(table: Mapping[int, float]) -> Callable[[int], float | None]:
    return table.get


@pytest.mark.parametrize(
    ("rows", "sizes", "cap", "costs", "expected"),
    [
        # 1 row / 0.01 s = 100 vs 5 rows / 0.02 s = 250 -> pad up to 8 and take all five.
        pytest.param([1] * 5, (1, 8), INF, {1: 0.01, 8: 0.02}, Plan(8, 5), id="pad-up wins"),
        # 1 / 0.01 = 100 vs 5 / 0.1 = 50 -> stay at 1.
        pytest.param([1] * 5, (1, 8), INF, {1: 0.01, 8: 0.1}, Plan(1, 1), id="too costly"),
        # Exact tie (1 / 0.125 = 5 / 0.625) -> the smaller size.
        pytest.param([1] * 5, (1, 8), INF, {1: 0.125, 8: 0.625}, Plan(1, 1), id="tie -> smaller"),
        # B = 1 planned; rows/cost 1/0.5 = 2, 3/1.0 = 3, 3/2.0 = 1.5 -> 4 takes all three.
        pytest.param(
            [1, 1, 1], (1, 4, 8), INF, {1: 0.5, 4: 1.0, 8: 2.0}, Plan(4, 3), id="best of three"
        ),
        # Exact tie between larger sizes (4 / 0.25 = 6 / 0.375) -> the smaller one.
        pytest.param(
            [1] * 6, (1, 4, 8), INF, {4: 0.25, 8: 0.375}, Plan(4, 4), id="tie above B -> smaller"
        ),
        # Sizes below the planned B need no measurement: B = 4 here, 1 is never considered.
        pytest.param([2, 2, 2], (1, 4, 8), INF, {4: 0.04, 8: 0.05}, Plan(8, 3), id="only s>=B"),
        # The cap still bounds the rows taken at a larger size.
        pytest.param([1] * 5, (1, 8), 2, {1: 0.01, 8: 0.015}, Plan(8, 2), id="capped"),
    ],
)
def test_pad_up_enabled(
    rows: list[int],
    sizes: tuple[int, ...],
    cap: int | None,
    costs: Mapping[int, float],
    expected: Plan,
) -> None:
    assert plan_batch(rows, sizes, cap=cap, measured=_costs(costs)) == expected


@pytest.mark.parametrize(
    "costs",
    [
        pytest.param({1: 0.01}, id="8 unmeasured"),
        pytest.param({8: 0.001}, id="1 unmeasured"),
        pytest.param({}, id="nothing measured"),
    ],
)
def test_pad_up_needs_every_larger_size_measured(costs: Mapping[int, float]) -> None:
    assert plan_batch([1] * 5, (1, 8), measured=_costs(costs)) == Plan(1, 1)


def test_pad_up_is_off_without_costs() -> None:
    assert plan_batch([1] * 5, (1, 8)) == Plan(1, 1)


def test_pad_up_does_not_apply_to_non_coalescable_models() -> None:
    plan = plan_batch([1] * 5, (1, 8), coalescable=False, measured=_costs({1: 1.0, 8: 0.001}))
    assert plan == Plan(1, 1)
