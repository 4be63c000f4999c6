"""Fixtures shared by the scheduler behaviour tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from reactantserver.core.config import SchedulingDiscipline

from ._fake import Harness


@pytest.fixture
def started() -> Iterator[Harness]:
    """A fifo scheduler on the real clock with its dispatch thread running."""
    h = Harness(discipline=SchedulingDiscipline.FIFO, real_clock=True)
    h.start()
    try:
        yield h
    finally:
        h.close()
