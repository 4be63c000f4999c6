"""Request traces shared by the density and fleet benchmarks, and the offline optimum of a trace.

Two kinds of traffic over a catalog of models, both from a fixed seed:

- **Zipf** (:func:`zipf_trace`): each request's model drawn Zipf(``s``) by popularity rank,
  arrivals Poisson at a given mean rate (or only the order, for closed-loop clients).
- **Bursty** (:func:`bursty_trace`): what serverless traces such as Azure Functions show —
  most models are idle most of the time and arrive in bursts. Each model alternates between on
  and off periods (exponential lengths; popular models are on more often and longer); while on
  it sends Poisson arrivals at a rate that grows with its popularity. The rates are scaled so
  the whole trace has the requested mean rate.

:func:`belady_loads` counts the loads an offline optimal cache (Belady's MIN: evict the model
used furthest in the future) needs for a sequence with ``slots`` equal-size models resident,
the yardstick the issue asks the online cache to be compared with::

    trace = bursty_trace(names, duration_s=60, rate=80, seed=7)
    optimum = belady_loads([r.model for r in trace], slots=4)
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import attrs
import numpy as np

__all__ = [
    "Arrival",
    "belady_loads",
    "bursty_trace",
    "lru_loads",
    "zipf_trace",
    "zipf_weights",
]


@attrs.frozen
class Arrival:
    """One request of a trace: when it is sent (seconds from the start) and to which model."""

    at_s: float
    model: str


def zipf_weights(n: int, s: float) -> np.ndarray[tuple[int], np.dtype[np.float64]]:
    """Probabilities of ranks 1..``n`` under Zipf(``s``)."""
    w: np.ndarray[tuple[int], np.dtype[np.float64]] = (
        1.0 / np.arange(1, n + 1, dtype=np.float64) ** s
    )
    out: np.ndarray[tuple[int], np.dtype[np.float64]] = w / w.sum()
    return out


def _ranked(names: Sequence[str], rng: np.random.Generator) -> list[str]:
    # Which model holds which popularity rank: a fixed-seed shuffle, so rank does not follow
    # the names' order (and so neither does any placement that sorts names).
    return [names[i] for i in rng.permutation(len(names))]


def zipf_trace(
    names: Sequence[str], *, duration_s: float, rate: float, seed: int, s: float = 1.1
) -> list[Arrival]:
    """Poisson arrivals at ``rate``/s for ``duration_s``, each to a Zipf(``s``)-drawn model."""
    rng = np.random.default_rng(seed)
    by_rank = _ranked(names, rng)
    gaps = rng.exponential(1.0 / rate, size=int(duration_s * rate * 1.5) + 16)
    times = np.cumsum(gaps)
    times = times[times < duration_s]
    ranks = rng.choice(len(names), size=len(times), p=zipf_weights(len(names), s))
    return [Arrival(float(t), by_rank[r]) for t, r in zip(times, ranks, strict=True)]


def bursty_trace(
    names: Sequence[str],
    *,
    duration_s: float,
    rate: float,
    seed: int,
    s: float = 1.1,
    mean_on_s: float = 2.0,
    mean_off_s: float = 10.0,
) -> list[Arrival]:
    """On/off arrivals: model of rank ``r`` is on for Exp(``mean_on_s``) periods separated by
    Exp(``mean_off_s`` * r ** 0.5) off periods (the first one a random phase of it), sending
    Poisson arrivals at a rate proportional to its Zipf(``s``) weight while on; rates are scaled
    so the trace's mean rate is ``rate``."""
    rng = np.random.default_rng(seed)
    by_rank = _ranked(names, rng)
    weights = zipf_weights(len(names), s)
    periods: list[list[tuple[float, float]]] = []
    for r in range(len(names)):
        off_mean = mean_off_s * (r + 1) ** 0.5
        on: list[tuple[float, float]] = []
        t = float(rng.uniform(0.0, off_mean))
        while t < duration_s:
            length = float(rng.exponential(mean_on_s))
            on.append((t, min(duration_s, t + length)))
            t += length + float(rng.exponential(off_mean))
        periods.append(on)
    on_time = np.array([sum(b - a for a, b in p) for p in periods])
    # Rate while on, per model: proportional to popularity, scaled to the requested total.
    raw = weights * on_time
    scale = rate * duration_s / raw.sum() if raw.sum() > 0 else 0.0
    out: list[Arrival] = []
    for r, on in enumerate(periods):
        model_rate = weights[r] * scale
        for start, end in on:
            count = rng.poisson(model_rate * (end - start))
            for t in np.sort(rng.uniform(start, end, size=count)):
                out.append(Arrival(float(t), by_rank[r]))
    out.sort(key=lambda a: a.at_s)
    return out


def belady_loads(sequence: Sequence[str], slots: int) -> int:
    """Loads an offline optimal cache of ``slots`` equal-size models needs to serve ``sequence``.

    Belady's MIN: on a miss with the cache full, evict the resident model whose next use is
    furthest away (never used again first). Optimal for equal sizes; the cache starts empty.
    """
    if slots <= 0:
        return len(sequence)
    never = len(sequence)
    next_use = [never] * len(sequence)
    seen: dict[str, int] = {}
    for i in range(len(sequence) - 1, -1, -1):
        next_use[i] = seen.get(sequence[i], never)
        seen[sequence[i]] = i
    resident: dict[str, int] = {}  # model -> its next use
    heap: list[tuple[int, str]] = []  # (-next use, model), stale entries skipped
    loads = 0
    for i, model in enumerate(sequence):
        if model not in resident:
            loads += 1
            if len(resident) >= slots:
                while True:
                    neg, victim = heapq.heappop(heap)
                    if resident.get(victim) == -neg:
                        del resident[victim]
                        break
        resident[model] = next_use[i]
        heapq.heappush(heap, (-next_use[i], model))
    return loads


def lru_loads(sequence: Sequence[str], slots: int) -> int:
    """Loads a least-recently-used cache of ``slots`` equal-size models needs (a cross-check)."""
    order: dict[str, None] = {}
    loads = 0
    for model in sequence:
        if model in order:
            del order[model]
        else:
            loads += 1
            if len(order) >= max(1, slots):
                del order[next(iter(order))]
        order[model] = None
    return loads
