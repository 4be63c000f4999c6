"""The adaptive wait: how long a partial batch waits for more rows without a fixed delay.

Pure logic over a model's :class:`~reactantserver.worker.scheduler.arrivals.Arrivals`, its
recent batch sizes and its learned costs; ``SchedulerState.ready_at_locked`` asks it when a
model has no ``max_queue_delay_microseconds``. A batch waits only while more rows are
coming, and never longer than :func:`max_hold_ns` of the batch it is waiting to become after
its oldest request (rules 1 and 2) or after the last execution ended (rule 3):

1. **The usual rows.** With fewer rows than the model's recent batches held, until the next
   arrival is a whole average gap overdue. A lone caller's recent batches hold one row, so
   it never waits; steady concurrent callers go as soon as the rows that usually come
   together are in. A request that comes after an idle spell (a gap over twice the average)
   does not wait for the rows of a burst long gone.
2. **A saturated device.** With as many, one gap past the last arrival, while the device is
   busy with the model (its last execution ended less than a gap ago) and requests arrive
   faster than one execution of the batch takes: serving them one by one could not keep up.
3. **Callers coming back.** While the callers the device just answered have not all sent
   again, and their rows together with the queued ones would be served more cheaply per row
   (a fuller or larger compiled size, by the learned costs), until two average turnarounds
   after that execution ended: in a closed loop the callers just answered send again about a
   turnaround later, and without the wait two part-size batches alternate for good. A lone
   caller is back as soon as its next request is queued, so it never waits here.

A batch waits as long as the longest of the rules that apply says. A request to a device that
has been idle never waits for rules 2 and 3.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from reactantserver.worker.scheduler.arrivals import Arrivals
from reactantserver.worker.scheduler.planning import fit_batch

__all__ = ["ADAPTIVE_MAX_HOLD_NS", "HOLD_COST_SHARE", "adaptive_end", "max_hold_ns"]

#: The longest the adaptive wait holds a batch's oldest request, unless its execution is
#: long (see :func:`max_hold_ns`): Triton users typically set 1-2 ms by hand.
ADAPTIVE_MAX_HOLD_NS = 2_000_000
#: For a long execution the bound grows to this share of the batch's learned cost.
HOLD_COST_SHARE = 0.25

#: The learned cost of one execution at a compiled size, in seconds (None: never measured).
CostOf = Callable[[int], float | None]


def max_hold_ns(cost_s: float | None) -> int:
    """The wait's bound for a batch whose execution costs ``cost_s``."""
    if cost_s is None:
        return ADAPTIVE_MAX_HOLD_NS
    return max(ADAPTIVE_MAX_HOLD_NS, int(HOLD_COST_SHARE * cost_s * 1e9))


def adaptive_end(
    arrivals: Arrivals,
    *,
    usual_rows: int,
    rows: int,
    oldest_ns: int,
    now_ns: int,
    sizes: Sequence[int],
    cost_of: CostOf,
) -> int | None:
    """Until when a batch of ``rows`` waits (None: not at all); see the module docstring."""
    gap, last = arrivals.gap_ns, arrivals.last_ns
    if gap is None or last is None:
        return None
    size = fit_batch(sizes, rows)
    cost = cost_of(size)
    ends: list[int | None] = []
    if rows < usual_rows and arrivals.on_the_beat():
        usual = fit_batch(sizes, usual_rows)
        bound = max_hold_ns(cost if usual == size else cost_of(usual))
        ends.append(min(last + int(2 * gap), oldest_ns + bound))
    done = arrivals.done_ns
    if done is not None:
        saturated = _saturated_end(gap, last, done, cost, now_ns)
        if saturated is not None:
            ends.append(min(saturated, oldest_ns + max_hold_ns(cost)))
        ends.append(
            _returning_end(arrivals, rows, size, cost, now_ns, sizes=sizes, cost_of=cost_of)
        )
    end = max((e for e in ends if e is not None), default=None)
    if end is None or now_ns >= end:
        return None
    return end


def _saturated_end(gap: float, last: int, done: int, cost: float | None, now_ns: int) -> int | None:
    """Rule 2: one gap past the last arrival while arrivals outpace executions."""
    if cost is not None and gap < cost * 1e9 and now_ns - done < gap:
        return last + int(gap)
    return None


def _returning_end(
    arrivals: Arrivals,
    rows: int,
    size: int,
    cost: float | None,
    now_ns: int,
    *,
    sizes: Sequence[int],
    cost_of: CostOf,
) -> int | None:
    """Rule 3: two turnarounds past the last execution while its callers would fill a larger,
    cheaper-per-row size."""
    turnaround, done = arrivals.turnaround_ns, arrivals.done_ns
    if turnaround is None or done is None or cost is None or now_ns - done >= 2 * turnaround:
        return None
    # The callers of the last execution not back yet (a lone caller is back: it is this row).
    still_out = arrivals.done_rows - arrivals.arrived_since_done
    if still_out <= 0:
        return None
    coming = rows + still_out
    target = fit_batch(sizes, coming)
    target_cost = cost if target == size else cost_of(target)
    if target_cost is None or target_cost / min(coming, target) >= cost / rows:
        return None  # their rows would not be served more cheaply together
    # From the execution's end: the queued rows have waited out that execution already.
    return done + min(int(2 * turnaround), max_hold_ns(target_cost))
