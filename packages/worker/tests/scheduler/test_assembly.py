"""Batch assembly and result slicing."""

from __future__ import annotations

from typing import Any

import numpy as np

from reactantserver.worker.scheduler.assembly import assemble, split
from reactantserver.worker.scheduler.planning import Plan, plan_batch

Array = np.ndarray[Any, Any]


def _rows(start: int, n: int, features: int = 2) -> Array:
    """``n`` rows of ``features``; row ``k`` is filled with ``start + k``."""
    return np.repeat(np.arange(start, start + n, dtype=np.float32)[:, None], features, axis=1)


# -- assemble ----------------------------------------------------------------------------------


def test_concatenates_in_request_order_and_pads_with_zeros() -> None:
    a, b = _rows(1, 1), _rows(2, 2)
    (merged,) = assemble([[a], [b]], [1, 2], [0], batch=4)
    assert merged.dtype == np.float32
    np.testing.assert_array_equal(merged, [[1, 1], [2, 2], [3, 3], [0, 0]])


def test_exact_fill_needs_no_padding() -> None:
    (merged,) = assemble([[_rows(1, 2)], [_rows(3, 2)]], [2, 2], [0], batch=4)
    np.testing.assert_array_equal(merged[:, 0], [1, 2, 3, 4])


def test_concatenates_along_each_inputs_own_batch_axis() -> None:
    # x is "nk" (axis 0), y is "kn" (axis 1), z has no batch axis.
    x1, x2 = _rows(1, 1, 3), _rows(2, 2, 3)
    y1, y2 = x1.T.copy(), x2.T.copy()
    z1, z2 = np.array([7, 7], np.int32), np.array([8, 8], np.int32)
    x, y, z = assemble([[x1, y1, z1], [x2, y2, z2]], [1, 2], [0, 1, None], batch=4)
    assert x.shape == (4, 3)
    assert y.shape == (3, 4)
    np.testing.assert_array_equal(x[:, 0], [1, 2, 3, 0])
    np.testing.assert_array_equal(y[0], [1, 2, 3, 0])
    np.testing.assert_array_equal(y, x.T)
    # An unbatched input is the first request's.
    assert z is z1


def test_higher_rank_non_zero_batch_axis() -> None:
    a = np.ones((2, 1, 3), np.int64)
    b = np.full((2, 2, 3), 2, np.int64)
    (merged,) = assemble([[a], [b]], [1, 2], [1], batch=8)
    assert merged.shape == (2, 8, 3)
    assert merged.dtype == np.int64
    np.testing.assert_array_equal(merged[:, 0], 1)
    np.testing.assert_array_equal(merged[:, 1:3], 2)
    np.testing.assert_array_equal(merged[:, 3:], 0)


def test_lone_request_filling_the_batch_passes_through() -> None:
    x, z = _rows(1, 4), np.zeros(3)
    out = assemble([[x, z]], [4], [0, None], batch=4)
    assert out[0] is x
    assert out[1] is z


def test_lone_request_of_an_unbatched_program_passes_through() -> None:
    x = np.ones((3, 2))
    (out,) = assemble([[x]], [3], [0], batch=0)
    assert out is x


def test_lone_partial_request_is_padded_into_a_new_array() -> None:
    x = _rows(5, 1)
    (out,) = assemble([[x]], [1], [0], batch=4)
    assert out is not x
    assert not np.shares_memory(out, x)
    np.testing.assert_array_equal(out[:, 0], [5, 0, 0, 0])
    np.testing.assert_array_equal(x, [[5, 5]])


def test_padding_does_not_reuse_stale_memory() -> None:
    # np.empty could return recycled memory: the padding must be written as zeros every time.
    for _ in range(3):
        (out,) = assemble([[np.full((1, 64), np.nan, np.float32)]], [1], [0], batch=8)
        assert not np.isnan(out[1:]).any()
        np.testing.assert_array_equal(out[1:], 0)


# -- split -------------------------------------------------------------------------------------


def test_split_slices_views_and_drops_padding() -> None:
    out = np.arange(8, dtype=np.float32).reshape(4, 2)
    first, second = split([out], [1, 2], [0])
    np.testing.assert_array_equal(first[0], [[0, 1]])
    np.testing.assert_array_equal(second[0], [[2, 3], [4, 5]])
    for view in (first[0], second[0]):
        assert not view.flags.owndata
        assert np.shares_memory(view, out)


def test_split_along_each_outputs_own_batch_axis() -> None:
    out0 = np.arange(12).reshape(4, 3)  # batch axis 0
    out1 = np.ascontiguousarray(out0.T)  # batch axis 1
    scalar = np.array(42.0)  # unbatched
    results = split([out0, out1, scalar], [2, 1], [0, 1, None])
    assert len(results) == 2
    (a0, a1, a2), (b0, b1, b2) = results
    np.testing.assert_array_equal(a0, out0[:2])
    np.testing.assert_array_equal(a1, out0[:2].T)
    np.testing.assert_array_equal(b0, out0[2:3])
    np.testing.assert_array_equal(b1, out0[2:3].T)
    assert a1.shape == (3, 2)
    assert b1.shape == (3, 1)
    # Unbatched outputs go whole to every request.
    assert a2 is scalar
    assert b2 is scalar
    assert np.shares_memory(b1, out1)


def test_split_lone_request_using_the_whole_batch_gets_the_outputs() -> None:
    out, extra = np.ones((4, 2)), np.zeros(5)
    ((a, b),) = split([out, extra], [4], [0, None])
    assert a is out
    assert b is extra


def test_split_lone_request_drops_the_padding() -> None:
    out = np.arange(8).reshape(2, 4)  # batch axis 1, compiled 4, request 3
    ((a,),) = split([out], [3], [1])
    np.testing.assert_array_equal(a, out[:, :3])
    assert not a.flags.owndata
    assert np.shares_memory(a, out)


def test_assemble_then_split_round_trip() -> None:
    requests = [_rows(1, 1), _rows(10, 3), _rows(100, 2)]
    rows = [1, 3, 2]
    (merged,) = assemble([[r] for r in requests], rows, [0], batch=8)
    results = split([merged * 2], rows, [0])
    for request, (result,) in zip(requests, results, strict=True):
        np.testing.assert_array_equal(result, request * 2)


# -- the documented example ------------------------------------------------------------------------

WEIGHTS = np.array([10, 100], np.float32)


def _run(requests: list[Array], sizes: tuple[int, ...]) -> list[Array]:
    """Plan, assemble, "execute" ``x * weights``, split: one dispatch of the whole queue."""
    rows = [len(r) for r in requests]
    plan = plan_batch(rows, sizes)
    assert plan.count == len(requests)
    (x,) = assemble([[r] for r in requests], rows, [0], batch=plan.batch)
    assert x.shape == (plan.batch, 2)
    return [out for (out,) in split([x * WEIGHTS], rows, [0])]


def test_spec_example_four_requests_one_dispatch() -> None:
    requests = [np.array([[k, k]], np.float32) for k in range(1, 5)]
    assert plan_batch([1, 1, 1, 1], (1, 4)) == Plan(4, 4)
    results = _run(requests, (1, 4))
    for k, result in enumerate(results, start=1):
        np.testing.assert_array_equal(result, [[10 * k, 100 * k]])


def test_spec_example_only_a_batch_4_program() -> None:
    assert plan_batch([1], (4,)) == Plan(4, 1)
    (result,) = _run([np.array([[3, 5]], np.float32)], (4,))
    np.testing.assert_array_equal(result, [[30, 500]])
