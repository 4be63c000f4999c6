"""Per-model queues, fifo / edf selection and completions."""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import threading
import weakref
from typing import Any

import attrs
import numpy as np
import pytest

from reactantserver.worker.scheduler.disciplines import select_edf, select_fifo
from reactantserver.worker.scheduler.queue import (
    FutureCompletion,
    LoopCompletion,
    ModelQueue,
    State,
)

from ._builders import pending, queue_of, scheduled

Outputs = list[np.ndarray[Any, Any]]


# -- ordering ----------------------------------------------------------------------------------


def test_committed_first_then_priority_then_fifo() -> None:
    m = scheduled()
    low1 = pending(m, priority=2)
    top1 = pending(m, priority=1)
    committed1 = pending(m, committed=True, priority=5)
    top2 = pending(m, priority=1)
    committed2 = pending(m, committed=True)
    low2 = pending(m, priority=2)
    top3 = pending(m, priority=1)
    queue = queue_of(low1, top1, committed1, top2, committed2, low2, top3)
    assert list(queue) == [committed1, committed2, top1, top2, top3, low1, low2]
    assert len(queue) == 7
    assert queue[0] is committed1


def test_new_state_is_queued() -> None:
    assert pending(scheduled()).state is State.QUEUED


# -- remove ------------------------------------------------------------------------------------


def test_remove() -> None:
    m = scheduled()
    a, b, c = pending(m), pending(m, priority=3), pending(m, committed=True)
    queue = queue_of(a, b, c)
    assert queue.remove(a) is True
    assert list(queue) == [c, b]
    assert queue.remove(a) is False
    # Same sort key, different object: not the queued request.
    assert queue.remove(attrs.evolve(b)) is False
    assert queue.remove(b) is True
    assert queue.remove(c) is True
    assert len(queue) == 0


def test_removed_requests_keep_the_order_of_later_pushes() -> None:
    m = scheduled()
    a, b = pending(m, priority=2), pending(m, priority=2)
    queue = queue_of(a, b)
    queue.remove(a)
    c = pending(m, priority=1)
    queue.push(c)
    assert list(queue) == [c, b]


def test_remove_all() -> None:
    m = scheduled()
    requests = [pending(m) for _ in range(5)]
    queue = queue_of(*requests)
    queue.remove_all([requests[1], requests[3]])
    assert list(queue) == [requests[0], requests[2], requests[4]]
    queue.remove_all([requests[0]])
    assert list(queue) == [requests[2], requests[4]]
    # The keys stay aligned with the items: removal and insertion still work afterwards.
    late = pending(m, committed=True)
    queue.push(late)
    assert list(queue) == [late, requests[2], requests[4]]
    assert queue.remove(requests[4]) is True
    assert list(queue) == [late, requests[2]]


# -- window ------------------------------------------------------------------------------------


def test_window_takes_the_coalescable_prefix() -> None:
    m = scheduled(sizes=(1, 8))
    requests = [pending(m) for _ in range(4)]
    queue = queue_of(*requests)
    assert queue.window(queue[0], math.inf) == requests


def test_window_stops_at_another_variant() -> None:
    m = scheduled(sizes=(1, 8), variants=(0, 1))
    a1, b, a2 = pending(m, variant=0), pending(m, variant=1), pending(m, variant=0)
    queue = queue_of(a1, b, a2)
    assert queue.window(a1, math.inf) == [a1]


def test_window_stops_at_another_generation() -> None:
    old = scheduled("m", generation=1, sizes=(1, 8))
    new = scheduled("m", generation=2, sizes=(1, 8))
    o1, o2, n1, o3 = pending(old), pending(old), pending(new), pending(old)
    queue = queue_of(o1, o2, n1, o3)
    assert queue.window(o1, math.inf) == [o1, o2]
    # Another object is another generation, even with equal fields.
    twin = scheduled("m", generation=1, sizes=(1, 8))
    t1 = pending(twin)
    assert not o1.coalesces_with(t1)
    assert o1.coalesces_with(o2)


def test_window_stops_once_the_limit_is_reached() -> None:
    m = scheduled(sizes=(1, 8))
    requests = [pending(m, rows=2) for _ in range(4)]
    queue = queue_of(*requests)
    assert queue.window(queue[0], 4) == requests[:2]
    assert queue.window(queue[0], 5) == requests[:3]
    assert queue.window(queue[0], 2) == requests[:1]


def test_window_of_a_non_coalescable_model_is_the_head() -> None:
    m = scheduled(sizes=(0,), coalescable=False)
    requests = [pending(m) for _ in range(3)]
    queue = queue_of(*requests)
    assert queue.window(queue[0], math.inf) == requests[:1]


def test_window_puts_a_committed_head_first() -> None:
    m = scheduled(sizes=(1, 8))
    plain, committed = pending(m), pending(m, committed=True)
    queue = queue_of(plain, committed)
    assert queue.window(committed, math.inf) == [committed, plain]


# -- deadlines ---------------------------------------------------------------------------------


def test_min_deadline() -> None:
    m = scheduled()
    assert ModelQueue().min_deadline() == math.inf
    queue = queue_of(pending(m), pending(m))
    assert queue.min_deadline() == math.inf
    queue.push(pending(m, deadline_ns=500, priority=3))
    queue.push(pending(m, deadline_ns=900))
    assert queue.min_deadline() == 500


def test_expired() -> None:
    m = scheduled()
    none, past, now, later = (pending(m, deadline_ns=d) for d in (None, 50, 100, 101))
    queue = queue_of(none, past, now, later)
    assert queue.expired(100) == [past, now]
    assert queue.expired(0) == []


def test_an_emptied_queue_keeps_no_request_alive() -> None:
    m = scheduled()
    requests = [pending(m, deadline_ns=d) for d in (300, 100, 200)]
    queue = queue_of(*requests)
    refs = [weakref.ref(r) for r in requests]
    queue.remove(requests[1])
    queue.remove_all([requests[0], requests[2]])
    del requests
    assert [ref() for ref in refs] == [None, None, None]
    assert queue.min_deadline() == math.inf


def test_pending_deadline_and_margin() -> None:
    m = scheduled()
    r = pending(m, deadline_ns=1_000)
    assert r.deadline == 1_000
    assert pending(m).deadline == math.inf
    assert not r.expired(900)
    assert r.expired(900, margin_ns=100)
    assert not pending(m).expired(10**18, margin_ns=10**18)


# -- fifo / edf --------------------------------------------------------------------------------


def test_select_fifo_oldest_head() -> None:
    a, b = scheduled("a"), scheduled("b")
    queues = {"a": queue_of(pending(a, enqueue_ns=20)), "b": queue_of(pending(b, enqueue_ns=10))}
    assert select_fifo(queues) == "b"


def test_select_fifo_looks_at_the_head_only() -> None:
    a, b = scheduled("a"), scheduled("b")
    # a's head is a committed sub-call that arrived late; an older request queues behind it.
    queues = {
        "a": queue_of(pending(a, enqueue_ns=5), pending(a, enqueue_ns=30, committed=True)),
        "b": queue_of(pending(b, enqueue_ns=10)),
    }
    assert select_fifo(queues) == "b"


def test_select_fifo_ties_by_name() -> None:
    a, b = scheduled("a"), scheduled("b")
    queues = {"b": queue_of(pending(b, enqueue_ns=10)), "a": queue_of(pending(a, enqueue_ns=10))}
    assert select_fifo(queues) == "a"


def test_select_edf_earliest_deadline_anywhere_in_the_queue() -> None:
    a, b = scheduled("a"), scheduled("b")
    queues = {
        "a": queue_of(pending(a, enqueue_ns=1, deadline_ns=900)),
        "b": queue_of(pending(b, enqueue_ns=2), pending(b, enqueue_ns=3, deadline_ns=500)),
    }
    assert select_edf(queues) == "b"


def test_select_edf_no_deadline_is_infinite() -> None:
    a, b = scheduled("a"), scheduled("b")
    queues = {
        "a": queue_of(pending(a, enqueue_ns=1)),
        "b": queue_of(pending(b, enqueue_ns=2, deadline_ns=10**18)),
    }
    assert select_edf(queues) == "b"


def test_select_edf_ties_oldest_head_then_name() -> None:
    a, b, c = scheduled("a"), scheduled("b"), scheduled("c")
    queues = {
        "c": queue_of(pending(c, enqueue_ns=5, deadline_ns=100)),
        "b": queue_of(pending(b, enqueue_ns=7, deadline_ns=100)),
        "a": queue_of(pending(a, enqueue_ns=7, deadline_ns=100)),
    }
    assert select_edf(queues) == "c"
    del queues["c"]
    assert select_edf(queues) == "a"
    # Without any deadline it is the same tie-break.
    queues = {"b": queue_of(pending(b, enqueue_ns=1)), "a": queue_of(pending(a, enqueue_ns=1))}
    assert select_edf(queues) == "a"


# -- completions -------------------------------------------------------------------------------


def test_future_completion_resolves_and_fails_once() -> None:
    done = FutureCompletion()
    out = [np.ones(2)]
    done.resolve(out)
    done.fail(RuntimeError("late"))
    assert done.future.result() is out

    failed = FutureCompletion()
    failed.fail(ValueError("boom"))
    failed.resolve(out)
    with pytest.raises(ValueError, match="boom"):
        failed.future.result()


def test_future_completion_ignores_a_cancelled_future() -> None:
    future: concurrent.futures.Future[Outputs] = concurrent.futures.Future()
    completion = FutureCompletion(future)
    assert completion.future is future
    assert future.cancel()
    completion.resolve([np.zeros(1)])
    completion.fail(RuntimeError("ignored"))
    assert future.cancelled()


def _in_thread(fn: Any, *args: Any) -> None:
    thread = threading.Thread(target=fn, args=args)
    thread.start()
    thread.join()


def test_loop_completion_resolves_from_another_thread() -> None:
    out = [np.arange(3)]

    async def main() -> Outputs:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Outputs] = loop.create_future()
        _in_thread(LoopCompletion(loop, future).resolve, out)
        return await future

    assert asyncio.run(main())[0] is out[0]


def test_loop_completion_fails_from_another_thread() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Outputs] = loop.create_future()
        _in_thread(LoopCompletion(loop, future).fail, KeyError("gone"))
        with pytest.raises(KeyError, match="gone"):
            await future

    asyncio.run(main())


def test_loop_completion_ignores_a_cancelled_future() -> None:
    errors: list[dict[str, Any]] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, context: errors.append(context))
        cancelled: asyncio.Future[Outputs] = loop.create_future()
        cancelled.cancel()
        marker: asyncio.Future[Outputs] = loop.create_future()
        _in_thread(LoopCompletion(loop, cancelled).resolve, [np.zeros(1)])
        _in_thread(LoopCompletion(loop, cancelled).fail, RuntimeError("late"))
        _in_thread(LoopCompletion(loop, marker).resolve, [])
        # Callbacks run in order: once the marker is set, both late settles have run.
        assert await marker == []
        assert cancelled.cancelled()

    asyncio.run(main())
    assert errors == []


def test_loop_completion_on_a_closed_loop_is_dropped() -> None:
    loop = asyncio.new_event_loop()
    future: asyncio.Future[Outputs] = loop.create_future()
    loop.close()
    completion = LoopCompletion(loop, future)
    completion.resolve([])
    completion.fail(RuntimeError("x"))
    assert not future.done()
