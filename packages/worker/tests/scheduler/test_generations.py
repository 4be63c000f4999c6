"""Reload and unload while requests are queued.

A new generation admits at once; requests already queued keep the generation they were
validated against, coalesce only with each other, and the old generation's ``on_drained``
runs on the dispatch thread (as a control) after its last request.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import grpc
import numpy as np
import pytest

from reactantserver.core.config import SchedulingDiscipline
from reactantserver.core.errors import DeadlineExceededError, ModelNotFoundError
from reactantserver.worker.scheduler import ScheduledModel

from ._fake import SCALE, WAIT_S, Harness, row

FIFO = SchedulingDiscipline.FIFO

Array = np.ndarray[Any, Any]


def plus_1000(x: Array) -> Array:
    return x + 1000


def test_queued_requests_keep_their_generation_and_never_coalesce_across() -> None:
    h = Harness(discipline=FIFO)
    old = h.add("m", sizes=(1, 2, 4))
    first = [h.submit("m", row(k)) for k in (1, 2)]
    new = h.add("m", sizes=(1, 2, 4), generation=2, compute=plus_1000)
    assert h.scheduler.model("m") is new
    assert not old.admitting
    assert new.admitting
    second = [h.submit("m", row(k)) for k in (3, 4)]
    assert [r.pending.model for r in first + second] == [old, old, new, new]
    h.drain()
    # Four one-row requests would fill B = 4; generations are never mixed.
    assert [(r.generation, r.batch, r.first_column) for r in h.runs] == [
        (1, 2, [1.0, 2.0]),
        (2, 2, [3.0, 4.0]),
    ]
    for k, request in zip((1, 2), first, strict=True):
        np.testing.assert_array_equal(request.value(), row(k) * SCALE)
    for k, request in zip((3, 4), second, strict=True):
        np.testing.assert_array_equal(request.value(), row(k) + 1000)
    stats = h.scheduler.stats("m")
    assert stats is not None
    assert (stats.dispatch_count, stats.requests_served) == (2, 4)


def test_interleaved_generations_coalesce_only_with_their_own() -> None:
    h = Harness(discipline=FIFO)
    drained: list[int] = []
    h.add("m", sizes=(1, 2, 4), on_drained=lambda: drained.append(len(h.runs)))
    h.submit("m", row(1), priority=5)
    h.submit("m", row(2), priority=1)
    h.add("m", sizes=(1, 2, 4), generation=2, compute=plus_1000)
    h.submit("m", row(3), priority=1)
    h.submit("m", row(4), priority=5)
    # Queue order: g1 [2] (p1), g2 [3] (p1), g1 [1] (p5), g2 [4] (p5): each window is one.
    h.drain()
    assert [(r.generation, r.batch, r.first_column) for r in h.runs] == [
        (1, 1, [2.0]),
        (2, 1, [3.0]),
        (1, 1, [1.0]),
        (2, 1, [4.0]),
    ]
    # The old generation drained after its third-position request, before the next selection.
    assert drained == [3]


def test_on_drained_runs_after_the_last_request_before_the_next_selection() -> None:
    h = Harness(discipline=FIFO)
    calls: list[tuple[int, str]] = []

    def drained() -> None:
        calls.append((len(h.runs), threading.current_thread().name))

    h.add("m", sizes=(1,), on_drained=drained)
    h.submit("m", row(1))
    h.submit("m", row(2))
    h.add("m", sizes=(1,), generation=2, compute=plus_1000)
    assert calls == []
    h.submit("m", row(3))
    h.drain()
    assert calls == [(2, threading.current_thread().name)]  # step() is the dispatch thread here
    assert [r.generation for r in h.runs] == [1, 1, 2]


def test_an_idle_generation_drains_at_once() -> None:
    h = Harness(discipline=FIFO)
    calls: list[str] = []
    h.add("m", on_drained=lambda: calls.append("g1"))
    h.add("m", generation=2, on_drained=lambda: calls.append("g2"))
    assert calls == []  # on the dispatch thread, not in add_model
    assert h.scheduler.step()
    assert calls == ["g1"]
    assert h.runs == []
    assert h.scheduler.remove_model("m") is not None
    assert h.scheduler.step()
    assert calls == ["g1", "g2"]
    assert not h.scheduler.step()


def _ends(h: Harness, how: str) -> None:
    """Let the old generation's only queued request end in the way ``how`` says."""
    if how == "served":
        h.drain()
    elif how == "failed":
        h.backend.fail_next_execution(RuntimeError("boom"))
        h.drain()
    elif how == "expired":
        h.clock.advance(1.0)
        h.drain()
    else:
        raise AssertionError(how)


@pytest.mark.parametrize("how", ["served", "failed", "expired", "cancelled"])
def test_on_drained_fires_however_the_last_request_ends(how: str) -> None:
    h = Harness(discipline=FIFO)
    calls: list[str] = []
    old = h.add("m", sizes=(1,), on_drained=lambda: calls.append("drained"))
    request = h.submit("m", row(1), deadline_ns=h.at(0.5))
    h.add("m", sizes=(1,), generation=2)
    if how == "cancelled":
        assert h.scheduler.cancel(request.pending)
        h.drain()
    else:
        _ends(h, how)
    assert request.future.done()
    if how == "expired":
        assert isinstance(request.error(), DeadlineExceededError)
    assert calls == ["drained"]
    assert old.outstanding == 0


def test_remove_model_stops_admitting_while_queued_requests_complete() -> None:
    h = Harness(discipline=FIFO)
    calls: list[int] = []
    model = h.add("m", sizes=(1, 2), on_drained=lambda: calls.append(len(h.runs)))
    queued = [h.submit("m", row(k)) for k in (1, 2)]
    assert h.scheduler.remove_model("m") is model
    assert h.scheduler.model("m") is None
    assert h.scheduler.remove_model("m") is None
    with pytest.raises(ModelNotFoundError) as info:
        h.submit("m", row(3))
    assert info.value.status is grpc.StatusCode.NOT_FOUND
    assert calls == []
    h.drain()
    for k, request in zip((1, 2), queued, strict=True):
        np.testing.assert_array_equal(request.value(), row(k) * SCALE)
    assert h.ran() == [("m", 2)]
    assert calls == [1]
    assert model.outstanding == 0


def test_a_model_added_again_after_removal_admits_and_stays_separate() -> None:
    h = Harness(discipline=FIFO)
    h.add("m", sizes=(1, 2))
    old = h.submit("m", row(1))
    h.scheduler.remove_model("m")
    h.add("m", sizes=(1, 2), generation=2, compute=plus_1000)
    new = h.submit("m", row(2))
    h.drain()
    np.testing.assert_array_equal(old.value(), row(1) * SCALE)
    np.testing.assert_array_equal(new.value(), row(2) + 1000)
    assert [(r.generation, r.batch) for r in h.runs] == [(1, 1), (2, 1)]


def test_on_drained_runs_on_the_dispatch_thread(started: Harness) -> None:
    h = started
    done = threading.Event()
    where: list[tuple[str, int]] = []

    def drained() -> None:
        where.append((threading.current_thread().name, len(h.runs)))
        done.set()

    old: ScheduledModel = h.add("m", sizes=(1,), on_drained=drained)
    gate = h.hold("m")
    running = h.submit("m", row(1))
    assert gate.entered.wait(WAIT_S)
    h.add("m", sizes=(1,), generation=2, compute=plus_1000)
    assert not old.admitting
    assert not done.is_set()  # its request is still executing
    gate.release.set()
    assert done.wait(WAIT_S)
    assert where == [("reactant-dispatch", 1)]
    np.testing.assert_array_equal(running.value(), row(1) * SCALE)
    after = h.submit("m", row(2))
    np.testing.assert_array_equal(after.value(), row(2) + 1000)


def test_old_generation_requests_coalesce_with_each_other_while_draining() -> None:
    h = Harness(discipline=FIFO)
    h.add("m", sizes=(1, 4))
    old: list[Callable[[], Array]] = [h.submit("m", row(k)).value for k in (1, 2, 3, 4)]
    h.add("m", sizes=(1, 4), generation=2, compute=plus_1000)
    h.drain()
    assert [(r.generation, r.batch) for r in h.runs] == [(1, 4)]
    for k, value in zip((1, 2, 3, 4), old, strict=True):
        np.testing.assert_array_equal(value(), row(k) * SCALE)


@pytest.mark.parametrize("discipline", list(SchedulingDiscipline))
def test_a_removed_model_drains_under_every_discipline(discipline: SchedulingDiscipline) -> None:
    h = Harness(discipline=discipline)
    calls: list[str] = []
    h.add("gone", sizes=(1,), duration_s=0.01, on_drained=lambda: calls.append("gone"))
    h.add("kept", sizes=(1,), duration_s=0.01)
    gone = [h.submit("gone", row(k), deadline_ns=h.at(10.0)) for k in (1, 2, 3)]
    kept = [h.submit("kept", row(k)) for k in (4, 5)]
    h.scheduler.remove_model("gone")
    h.drain()
    for k, request in zip((1, 2, 3, 4, 5), gone + kept, strict=True):
        np.testing.assert_array_equal(request.value(), row(k) * SCALE)
    assert calls == ["gone"]
    assert sorted(name for name, _ in h.ran()) == ["gone"] * 3 + ["kept"] * 2
