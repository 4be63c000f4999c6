"""What the adaptive wait knows of a model's traffic: arrival gaps, completions, turnarounds.

Updated under the scheduler lock: an arrival at every admission, a completion at the end of
every execution. Three averages come out of it:

- ``gap_ns``: the average gap between arrivals (about the last eight count);
- ``turnaround_ns``: how long after an execution ends the next request arrives (in a closed
  loop, the time the callers just answered take to send again);
- ``done_ns`` / ``done_rows`` / ``arrived_since_done``: when the last execution ended, how
  many rows it answered and how many requests came since.
"""

from __future__ import annotations

import attrs

__all__ = ["ARRIVAL_EMA_ALPHA", "ARRIVAL_GAP_CAP_NS", "Arrivals"]

#: Weight of the newest sample in the averages.
ARRIVAL_EMA_ALPHA = 0.25
#: A gap longer than this counts as this long: one idle spell marks traffic as sparse
#: without taking hundreds of arrivals to forget.
ARRIVAL_GAP_CAP_NS = 50_000_000


def _average(old: float | None, sample: float) -> float:
    return sample if old is None else old + ARRIVAL_EMA_ALPHA * (sample - old)


@attrs.define
class Arrivals:
    """One model generation's traffic, as the adaptive wait reads it."""

    gap_ns: float | None = None
    """Average gap between arrivals (None before the second)."""
    last_ns: int | None = None
    """When the last request arrived."""
    last_gap_ns: int | None = None
    """The gap just before the last request (capped like the average's samples)."""
    done_ns: int | None = None
    """When the last execution ended."""
    done_rows: int = 0
    """Rows the last execution answered."""
    turnaround_ns: float | None = None
    """Average time from an execution's end to the next arrival (None before the first)."""
    arrived_since_done: int = 0
    """Requests admitted since the last execution ended."""

    def arrived(self, now_ns: int) -> None:
        """Count one admitted request."""
        if self.arrived_since_done == 0 and self.done_ns is not None:
            self.turnaround_ns = _average(
                self.turnaround_ns, min(now_ns - self.done_ns, ARRIVAL_GAP_CAP_NS)
            )
        self.arrived_since_done += 1
        last = self.last_ns
        self.last_ns = now_ns
        if last is not None:
            self.last_gap_ns = min(now_ns - last, ARRIVAL_GAP_CAP_NS)
            self.gap_ns = _average(self.gap_ns, self.last_gap_ns)

    def on_the_beat(self) -> bool:
        """Whether the last request came about when the recent traffic said it would: not
        after an idle spell (its gap more than twice the average, itself included)."""
        return (
            self.gap_ns is not None
            and self.last_gap_ns is not None
            and self.last_gap_ns <= 2 * self.gap_ns
        )

    def done(self, now_ns: int, rows: int) -> None:
        """Count one finished execution of ``rows`` rows."""
        self.done_ns = now_ns
        self.done_rows = rows
        self.arrived_since_done = 0
