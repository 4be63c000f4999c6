"""Open-loop replay of a request trace (``bench._traces``) against one worker.

Each arrival is sent at its time from the start, whatever the previous ones are doing, by a pool
of ``clients`` sync ``tritonclient.grpc`` clients; its latency runs from its scheduled arrival
to its decoded answer, so a request that waits for a free client (or a worker that falls
behind) is charged the wait: no coordinated omission. ``clients`` bounds the requests in flight
and should exceed what the worker can hold, or the replay itself becomes the queue::

    load = replay(server.url, catalog.signature, trace, clients=32)
    load.summary()["p99_ms"]
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Sequence

from bench._grpc_load import _CHANNEL_ARGS, Load, Signature, _check, _inputs, on_threads
from bench._traces import Arrival

__all__ = ["replay"]

_STOP = None


def replay(
    url: str, signature: Signature, trace: Sequence[Arrival], *, clients: int, model: str = "trace"
) -> Load:
    """Send ``trace`` open-loop; every request's latency is from its scheduled arrival."""
    import tritonclient.grpc as grpcclient

    work: queue.Queue[tuple[int, str] | None] = queue.Queue()
    latencies: list[list[int]] = [[] for _ in range(clients)]
    errors: list[str] = []
    lock = threading.Lock()
    start = time.perf_counter_ns() + 200_000_000  # every client connected first
    due = [start + int(a.at_s * 1e9) for a in trace]

    def client(i: int) -> None:
        inputs, output, shape = _inputs(signature, i)
        triton = grpcclient.InferenceServerClient(url, channel_args=_CHANNEL_ARGS)
        try:
            while (item := work.get()) is not _STOP:
                at, name = item
                try:
                    _check(triton.infer(name, inputs).as_numpy(output), output, shape)
                except Exception as exc:
                    with lock:
                        errors.append(f"{type(exc).__name__}: {exc}")
                    continue
                latencies[i].append(time.perf_counter_ns() - due[at])
        finally:
            triton.close()

    def feed() -> None:
        for at, arrival in enumerate(trace):
            wait = (due[at] - time.perf_counter_ns()) / 1e9
            if wait > 0:
                time.sleep(wait)
            work.put((at, arrival.model))
        for _ in range(clients):
            work.put(_STOP)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    on_threads(clients, client)
    feeder.join()
    span_s = max((d - start for d in due), default=0) / 1e9
    return Load(
        model=model,
        concurrency=clients,
        client="open-loop",
        duration_s=max(span_s, 1e-9),
        latencies_ns=[x for per in latencies for x in per],
        errors=len(errors),
        first_error=errors[0] if errors else None,
    )
