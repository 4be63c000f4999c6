"""The traces of the density and fleet benchmarks, and Belady's offline optimum."""

from __future__ import annotations

import collections
import functools
import random

from bench._traces import belady_loads, bursty_trace, lru_loads, zipf_trace

NAMES = [f"m{i:02d}" for i in range(20)]


def _brute_force_optimum(sequence: list[str], slots: int) -> int:
    @functools.cache
    def loads(i: int, resident: frozenset[str]) -> int:
        if i == len(sequence):
            return 0
        model = sequence[i]
        if model in resident:
            return loads(i + 1, resident)
        if len(resident) < slots:
            return 1 + loads(i + 1, resident | {model})
        return 1 + min(loads(i + 1, (resident - {v}) | {model}) for v in resident)

    return loads(0, frozenset())


def test_belady_is_the_optimum_and_never_worse_than_lru() -> None:
    rng = random.Random(1)
    for _ in range(150):
        sequence = [rng.choice("abcde") for _ in range(12)]
        slots = rng.randint(1, 3)
        assert belady_loads(sequence, slots) == _brute_force_optimum(sequence, slots)
        assert belady_loads(sequence, slots) <= lru_loads(sequence, slots)


def test_traces_are_seeded_sorted_and_at_the_requested_rate() -> None:
    for make in (zipf_trace, bursty_trace):
        trace = make(NAMES, duration_s=60, rate=50, seed=7)
        assert trace == make(NAMES, duration_s=60, rate=50, seed=7)
        assert trace != make(NAMES, duration_s=60, rate=50, seed=8)
        times = [a.at_s for a in trace]
        assert times == sorted(times)
        assert times[0] >= 0
        assert times[-1] < 60
        assert 0.8 * 3000 < len(trace) < 1.2 * 3000


def test_bursty_traffic_is_skewed_and_comes_in_bursts() -> None:
    trace = bursty_trace(NAMES, duration_s=120, rate=50, seed=3)
    counts = collections.Counter(a.model for a in trace)
    assert counts.most_common(1)[0][1] > 0.2 * len(trace)
    # Bursts: a model's next request is usually the same model's (on/off, not interleaved
    # uniformly), so an LRU cache of a few slots misses far less than under Zipf alone.
    sequence = [a.model for a in trace]
    zipf = [a.model for a in zipf_trace(NAMES, duration_s=120, rate=50, seed=3)]
    assert lru_loads(sequence, 4) < 0.5 * lru_loads(zipf, 4)
