"""MetaCallSession, the ``call`` a meta's ``run`` receives: sub-calls and scratch.

The sessions here are driven from the test thread against a started worker (real jax
sub-models on the CPU, the scheduler's dispatch thread running), exactly as ``run`` drives
them from a hook-pool thread.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest

from packages.worker.tests._world import World
from reactantserver.core.buffer_pool import BufferPool
from reactantserver.core.errors import (
    DeadlineExceededError,
    InvalidArgumentError,
    ModelUnavailableError,
    PoolAcquireTimeout,
    status_of,
)
from reactantserver.core.hooks import NamedTensor
from reactantserver.worker.hooks import HookError
from reactantserver.worker.meta import (
    MetaCallSession,
    MetaModel,
    RequestCancelledError,
    scratch_span,
)
from reactantserver.worker.scheduler import StatsSnapshot

from ._metaworld import (
    EMBED,
    HOOKED,
    META,
    SCORE,
    WAIT_S,
    Exported,
    entry_of,
    export_bundles,
    items,
    meta_config,
    meta_model,
    start_meta_world,
    wait_for,
)

Array = np.ndarray[Any, Any]
META_LOGGER = "reactantserver.worker.meta"


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Exported:
    return export_bundles(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def world(exported: Exported, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    config = meta_config(tmp_path_factory.getbasetemp() / "meta-cache")
    bundles = [exported.embed, exported.score, exported.hooked, exported.pipeline]
    world = start_meta_world(config, bundles)
    try:
        yield world
    finally:
        world.close()


def _unused_run(inputs: list[NamedTensor], call: Any) -> list[NamedTensor]:
    raise AssertionError("these tests drive the session directly")


def make_meta(world: World, name: str, calls: tuple[str, ...] = (EMBED, SCORE)) -> MetaModel:
    template = entry_of(world, META).meta
    assert template is not None
    return meta_model(template, name, _unused_run, calls)


def session(
    world: World,
    meta: MetaModel,
    pool: BufferPool | None = None,
    *,
    deadline_ns: int | None = None,
) -> MetaCallSession:
    return MetaCallSession(
        meta, world.state.registry, world.runtime.scheduler, pool, deadline_ns=deadline_ns
    )


def stats(world: World, name: str) -> StatsSnapshot:
    return world.runtime.scheduler.stats(name) or StatsSnapshot()


def direct(world: World, name: str, tensor: NamedTensor) -> Array:
    (out,) = world.runtime.scheduler.call(name, [tensor])
    return np.asarray(out)


# -- sub-calls -------------------------------------------------------------------------------


def test_a_sub_call_returns_what_the_stage_computes(world: World) -> None:
    x = items(5)
    call = session(world, make_meta(world, "direct"))
    (emb,) = call(EMBED, [NamedTensor("x", x)])
    assert emb.name == "emb"
    np.testing.assert_array_equal(emb.data, direct(world, EMBED, NamedTensor("x", x)))
    (score,) = call(SCORE, [NamedTensor("emb", emb.data[:2])])
    assert score.shape == (2, 1)
    np.testing.assert_array_equal(
        score.data, direct(world, SCORE, NamedTensor("emb", emb.data[:2]))
    )
    assert call.calls == 2
    assert call.compute_ns > 0


def test_an_undeclared_callee_is_an_internal_error(world: World) -> None:
    before = stats(world, SCORE).requests_served
    call = session(world, make_meta(world, "embed_only", (EMBED,)))
    with pytest.raises(HookError, match="undeclared") as caught:
        call(SCORE, [NamedTensor("emb", np.zeros((1, 8), np.float32))])
    assert status_of(caught.value) is grpc.StatusCode.INTERNAL
    assert "'pipeline_score'" in str(caught.value)
    assert stats(world, SCORE).requests_served == before


@pytest.mark.parametrize(
    ("callee", "fragment"),
    [("ghost", "sub-model 'ghost' of meta 'm' is not loaded"), (META, "is a meta model")],
)
def test_a_callee_that_cannot_serve_is_unavailable(
    world: World, callee: str, fragment: str
) -> None:
    call = session(world, make_meta(world, "m", (callee,)))
    with pytest.raises(ModelUnavailableError, match=fragment) as caught:
        call(callee, [NamedTensor("items", items(2))])
    assert status_of(caught.value) is grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize(
    ("tensors", "fragment"),
    [
        ([NamedTensor("x", np.zeros((2, 15), np.float32))], "x"),
        ([NamedTensor("y", np.zeros((2, 16), np.float32))], "unexpected inference input 'y'"),
        ([], "expects input 'x', missing"),
    ],
)
def test_inputs_are_checked_against_the_sub_models_client_spec(
    world: World, tensors: list[NamedTensor], fragment: str
) -> None:
    before = stats(world, EMBED).requests_served
    call = session(world, make_meta(world, "checked"))
    with pytest.raises(InvalidArgumentError, match=fragment) as caught:
        call(EMBED, tensors)
    assert type(caught.value) is InvalidArgumentError  # the same class run can catch
    assert stats(world, EMBED).requests_served == before


def test_inputs_that_are_not_named_tensors_are_an_internal_error(world: World) -> None:
    call = session(world, make_meta(world, "untyped"))
    with pytest.raises(HookError, match="expected a list of NamedTensor"):
        call(EMBED, [np.zeros((1, 16), np.float32)])  # type: ignore[list-item]


def test_the_sub_models_hooks_run_around_the_sub_call(world: World) -> None:
    raw = items(3, seed=4)
    call = session(world, make_meta(world, "hooks", (HOOKED,)))
    emb, norm = call(HOOKED, [NamedTensor("raw", raw)])
    executable = direct(world, HOOKED, NamedTensor("x", raw * np.float32(2.0)))  # preprocess
    assert (emb.name, norm.name) == ("emb", "norm")  # client output order
    np.testing.assert_array_equal(emb.data, executable + np.float32(1.0))  # postprocess
    np.testing.assert_allclose(norm.data, np.linalg.norm(executable, axis=1), rtol=1e-6)


@pytest.mark.parametrize(
    "requested", [["norm", "emb"], ["norm"], ["emb"]], ids=["reordered", "norm", "emb"]
)
def test_requested_outputs_pick_and_order_the_outputs(world: World, requested: list[str]) -> None:
    call = session(world, make_meta(world, "picky", (HOOKED,)))
    raw = NamedTensor("raw", items(2, seed=5))
    out = call(HOOKED, [raw], requested_outputs=requested)
    assert [t.name for t in out] == requested
    everything = {t.name: t.data for t in call(HOOKED, [raw])}
    for tensor in out:
        np.testing.assert_array_equal(tensor.data, everything[tensor.name])


def test_an_unknown_requested_output_is_an_internal_error(world: World) -> None:
    call = session(world, make_meta(world, "picky", (HOOKED,)))
    with pytest.raises(HookError, match="unknown output 'nope' of sub-model 'hooked'"):
        call(HOOKED, [NamedTensor("raw", items(1))], requested_outputs=["emb", "nope"])


# -- cancellation ----------------------------------------------------------------------------


def test_cancel_withdraws_a_queued_sub_call_and_later_boundaries_raise(world: World) -> None:
    scheduler = world.runtime.scheduler
    before = stats(world, EMBED)
    call = session(world, make_meta(world, "cancelled"), BufferPool(1 << 16, 2))
    entered, release = threading.Event(), threading.Event()

    def hold_dispatch() -> None:
        entered.set()
        release.wait(WAIT_S)

    blocked = scheduler.control(hold_dispatch)  # the sub-call stays queued behind this
    try:
        assert entered.wait(WAIT_S)
        with concurrent.futures.ThreadPoolExecutor(1) as meta_thread:
            pending = meta_thread.submit(call, EMBED, [NamedTensor("x", items(2))])
            wait_for(lambda: scheduler.queue_depth(EMBED) == 1)
            call.cancel()
            with pytest.raises(RequestCancelledError, match="during sub-call 'pipeline_embed'"):
                pending.result(WAIT_S)
        assert scheduler.queue_depth(EMBED) == 0
    finally:
        release.set()
        blocked.result(WAIT_S)
    with pytest.raises(RequestCancelledError) as caught:
        call(SCORE, [NamedTensor("emb", np.zeros((1, 8), np.float32))])
    assert status_of(caught.value) is grpc.StatusCode.CANCELLED
    with pytest.raises(RequestCancelledError, match="before scratch"):
        call.scratch((2,), np.float32)
    after = stats(world, EMBED)
    assert after.cancelled == before.cancelled + 1
    assert after.requests_served == before.requests_served  # never executed


def test_a_sub_call_of_a_session_already_late_never_queues(world: World) -> None:
    before = stats(world, EMBED)
    call = session(world, make_meta(world, "late"), deadline_ns=0)
    with pytest.raises(DeadlineExceededError, match="before sub-call 'pipeline_embed'"):
        call(EMBED, [NamedTensor("x", items(1))])
    with pytest.raises(DeadlineExceededError, match="before scratch"):
        call.scratch((1,), np.float32)
    after = stats(world, EMBED)
    assert (after.requests_served, after.expired) == (before.requests_served, before.expired)


# -- scratch ---------------------------------------------------------------------------------


def _whole_pool(pool: BufferPool) -> Array:
    """Every byte of ``pool`` (it must be idle), as a uint8 view; release with the slot."""
    slot = pool.acquire(pool.n_slots)
    view = np.frombuffer(slot.buffer, np.uint8)
    slot.release()
    return view


def test_scratch_buffers_alias_one_aligned_span_of_the_pool(world: World) -> None:
    pool = BufferPool(1 << 16, 4)
    memory = _whole_pool(pool)
    call = session(world, make_meta(world, "scratchy"), pool)
    specs: list[tuple[Any, Any]] = [((3, 5), np.float32), ((7,), np.int64), (4, np.uint8)]
    buffers = call.scratch(specs)
    assert [(b.shape, b.dtype) for b in buffers] == [
        ((3, 5), np.dtype(np.float32)),
        ((7,), np.dtype(np.int64)),
        ((4,), np.dtype(np.uint8)),
    ]
    for buffer in buffers:
        assert np.shares_memory(buffer, memory)
        assert buffer.ctypes.data % 64 == 0
        buffer[...] = 1  # writable
    assert pool.free_slots == pool.n_slots - 1
    call.close()
    assert pool.free_slots == pool.n_slots
    call.close()  # idempotent
    assert pool.free_slots == pool.n_slots


def test_scratch_with_one_shape_returns_one_array(world: World) -> None:
    pool = BufferPool(1 << 16, 4)
    memory = _whole_pool(pool)
    call = session(world, make_meta(world, "single"), pool)
    buffer = call.scratch((2, 3), np.float32)
    assert isinstance(buffer, np.ndarray)
    assert (buffer.shape, buffer.dtype) == ((2, 3), np.dtype(np.float32))
    assert np.shares_memory(buffer, memory)
    call.close()


def test_a_large_request_takes_a_span_of_several_slots(world: World) -> None:
    pool = BufferPool(1 << 16, 4)  # 16 KiB slots
    call = session(world, make_meta(world, "wide"), pool)
    (buffer,) = call.scratch([((5000,), np.float32)])  # 20000 bytes: two slots
    assert buffer.nbytes == 20000
    assert pool.free_slots == 2
    call.close()
    assert pool.free_slots == 4


def test_scratch_may_be_called_once_per_request(world: World) -> None:
    pool = BufferPool(1 << 16, 4)
    call = session(world, make_meta(world, "greedy"), pool)
    call.scratch((4,), np.float32)
    with pytest.raises(HookError, match="at most once per request of meta 'greedy'") as caught:
        call.scratch((4,), np.float32)
    assert status_of(caught.value) is grpc.StatusCode.INTERNAL
    call.close()
    assert pool.free_slots == pool.n_slots


@pytest.mark.parametrize("specs", ["nonsense", [((2,), "not-a-dtype")], 7])
def test_malformed_scratch_specs_are_an_internal_error(world: World, specs: Any) -> None:
    call = session(world, make_meta(world, "malformed"), BufferPool(1 << 16, 4))
    with pytest.raises(HookError, match=r"call\.scratch\(\)"):
        call.scratch(specs)
    call.close()


def test_without_a_pool_scratch_returns_plain_arrays(world: World) -> None:
    call = session(world, make_meta(world, "poolless"))
    one, two = call.scratch([((2, 2), np.float32), ((3,), np.int32)])
    assert one.flags.owndata
    assert two.flags.owndata
    assert (one.shape, one.dtype, two.shape, two.dtype) == (
        (2, 2),
        np.dtype(np.float32),
        (3,),
        np.dtype(np.int32),
    )
    call.close()


def test_an_oversize_request_gets_plain_arrays_and_one_warning_per_meta(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    pool = BufferPool(4096, 4)
    first, other = make_meta(world, "huge"), make_meta(world, "huge2")
    with caplog.at_level(logging.WARNING, logger=META_LOGGER):
        for meta in (first, first, other):
            call = session(world, meta, pool)
            buffer = call.scratch((1024,), np.float64)  # 8 KiB > the whole 4 KiB pool
            assert buffer.flags.owndata
            assert buffer.shape == (1024,)
            assert pool.free_slots == pool.n_slots
            call.close()
    warnings = [r.getMessage() for r in caplog.records if "larger than the whole" in r.getMessage()]
    assert len(warnings) == 2
    assert "'huge'" in warnings[0]
    assert "'huge2'" in warnings[1]


def test_the_scratch_wait_is_bounded_by_the_deadline(world: World) -> None:
    pool = BufferPool(4096, 1)
    taken = pool.acquire(1)
    try:
        deadline = time.monotonic_ns() + 50_000_000
        call = session(world, make_meta(world, "starved"), pool, deadline_ns=deadline)
        with pytest.raises(DeadlineExceededError) as caught:
            call.scratch((16,), np.float32)
        assert isinstance(caught.value, PoolAcquireTimeout)
        assert status_of(caught.value) is grpc.StatusCode.DEADLINE_EXCEEDED
        assert pool.waiting == 0
        call.close()
    finally:
        taken.release()
    assert pool.free_slots == 1


def test_scratch_specs_are_sized_with_alignment_padding() -> None:
    pool = BufferPool(1024, 4)  # 256-byte slots
    assert scratch_span(pool, [((1,), np.uint8)]) == 1
    # Each piece is rounded up to 64 bytes, plus 64 of leading slack: 64 + 192 + 64 = 320.
    assert scratch_span(pool, [((190,), np.uint8), ((1,), np.uint8)]) == 2
    assert scratch_span(pool, [((2000,), np.uint8)]) is None  # larger than the pool
