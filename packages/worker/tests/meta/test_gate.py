"""MetaGate: a FIFO, deadline-bounded counting semaphore for gated metas.

Every scenario runs on its own event loop (``asyncio.run``); waiters are tasks, and
``asyncio.sleep(0)`` turns let each one reach the gate in a known order.
"""

from __future__ import annotations

import asyncio
import threading
import time

import grpc
import pytest

from reactantserver.core.errors import DeadlineExceededError, status_of
from reactantserver.worker.meta import MetaGate

WAIT = 30.0
"""Generous bound for waits that succeed (never reached when things work)."""
SETTLE_TURNS = 5
"""Loop turns that let freshly created tasks reach their ``await``."""


async def settle() -> None:
    """Let every ready task run until it blocks."""
    for _ in range(SETTLE_TURNS):
        await asyncio.sleep(0)


def soon(seconds: float) -> int:
    """An absolute deadline ``seconds`` from now."""
    return time.monotonic_ns() + round(seconds * 1e9)


@pytest.mark.parametrize("capacity", [0, -1])
def test_capacity_below_one_is_rejected(capacity: int) -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        MetaGate(capacity)


def test_at_most_capacity_permits_are_held() -> None:
    async def scenario() -> None:
        gate = MetaGate(2)
        assert gate.capacity == 2
        await gate.acquire()
        await gate.acquire()
        third = asyncio.ensure_future(gate.acquire())
        await settle()
        assert not third.done()
        assert (gate.in_use, gate.waiting) == (2, 1)
        gate.release()  # handed to the waiter: still two in use
        await asyncio.wait_for(third, WAIT)
        assert (gate.in_use, gate.waiting) == (2, 0)
        gate.release()
        gate.release()
        assert gate.in_use == 0
        with pytest.raises(RuntimeError, match="released more often"):
            gate.release()

    asyncio.run(scenario())


def test_waiters_are_served_first_come_first_served() -> None:
    async def scenario() -> None:
        gate = MetaGate(1)
        await gate.acquire()
        order: list[str] = []

        async def wait(name: str) -> None:
            await gate.acquire(model=name)
            order.append(name)

        tasks = []
        for name in ("a", "b", "c"):
            tasks.append(asyncio.ensure_future(wait(name)))
            await settle()  # queued in creation order
        assert gate.waiting == 3
        for expected in (["a"], ["a", "b"], ["a", "b", "c"]):
            gate.release()
            await settle()
            assert order == expected
            assert gate.in_use == 1
        await asyncio.gather(*tasks)
        gate.release()
        assert gate.in_use == 0

    asyncio.run(scenario())


def test_a_new_arrival_does_not_overtake_a_waiter() -> None:
    async def scenario() -> None:
        gate = MetaGate(1)
        await gate.acquire()
        first = asyncio.ensure_future(gate.acquire(model="first"))
        await settle()
        gate.release()  # granted to `first` on the next turn, not to a newcomer
        late = asyncio.ensure_future(gate.acquire(model="late"))
        await settle()
        assert first.done()
        assert not late.done()
        assert gate.waiting == 1
        gate.release()
        await asyncio.wait_for(late, WAIT)
        gate.release()
        assert gate.in_use == 0

    asyncio.run(scenario())


def test_deadline_bounds_the_wait_and_the_waiter_leaves_the_queue() -> None:
    async def scenario() -> None:
        gate = MetaGate(1)
        await gate.acquire()
        with pytest.raises(DeadlineExceededError) as caught:
            await gate.acquire(soon(0.05), model="slow")
        assert status_of(caught.value) is grpc.StatusCode.DEADLINE_EXCEEDED
        assert "meta 'slow'" in str(caught.value)
        assert "meta gate" in str(caught.value)
        assert (gate.in_use, gate.waiting) == (1, 0)
        # A deadline already passed while the gate is full fails at once, without queueing.
        with pytest.raises(DeadlineExceededError, match="a meta waited"):
            await gate.acquire(time.monotonic_ns() - 1)
        assert gate.waiting == 0
        gate.release()  # nobody is left to hand the permit to
        assert gate.in_use == 0
        await asyncio.wait_for(gate.acquire(soon(WAIT)), WAIT)  # free again
        gate.release()

    asyncio.run(scenario())


def test_a_cancelled_waiter_leaves_the_queue() -> None:
    async def scenario() -> None:
        gate = MetaGate(1)
        await gate.acquire()
        waiter = asyncio.ensure_future(gate.acquire())
        await settle()
        assert gate.waiting == 1
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert (gate.in_use, gate.waiting) == (1, 0)
        gate.release()
        assert gate.in_use == 0

    asyncio.run(scenario())


def test_a_permit_released_to_a_waiter_that_gave_up_is_passed_on() -> None:
    async def scenario() -> None:
        gate = MetaGate(1)
        await gate.acquire()
        quitter = asyncio.ensure_future(gate.acquire(model="quitter"))
        await settle()
        next_one = asyncio.ensure_future(gate.acquire(model="next"))
        await settle()
        assert gate.waiting == 2
        gate.release()  # pops `quitter`; the grant runs on a later turn...
        quitter.cancel()  # ...by which time it has given up
        with pytest.raises(asyncio.CancelledError):
            await quitter
        await asyncio.wait_for(next_one, WAIT)
        assert (gate.in_use, gate.waiting) == (1, 0)
        # With nobody behind it, the permit goes back to the pool: nothing leaks.
        last = asyncio.ensure_future(gate.acquire(model="last"))
        await settle()
        gate.release()
        last.cancel()
        with pytest.raises(asyncio.CancelledError):
            await last
        await settle()
        assert (gate.in_use, gate.waiting) == (0, 0)

    asyncio.run(scenario())


def test_a_waiter_cancelled_after_its_grant_gives_the_permit_back() -> None:
    async def scenario() -> None:
        gate = MetaGate(1)
        await gate.acquire()
        waiter = asyncio.ensure_future(gate.acquire(model="late-cancel"))
        await settle()
        gate.release()  # pops the waiter and schedules the grant
        await asyncio.sleep(0)  # the grant runs: the waiter's future has its result...
        waiter.cancel()  # ...but the task is cancelled before it resumes
        with pytest.raises(asyncio.CancelledError):
            await waiter
        await settle()
        assert (gate.in_use, gate.waiting) == (0, 0)

    asyncio.run(scenario())


def test_release_on_another_thread_wakes_the_waiter() -> None:
    async def scenario() -> None:
        gate = MetaGate(1)
        await gate.acquire()
        waiter = asyncio.ensure_future(gate.acquire(soon(WAIT)))
        await settle()
        await asyncio.to_thread(gate.release)
        await asyncio.wait_for(waiter, WAIT)
        assert (gate.in_use, gate.waiting) == (1, 0)
        await asyncio.to_thread(gate.release)
        assert gate.in_use == 0

    asyncio.run(scenario())


def test_waiters_on_other_threads_loops_are_served_in_order() -> None:
    gate = MetaGate(1)
    asyncio.run(gate.acquire())  # held by the main thread
    served: list[str] = []

    def wait_on_own_loop(name: str, queued: threading.Event) -> None:
        async def body() -> None:
            task = asyncio.ensure_future(gate.acquire(soon(WAIT), model=name))
            await settle()
            queued.set()
            await task
            served.append(name)
            gate.release()

        asyncio.run(body())

    threads = []
    for name in ("a", "b"):
        queued = threading.Event()
        thread = threading.Thread(target=wait_on_own_loop, args=(name, queued))
        thread.start()
        threads.append(thread)
        assert queued.wait(WAIT)
    assert gate.waiting == 2
    gate.release()  # from a thread with no loop: granted on a's loop, then a hands it to b
    for thread in threads:
        thread.join(WAIT)
    assert served == ["a", "b"]
    assert (gate.in_use, gate.waiting) == (0, 0)


def test_permit_is_released_however_the_body_ends() -> None:
    async def scenario() -> None:
        gate = MetaGate(1)
        async with gate.permit(soon(WAIT), model="m"):
            assert gate.in_use == 1
        assert gate.in_use == 0
        with pytest.raises(KeyError):
            async with gate.permit():
                raise KeyError("body failed")
        assert gate.in_use == 0

    asyncio.run(scenario())
