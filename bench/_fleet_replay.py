"""Open-loop replay of a trace through one endpoint with stock ``tritonclient.grpc.aio``.

Every :class:`~bench._traces.Arrival` is sent at its time from the start, whether or not earlier
requests have been answered (open loop: a slow fleet builds a queue instead of slowing the
client down). A request's latency runs from its scheduled time to its answer, so a client that
falls behind its schedule counts against the fleet, not for it::

    result = replay("127.0.0.1:8001", trace, ("x", (1, 1024), "y", (1, 1000)))
    result.summary()["p99_ms"]
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

from bench._gateway_load import _CHANNEL_ARGS, _pct
from bench._grpc_load import Signature
from bench._traces import Arrival

__all__ = ["Replay", "replay"]

#: A request not answered within this many seconds counts as an error.
REQUEST_TIMEOUT_S = 120.0


@attrs.define
class Replay:
    """What one replay measured: per-request latencies in trace order (None: failed)."""

    latencies_ns: list[int | None]
    #: Seconds from the first scheduled send to the last answer.
    wall_s: float
    #: How late the client sent its requests (seconds after their scheduled time), worst case.
    max_send_lag_s: float
    errors: int = 0
    first_error: str | None = None

    def summary(self) -> dict[str, Any]:
        """JSON-ready: mean / p50 / p99 in ms, answered requests per second, errors."""
        lat = sorted(ns for ns in self.latencies_ns if ns is not None)
        n = len(lat)
        return {
            "requests": len(self.latencies_ns),
            "answered": n,
            "wall_s": self.wall_s,
            "requests_per_s": n / self.wall_s if self.wall_s > 0 else 0.0,
            "mean_ms": statistics.fmean(lat) / 1e6 if lat else 0.0,
            "p50_ms": _pct(lat, 0.50) / 1e6,
            "p99_ms": _pct(lat, 0.99) / 1e6,
            "max_send_lag_ms": self.max_send_lag_s * 1e3,
            "errors": self.errors,
            "first_error": self.first_error,
        }


async def _replay(url: str, trace: Sequence[Arrival], signature: Signature) -> Replay:
    import tritonclient.grpc.aio as aioclient

    name, one, output, _ = signature
    tensor = aioclient.InferInput(name, list(one), "FP32")
    tensor.set_data_from_numpy(np.random.default_rng(0).standard_normal(one).astype(np.float32))
    wanted = [aioclient.InferRequestedOutput(output)]
    latencies: list[int | None] = [None] * len(trace)
    errors: list[str] = []
    lag = 0.0
    client = aioclient.InferenceServerClient(url, channel_args=_CHANNEL_ARGS)
    try:
        start = time.perf_counter_ns()

        async def send(i: int, arrival: Arrival) -> None:
            due = start + round(arrival.at_s * 1e9)
            try:
                await client.infer(
                    arrival.model, [tensor], outputs=wanted, client_timeout=REQUEST_TIMEOUT_S
                )
            except Exception as exc:  # counted and reported
                errors.append(f"{arrival.model}: {type(exc).__name__}: {exc}")
                return
            latencies[i] = time.perf_counter_ns() - due

        tasks = []
        for i, arrival in enumerate(trace):
            wait = arrival.at_s - (time.perf_counter_ns() - start) / 1e9
            if wait > 0:
                await asyncio.sleep(wait)
            else:
                lag = max(lag, -wait)
            tasks.append(asyncio.create_task(send(i, arrival)))
        await asyncio.gather(*tasks)
        wall = (time.perf_counter_ns() - start) / 1e9
    finally:
        await client.close()
    return Replay(latencies, wall, lag, len(errors), errors[0] if errors else None)


def replay(url: str, trace: Sequence[Arrival], signature: Signature) -> Replay:
    """Send ``trace`` to ``url`` open-loop (one connection, one event loop); see the module."""
    return asyncio.run(_replay(url, trace, signature))
