"""The thin client (``reactantserver.client``) vs stock ``tritonclient.grpc``, one real worker.

Both clients run in this process against one worker subprocess (CPU backend), side by side in
one run, alternating rounds so the machine's drift falls on every way::

    python -m bench.client [--requests 2000] [--rounds 3] [--items 256] [--passes 10]
                           [--chunk 8 32] [--out bench/results] [--no-pin]

1. **Per request, concurrency 1.** The tiny ``mlp`` example, one row per request:
   ``infer_sync`` + ``InferOutput`` vs ``tritonclient`` ``infer`` + ``as_numpy``. Inputs are
   built for every request in both (new data each time, as callers do).
2. **Concurrency 8.** ``infer_async`` from 8 tasks on one event loop vs ``tritonclient``
   ``async_infer`` keeping 8 requests in flight (the next one sent from each answer's callback),
   and ``tritonclient.grpc.aio`` from 8 tasks on the same kind of loop.
3. **Bulk items.** ``--items`` images of the ``cnn`` example through an ``InferenceIO`` with
   ``KServeModel(max_batch_size=chunk)`` and ``infer_sync`` (chunks one after another): from a
   shared-memory ``StagingPool`` (inputs and declared outputs in the pool, ``shared_memory="on"``),
   from a plain-memory pool (inline bytes), and as ``tritonclient`` calls of the same chunks;
   ``--passes`` batches per round.

Reported: requests (items) per second, p50 / p99 latency, and client CPU per request (item):
``time.process_time`` (every thread of this process, gRPC's included) and ``time.thread_time``
(the calling thread). By default this process runs on the first CPU and the worker on the
others (``--no-pin`` turns that off). Writes ``client-cpu.json`` and ``client-cpu.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt

from bench._common import figure, loadavg, machine, write_report
from bench._grpc_servers import cpu_split, export_examples, start_worker

__all__ = ["CONCURRENCY", "RESULT_NAME", "BulkIO", "main"]

RESULT_NAME = "client-cpu"
CONCURRENCY = 8
_MLP_IN, _MLP_OUT = ("x", (1, 16)), ("logits", (1, 4))
_CNN_ITEM = (1, 28, 28)
_CNN_CLASSES = 10
_POOL_BYTES = 4 << 20
_POOL_SLOTS = 8
_MAX_MESSAGE = 512 * 1024 * 1024
# tritonclient's default message limits plus a private subchannel pool: without it the two
# clients of this process would share one HTTP/2 connection (gRPC pools subchannels globally).
_TRITON_CHANNEL_ARGS = [
    ("grpc.max_send_message_length", _MAX_MESSAGE),
    ("grpc.max_receive_message_length", _MAX_MESSAGE),
    ("grpc.use_local_subchannel_pool", 1),
]
_WAIT_S = 300.0


@attrs.define
class Sample:
    """One round of one way: how many requests (or items), in what time, at what CPU cost."""

    count: int
    wall_s: float
    cpu_s: float
    thread_cpu_s: float
    latencies_ns: list[int] = attrs.field(factory=list)


def _pct(ordered: Sequence[int], q: float) -> float:
    if not ordered:
        return 0.0
    return float(ordered[min(len(ordered) - 1, max(0, int(q * len(ordered) + 0.5) - 1))])


def summary(samples: Sequence[Sample], unit: str) -> dict[str, Any]:
    """Rounds of one way as a JSON-ready row: rate per round and its median, latency
    percentiles over every round (ms), and CPU microseconds per ``unit`` over all rounds."""
    rates = [s.count / s.wall_s for s in samples]
    lat = sorted(ns for s in samples for ns in s.latencies_ns)
    count = sum(s.count for s in samples)
    row: dict[str, Any] = {
        f"{unit}s_per_s_rounds": rates,
        f"{unit}s_per_s": statistics.median(rates),
        f"{unit}s": count,
        f"cpu_us_per_{unit}": sum(s.cpu_s for s in samples) / count * 1e6,
        f"thread_cpu_us_per_{unit}": sum(s.thread_cpu_s for s in samples) / count * 1e6,
    }
    if lat:
        row["p50_ms"] = _pct(lat, 0.50) / 1e6
        row["p99_ms"] = _pct(lat, 0.99) / 1e6
    return row


def _timed(body: Callable[[list[int]], int]) -> Sample:
    """Run ``body(latencies)`` (returns its count) between CPU and wall-clock readings."""
    latencies: list[int] = []
    cpu0, thread0, wall0 = time.process_time(), time.thread_time(), time.perf_counter()
    count = body(latencies)
    wall = time.perf_counter() - wall0
    return Sample(count, wall, time.process_time() - cpu0, time.thread_time() - thread0, latencies)


def _rounds(ways: dict[str, Callable[[], Sample]], rounds: int) -> dict[str, list[Sample]]:
    """Every way once per round, in turn."""
    out: dict[str, list[Sample]] = {name: [] for name in ways}
    for _ in range(rounds):
        for name, way in ways.items():
            out[name].append(way())
    return out


def _triton_input(name: str, array: npt.NDArray[Any]) -> Any:
    import tritonclient.grpc as grpcclient

    tensor = grpcclient.InferInput(name, list(array.shape), "FP32")
    tensor.set_data_from_numpy(array)
    return tensor


# -- 1. per request, concurrency 1 -------------------------------------------------------------


def measure_single(url: str, *, requests: int, rounds: int) -> dict[str, list[Sample]]:
    """``mlp`` one row at a time: ``reactant_sync`` vs ``triton_sync``."""
    import tritonclient.grpc as grpcclient

    from reactantserver.client import InferInput, InferOutput, KServeModel, infer_sync

    x = np.random.default_rng(1).standard_normal(_MLP_IN[1]).astype(np.float32)
    triton = grpcclient.InferenceServerClient(url, channel_args=_TRITON_CHANNEL_ARGS)
    model = KServeModel(f"grpc://{url}", "mlp")

    def reactant_once() -> npt.NDArray[Any]:
        reply = infer_sync(model, [InferInput(_MLP_IN[0], x)])
        assert reply is not None  # a list of inputs always gets a response
        return InferOutput(reply, _MLP_OUT[0])

    def triton_once() -> npt.NDArray[Any]:
        out: npt.NDArray[Any] = triton.infer("mlp", [_triton_input(_MLP_IN[0], x)]).as_numpy(
            _MLP_OUT[0]
        )
        return out

    def loop(once: Callable[[], Any]) -> Callable[[], Sample]:
        def body(latencies: list[int]) -> int:
            for _ in range(requests):
                begin = time.perf_counter_ns()
                once()
                latencies.append(time.perf_counter_ns() - begin)
            return requests

        return lambda: _timed(body)

    try:
        np.testing.assert_allclose(reactant_once(), triton_once(), rtol=1e-6)
        for once in (reactant_once, triton_once):  # warm both paths
            for _ in range(min(100, requests)):
                once()
        return _rounds(
            {"reactant_sync": loop(reactant_once), "triton_sync": loop(triton_once)}, rounds
        )
    finally:
        model.close()
        triton.close()


# -- 2. concurrency 8 --------------------------------------------------------------------------


async def _tasks(requests: int, once: Callable[[], Awaitable[Any]], latencies: list[int]) -> int:
    """``CONCURRENCY`` tasks sending ``requests`` in all, back to back."""
    left = [requests]

    async def task() -> None:
        while left[0] > 0:
            left[0] -= 1
            begin = time.perf_counter_ns()
            await once()
            latencies.append(time.perf_counter_ns() - begin)

    await asyncio.gather(*(task() for _ in range(CONCURRENCY)))
    return requests


def _triton_callbacks(client: Any, x: npt.NDArray[Any], requests: int, lat: list[int]) -> int:
    """``async_infer`` with ``CONCURRENCY`` in flight: each answer's callback sends the next."""
    lock = threading.Lock()
    finished = threading.Event()
    state = {"sent": 0, "done": 0}
    errors: list[BaseException] = []

    def send() -> None:
        begin = time.perf_counter_ns()
        tensor = _triton_input(_MLP_IN[0], x)
        client.async_infer("mlp", [tensor], lambda result, error: answered(begin, result, error))

    def answered(begin: int, result: Any, error: BaseException | None) -> None:
        if error is None:
            result.as_numpy(_MLP_OUT[0])
        else:
            errors.append(error)
        end = time.perf_counter_ns()
        with lock:
            lat.append(end - begin)
            state["done"] += 1
            again = state["sent"] < requests and not errors
            if again:
                state["sent"] += 1
            if state["done"] == state["sent"] and not again:
                finished.set()
        if again:
            send()

    with lock:
        first = min(CONCURRENCY, requests)
        state["sent"] = first
    for _ in range(first):
        send()
    if not finished.wait(_WAIT_S):
        raise TimeoutError(f"async_infer: {state} after {_WAIT_S:g} s")
    if errors:
        raise errors[0]
    return requests


def measure_concurrent(url: str, *, requests: int, rounds: int) -> dict[str, list[Sample]]:
    """``mlp`` with 8 requests in flight: ``reactant_async``, ``triton_async_infer``,
    ``triton_aio``. The asyncio ways share one event loop for the whole run."""
    import tritonclient.grpc as grpcclient
    import tritonclient.grpc.aio as aioclient

    from reactantserver.client import InferInput, InferOutput, KServeModel, infer_async

    x = np.random.default_rng(2).standard_normal(_MLP_IN[1]).astype(np.float32)
    loop = asyncio.new_event_loop()
    model = KServeModel(f"grpc://{url}", "mlp")
    triton = grpcclient.InferenceServerClient(url, channel_args=_TRITON_CHANNEL_ARGS)

    async def aio_client() -> Any:
        return aioclient.InferenceServerClient(url, channel_args=_TRITON_CHANNEL_ARGS)

    triton_aio = loop.run_until_complete(aio_client())

    async def reactant_once() -> npt.NDArray[Any]:
        reply = await infer_async(model, [InferInput(_MLP_IN[0], x)])
        assert reply is not None
        return InferOutput(reply, _MLP_OUT[0])

    async def aio_once() -> npt.NDArray[Any]:
        result = await triton_aio.infer("mlp", [_triton_input(_MLP_IN[0], x)])
        out: npt.NDArray[Any] = result.as_numpy(_MLP_OUT[0])
        return out

    def on_loop(once: Callable[[], Awaitable[Any]], n: int) -> Callable[[list[int]], int]:
        return lambda lat: loop.run_until_complete(_tasks(n, once, lat))

    def callbacks(n: int) -> Callable[[list[int]], int]:
        return lambda lat: _triton_callbacks(triton, x, n, lat)

    ways: dict[str, Callable[[int], Callable[[list[int]], int]]] = {
        "reactant_async": lambda n: on_loop(reactant_once, n),
        "triton_async_infer": callbacks,
        "triton_aio": lambda n: on_loop(aio_once, n),
    }
    try:
        for make in ways.values():  # warm every path
            make(min(200, requests))([])
        return _rounds(
            {name: functools.partial(_timed, make(requests)) for name, make in ways.items()},
            rounds,
        )
    finally:
        model.close()
        triton.close()
        loop.run_until_complete(triton_aio.close())
        loop.close()


# -- 3. bulk items -----------------------------------------------------------------------------


def _passes(way: Callable[[int], int], passes: int) -> Callable[[list[int]], int]:
    return lambda _: way(passes)


class BulkIO:
    """``cnn`` images in, logits out: an ``InferenceIO`` that stages each chunk in its slot."""

    def __init__(self, images: npt.NDArray[np.float32]) -> None:
        self.images = images
        self.logits = np.zeros((len(images), _CNN_CLASSES), np.float32)

    def __len__(self) -> int:
        return len(self.images)

    def item_input_bytes(self) -> int:
        """One image's bytes."""
        return int(self.images[0].nbytes)

    def encode_chunk(self, items: range, slot: Any) -> list[Any]:
        """Copy the chunk's images into the slot; one input over them."""
        from reactantserver.client import InferInput

        buffer = slot.scratch((len(items), *_CNN_ITEM), np.float32)
        buffer[...] = self.images[items.start : items.stop]
        return [InferInput.from_slot("image", buffer)]

    def decode_chunk(self, items: range, response: Any) -> None:
        """Copy the chunk's logits out."""
        from reactantserver.client import InferOutput

        self.logits[items.start : items.stop] = InferOutput(response, "logits")

    def output_specs(self) -> list[Any]:
        """``logits``: ten FP32 per item (into the pool's slot when it is SHM)."""
        from reactantserver.client import OutputSpec

        return [OutputSpec("logits", np.float32, (_CNN_CLASSES,))]


def measure_bulk(
    url: str, *, items: int, chunk: int, rounds: int, passes: int
) -> tuple[dict[str, list[Sample]], dict[str, Any]]:
    """``items`` cnn images in chunks of ``chunk``, ``passes`` times a round: ``reactant_shm``,
    ``reactant_inline``, ``triton_chunks``; also whether the SHM pool was registered and
    stayed in use."""
    import tritonclient.grpc as grpcclient

    from reactantserver.client import KServeModel, StagingPool, infer_sync

    images = np.random.default_rng(3).standard_normal((items, *_CNN_ITEM)).astype(np.float32)
    shm_pool = StagingPool(_POOL_BYTES, _POOL_SLOTS)
    plain_pool = StagingPool(_POOL_BYTES, _POOL_SLOTS, shm=False)
    target = f"grpc://{url}"
    shm_model = KServeModel(
        target, "cnn", max_batch_size=chunk, shared_memory="on", pool=shm_pool, deadline=60.0
    )
    plain_model = KServeModel(
        target, "cnn", max_batch_size=chunk, shared_memory="off", pool=plain_pool, deadline=60.0
    )
    triton = grpcclient.InferenceServerClient(url, channel_args=_TRITON_CHANNEL_ARGS)
    results: dict[str, npt.NDArray[Any]] = {}

    def reactant(name: str, model: Any) -> Callable[[int], int]:
        def body(n: int) -> int:
            for _ in range(n):
                io = BulkIO(images)
                infer_sync(model, io)
                results[name] = io.logits
            return n * items

        return body

    def triton_chunks(n: int) -> int:
        for _ in range(n):
            logits = np.zeros((items, _CNN_CLASSES), np.float32)
            for start in range(0, items, chunk):
                stop = min(start + chunk, items)
                tensor = _triton_input("image", images[start:stop])
                logits[start:stop] = triton.infer("cnn", [tensor]).as_numpy("logits")
            results["triton_chunks"] = logits
        return n * items

    ways = {
        "reactant_shm": reactant("reactant_shm", shm_model),
        "reactant_inline": reactant("reactant_inline", plain_model),
        "triton_chunks": triton_chunks,
    }
    try:
        for way in ways.values():  # warm (the SHM way probes and registers its pool here)
            way(1)
        for name in ("reactant_shm", "reactant_inline"):
            np.testing.assert_allclose(
                results[name], results["triton_chunks"], rtol=1e-5, atol=1e-5
            )
        runs = _rounds(
            {name: functools.partial(_timed, _passes(way, passes)) for name, way in ways.items()},
            rounds,
        )
        status = triton.get_system_shared_memory_status(as_json=True)
        registered = [r.get("name") for r in status.get("regions", {}).values()]
        shm = {
            "pool_registered": shm_pool.name in registered,
            "pool_latched_inline": shm_model.endpoint.latched(shm_pool),
        }
        return runs, shm
    finally:
        shm_model.close()
        plain_model.close()
        triton.close()
        shm_pool.close()
        plain_pool.close()


# -- report ------------------------------------------------------------------------------------


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _ratio(a: float, b: float) -> float:
    return a / b if b else 0.0


def markdown(report: dict[str, Any]) -> list[str]:
    """The report as Markdown lines."""
    m, args = report["machine"], report["args"]
    single, conc = report["single"], report["concurrent"]
    pinned, load = report["pinned"], m["loadavg_1m"]
    where = (
        f"client pinned to CPU {pinned['client']}, worker to {pinned['worker']}"
        if pinned
        else "unpinned"
    )
    lines = [
        "# Thin client vs tritonclient (CPU)",
        "",
        f"{m['cpus']} CPUs ({where}), Python {m['python']}, grpcio {m['grpcio']}, "
        f"tritonclient {m['tritonclient']}; one worker subprocess (CPU backend). "
        f"{args['requests']} requests x {args['rounds']} rounds per way; rates are medians of "
        "rounds, latencies over all rounds, CPU is this process's (all threads / calling "
        "thread) per request or item.",
        "",
        f"1-minute load average before / after the run: {_fmt(load['before'])} / "
        f"{_fmt(load['after'])} (other work on the machine skews every figure).",
        "",
        "## 1. Tiny MLP, one row, concurrency 1",
        "",
        "| Client | req/s | p50 ms | p99 ms | CPU µs/req | thread CPU µs/req |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in single["ways"].items():
        lines.append(
            f"| {name} | {row['requests_per_s']:.0f} | {row['p50_ms']:.3f} | "
            f"{row['p99_ms']:.3f} | {row['cpu_us_per_request']:.0f} | "
            f"{row['thread_cpu_us_per_request']:.0f} |"
        )
    lines += [
        "",
        f"reactant_sync / triton_sync req/s: **{single['reactant_over_triton']:.2f}**",
        "",
        f"## 2. Tiny MLP, one row, {CONCURRENCY} in flight",
        "",
        "| Client | req/s | p50 ms | p99 ms | CPU µs/req |",
        "|---|---|---|---|---|",
    ]
    for name, row in conc["ways"].items():
        lines.append(
            f"| {name} | {row['requests_per_s']:.0f} | {row['p50_ms']:.3f} | "
            f"{row['p99_ms']:.3f} | {row['cpu_us_per_request']:.0f} |"
        )
    lines += [
        "",
        f"reactant_async / triton_async_infer req/s: "
        f"**{conc['reactant_over_triton_async_infer']:.2f}**; "
        f"reactant_async / triton_aio: **{conc['reactant_over_triton_aio']:.2f}**",
        "",
        f"## 3. Bulk: {args['items']} CNN images (3136 B each) through infer_sync, "
        f"{args['passes']} passes x {args['rounds']} rounds per way",
        "",
        "| Chunk | Way | items/s | CPU µs/item | thread CPU µs/item |",
        "|---|---|---|---|---|",
    ]
    for point in report["bulk"]:
        for name, row in point["ways"].items():
            lines.append(
                f"| {point['chunk']} | {name} | {row['items_per_s']:.0f} | "
                f"{row['cpu_us_per_item']:.0f} | {row['thread_cpu_us_per_item']:.0f} |"
            )
    lines += ["", "| Chunk | shm / inline items/s | shm / triton | inline / triton | SHM in use |"]
    lines.append("|---|---|---|---|---|")
    for point in report["bulk"]:
        r, shm = point["ratios"], point["shm"]
        used = shm["pool_registered"] and not shm["pool_latched_inline"]
        lines.append(
            f"| {point['chunk']} | {r['shm_over_inline']:.2f} | {r['shm_over_triton']:.2f} | "
            f"{r['inline_over_triton']:.2f} | {'yes' if used else 'NO'} |"
        )
    lines.append("")
    return lines


def figures(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The headlines (no targets): the thin client's req/s over tritonclient's, one by one and
    at concurrency 8, and its SHM bulk items/s over tritonclient's per chunk size."""
    single, conc = report["single"], report["concurrent"]
    out = [
        figure("thin client / tritonclient req/s (mlp, c=1)", single["reactant_over_triton"], "x"),
        figure(
            f"thin client / tritonclient aio req/s (mlp, c={conc['concurrency']})",
            conc["reactant_over_triton_aio"],
            "x",
        ),
    ]
    for point in report["bulk"]:
        out.append(
            figure(
                f"thin client SHM / tritonclient items/s (cnn, chunk {point['chunk']})",
                point["ratios"]["shm_over_triton"],
                "x",
            )
        )
    return out


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="requests per way per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--items", type=int, default=256, help="CNN images per bulk pass")
    parser.add_argument("--passes", type=int, default=10, help="bulk passes per way per round")
    parser.add_argument(
        "--chunk", type=int, nargs="+", default=[8, 32], help="items per bulk request"
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--no-pin", action="store_true", help="leave CPU affinity alone")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 20 requests, one round, 16 items"
    )
    parser.add_argument(
        "--suite",
        action="store_true",
        help="the size `nox -s bench` runs: 500 requests, 2 rounds, 128 items x 4 passes",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write JSON + Markdown under ``--out``."""
    args = _parser().parse_args(argv)
    if args.quick:
        args.requests, args.rounds, args.items, args.passes, args.chunk = 20, 1, 16, 1, [8]
    elif args.suite:
        args.requests, args.rounds, args.items, args.passes = 500, 2, 128, 4
    load_before = loadavg()
    split = None if args.no_pin else cpu_split()
    client_cpus, worker_cpus = split or (None, None)
    with tempfile.TemporaryDirectory(prefix="rs-bench-client-") as scratch:
        tmp = Path(scratch)
        models = tmp / "models"
        export_examples(models, ["mlp", "cnn"])
        worker = start_worker(tmp, models, {}, worker_cpus)
        try:
            if client_cpus is not None:
                # Before any client thread exists (gRPC's included): they all inherit it.
                os.sched_setaffinity(0, client_cpus)
            worker.wait_ready(["mlp", "cnn"], _WAIT_S)
            single = measure_single(worker.url, requests=args.requests, rounds=args.rounds)
            conc = measure_concurrent(worker.url, requests=args.requests, rounds=args.rounds)
            bulk_args = {"items": args.items, "rounds": args.rounds, "passes": args.passes}
            bulk = [
                (chunk, *measure_bulk(worker.url, **bulk_args, chunk=chunk)) for chunk in args.chunk
            ]
        finally:
            from reactantserver.client import shutdown

            shutdown()  # while the worker still answers: unregister and unlink the pools
            exit_status = worker.stop()

    single_rows = {name: summary(s, "request") for name, s in single.items()}
    conc_rows = {name: summary(s, "request") for name, s in conc.items()}
    bulk_points = []
    for chunk, runs, shm in bulk:
        rows = {name: summary(s, "item") for name, s in runs.items()}
        rate = {name: row["items_per_s"] for name, row in rows.items()}
        bulk_points.append(
            {
                "chunk": chunk,
                "ways": rows,
                "shm": shm,
                "ratios": {
                    "shm_over_inline": _ratio(rate["reactant_shm"], rate["reactant_inline"]),
                    "shm_over_triton": _ratio(rate["reactant_shm"], rate["triton_chunks"]),
                    "inline_over_triton": _ratio(rate["reactant_inline"], rate["triton_chunks"]),
                },
            }
        )
    rps = {name: row["requests_per_s"] for name, row in {**single_rows, **conc_rows}.items()}
    report: dict[str, Any] = {
        "machine": {
            **machine("grpcio", "protobuf", "tritonclient", "numpy", "reactantserver-client"),
            # Other work on the machine skews every figure: the 1-minute load around the run.
            "loadavg_1m": {"before": load_before, "after": loadavg()},
        },
        "command": " ".join([".venv/bin/python -m bench.client", *(argv or sys.argv[1:])]),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "pinned": (
            {"client": sorted(client_cpus), "worker": sorted(worker_cpus)}
            if client_cpus is not None and worker_cpus is not None
            else None
        ),
        "worker_exit_status": exit_status,
        "single": {
            "model": "mlp",
            "concurrency": 1,
            "ways": single_rows,
            "reactant_over_triton": _ratio(rps["reactant_sync"], rps["triton_sync"]),
        },
        "concurrent": {
            "model": "mlp",
            "concurrency": CONCURRENCY,
            "ways": conc_rows,
            "reactant_over_triton_async_infer": _ratio(
                rps["reactant_async"], rps["triton_async_infer"]
            ),
            "reactant_over_triton_aio": _ratio(rps["reactant_async"], rps["triton_aio"]),
        },
        "bulk": bulk_points,
    }
    report["figures"] = figures(report)
    write_report(args.out, RESULT_NAME, report, markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
