"""Closed-loop load from stock ``tritonclient`` for ``bench.worker_grpc``.

``concurrency`` clients, each with its own ``InferenceServerClient``, send requests (one row
each unless ``rows`` says more) back to back: the next one as soon as the previous answer is
decoded. Three kinds of client:

- ``threads``: sync ``tritonclient.grpc``, one thread per client. The gRPC core releases the
  GIL while a call waits, so the threads only contend for the Python part of each call.
- ``asyncio`` / ``uvloop``: ``tritonclient.grpc.aio``, one task per client on one event loop
  (the stdlib loop or uvloop).

``route`` (optional) names the model of each request, called once per request from any
client: the model set of ``model``'s input shape (e.g. copies of the CNN) in a chosen order.

A request counts when its answer arrives inside the window (``warmup_s`` after the start, for
``duration_s``); its latency is from just before ``infer`` to just after the output is decoded.
A helper thread samples this process's CPU time and the server's (by thread group) at the
window's edges.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np

__all__ = [
    "CLIENT_KINDS",
    "INPUTS",
    "MODELS",
    "CpuSampler",
    "Load",
    "Route",
    "Signature",
    "Window",
    "closed_loop",
    "combine",
    "on_threads",
    "run_load",
    "run_window",
    "sample_cpu",
]

CLIENT_KINDS = ("threads", "asyncio", "uvloop")
#: (input name, one-row shape, output name, one-row output shape) of a model's requests.
Signature = tuple[str, tuple[int, ...], str, tuple[int, ...]]
#: Model -> its :data:`Signature`, as the examples export them.
INPUTS: Mapping[str, Signature] = {
    "mlp": ("x", (1, 16), "logits", (1, 4)),
    "cnn": ("image", (1, 1, 28, 28), "logits", (1, 10)),
}
MODELS = tuple(INPUTS)

#: Reads the server's CPU seconds so far, by thread group; None where it cannot.
CpuSampler = Callable[[], Mapping[str, float] | None]
#: Names the model of the next request (thread-safe: every client calls it).
Route = Callable[[], str]

# The client's default channel options plus a private subchannel pool: without it every
# client of the process shares one HTTP/2 connection (gRPC pools subchannels globally).
_MAX_MESSAGE = 512 * 1024 * 1024
_CHANNEL_ARGS = [
    ("grpc.max_send_message_length", _MAX_MESSAGE),
    ("grpc.max_receive_message_length", _MAX_MESSAGE),
    ("grpc.use_local_subchannel_pool", 1),
]


@attrs.define
class Load:
    """What one closed-loop run measured."""

    model: str
    concurrency: int
    client: str
    duration_s: float
    latencies_ns: list[int]
    errors: int = 0
    first_error: str | None = None
    server_cpu: dict[str, float] | None = None
    client_cpu_s: float | None = None

    @property
    def server_cpu_s(self) -> float | None:
        """The server's CPU seconds in the window, all its threads."""
        return None if self.server_cpu is None else sum(self.server_cpu.values())

    @property
    def requests(self) -> int:
        """Requests answered inside the window."""
        return len(self.latencies_ns)

    def summary(self) -> dict[str, Any]:
        """The run as a JSON-ready row (latencies in ms)."""
        lat = sorted(self.latencies_ns)
        return {
            "model": self.model,
            "concurrency": self.concurrency,
            "client": self.client,
            "duration_s": self.duration_s,
            "requests": self.requests,
            "requests_per_s": self.requests / self.duration_s,
            "p50_ms": _pct(lat, 0.50) / 1e6,
            "p99_ms": _pct(lat, 0.99) / 1e6,
            "mean_ms": statistics.fmean(lat) / 1e6 if lat else 0.0,
            "errors": self.errors,
            "first_error": self.first_error,
            "client_cpu_us_per_request": (
                self.client_cpu_s / self.requests * 1e6
                if self.client_cpu_s is not None and self.requests
                else None
            ),
        }


def combine(loads: Sequence[Load]) -> Load:
    """Several runs of one (model, concurrency, client) as one: windows and counts added."""
    first = loads[0]
    cpu_server = [x.server_cpu for x in loads]
    cpu_client = [x.client_cpu_s for x in loads]
    server: dict[str, float] | None = None
    if all(c is not None for c in cpu_server):
        server = {}
        for c in cpu_server:
            for group, seconds in (c or {}).items():
                server[group] = server.get(group, 0.0) + seconds
    return Load(
        model=first.model,
        concurrency=first.concurrency,
        client=first.client,
        duration_s=sum(x.duration_s for x in loads),
        latencies_ns=[ns for x in loads for ns in x.latencies_ns],
        errors=sum(x.errors for x in loads),
        first_error=next((x.first_error for x in loads if x.first_error), None),
        server_cpu=server,
        client_cpu_s=None if None in cpu_client else sum(c or 0.0 for c in cpu_client),
    )


def _pct(ordered: list[int], q: float) -> float:
    if not ordered:
        return 0.0
    return float(ordered[min(len(ordered) - 1, max(0, int(q * len(ordered) + 0.5) - 1))])


class Window:
    """The measuring window's edges, and the per-client records of answers inside it."""

    def __init__(self, concurrency: int, warmup_s: float, duration_s: float) -> None:
        self.start_ns = time.perf_counter_ns() + int(warmup_s * 1e9)
        self.end_ns = self.start_ns + int(duration_s * 1e9)
        self.latencies: list[list[int]] = [[] for _ in range(concurrency)]
        self.errors = 0
        self.first_error: str | None = None
        self._lock = threading.Lock()

    def record(self, client: int, begin: int, end: int) -> None:
        if self.start_ns <= end <= self.end_ns:
            self.latencies[client].append(end - begin)

    def error(self, exc: BaseException) -> None:
        with self._lock:
            self.errors += 1
            if self.first_error is None:
                self.first_error = f"{type(exc).__name__}: {exc}"


def _inputs(
    signature: Signature, seed: int, rows: int = 1
) -> tuple[list[Any], str, tuple[int, ...]]:
    from tritonclient.grpc import InferInput

    name, one, output, one_out = signature
    shape, out_shape = (rows, *one[1:]), (rows, *one_out[1:])
    data = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    tensor = InferInput(name, list(shape), "FP32")
    tensor.set_data_from_numpy(data)
    return [tensor], output, out_shape


def _check(got: Any, output: str, shape: tuple[int, ...]) -> None:
    if got is None or tuple(got.shape) != shape:
        raise RuntimeError(f"output {output!r} is {got!r}, expected shape {shape}")


def sample_cpu(window: Window, server_cpu: CpuSampler, out: dict[str, Any]) -> None:
    """At the window's edges, read this process's CPU time and the server's (per group)."""
    marks = []
    for edge in (window.start_ns, window.end_ns):
        time.sleep(max(0.0, (edge - time.perf_counter_ns()) / 1e9))
        marks.append((time.process_time(), server_cpu()))
    (c0, s0), (c1, s1) = marks
    out["client"] = c1 - c0
    if s0 is not None and s1 is not None:
        # A thread that exited in the window takes its time with it: clamp at zero.
        out["server"] = {k: max(0.0, v - s0.get(k, 0.0)) for k, v in s1.items()}


def closed_loop(
    window: Window, i: int, infer: Callable[[], Any], check: Callable[[Any], None]
) -> None:
    """Client ``i``: one checked ``infer()``, then calls back to back until the window closes.

    ``infer`` sends one request and decodes its answer; errors are counted, not raised.
    """
    try:
        check(infer())
        while time.perf_counter_ns() < window.end_ns:
            begin = time.perf_counter_ns()
            try:
                infer()
            except Exception as exc:  # counted and reported
                window.error(exc)
                continue
            window.record(i, begin, time.perf_counter_ns())
    except Exception as exc:  # counted and reported
        window.error(exc)


def on_threads(concurrency: int, client: Callable[[int], None]) -> None:
    """Run ``client(i)`` for each of ``concurrency`` clients on its own thread; wait for all."""
    threads = [threading.Thread(target=client, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _load_threads(
    url: str, signature: Signature, window: Window, concurrency: int, route: Route, *, rows: int
) -> None:
    import tritonclient.grpc as grpcclient

    def client(i: int) -> None:
        inputs, output, shape = _inputs(signature, i, rows)
        triton = grpcclient.InferenceServerClient(url, channel_args=_CHANNEL_ARGS)
        try:
            closed_loop(
                window,
                i,
                lambda: triton.infer(route(), inputs).as_numpy(output),
                lambda got: _check(got, output, shape),
            )
        finally:
            triton.close()

    on_threads(concurrency, client)


async def _load_async(
    url: str, signature: Signature, window: Window, concurrency: int, route: Route, *, rows: int
) -> None:
    import tritonclient.grpc.aio as aioclient

    async def client(i: int) -> None:
        inputs, output, shape = _inputs(signature, i, rows)
        triton = aioclient.InferenceServerClient(url, channel_args=_CHANNEL_ARGS)
        try:
            _check((await triton.infer(route(), inputs)).as_numpy(output), output, shape)
            while time.perf_counter_ns() < window.end_ns:
                begin = time.perf_counter_ns()
                try:
                    (await triton.infer(route(), inputs)).as_numpy(output)
                except Exception as exc:  # counted and reported
                    window.error(exc)
                    continue
                window.record(i, begin, time.perf_counter_ns())
        except Exception as exc:  # counted and reported
            window.error(exc)
        finally:
            await triton.close()

    await asyncio.gather(*(client(i) for i in range(concurrency)))


def run_load(
    url: str,
    model: str,
    *,
    concurrency: int,
    kind: str,
    warmup_s: float,
    duration_s: float,
    server_cpu: CpuSampler,
    route: Route | None = None,
    rows: int = 1,
    signature: Signature | None = None,
) -> Load:
    """Drive ``url`` with ``concurrency`` closed-loop ``kind`` clients sending to ``model``
    (or, with ``route``, to the model it names for each request; ``model`` gives the inputs),
    each request ``rows`` rows (random, fixed per client). ``signature`` gives the inputs of a
    model not in :data:`INPUTS`."""
    if kind not in CLIENT_KINDS:
        raise ValueError(f"unknown client kind {kind!r}; expected one of {CLIENT_KINDS}")

    name = route or (lambda: model)
    sig = signature or INPUTS[model]

    def drive(window: Window) -> None:
        if kind == "threads":
            _load_threads(url, sig, window, concurrency, name, rows=rows)
        elif kind == "asyncio":
            asyncio.run(_load_async(url, sig, window, concurrency, name, rows=rows))
        else:
            import uvloop

            uvloop.run(_load_async(url, sig, window, concurrency, name, rows=rows))

    return run_window(
        drive,
        model=model,
        concurrency=concurrency,
        client=kind,
        warmup_s=warmup_s,
        duration_s=duration_s,
        server_cpu=server_cpu,
    )


def run_window(
    drive: Callable[[Window], None],
    *,
    model: str,
    concurrency: int,
    client: str,
    warmup_s: float,
    duration_s: float,
    server_cpu: CpuSampler,
) -> Load:
    """One measuring window: ``drive(window)`` runs the clients while a helper thread samples
    CPU time at the window's edges; what they recorded becomes a :class:`Load`."""
    window = Window(concurrency, warmup_s, duration_s)
    cpu: dict[str, Any] = {}
    sampler = threading.Thread(target=sample_cpu, args=(window, server_cpu, cpu), daemon=True)
    sampler.start()
    drive(window)
    sampler.join()
    return Load(
        model=model,
        concurrency=concurrency,
        client=client,
        duration_s=duration_s,
        latencies_ns=[ns for per_client in window.latencies for ns in per_client],
        errors=window.errors,
        first_error=window.first_error,
        server_cpu=cpu.get("server"),
        client_cpu_s=cpu.get("client"),
    )
