"""Committed meta sub-calls in the dispatch loop, where the scheduler tests leave gaps.

``packages/worker/tests/scheduler`` already shows, on a fake clock and ``step()``: a committed
request dispatched first under ``fifo`` and leading its batch, committed requests oldest
first across models, committed ahead of more urgent priorities, a cancelled committed entry
skipped, the ``edf`` laxity margin skipped and the hard deadline kept. Added here: the
committed list is consulted *before* the ``edf`` and ``fair`` scans too, and a full queue
still sheds a committed request.
"""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from packages.worker.tests.scheduler._fake import SCALE, Harness, row
from reactantserver.core.config import SchedulingDiscipline
from reactantserver.core.errors import OverloadedError
from reactantserver.worker.runtime.probe import RunKey

EDF = SchedulingDiscipline.EDF
FAIR = SchedulingDiscipline.FAIR


def _first_dispatched(h: Harness) -> str:
    assert h.scheduler.step()
    ((name, _),) = h.ran()
    return name


@pytest.mark.parametrize("committed", [False, True])
def test_edf_serves_a_committed_sub_call_before_an_earlier_deadline(committed: bool) -> None:
    h = Harness(discipline=EDF)
    h.add("urgent", sizes=(1,))
    h.add("sub", sizes=(1,))
    h.submit("urgent", row(1), deadline_ns=h.at(1.0))
    h.clock.advance(0.001)
    late = h.submit("sub", row(2), deadline_ns=h.at(60.0), committed=committed)
    # Without the commitment edf picks the earlier deadline; with it, the sub-call goes first.
    assert _first_dispatched(h) == ("sub" if committed else "urgent")
    h.drain()
    np.testing.assert_array_equal(late.value(), row(2) * SCALE)


@pytest.mark.parametrize("committed", [False, True])
def test_fair_serves_a_committed_sub_call_before_a_model_it_would_prefer(committed: bool) -> None:
    h = Harness(discipline=FAIR)
    h.add("favoured", sizes=(1,), weight=10.0, duration_s=0.010)
    h.add("sub", sizes=(1,), weight=1.0, duration_s=0.010)
    h.scheduler.seed_costs({RunKey("favoured", None, 1): 0.010, RunKey("sub", None, 1): 0.010})
    h.submit("sub")  # sub has been busy recently; favoured has not
    h.drain()
    h.runs.clear()
    h.submit("favoured", row(1))
    h.clock.advance(0.001)
    h.submit("sub", row(2), committed=committed)
    assert _first_dispatched(h) == ("sub" if committed else "favoured")
    h.drain()
    assert sorted(name for name, _ in h.ran()) == ["favoured", "sub"]


def test_a_full_queue_sheds_a_committed_sub_call() -> None:
    h = Harness(discipline=SchedulingDiscipline.FIFO, max_queue_depth=1)
    h.add("sub", sizes=(1,))
    h.submit("sub", row(1))
    with pytest.raises(OverloadedError) as caught:
        h.submit("sub", row(2), committed=True)
    assert caught.value.status is grpc.StatusCode.RESOURCE_EXHAUSTED
    stats = h.scheduler.stats("sub")
    assert stats is not None
    assert stats.shed == 1
    h.drain()
    assert h.ran() == [("sub", 1)]
