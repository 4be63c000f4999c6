"""Coalescing benchmark: rows/s and per-row latency vs batch size, served over gRPC vs raw.

Run from the repository root with the dev environment::

    .venv/bin/python -m bench.coalescing            # ~2 min on the 2-core machine
    .venv/bin/python -m bench.coalescing --suite    # the size `nox -s bench` runs (~90 s)
    .venv/bin/python -m bench.coalescing --quick    # smoke run (tests/test_bench_coalescing.py)

The ``cnn`` example (compiled batch sizes 1, 4, 8, 32) at each batch size b (default 1, 2, 4,
8, 16, 32), three ways:

- **raw**: the compiled program in this process on the worker's backend (``JaxBackend``, CPU),
  weights on the device once, in a loop: ``to_device`` + ``execute`` + ``to_host`` + ``free``.
  A b without its own program runs the size the scheduler would pad it to (``fit_batch``: 2 on
  the batch-4 program, 16 on the batch-32 one); raw rows/s = b / time per batch.
- **batched**: one ``tritonclient.grpc`` client sending requests of b rows back to back against
  a real worker subprocess; per-row latency = request latency / b.
- **coalesced**: b closed-loop clients sending one-row requests, which the worker's scheduler
  coalesces; rows per execution and executions per compiled size from ``ModelStatistics``.

Placement (2 cores): the worker runs on every CPU but the first, the clients (this process)
on the first. The raw loops run in this process on the worker's CPUs (the XLA thread pool
starts there) while the worker sits idle and no client runs: one slice just before and one just
after each batch size's served runs, whose mean is that size's reference (the shared machine's
speed drifts; the two slices' ratio is reported). At the headline size the bare grpc.aio server
(``bench/_bare_server.py``) takes the same one-row load: the Python gRPC floor, which bounds
what the served one-row ratio can reach here; and so does the same canned answer on our own
front door (``--native``, the *front floor*): what the worker's front costs with no model, so
the worker's CPU per row above it is its own request path.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench._coalescing_report import HEADLINE_BATCH, figures, markdown, points
from bench._common import loadavg, machine, write_report
from bench._grpc_load import run_load
from bench._grpc_servers import (
    Server,
    cpu_split,
    executions_by_batch,
    export_examples,
    model_stats,
    start_bare,
    start_worker,
)
from bench.scheduler import MODEL, loaded_cnn, raw_program

if TYPE_CHECKING:
    from reactantserver.worker.runtime import Backend, LoadedModel

ROOT = Path(__file__).resolve().parent.parent

RESULT_NAME = "coalescing-cpu"
BATCHES = (1, 2, 4, 8, 16, 32)
#: (served window s, warm-up s before it, raw loop s per program and pass) per size of run.
PRESETS: dict[str, tuple[float, float, float]] = {
    "default": (4.0, 0.5, 2.0),
    "suite": (2.5, 0.4, 1.0),
    "quick": (0.8, 0.2, 0.2),
}


@contextmanager
def _pinned(cpus: frozenset[int] | None) -> Iterator[None]:
    """This thread (and the threads it starts meanwhile) on ``cpus``; restored on exit."""
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def raw_slice(
    backend: Backend, loaded: LoadedModel, weights: list[Any], size: int, seconds: float
) -> dict[str, Any]:
    """The compiled program of batch ``size`` in a loop for ``seconds`` (see ``raw_program``)."""
    run = raw_program(backend, loaded, weights, size, seconds)
    print(f"raw   batch {size:2d}: {run['ms_per_batch']:.3f} ms / batch", flush=True)
    return run


def _delta(before: dict[Any, int] | None, after: dict[Any, int] | None) -> dict[Any, int]:
    if before is None or after is None:
        return {}
    return {k: v - before.get(k, 0) for k, v in sorted(after.items()) if v - before.get(k, 0)}


def _rows_per_exec(run: dict[str, Any]) -> str:
    value = run["rows_per_execution"]
    return "-" if value is None else f"{value:.1f}"


def served(
    server: Server,
    *,
    rows: int,
    concurrency: int,
    warmup_s: float,
    duration_s: float,
    mode: str,
) -> dict[str, Any]:
    """One closed-loop window of ``concurrency`` clients sending ``rows``-row requests.

    Rows per execution and executions per compiled size are the worker's ``ModelStatistics``
    around the whole run (warm-up included); empty for the bare server.
    """
    stats0 = model_stats(server.url, MODEL)
    hist0 = executions_by_batch(server.url, MODEL)
    load = run_load(
        server.url,
        MODEL,
        concurrency=concurrency,
        kind="threads",
        warmup_s=warmup_s,
        duration_s=duration_s,
        server_cpu=server.cpu_seconds,
        rows=rows,
    )
    stats = _delta(stats0, model_stats(server.url, MODEL))
    executions = _delta(hist0, executions_by_batch(server.url, MODEL))
    run = load.summary()
    total = load.requests * rows
    cpu = load.server_cpu_s
    run.update(
        mode=mode,
        target=server.name,
        rows_per_request=rows,
        rows_per_s=total / load.duration_s,
        row_p50_us=run["p50_ms"] * 1e3 / rows,
        row_mean_us=run["mean_ms"] * 1e3 / rows,
        server_cpu_us_per_row=cpu / total * 1e6 if cpu is not None and total else None,
        rows_per_execution=(
            stats["inference_count"] / stats["execution_count"]
            if stats.get("execution_count")
            else None
        ),
        executions_by_batch={str(b): n for b, n in executions.items()},
    )
    print(
        f"{server.name:11s} {mode:9s} rows={rows:<2d} c={concurrency:<2d} "
        f"{run['rows_per_s']:8,.0f} rows/s  p50 {run['p50_ms']:.2f} ms  "
        f"rows/exec {_rows_per_exec(run)}  errors {load.errors}",
        flush=True,
    )
    return run


def _serve_all(
    args: argparse.Namespace,
    worker: Server,
    floors: dict[str, Server],
    raw: Callable[[int], dict[str, Any]],
) -> tuple[dict[str, list[dict[str, Any]]], list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """At each batch size: raw slice, batched run, coalesced run, raw slice; then each floor
    server (report key -> server) at the headline load.

    ``raw(b)`` times the program that runs b rows; the slices just before and after a batch
    size's served runs are their reference, so the machine's drift falls on both.
    """
    window = {"warmup_s": args.warmup, "duration_s": args.duration}
    slices: dict[str, list[dict[str, Any]]] = {}
    runs = []
    for b in args.batches:
        slices[str(b)] = [raw(b)]
        runs.append(served(worker, rows=b, concurrency=1, mode="batched", **window))
        runs.append(served(worker, rows=1, concurrency=b, mode="coalesced", **window))
        slices[str(b)].append(raw(b))
    measured = {
        key: served(server, rows=1, concurrency=HEADLINE_BATCH, mode="coalesced", **window)
        for key, server in floors.items()
    }
    return slices, runs, measured


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument(
        "--models",
        type=Path,
        default=None,
        help=f"model repository holding the {MODEL!r} bundle (default: export the example)",
    )
    parser.add_argument(
        "--batches", type=int, nargs="+", default=list(BATCHES), help="batch sizes b to measure"
    )
    parser.add_argument("--duration", type=float, help="seconds per served window")
    parser.add_argument("--warmup", type=float, help="seconds before each served window")
    parser.add_argument(
        "--raw-seconds", type=float, help="seconds per compiled program in each raw pass"
    )
    parser.add_argument(
        "--no-floor",
        action="store_true",
        help="skip the canned-answer servers (grpc.aio and our front: the floors)",
    )
    parser.add_argument(
        "--no-pin",
        action="store_true",
        help="let every process use every CPU (default: clients on the first CPU, the worker "
        "and the raw loops on the others)",
    )
    parser.add_argument(
        "--startup-timeout", type=float, default=300.0, help="seconds to wait for readiness"
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="smoke run: 0.8 s windows")
    size.add_argument(
        "--suite", action="store_true", help="the size `nox -s bench` runs (<= 120 s)"
    )
    return parser


def _settings(args: argparse.Namespace) -> argparse.Namespace:
    """Fill the timings the command line left out from the preset of its size."""
    preset = PRESETS["quick" if args.quick else "suite" if args.suite else "default"]
    for name, value in zip(("duration", "warmup", "raw_seconds"), preset, strict=True):
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.batches = sorted(set(args.batches))
    if max(args.batches) > max(BATCHES) or min(args.batches) < 1:
        raise SystemExit(f"--batches must lie in 1..{max(BATCHES)} (the largest compiled size)")
    return args


def _measure(
    args: argparse.Namespace, tmp: Path, split: tuple[frozenset[int], frozenset[int]] | None
) -> dict[str, Any]:
    """The served runs against the worker, each batch size between two raw slices."""
    from reactantserver.worker.scheduler.planning import fit_batch

    client_cpus, server_cpus = split or (None, None)
    models = args.models
    if models is None:
        models = tmp / "models"
        export_examples(models, [MODEL])
    # Pinned before jax starts: XLA's thread pool inherits the worker's CPUs.
    with _pinned(server_cpus), loaded_cnn(models) as (backend, _, loaded, weights):
        sizes = sorted(b for _, b in loaded.modules)
        padded = {b: fit_batch(sizes, b) for b in args.batches}

        def raw(b: int) -> dict[str, Any]:
            with _pinned(server_cpus):
                return raw_slice(backend, loaded, weights, padded[b], args.raw_seconds)

        servers: dict[str, Server] = {}
        started = time.perf_counter()
        try:
            servers["worker"] = start_worker(tmp, models, {}, server_cpus)
            if not args.no_floor:
                servers["bare"] = start_bare(tmp, server_cpus)
                servers["front"] = start_bare(tmp, server_cpus, native=True)
            with _pinned(client_cpus):
                # Before any client thread exists (gRPC's included): they all inherit it.
                for name, server in servers.items():
                    server.wait_ready([MODEL] if name == "worker" else [], args.startup_timeout)
                ready_s = time.perf_counter() - started
                print(f"servers ready in {ready_s:.1f} s", flush=True)
                floors = {
                    key: servers[name]
                    for key, name in (("floor", "bare"), ("front_floor", "front"))
                    if name in servers
                }
                slices, runs, measured = _serve_all(args, servers["worker"], floors, raw)
        finally:
            exits = {name: server.stop() for name, server in servers.items()}
    return {
        "compiled_sizes": sizes,
        "padded_to": {str(b): p for b, p in padded.items()},
        "raw_slices": slices,
        "runs": runs,
        "floor": measured.get("floor"),
        "front_floor": measured.get("front_floor"),
        "ready_after_s": ready_s,
        "exit_status": exits,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write ``<out>/coalescing-cpu.{json,md}``."""
    args = _settings(_parser().parse_args(argv))
    split = None if args.no_pin else cpu_split()
    description = machine("jax", "grpcio", "tritonclient")
    with tempfile.TemporaryDirectory(prefix="rs-bench-coalescing-") as name:
        measured = _measure(args, Path(name), split)
    report: dict[str, Any] = {
        "machine": description,
        "backend": "cpu",
        "model": MODEL,
        "command": " ".join([".venv/bin/python -m bench.coalescing", *(argv or sys.argv[1:])]),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "pinned": (
            None if split is None else {"client": sorted(split[0]), "servers": sorted(split[1])}
        ),
        **measured,
    }
    report["machine"]["loadavg_1m_after"] = loadavg()
    report["points"] = points(report)
    report["figures"] = figures(report)
    floors = [measured[key] for key in ("floor", "front_floor") if measured[key]]
    everything = [*measured["runs"], *floors]
    report["errors"] = [
        f"{r['target']} {r['mode']} rows={r['rows_per_request']} c={r['concurrency']}: "
        f"{r['first_error']}"
        for r in everything
        if r["first_error"]
    ]
    write_report(args.out, RESULT_NAME, report, markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
