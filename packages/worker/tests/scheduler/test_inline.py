"""The inline turn: a lone cheap request runs on the event loop that admitted it instead of
waking the dispatch thread (``scheduler.inline_max_cost_microseconds``).

Without a started dispatch thread nothing else would run a queued request, so a request that
completes here ran inline; one that did not stays queued until the test steps the loop.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np

from reactantserver.core.config import SchedulingDiscipline
from reactantserver.core.hooks import NamedTensor

from ._fake import SCALE, Harness, row

FIFO = SchedulingDiscipline.FIFO


def _harness(limit_us: int = 300, cost_s: float | None = 50e-6) -> Harness:
    h = Harness(discipline=FIFO, inline_max_cost_microseconds=limit_us)
    h.add("m", sizes=(1, 4))
    if cost_s is not None:
        h.scheduler.costs.record("m", 1, cost_s)
    return h


async def _infer(h: Harness, value: float) -> Any:
    return await h.scheduler.infer("m", [NamedTensor("x", row(value))], alone=True)


def _ran_inline(h: Harness) -> bool:
    """Run one request; True when it finished without the loop being stepped."""

    async def main() -> bool:
        task = asyncio.ensure_future(_infer(h, 7))
        await asyncio.sleep(0.05)
        if task.done():
            (out,) = task.result()
            np.testing.assert_array_equal(out, row(7) * SCALE)
            return True
        while not task.done():  # it was queued: the dispatch thread's turns
            h.scheduler.step()
            await asyncio.sleep(0)
        await task
        return False

    return asyncio.run(main())


def test_a_lone_cheap_request_runs_on_the_admitting_loop() -> None:
    h = _harness()
    assert _ran_inline(h)
    assert h.ran() == [("m", 1)]
    stats = h.scheduler.stats("m")
    assert stats is not None
    assert (stats.dispatch_count, stats.requests_served) == (1, 1)


def test_not_inline_when_switched_off_unmeasured_or_too_costly() -> None:
    assert not _ran_inline(_harness(limit_us=0))
    assert not _ran_inline(_harness(cost_s=None))  # never measured: no basis
    assert not _ran_inline(_harness(limit_us=300, cost_s=400e-6))


def test_not_inline_when_other_work_is_queued() -> None:
    h = _harness()
    queued = h.submit("m", row(1))  # waits for the dispatch thread's turn
    assert not _ran_inline(h)  # queued behind the older request, not run ahead of it
    np.testing.assert_array_equal(queued.value(), row(1) * SCALE)


def test_the_dispatch_thread_waits_out_an_inline_turn_then_takes_what_came_meanwhile() -> None:
    h = Harness(discipline=FIFO, real_clock=True, inline_max_cost_microseconds=1_000_000)
    h.add("m", sizes=(1, 4), duration_s=0.0)
    h.scheduler.costs.record("m", 1, 1e-6)
    entered = threading.Event()
    release = threading.Event()
    other: list[Any] = []

    def compute(x: Any) -> Any:
        if float(x.flat[0]) == 1.0:  # the inline request: hold it while another arrives
            entered.set()
            assert release.wait(10)
        return x * SCALE

    h.scheduler.remove_model("m")
    h.add("m", sizes=(1, 4), compute=compute)
    h.scheduler.costs.record("m", 1, 1e-6)
    h.start()

    def later() -> None:
        assert entered.wait(10)
        other.append(h.submit("m", row(2)))  # queued while the inline turn runs
        release.set()

    helper = threading.Thread(target=later)
    helper.start()
    try:
        (out,) = asyncio.run(_infer(h, 1))
        helper.join(10)
        np.testing.assert_array_equal(out, row(1) * SCALE)
        np.testing.assert_array_equal(other[0].value(), row(2) * SCALE)
    finally:
        h.close()


def test_a_caller_with_other_requests_in_flight_leaves_its_request_to_coalesce() -> None:
    h = _harness()

    async def main() -> bool:
        task = asyncio.ensure_future(h.scheduler.infer("m", [NamedTensor("x", row(3))]))
        await asyncio.sleep(0.05)
        queued = not task.done()
        while not task.done():
            h.scheduler.step()
            await asyncio.sleep(0)
        await task
        return queued

    assert asyncio.run(main())  # alone=False (the default): it queued
