"""The raw executable's rows/s: the MLP's jitted function called in a loop, no server.

A closed loop of ``c`` one-row clients can be answered no faster than the executable runs
batches of ``c``: rows/s at batch ``c`` is each cell's cap. The call is the one the peers
serve (:func:`~bench._peers.models.compiled`: host array in, host array out). Run in its own
process so it can be pinned to the servers' CPU without touching the load generator's::

    python -m bench._peers.raw --batches 1 8 32 --seconds 0.5 --cpus 1   # JSON on stdout
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence

from bench._peers.models import MODELS, Array, Mlp, compiled, sample

__all__ = ["main", "measure", "rows_per_s"]

#: The fewest calls before timing (the first compiles) and timed.
_MIN_CALLS = 3


def _loop(run: Callable[[Array], Array], x: Array, seconds: float) -> tuple[int, float]:
    """Call ``run(x)`` back to back for ``seconds`` (at least ``_MIN_CALLS`` times)."""
    calls = 0
    start = time.perf_counter()
    while True:
        run(x)
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds and calls >= _MIN_CALLS:
            return calls, elapsed


def rows_per_s(run: Callable[[Array], Array], x: Array, seconds: float) -> dict[str, float]:
    """Rows/s and ms per call of ``run(x)`` over ``seconds``, after ``seconds / 2`` of calls
    untimed: in a probe here a fresh process ran the heavy MLP 13% slower over its first
    2 s than over the next 4 (8.0 vs 7.05 ms at batch 1), and 3 warm calls did not cover it."""
    _loop(run, x, seconds / 2)
    calls, elapsed = _loop(run, x, seconds)
    return {
        "batch": len(x),
        "calls": calls,
        "ms_per_call": elapsed / calls * 1e3,
        "rows_per_s": calls * len(x) / elapsed,
    }


def measure(model: Mlp, batches: Sequence[int], seconds: float) -> list[dict[str, float]]:
    """Rows/s of ``model`` at each batch size, in order."""
    run = compiled(model)
    return [rows_per_s(run, sample(model, b), seconds) for b in batches]


def main(argv: list[str] | None = None) -> int:
    """Print ``{model: [point, ...]}`` as JSON."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=list(MODELS))
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8, 32])
    parser.add_argument("--seconds", type=float, default=1.0, help="timed seconds per point")
    parser.add_argument("--cpus", nargs="+", type=int, help="pin this process to these CPUs")
    args = parser.parse_args(argv)
    if args.cpus:
        os.sched_setaffinity(0, args.cpus)  # before jax starts its threads
    points = {m: measure(MODELS[m], args.batches, args.seconds) for m in args.models}
    json.dump(points, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
