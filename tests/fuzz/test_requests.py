"""Property: a malformed ``ModelInferRequest`` gets its documented status and harms nothing.

One real worker (``static`` mode), raw ``service_pb2`` requests over gRPC. Every case must end
with a status of the set docs/reference/protocol.md documents for what it breaks (never
``INTERNAL`` or ``UNKNOWN``, never a hang), and after each one a good inference,
``ServerReady`` and ``ModelControlStatus`` succeed. At the end the worker is alive and its
RSS grew less than :data:`RSS_GROWTH_BOUND` after warm-up.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from . import _report
from ._probe import Probe
from ._requests import MAX_ROWS, Mutation, base_request, expected_statuses
from ._settings import fuzz_settings
from ._tensors import (
    byte_counts,
    bytes_edge,
    datatypes,
    extents,
    huge_shapes,
    input_sets,
    negative_dims,
    typed_raw,
)
from ._wire import model_names, outputs, parameters, shm

pytestmark = pytest.mark.slow

RSS_GROWTH_BOUND = 64 << 20
WARM_UP_REQUESTS = 200
ROWS = st.integers(1, MAX_ROWS)


@pytest.fixture(scope="module", autouse=True)
def rss_after_warm_up(probe: Probe) -> int:
    """The worker's RSS once every batch size has run and the error paths have been taken."""
    for i in range(WARM_UP_REQUESTS):
        request = base_request(i % MAX_ROWS + 1)
        if i % 2:
            request.inputs[0].datatype = "INT32"
        probe.send(request)
    probe.assert_healthy("warm-up")
    return probe.rss()


def run_case(probe: Probe, strategy: str, rows: int, mutations: Sequence[Mutation]) -> None:
    """Build the case on a good ``rows``-row request and check it (see :class:`Probe`)."""
    request = base_request(rows)
    for mutation in mutations:
        mutation.apply(request)
    label = "; ".join(m.label for m in mutations)
    probe.check(strategy, request, expected_statuses(mutations), f"{label} (rows={rows})")


@fuzz_settings(0.06)
@given(rows=ROWS, mutation=datatypes())
def test_datatypes(probe: Probe, rows: int, mutation: Mutation) -> None:
    run_case(probe, "datatypes", rows, [mutation])


@fuzz_settings(0.08)
@given(rows=ROWS, mutation=extents())
def test_ranks_and_extents(probe: Probe, rows: int, mutation: Mutation) -> None:
    run_case(probe, "ranks/extents", rows, [mutation])


@fuzz_settings(0.05)
@given(rows=ROWS, mutation=byte_counts())
def test_byte_counts(probe: Probe, rows: int, mutation: Mutation) -> None:
    run_case(probe, "byte counts", rows, [mutation])


@fuzz_settings(0.05)
@given(rows=ROWS, mutation=huge_shapes())
def test_huge_shapes(probe: Probe, rows: int, mutation: Mutation) -> None:
    run_case(probe, "huge shapes", rows, [mutation])


@fuzz_settings(0.04)
@given(rows=ROWS, mutation=negative_dims())
def test_negative_dims(probe: Probe, rows: int, mutation: Mutation) -> None:
    run_case(probe, "negative dims", rows, [mutation])


@fuzz_settings(0.06)
@given(rows=ROWS, mutation=input_sets())
def test_input_sets(probe: Probe, rows: int, mutation: Mutation) -> None:
    run_case(probe, "input sets", rows, [mutation])


@fuzz_settings(0.06)
@given(rows=ROWS, mutation=outputs())
def test_requested_outputs(probe: Probe, rows: int, mutation: Mutation) -> None:
    run_case(probe, "outputs", rows, [mutation])


@fuzz_settings(0.1)
@given(rows=ROWS, mutation=parameters())
def test_parameters(probe: Probe, rows: int, mutation: Mutation) -> None:
    run_case(probe, "parameters", rows, [mutation])


@fuzz_settings(0.1)
@given(case=ROWS.flatmap(lambda rows: st.tuples(st.just(rows), shm(rows))))
def test_shared_memory_references(probe: Probe, case: tuple[int, Mutation]) -> None:
    rows, mutation = case
    run_case(probe, "shm references", rows, [mutation])


@fuzz_settings(0.06)
@given(rows=ROWS, mutation=bytes_edge())
def test_bytes_framing(probe: Probe, rows: int, mutation: Mutation) -> None:
    run_case(probe, "BYTES framing", rows, [mutation])


@fuzz_settings(0.05)
@given(rows=ROWS, mutation=typed_raw())
def test_typed_and_raw_contents(probe: Probe, rows: int, mutation: Mutation) -> None:
    run_case(probe, "typed/raw contents", rows, [mutation])


@fuzz_settings(0.04)
@given(rows=ROWS, mutation=model_names())
def test_unknown_models_and_versions(probe: Probe, rows: int, mutation: Mutation) -> None:
    run_case(probe, "model/version", rows, [mutation])


def _breaking(rows: int) -> st.SearchStrategy[Mutation]:
    families = st.one_of(
        datatypes(),
        extents(),
        byte_counts(),
        huge_shapes(),
        negative_dims(),
        input_sets(),
        outputs(),
        parameters(),
        shm(rows),
        bytes_edge(),
        typed_raw(),
        model_names(),
    )
    return families.filter(lambda mutation: not mutation.harmless)


@fuzz_settings(0.1)
@given(
    case=ROWS.flatmap(
        lambda rows: st.tuples(st.just(rows), st.lists(_breaking(rows), min_size=2, max_size=3))
    )
)
def test_combined_breakage(probe: Probe, case: tuple[int, list[Mutation]]) -> None:
    rows, mutations = case
    run_case(probe, "combined", rows, mutations)


def test_worker_survived_with_bounded_rss(probe: Probe, rss_after_warm_up: int) -> None:
    probe.assert_healthy("the whole run")
    rss = probe.rss()
    _report.RSS["request worker"] = (rss_after_warm_up, rss)
    growth = rss - rss_after_warm_up
    assert growth < RSS_GROWTH_BOUND, f"RSS grew by {growth / _report.MIB:.1f} MiB"
