"""Stopping the scheduler: drain within the grace, then fail what is left.

These run the real dispatch thread on the real clock. An execution is held open with a
:class:`Gate` so the test decides what is queued when the grace ends; waits are bounded and
nothing asserts on elapsed time.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable, Iterator

import grpc
import numpy as np
import pytest

from reactantserver.core.config import SchedulingDiscipline
from reactantserver.core.errors import ShuttingDownError
from reactantserver.core.hooks import NamedTensor
from reactantserver.worker.scheduler import SHUTTING_DOWN

from ._fake import SCALE, WAIT_S, Harness, Request, row, wait_for


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness(discipline=SchedulingDiscipline.FIFO, real_clock=True)
    harness.start()
    try:
        yield harness
    finally:
        harness.close()


def assert_shutting_down(exc: BaseException | None) -> None:
    assert isinstance(exc, ShuttingDownError)
    assert exc.status is grpc.StatusCode.UNAVAILABLE
    assert str(exc) == "server is shutting down"


def stop_in_background(h: Harness, grace_s: float) -> threading.Thread:
    """Call ``stop`` on another thread (it joins the dispatch thread) once ``stopping`` is set."""
    stopper = threading.Thread(
        target=h.scheduler.stop, kwargs={"grace_s": grace_s}, name="test-stopper"
    )
    stopper.start()
    wait_for(lambda: h.scheduler.stopping)
    return stopper


def join(thread: threading.Thread) -> None:
    thread.join(WAIT_S)
    assert not thread.is_alive(), f"{thread.name} did not finish"


def no_dispatch_thread() -> bool:
    return not any(t.name == "reactant-dispatch" and t.is_alive() for t in threading.enumerate())


def test_stop_serves_queued_requests_that_finish_within_the_grace(h: Harness) -> None:
    h.add("m", sizes=(1,))
    gate = h.hold("m")
    running = h.submit("m", row(1))
    assert gate.entered.wait(WAIT_S)
    queued = [h.submit("m", row(k)) for k in (2, 3, 4)]
    stopper = stop_in_background(h, grace_s=60.0)
    with pytest.raises(ShuttingDownError) as info:
        h.submit("m", row(5))
    assert_shutting_down(info.value)
    gate.release.set()
    join(stopper)
    for k, request in zip((1, 2, 3, 4), [running, *queued], strict=True):
        np.testing.assert_array_equal(request.value(), row(k) * SCALE)
    assert [r.first_column for r in h.runs] == [[1.0], [2.0], [3.0], [4.0]]
    assert no_dispatch_thread()


def test_requests_still_queued_after_the_grace_fail_unavailable(h: Harness) -> None:
    h.add("m", sizes=(1,))
    h.add("n", sizes=(1, 2))
    gate = h.hold("m")
    running = h.submit("m", row(1))
    assert gate.entered.wait(WAIT_S)
    queued = [h.submit("m", row(2)), h.submit("n", row(3)), h.submit("n", row(4))]
    stopper = stop_in_background(h, grace_s=0.0)
    gate.release.set()
    join(stopper)
    # The running execution is never interrupted; the rest fail once the grace is over.
    np.testing.assert_array_equal(running.value(), row(1) * SCALE)
    for request in queued:
        assert_shutting_down(request.future.exception(timeout=0))
    assert len(h.runs) == 1
    assert h.scheduler.queue_depth("m") == h.scheduler.queue_depth("n") == 0
    assert no_dispatch_thread()


def test_submits_and_controls_after_stop_are_refused(h: Harness) -> None:
    h.add("m", sizes=(1,))
    served = h.submit("m", row(1))
    np.testing.assert_array_equal(served.value(), row(1) * SCALE)
    h.scheduler.stop(grace_s=5.0)
    with pytest.raises(ShuttingDownError) as info:
        h.submit("m", row(2))
    assert_shutting_down(info.value)
    with pytest.raises(ShuttingDownError):
        h.scheduler.call("m", [NamedTensor("x", row(3))])
    ran: list[str] = []
    future = h.scheduler.control(lambda: ran.append("control"))
    assert_shutting_down(future.exception(timeout=0))
    assert ran == []
    h.scheduler.stop(grace_s=5.0)  # a second stop is harmless
    assert SHUTTING_DOWN == "server is shutting down"


def test_controls_queued_during_the_grace_are_answered(h: Harness) -> None:
    h.add("m", sizes=(1,))
    gate = h.hold("m")
    h.submit("m", row(1))
    assert gate.entered.wait(WAIT_S)
    stopper = stop_in_background(h, grace_s=0.0)
    during = h.scheduler.control(lambda: "ran")
    gate.release.set()
    join(stopper)
    # Either it ran before the loop ended or it failed with UNAVAILABLE: never left pending.
    assert during.done()
    exc = during.exception(timeout=0)
    if exc is None:
        assert during.result(timeout=0) == "ran"
    else:
        assert_shutting_down(exc)


def test_stop_on_a_never_started_scheduler_fails_everything_queued() -> None:
    h = Harness(discipline=SchedulingDiscipline.FIFO)
    h.add("m", sizes=(1, 2))
    h.add("n", sizes=(1,))
    requests = [h.submit("m", row(1)), h.submit("m", row(2)), h.submit("n", row(3))]
    committed = h.submit("n", row(4), committed=True)
    ran: list[str] = []
    control = h.scheduler.control(lambda: ran.append("control"))
    h.scheduler.stop(grace_s=10.0)
    for request in [*requests, committed]:
        assert_shutting_down(request.future.exception(timeout=0))
    assert_shutting_down(control.exception(timeout=0))
    assert ran == []
    assert h.runs == []
    assert h.scheduler.queue_depth("m") == h.scheduler.queue_depth("n") == 0
    with pytest.raises(ShuttingDownError):
        h.submit("m")
    assert not h.scheduler.step()


def test_event_loop_callers_get_unavailable_at_shutdown(h: Harness) -> None:
    h.add("m", sizes=(1,))
    gate = h.hold("m")

    async def scenario() -> None:
        running = asyncio.ensure_future(h.scheduler.infer("m", [NamedTensor("x", row(1))]))
        assert await asyncio.to_thread(gate.entered.wait, WAIT_S)
        queued = asyncio.ensure_future(h.scheduler.infer("m", [NamedTensor("x", row(2))]))
        await asyncio.sleep(0)
        stopper = await asyncio.to_thread(stop_in_background, h, 0.0)
        gate.release.set()
        await asyncio.to_thread(join, stopper)
        (out,) = await asyncio.wait_for(running, WAIT_S)
        np.testing.assert_array_equal(out, row(1) * SCALE)
        with pytest.raises(ShuttingDownError) as info:
            await asyncio.wait_for(queued, WAIT_S)
        assert_shutting_down(info.value)

    asyncio.run(scenario())


def test_no_future_is_left_unresolved_after_stop(h: Harness) -> None:
    for name, sizes in (("a", (1, 2, 4)), ("b", (1,)), ("c", (2,))):
        h.add(name, sizes=sizes)
    gate = h.hold("b")
    submitted: list[Request] = [h.submit("b", row(1))]
    assert gate.entered.wait(WAIT_S)
    controls: list[concurrent.futures.Future[int]] = []
    errors: list[BaseException] = []

    def producer(name: str) -> None:
        for k in range(20):
            try:
                submitted.append(h.submit(name, row(k + 1)))
            except ShuttingDownError as exc:
                errors.append(exc)

    threads = [threading.Thread(target=producer, args=(n,)) for n in "abc"]
    for thread in threads:
        thread.start()
    for thread in threads:
        join(thread)
    make: Callable[[int], Callable[[], int]] = lambda i: lambda: i  # noqa: E731
    controls.extend(h.scheduler.control(make(i)) for i in range(3))
    stopper = stop_in_background(h, grace_s=0.0)
    gate.release.set()
    join(stopper)
    assert errors == []
    assert len(submitted) == 61
    assert all(r.future.done() for r in submitted)
    assert all(f.done() for f in controls)
    outcomes = [r.future.exception(timeout=0) for r in submitted]
    assert outcomes[0] is None
    for exc in outcomes[1:]:
        assert exc is None or isinstance(exc, ShuttingDownError)
    assert no_dispatch_thread()


def test_stop_while_another_thread_is_starting_it_never_fails() -> None:
    # A shutdown during start-up: stop() lands while the loader thread is inside start(), the
    # dispatch thread listed by threading but not yet running. Before the fix, stop() joined
    # it then and failed with "cannot join thread before it is started".
    def listed() -> bool:  # started or not (is_alive() is false until it runs)
        return any(t.name == "reactant-dispatch" for t in threading.enumerate())

    errors: list[BaseException] = []
    for _ in range(200):
        h = Harness(discipline=SchedulingDiscipline.FIFO)
        starter = threading.Thread(target=h.scheduler.start)
        starter.start()
        deadline = time.monotonic() + WAIT_S
        while not listed() and time.monotonic() < deadline:
            pass  # spin, holding the GIL, so the new thread is caught before it runs
        try:
            h.scheduler.stop(grace_s=0.0)
        except BaseException as exc:  # collected, so one failure does not hide the count
            errors.append(exc)
        join(starter)
        h.scheduler.stop(grace_s=0.0)
        wait_for(no_dispatch_thread)
    assert errors == []
