"""GPU kit: served vs raw rows/s of the ResNet-50-size CNN at batch 1..64, one-row clients.

Run by ``bench/gpu/run.sh``. One worker serves the kit network (compiled at 1, 2, 4, ..., 64;
its executables come from the kit's shared cache). For each size ``b``, side by side:

- **raw**: this process runs the compiled program of size ``b`` in a loop (input copy,
  execution, logits back), the device's ceiling for that size;
- **served**: ``b`` closed-loop ``tritonclient`` clients each send one image per request
  through the worker's gRPC port, and the scheduler coalesces them.

Reported per size: rows/s of both, their ratio, p50/p99, and rows per execution from the
worker's statistics. Target: served >= 85% of raw at 32 (the Python client and gRPC
transport of 600 KB images are part of the served path).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench._common import figure
from bench._grpc_servers import Server, executions_by_batch, start_worker
from bench.gpu._load import run_rows
from bench.gpu._modes import worker_env
from bench.gpu._step import MODEL, Step, ensure_bundle

__all__ = ["main"]

#: 04's target: served >= 85% of the raw rows/s, checked at this size.
TARGET_RATIO = 0.85
HEADLINE_BATCH = 32
#: Seconds kept back from the deadline for stopping the worker and writing the report.
_RESERVE_S = 8.0


def _raw(step: Step, bundle: Path) -> Any:
    from reactantserver.worker.runtime import CompileSpec, ExecutableCache, load_bundle
    from reactantserver.worker.runtime.jax_backend import JaxBackend

    backend = JaxBackend(step.mode.platform)
    cache = ExecutableCache(step.work / "cache" / "executables", backend)
    model = load_bundle(bundle, backend, cache, opts=CompileSpec(autotune=False))
    weights = backend.to_device_many(model.read_weights())

    def window(batch: int, warmup_s: float, duration_s: float) -> dict[str, Any]:
        exe = model.module(None, batch).executable
        rows = np.random.default_rng(batch).standard_normal(
            (batch, *step.mode.arch.row_shape()[1:])
        )
        host = rows.astype(np.float32)
        runs, start, end = 0, time.perf_counter() + warmup_s, 0.0
        while True:
            now = time.perf_counter()
            if now >= start + duration_s:
                end = now
                break
            x = backend.to_device(host)
            (out,) = backend.execute(exe, [x, *weights])
            backend.to_host(out)
            backend.free(x)
            backend.free(out)
            if now >= start:
                runs += 1
        seconds = end - start
        return {"runs": runs, "seconds": seconds, "rows_per_s": runs * batch / seconds}

    return window, {"hits": cache.counters.hits, "compiles": cache.counters.compiles}


def _served(step: Step, server: Server, batch: int, warmup_s: float, duration_s: float) -> Any:
    before = executions_by_batch(server.url, MODEL) or {}
    load = run_rows(
        server.url,
        lambda: MODEL,
        arch=step.mode.arch,
        concurrency=batch,
        warmup_s=warmup_s,
        duration_s=duration_s,
        server_cpu=server.cpu_seconds,
    )
    after = executions_by_batch(server.url, MODEL) or {}
    executions = {b: n - before.get(b, 0) for b, n in after.items() if n - before.get(b, 0)}
    rows = sum(b * n for b, n in executions.items())
    summary = load.summary()
    summary["rows_per_s"] = summary["requests_per_s"]
    summary["executions_by_batch"] = executions
    summary["rows_per_execution"] = rows / sum(executions.values()) if executions else None
    return summary


def main(argv: list[str] | None = None) -> int:
    """Raw and served windows per batch size; write ``<out>/served.json`` point by point."""
    step = Step.from_argv("served", argv, __doc__ or "")
    report, mode = step.report, step.mode
    bundle = ensure_bundle(step, "served", mode.served_batches)
    env = worker_env(mode, step.work / "cache", mem_fraction=mode.served_mem_fraction)
    tmp = step.work / "served-worker"
    tmp.mkdir(parents=True, exist_ok=True)
    # The raw side first: it fills any gap in the shared executable cache, so the worker
    # started next only reads it (two processes compiling the same sizes would waste minutes).
    raw, compiled = _raw(step, bundle)
    server = start_worker(tmp, bundle.parent, env, None)
    points: list[dict[str, Any]] = []
    try:
        ready_s = server.wait_ready([MODEL], max(5.0, step.left() - _RESERVE_S))
        report.put("worker", {"ready_after_s": ready_s, "raw_side_cache": compiled})
        for i, batch in enumerate(mode.served_batches):
            left = step.left() - _RESERVE_S
            share = left / (len(mode.served_batches) - i) / 2 - mode.warmup_s
            duration = min(mode.window_s, share)
            if duration < 0.3:
                report.note(f"stopped before batch {batch}: the step's time budget is spent")
                break
            if duration < mode.window_s:
                report.note(f"batch {batch}: windows shortened to {duration:.1f} s")
            point = {
                "batch": batch,
                "raw": raw(batch, mode.warmup_s, duration),
                "served": _served(step, server, batch, mode.warmup_s, duration),
            }
            point["ratio"] = point["served"]["rows_per_s"] / point["raw"]["rows_per_s"]
            points.append(point)
            report.put("points", points)
            print(
                f"b={batch:3d} raw {point['raw']['rows_per_s']:9,.0f} rows/s  served "
                f"{point['served']['rows_per_s']:9,.0f} rows/s  ratio {point['ratio']:.2f}",
                flush=True,
            )
    finally:
        report.put("worker_exit", server.stop())
        report.put("worker_log_tail", server.log_tail(30))
    report.add_figures(_figures(points))
    if len(points) == len(mode.served_batches):
        report.finish()
    return 0


def _figures(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    figures = []
    for point in points:
        b = point["batch"]
        target = f">= {TARGET_RATIO:g}" if b == HEADLINE_BATCH else None
        figures.append(
            figure(
                f"served / raw rows/s, {b} one-row clients vs the batch-{b} program",
                point["ratio"],
                "x",
                target=target,
                met=point["ratio"] >= TARGET_RATIO if target else None,
            )
        )
    for point in points:
        b = point["batch"]
        figures += [
            figure(f"raw rows/s, batch {b}", point["raw"]["rows_per_s"], "rows/s"),
            figure(f"served rows/s, {b} clients", point["served"]["rows_per_s"], "rows/s"),
            figure(f"served p99, {b} clients", point["served"]["p99_ms"], "ms"),
        ]
    return figures


if __name__ == "__main__":
    sys.exit(main())
