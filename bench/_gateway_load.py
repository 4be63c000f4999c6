"""Closed-loop, count-based load from stock ``tritonclient.grpc`` for ``bench.gateway``.

``concurrency`` threads, each with its own ``InferenceServerClient`` (its own connection), first
send ``warmup`` unmeasured requests, meet at a barrier, then send their share of ``requests``
back to back (the next one as soon as the previous answer is decoded). The phase's wall time
runs from the barrier to the last answer; around it the CPU time of this process and of every
server process is read, so a phase can say what the gateway cost per request.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from bench._grpc_load import INPUTS

__all__ = ["CpuReader", "Phase", "closed_loop", "combine"]

#: Reads one server process's CPU seconds so far (all threads); None where it cannot.
CpuReader = Callable[[], float | None]

# Default channel options plus a private subchannel pool: without it every client of the
# process shares one HTTP/2 connection (gRPC pools subchannels globally).
_MAX_MESSAGE = 512 * 1024 * 1024
_CHANNEL_ARGS = [
    ("grpc.max_send_message_length", _MAX_MESSAGE),
    ("grpc.max_receive_message_length", _MAX_MESSAGE),
    ("grpc.use_local_subchannel_pool", 1),
]
_BARRIER_TIMEOUT_S = 300.0


def _pct(ordered: Sequence[int], q: float) -> float:
    if not ordered:
        return 0.0
    return float(ordered[min(len(ordered) - 1, max(0, int(q * len(ordered) + 0.5) - 1))])


@attrs.define
class Phase:
    """What one closed-loop phase (or several of one target, combined) measured."""

    target: str
    model: str
    concurrency: int
    rows: int
    wall_s: float
    latencies_ns: list[int]
    errors: int = 0
    first_error: str | None = None
    #: CPU seconds in the phase by process (``client`` = this process).
    cpu_s: dict[str, float] = attrs.field(factory=dict)
    rounds: int = 1

    def summary(self) -> dict[str, Any]:
        """The phase as a JSON-ready row (latencies in ms, CPU in us per request)."""
        lat = sorted(self.latencies_ns)
        n = len(lat)
        return {
            "target": self.target,
            "model": self.model,
            "concurrency": self.concurrency,
            "rows_per_request": self.rows,
            "rounds": self.rounds,
            "requests": n,
            "wall_s": self.wall_s,
            "requests_per_s": n / self.wall_s if self.wall_s > 0 else 0.0,
            "p50_ms": _pct(lat, 0.50) / 1e6,
            "p99_ms": _pct(lat, 0.99) / 1e6,
            "mean_ms": statistics.fmean(lat) / 1e6 if lat else 0.0,
            "errors": self.errors,
            "first_error": self.first_error,
            "cpu_us_per_request": {
                name: seconds / n * 1e6 for name, seconds in sorted(self.cpu_s.items()) if n
            },
        }


def combine(phases: Sequence[Phase]) -> Phase:
    """The rounds of one (target, model, concurrency) as one phase: times and counts added."""
    first = phases[0]
    cpu: dict[str, float] = {}
    for phase in phases:
        for name, seconds in phase.cpu_s.items():
            cpu[name] = cpu.get(name, 0.0) + seconds
    return Phase(
        target=first.target,
        model=first.model,
        concurrency=first.concurrency,
        rows=first.rows,
        wall_s=sum(p.wall_s for p in phases),
        latencies_ns=[ns for p in phases for ns in p.latencies_ns],
        errors=sum(p.errors for p in phases),
        first_error=next((p.first_error for p in phases if p.first_error), None),
        cpu_s=cpu,
        rounds=sum(p.rounds for p in phases),
    )


class _Errors:
    def __init__(self) -> None:
        self.count = 0
        self.first: str | None = None
        self._lock = threading.Lock()

    def add(self, exc: BaseException) -> None:
        with self._lock:
            self.count += 1
            if self.first is None:
                self.first = f"{type(exc).__name__}: {exc}"


def _cpu(readers: Mapping[str, CpuReader]) -> dict[str, float | None]:
    out: dict[str, float | None] = {name: read() for name, read in readers.items()}
    out["client"] = time.process_time()
    return out


def closed_loop(
    url: str,
    model: str,
    *,
    target: str,
    concurrency: int,
    requests: int,
    warmup: int,
    cpu: Mapping[str, CpuReader],
    rows: int = 1,
) -> Phase:
    """Send ``requests`` requests of ``rows`` rows to ``model`` at ``url`` from ``concurrency``
    clients.

    Each client first sends ``warmup`` unmeasured requests (its connection is made and the
    server's paths are warm); the measured part starts for all clients at once.
    """
    import tritonclient.grpc as grpcclient

    name, one, output, one_out = INPUTS[model]
    shape, out_shape = (rows, *one[1:]), (rows, *one_out[1:])
    shares = [requests // concurrency + (i < requests % concurrency) for i in range(concurrency)]
    latencies: list[list[int]] = [[] for _ in range(concurrency)]
    errors = _Errors()
    barrier = threading.Barrier(concurrency + 1)

    def client(i: int) -> None:
        triton = None
        try:
            # Any failure before the barrier is counted; the client still meets the others.
            data = np.random.default_rng(i).standard_normal(shape).astype(np.float32)
            tensor = grpcclient.InferInput(name, list(shape), "FP32")
            tensor.set_data_from_numpy(data)
            triton = grpcclient.InferenceServerClient(url, channel_args=_CHANNEL_ARGS)
            for _ in range(warmup):
                got = triton.infer(model, [tensor]).as_numpy(output)
                if got is None or tuple(got.shape) != out_shape:
                    raise RuntimeError(f"{output!r} is {got!r}, expected shape {out_shape}")
        except Exception as exc:  # counted and reported
            errors.add(exc)
        barrier.wait(_BARRIER_TIMEOUT_S)
        if triton is None:
            return
        try:
            mine = latencies[i]
            for _ in range(shares[i]):
                begin = time.perf_counter_ns()
                try:
                    triton.infer(model, [tensor]).as_numpy(output)
                except Exception as exc:  # counted and reported
                    errors.add(exc)
                    continue
                mine.append(time.perf_counter_ns() - begin)
        finally:
            triton.close()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(concurrency)]
    for t in threads:
        t.start()
    barrier.wait(_BARRIER_TIMEOUT_S)
    start, cpu0 = time.perf_counter(), _cpu(cpu)
    for t in threads:
        t.join()
    wall, cpu1 = time.perf_counter() - start, _cpu(cpu)
    spent = {
        k: max(0.0, v1 - v0)
        for k, v1 in cpu1.items()
        if v1 is not None and (v0 := cpu0.get(k)) is not None
    }
    return Phase(
        target=target,
        model=model,
        concurrency=concurrency,
        rows=rows,
        wall_s=wall,
        latencies_ns=[ns for mine in latencies for ns in mine],
        errors=errors.count,
        first_error=errors.first,
        cpu_s=spent,
    )
