"""The scheduler's share of ``reactantserver_worker_stage_cpu_seconds_total``: queue and dispatch
CPU by model.

Thread CPU is real time (``time.thread_time_ns``), not the fake clock: the tests only say which
counter moves, never by how much.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from reactantserver.core.config import SchedulingDiscipline
from reactantserver.core.errors import OverloadedError
from reactantserver.core.hooks import NamedTensor
from reactantserver.worker.scheduler import (
    SAMPLE_EVERY,
    LoopCompletion,
    StageClock,
    StatsSnapshot,
    resolve_all,
)

from ._fake import Harness, Outputs, row


def cpu(h: Harness, name: str) -> tuple[int, int]:
    """(queue ns, dispatch ns) of ``name`` so far."""
    stats = h.scheduler.stats(name) or StatsSnapshot()
    return stats.queue_cpu_ns, stats.dispatch_cpu_ns


def test_submit_charges_queue_and_a_turn_charges_dispatch_to_the_model_it_ran() -> None:
    h = Harness(discipline=SchedulingDiscipline.FIFO)
    h.add("a", sizes=(1, 4))
    h.add("b")
    requests = [h.submit("a", row(k)) for k in range(3)]
    queue, dispatch = cpu(h, "a")
    assert queue > 0
    assert dispatch == 0
    h.drain()
    assert {model for model, _ in h.ran()} == {"a"}
    assert [r.value()[0, 0] for r in requests] == [0.0, 10.0, 20.0]
    queue_after, dispatch_after = cpu(h, "a")
    assert queue_after == queue  # FutureCompletion callers are not on a loop: no wake charge
    assert dispatch_after > 0
    assert cpu(h, "b") == (0, 0)


def test_a_turn_that_only_runs_control_commands_charges_nobody() -> None:
    h = Harness(discipline=SchedulingDiscipline.FIFO)
    h.add("a")
    done = h.scheduler.control(lambda: sum(range(100_000)))
    assert h.drain() == 1
    assert done.result() == sum(range(100_000))
    assert cpu(h, "a") == (0, 0)


def test_a_refused_request_charges_nothing() -> None:
    h = Harness(discipline=SchedulingDiscipline.FIFO, max_queue_depth=1)
    h.add("a")
    h.submit("a")
    queue, _ = cpu(h, "a")
    with pytest.raises(OverloadedError):
        h.submit("a")
    assert cpu(h, "a") == (queue, 0)


def test_resolve_all_charges_each_loop_its_settling_cpu() -> None:
    charges: list[int] = []

    async def main() -> list[Outputs]:
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[Outputs]] = [loop.create_future() for _ in range(3)]
        results = [
            (LoopCompletion(loop, f), [np.full(2, k, np.float32)]) for k, f in enumerate(futures)
        ]
        resolve_all(results, charges.append)
        return await asyncio.gather(*futures)

    outputs = asyncio.run(main())
    assert [float(o[0][0]) for o in outputs] == [0.0, 1.0, 2.0]
    assert len(charges) == 1  # one loop, one wake-up, one charge
    assert charges[0] >= 0


def test_an_awaiting_caller_is_charged_for_admission_and_its_wake_up() -> None:
    h = Harness(discipline=SchedulingDiscipline.FIFO, real_clock=True)
    h.add("a", sizes=(1, 4))
    h.start()
    try:

        async def main() -> None:
            outputs = await asyncio.gather(
                *(h.scheduler.infer("a", [NamedTensor("x", row(k))]) for k in range(4))
            )
            assert [float(o[0][0, 0]) for o in outputs] == [0.0, 10.0, 20.0, 30.0]

        asyncio.run(main())
    finally:
        h.close()
    queue, dispatch = cpu(h, "a")
    assert queue > 0
    assert dispatch > 0


def test_the_stage_clock_times_the_first_request_then_one_in_every() -> None:
    clock = StageClock(4)
    assert [clock.timed() for _ in range(9)] == [True, False, False, False] * 2 + [True]
    assert clock.scale(250) == 1000
    assert all(StageClock(1).timed() for _ in range(3))
    with pytest.raises(ValueError, match="every"):
        StageClock(0)


def test_admission_is_timed_on_one_request_in_sample_every() -> None:
    h = Harness(discipline=SchedulingDiscipline.FIFO)
    h.add("a", sizes=(1, 4))
    h.submit("a")
    queue, _ = cpu(h, "a")
    assert queue > 0
    for _ in range(SAMPLE_EVERY - 1):
        h.submit("a")
    assert cpu(h, "a")[0] == queue
    h.submit("a")
    assert cpu(h, "a")[0] > queue
