"""MetaRunner: one meta request end to end in process.

Requests go through ``MetaRunner.infer`` (the data plane's path for a meta) on a fresh event
loop; ``run`` executes in the worker's hook pool and its sub-calls on the real scheduler with
jax sub-models on the CPU. Deadline tests move a skewed clock instead of sleeping.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import grpc
import numpy as np
import pytest

from packages.worker.tests._world import World
from reactantserver.core.errors import (
    DeadlineExceededError,
    InvalidArgumentError,
    ReactantError,
    status_of,
)
from reactantserver.core.hooks import NamedTensor
from reactantserver.core.types import InferRequest
from reactantserver.worker.hooks import THREAD_NAME_PREFIX, HookError
from reactantserver.worker.meta import MetaGate, MetaModel, MetaRunner, RequestCancelledError
from reactantserver.worker.scheduler import StatsSnapshot

from ._metaworld import (
    EMBED,
    META,
    SCORE,
    WAIT_S,
    Exported,
    entry_of,
    export_bundles,
    infer,
    items,
    meta_config,
    meta_model,
    runner,
    stages,
    start_meta_world,
    wait_for,
)

Array = np.ndarray[Any, Any]
Run = Callable[[list[NamedTensor], Any], list[NamedTensor]]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Exported:
    return export_bundles(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def world(exported: Exported, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    config = meta_config(tmp_path_factory.getbasetemp() / "meta-cache")
    world = start_meta_world(config, [exported.embed, exported.score, exported.pipeline])
    try:
        yield world
    finally:
        world.close()


@attrs.define
class SkewedClock:
    """``time.monotonic_ns`` plus an offset a test moves forward (time passing at once)."""

    offset_ns: int = 0

    def __call__(self) -> int:
        return time.monotonic_ns() + self.offset_ns

    def advance(self, seconds: float) -> None:
        self.offset_ns += round(seconds * 1e9)


def make_meta(
    world: World, name: str, run: Run, calls: tuple[str, ...] = (EMBED, SCORE)
) -> MetaModel:
    template = entry_of(world, META).meta
    assert template is not None
    return meta_model(template, name, run, calls)


def own_runner(
    world: World, *, capacity: int = 2, clock: Callable[[], int] = time.monotonic_ns
) -> MetaRunner:
    """A runner over the world's registry, scheduler and hook pool with its own gate."""
    return MetaRunner(
        world.state.registry,
        world.runtime.scheduler,
        world.runtime.pool,
        gate=MetaGate(capacity),
        scratch=runner(world).scratch,
        clock=clock,
    )


def outputs(scores: Array, indices: Array) -> list[NamedTensor]:
    return [
        NamedTensor("scores", np.asarray(scores, np.float32)),
        NamedTensor("indices", np.asarray(indices, np.int64)),
    ]


FIXED = outputs(np.array([0.5], np.float32), np.array([0], np.int64))


def stats(world: World, name: str) -> StatsSnapshot:
    return world.runtime.scheduler.stats(name) or StatsSnapshot()


def request(x: Array, name: str = META, deadline_ns: int | None = None) -> InferRequest:
    return InferRequest(model_name=name, inputs=[NamedTensor("items", x)], deadline_ns=deadline_ns)


# -- results ---------------------------------------------------------------------------------


@pytest.mark.parametrize("count", [1, 10, 32])
def test_the_pipeline_meta_equals_its_stages_run_directly(world: World, count: int) -> None:
    x = items(count, seed=count)
    meta = entry_of(world, META).meta
    assert meta is not None
    response = infer(runner(world), meta, [NamedTensor("items", x)])
    assert response.model_name == META
    scores, indices = response.outputs
    assert (scores.name, indices.name) == ("scores", "indices")
    want_scores, want_indices = stages(world, x)
    np.testing.assert_array_equal(indices.data, want_indices)
    np.testing.assert_allclose(scores.data, want_scores, rtol=1e-6)


def test_the_data_plane_routes_a_meta_to_its_runner(world: World) -> None:
    x = items(6, seed=6)
    response = asyncio.run(world.runtime.dataplane.infer(request(x)))
    want_scores, want_indices = stages(world, x)
    np.testing.assert_array_equal(response.outputs[1].data, want_indices)
    np.testing.assert_allclose(response.outputs[0].data, want_scores, rtol=1e-6)


def test_run_executes_on_a_hook_pool_thread(world: World) -> None:
    threads: list[str] = []

    def run(inputs: list[NamedTensor], call: Any) -> list[NamedTensor]:
        threads.append(threading.current_thread().name)
        return FIXED

    infer(runner(world), make_meta(world, "threads", run), [NamedTensor("items", items(1))])
    assert len(threads) == 1
    assert threads[0].startswith(THREAD_NAME_PREFIX)


# -- errors ----------------------------------------------------------------------------------


def test_a_sub_call_error_reaches_run_as_its_own_class(world: World) -> None:
    caught: list[BaseException] = []

    def forgiving(inputs: list[NamedTensor], call: Any) -> list[NamedTensor]:
        try:
            call(EMBED, [NamedTensor("x", np.zeros((1, 3), np.float32))])
        except InvalidArgumentError as exc:
            caught.append(exc)
        return FIXED

    response = infer(
        runner(world), make_meta(world, "forgiving", forgiving), [NamedTensor("items", items(1))]
    )
    assert [t.name for t in response.outputs] == ["scores", "indices"]
    assert len(caught) == 1
    assert type(caught[0]) is InvalidArgumentError

    def careless(inputs: list[NamedTensor], call: Any) -> list[NamedTensor]:
        call(EMBED, [NamedTensor("x", np.zeros((1, 3), np.float32))])
        return FIXED

    with pytest.raises(InvalidArgumentError) as escaped:
        infer(
            runner(world), make_meta(world, "careless", careless), [NamedTensor("items", items(1))]
        )
    assert status_of(escaped.value) is grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    ("result", "fragment"),
    [
        (None, "returned None, expected a list of NamedTensor"),
        ([], "did not return tensor 'scores'"),
        (FIXED[:1], "did not return tensor 'indices'"),
        (
            [NamedTensor("scores", np.zeros(1, np.float64)), FIXED[1]],
            "tensor 'scores' with dtype f64, expected f32",
        ),
        ([*FIXED, NamedTensor("extra", np.zeros(1, np.float32))], "unexpected tensor 'extra'"),
    ],
    ids=["none", "empty", "missing", "dtype", "extra"],
)
def test_run_returning_the_wrong_value_is_internal(
    world: World, result: object, fragment: str
) -> None:
    def run(inputs: list[NamedTensor], call: Any) -> list[NamedTensor]:
        return result  # type: ignore[return-value]

    with pytest.raises(HookError, match=fragment) as caught:
        infer(runner(world), make_meta(world, "wrong", run), [NamedTensor("items", items(1))])
    assert status_of(caught.value) is grpc.StatusCode.INTERNAL
    assert "run hook of model 'wrong'" in str(caught.value)


def test_run_raising_is_internal_and_names_the_meta(world: World) -> None:
    def run(inputs: list[NamedTensor], call: Any) -> list[NamedTensor]:
        raise ValueError("boom")

    with pytest.raises(HookError) as caught:
        infer(runner(world), make_meta(world, "exploding", run), [NamedTensor("items", items(1))])
    assert str(caught.value) == "run of meta 'exploding' raised ValueError: boom"
    assert status_of(caught.value) is grpc.StatusCode.INTERNAL
    assert isinstance(caught.value.__cause__, ValueError)


def test_invalid_argument_from_run_is_the_clients_fault(world: World) -> None:
    meta = entry_of(world, META).meta
    assert meta is not None
    with pytest.raises(InvalidArgumentError, match="1 to 32 rows") as caught:
        infer(runner(world), meta, [NamedTensor("items", items(33))])
    assert status_of(caught.value) is grpc.StatusCode.INVALID_ARGUMENT


def test_client_inputs_are_checked_before_run(world: World) -> None:
    ran: list[bool] = []

    def run(inputs: list[NamedTensor], call: Any) -> list[NamedTensor]:
        ran.append(True)
        return FIXED

    with pytest.raises(InvalidArgumentError):
        infer(
            runner(world), make_meta(world, "strict", run), [NamedTensor("items", items(1)[:, :4])]
        )
    assert ran == []


# -- scratch ---------------------------------------------------------------------------------


@pytest.mark.parametrize("fails", [False, True], ids=["returns", "raises"])
def test_the_scratch_span_is_returned_when_run_ends(world: World, fails: bool) -> None:
    pool = runner(world).scratch
    assert pool is not None
    held: list[int] = []

    def run(inputs: list[NamedTensor], call: Any) -> list[NamedTensor]:
        roi, mask = call.scratch([((4, 8), np.float32), ((4,), np.int64)])
        roi[...] = 1.0
        mask[...] = 2
        held.append(pool.free_slots)
        if fails:
            raise RuntimeError("after scratch")
        return outputs(roi[:, 0], mask)

    meta = make_meta(world, f"scratch-{fails}", run)
    if fails:
        with pytest.raises(HookError, match="after scratch"):
            infer(runner(world), meta, [NamedTensor("items", items(1))])
    else:
        response = infer(runner(world), meta, [NamedTensor("items", items(1))])
        np.testing.assert_array_equal(response.outputs[1].data, [2, 2, 2, 2])
    assert held == [pool.n_slots - 1]
    assert pool.free_slots == pool.n_slots


# -- deadlines and cancellation --------------------------------------------------------------


def test_a_deadline_passing_mid_pipeline_stops_before_the_next_stage(world: World) -> None:
    clock = SkewedClock()
    reached: list[str] = []

    def run(inputs: list[NamedTensor], call: Any) -> list[NamedTensor]:
        (emb,) = call(EMBED, [NamedTensor("x", inputs[0].data)])
        reached.append(EMBED)
        clock.advance(120.0)  # the glue "took" two minutes
        call(SCORE, [NamedTensor("emb", emb.data)])
        reached.append(SCORE)
        return FIXED

    before_embed, before_score = stats(world, EMBED), stats(world, SCORE)
    deadline = clock() + 60_000_000_000
    meta = make_meta(world, "late-glue", run)
    with pytest.raises(DeadlineExceededError) as caught:
        infer(
            own_runner(world, clock=clock),
            meta,
            [NamedTensor("items", items(3))],
            deadline_ns=deadline,
        )
    assert "before sub-call 'pipeline_score' of meta 'late-glue'" in str(caught.value)
    assert status_of(caught.value) is grpc.StatusCode.DEADLINE_EXCEEDED
    assert reached == [EMBED]
    assert stats(world, EMBED).requests_served == before_embed.requests_served + 1
    after_score = stats(world, SCORE)
    assert after_score.requests_served == before_score.requests_served  # never ran
    assert after_score.expired == before_score.expired  # never even queued
    assert world.runtime.scheduler.stats("late-glue") is None  # a failed meta is not served


def test_a_meta_whose_deadline_passed_does_not_start(world: World) -> None:
    ran: list[bool] = []

    def run(inputs: list[NamedTensor], call: Any) -> list[NamedTensor]:
        ran.append(True)
        return FIXED

    with pytest.raises(DeadlineExceededError, match="before meta 'too-late' started"):
        infer(
            runner(world),
            make_meta(world, "too-late", run),
            [NamedTensor("items", items(1))],
            deadline_ns=1,
        )
    assert ran == []


def test_cancelling_the_request_withdraws_its_queued_sub_call(world: World) -> None:
    scheduler = world.runtime.scheduler
    metas = own_runner(world)
    raised: list[BaseException] = []

    def run(inputs: list[NamedTensor], call: Any) -> list[NamedTensor]:
        try:
            call(EMBED, [NamedTensor("x", inputs[0].data)])
        except ReactantError as exc:
            raised.append(exc)
            raise
        return FIXED

    meta = make_meta(world, "abandoned", run)
    before = stats(world, EMBED)
    entered, release = threading.Event(), threading.Event()

    def hold_dispatch() -> None:
        entered.set()
        release.wait(WAIT_S)

    async def scenario() -> None:
        task = asyncio.ensure_future(metas.infer(meta, request(items(2), meta.name)))
        await asyncio.to_thread(wait_for, lambda: scheduler.queue_depth(EMBED) == 1)
        assert metas.gate.in_use == 1
        task.cancel()  # the client went away
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.to_thread(wait_for, lambda: metas.gate.in_use == 0)

    blocked = scheduler.control(hold_dispatch)
    try:
        assert entered.wait(WAIT_S)
        asyncio.run(scenario())
    finally:
        release.set()
        blocked.result(WAIT_S)
    assert len(raised) == 1
    assert isinstance(raised[0], RequestCancelledError)
    after = stats(world, EMBED)
    assert after.cancelled == before.cancelled + 1
    assert after.requests_served == before.requests_served


# -- statistics ------------------------------------------------------------------------------


def test_each_request_counts_once_in_the_metas_statistics(world: World) -> None:
    def run(inputs: list[NamedTensor], call: Any) -> list[NamedTensor]:
        (emb,) = call(EMBED, [NamedTensor("x", inputs[0].data)])
        (score,) = call(SCORE, [NamedTensor("emb", emb.data)])
        return outputs(score.data[:, 0], np.arange(len(score.data)))

    meta = make_meta(world, "counted", run)
    before_embed = stats(world, EMBED).requests_served
    assert world.runtime.scheduler.stats("counted") is None
    for expected in (1, 2):
        infer(runner(world), meta, [NamedTensor("items", items(7))])  # 7 rows: still one
        counted = stats(world, "counted")
        assert (counted.dispatch_count, counted.requests_served, counted.rows_served) == (
            expected,
            expected,
            expected,
        )
    assert counted.compute_seconds > 0
    assert stats(world, EMBED).requests_served == before_embed + 2  # sub-models keep theirs


# -- the gate --------------------------------------------------------------------------------


def test_a_compute_only_meta_takes_no_permit(world: World) -> None:
    metas = own_runner(world, capacity=1)

    def run(inputs: list[NamedTensor], call: Any) -> list[NamedTensor]:
        (x,) = inputs
        return outputs(x.data.sum(axis=1), np.arange(x.shape[0]))

    compute_only = make_meta(world, "compute-only", run, calls=())
    assert not compute_only.gated

    async def scenario() -> None:
        await metas.gate.acquire()  # the gate is fully held
        response = await asyncio.wait_for(
            metas.infer(compute_only, request(items(3), compute_only.name)), WAIT_S
        )
        np.testing.assert_allclose(response.outputs[0].data, items(3).sum(axis=1), rtol=1e-6)
        assert (metas.gate.in_use, metas.gate.waiting) == (1, 0)
        metas.gate.release()

    asyncio.run(scenario())
    assert stats(world, "compute-only").requests_served == 1


def test_with_capacity_one_a_second_gated_meta_waits_then_times_out(world: World) -> None:
    metas = own_runner(world, capacity=1)
    hold = threading.Event()
    started = threading.Event()

    def blocking(inputs: list[NamedTensor], call: Any) -> list[NamedTensor]:
        started.set()
        if not hold.wait(WAIT_S):
            raise AssertionError("never released")
        return FIXED

    ran_second: list[bool] = []

    def second(inputs: list[NamedTensor], call: Any) -> list[NamedTensor]:
        ran_second.append(True)
        return FIXED

    first_meta = make_meta(world, "holder", blocking)
    second_meta = make_meta(world, "waiter", second)

    async def scenario() -> None:
        first = asyncio.ensure_future(metas.infer(first_meta, request(items(1), "holder")))
        await asyncio.to_thread(started.wait, WAIT_S)
        assert metas.gate.in_use == 1
        deadline = time.monotonic_ns() + 1_000_000_000
        waiting = asyncio.ensure_future(
            metas.infer(second_meta, request(items(1), "waiter", deadline))
        )
        for _ in range(1000):
            if metas.gate.waiting == 1 or waiting.done():
                break
            await asyncio.sleep(0.001)
        assert metas.gate.waiting == 1
        with pytest.raises(
            DeadlineExceededError, match="meta 'waiter' waited for the meta gate"
        ) as caught:
            await waiting
        assert status_of(caught.value) is grpc.StatusCode.DEADLINE_EXCEEDED
        assert (metas.gate.in_use, metas.gate.waiting) == (1, 0)
        hold.set()
        response = await asyncio.wait_for(first, WAIT_S)
        assert response.model_name == "holder"

    try:
        asyncio.run(scenario())
    finally:
        hold.set()
    wait_for(lambda: metas.gate.in_use == 0)
    assert ran_second == []
