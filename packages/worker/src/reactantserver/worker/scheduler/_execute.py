"""One execution on the device: assemble, transfer, run, copy back, slice, timed in parts.

Runs on the dispatch thread only, outside the scheduler lock. Device buffers made here are
freed before returning, whatever happens.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np

from reactantserver.worker.runtime.backend import Backend, DeviceBuffer
from reactantserver.worker.runtime.weight_cache import WeightCache, run_with_oom_retry
from reactantserver.worker.scheduler.assembly import assemble, split
from reactantserver.worker.scheduler.queue import Pending

__all__ = ["Execution", "execute"]

Array = np.ndarray[Any, Any]

_log = logging.getLogger(__name__)


@attrs.frozen
class Execution:
    """The per-request outputs of one execution and where its time went (nanoseconds)."""

    batch: int
    results: list[list[Array]]
    input_ns: int
    infer_ns: int
    output_ns: int

    @property
    def seconds(self) -> float:
        """Input assembly and transfer + execution + output transfer and slicing."""
        return (self.input_ns + self.infer_ns + self.output_ns) * 1e-9


def _start_prefetch(cache: WeightCache, name: str, running: str | None) -> bool:
    try:
        return cache.prefetch(name, keep=running)
    except Exception as exc:  # optional work: the batch runs whatever happens here
        _log.warning("prefetch of the weights of %r failed: %s", name, exc)
        return False


def execute(
    backend: Backend,
    cache: WeightCache | None,
    requests: Sequence[Pending],
    batch: int,
    clock: Callable[[], int],
    *,
    prefetch: str | None = None,
) -> Execution:
    """Run ``requests`` (one generation, one variant) as one batch of compiled size ``batch``.

    Weights are acquired first (loading them is not part of the measured time); a device
    out-of-memory is retried once with the other on-demand weights evicted. ``prefetch``
    names weights to start loading once the execution is queued, so the copy overlaps it
    (the execution time then includes queuing that copy).
    """
    model = requests[0].model
    program = model.programs[(requests[0].variant, batch)]
    weights: list[DeviceBuffer] = []
    if model.weights is not None and cache is not None:
        weights = cache.acquire(model.weights)
    rows = [r.rows for r in requests]

    def run() -> Execution:
        buffers: list[DeviceBuffer] = []
        try:
            start = clock()
            hosts = assemble([r.inputs for r in requests], rows, model.input_axes, batch=batch)
            args = [backend.to_device(h) for h in hosts]
            buffers.extend(args)
            ready = clock()
            overlap = cache if prefetch is not None and prefetch != model.weights else None
            outputs = backend.execute(program, [*args, *weights], wait=overlap is None)
            buffers.extend(outputs)
            if overlap is not None and prefetch is not None:
                _start_prefetch(overlap, prefetch, model.weights)
                backend.wait(outputs)
            ran = clock()
            host_out = [backend.to_host(o) for o in outputs]
            results = split(host_out, rows, model.output_axes)
            done = clock()
        finally:
            for buf in buffers:
                backend.free(buf)
        return Execution(batch, results, ready - start, ran - ready, done - ran)

    if cache is None or model.weights is None:
        return run()
    return run_with_oom_retry(cache, model.weights, run)
