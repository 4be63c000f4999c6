"""Overload benchmark: ten times more concurrent clients than the worker admits.

Run from the repository root with the dev environment::

    .venv/bin/python -m bench.overload --out bench/results

Starts the worker (the exported example, ``cnn`` by default) with an in-flight cap of
``--cap`` requests (``endpoints.max_concurrent_requests``), pinned apart from this process, and
drives it with stock ``tritonclient.grpc.aio`` clients in closed loops: first ``cap`` clients
(the load it admits), then ``10 x cap`` clients that resend at once when refused (the worst
case: no back-off), the two windows alternating. Reports the admitted requests' rate and
latency in both, how fast the excess is refused (``RESOURCE_EXHAUSTED``) and the worker's RSS
before and after. Targets: admitted in-server latency under overload <= 2x its value at the
cap, refusals answered faster than the admitted requests (p50, both seen from the same
client), RSS growth <= 64 MiB. The admitted requests' latency
target is measured inside the worker (``ModelStatistics``): on two cores the one client
process handling thousands of refusals per second delays its own admitted answers, which the
client-side p50/p99 (reported too) include.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from bench._common import figure, fmt, machine, machine_line, write_report
from bench._grpc_load import INPUTS
from bench._grpc_servers import Server, cpu_split, export_examples, start_worker

ROOT = Path(__file__).resolve().parent.parent
RESULT_NAME = "overload-cpu"
P99_TARGET = 2.0
RSS_TARGET_MIB = 64.0


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _window(
    url: str, model: str, clients: int, warmup: float, duration: float
) -> dict[str, Any]:
    import tritonclient.grpc.aio as aioclient
    from tritonclient.grpc import InferInput
    from tritonclient.utils import InferenceServerException

    name, shape, _, _ = INPUTS[model]
    data = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    tensor = InferInput(name, list(shape), "FP32")
    tensor.set_data_from_numpy(data)
    start = time.perf_counter() + warmup
    end = start + duration
    ok: list[float] = []
    refused: list[float] = []
    other: Counter[str] = Counter()
    examples: dict[str, str] = {}  # status -> the first such error's message
    triton = aioclient.InferenceServerClient(url)

    async def client() -> None:
        while (now := time.perf_counter()) < end:
            try:
                await triton.infer(model, [tensor])
            except InferenceServerException as error:
                status = str(error.status() or "").removeprefix("StatusCode.")
                done = time.perf_counter()
                if done >= start:
                    if status == "RESOURCE_EXHAUSTED":
                        refused.append(done - now)
                    else:
                        other[status] += 1
                        examples.setdefault(status, str(error.message()))
                continue
            done = time.perf_counter()
            if done >= start:
                ok.append(done - now)

    try:
        await asyncio.gather(*(client() for _ in range(clients)))
    finally:
        await triton.close()
    return {
        "ok": ok,
        "refused": refused,
        "other": dict(other),
        "other_examples": examples,
        "duration_s": duration,
    }


def _row(kind: str, clients: int, windows: list[dict[str, Any]], cpu_s: float) -> dict[str, Any]:
    ok = [x for w in windows for x in w["ok"]]
    refused = [x for w in windows for x in w["refused"]]
    other: Counter[str] = Counter()
    for w in windows:
        other.update(w["other"])
    seconds = sum(w["duration_s"] for w in windows)
    return {
        "kind": kind,
        "clients": clients,
        "admitted_per_s": len(ok) / seconds,
        "refused_per_s": len(refused) / seconds,
        "admitted_p50_ms": 1e3 * (_pct(ok, 0.50) or 0.0),
        "admitted_p99_ms": 1e3 * (_pct(ok, 0.99) or 0.0),
        "refusal_p50_ms": None if not refused else 1e3 * (_pct(refused, 0.50) or 0.0),
        "refusal_p99_ms": None if not refused else 1e3 * (_pct(refused, 0.99) or 0.0),
        "other_statuses": dict(other),
        "other_examples": {k: v for w in windows for k, v in w.get("other_examples", {}).items()},
        "server_cpu_us_per_admitted": 1e6 * cpu_s / len(ok) if ok else None,
    }


def _cpu(server: Server) -> float:
    return sum((server.cpu_seconds() or {}).values())


def _served(url: str, model: str) -> tuple[int, int]:
    """(successful requests, their summed in-server latency in ns) from ModelStatistics."""
    import tritonclient.grpc as grpcclient

    with grpcclient.InferenceServerClient(url) as client:
        stats = client.get_inference_statistics(model, client_timeout=10.0).model_stats[0]
    success = stats.inference_stats.success
    return int(success.count), int(success.ns)


def run(args: argparse.Namespace, worker: Server) -> dict[str, Any]:
    """Alternate the windows at the cap and at ten times it; sample RSS around them."""
    process = psutil.Process(worker.proc.pid)
    asyncio.run(_window(worker.url, args.model, args.cap, 0.2, args.warmup))  # warm
    rss_before = process.memory_info().rss
    windows: dict[str, list[dict[str, Any]]] = {"cap": [], "overload": []}
    cpu: dict[str, float] = {"cap": 0.0, "overload": 0.0}
    served: dict[str, list[int]] = {"cap": [0, 0], "overload": [0, 0]}
    rss_peak = rss_before
    for _ in range(args.rounds):
        for kind, clients in (("cap", args.cap), ("overload", 10 * args.cap)):
            before = _cpu(worker)
            count, ns = _served(worker.url, args.model)
            window = asyncio.run(
                _window(worker.url, args.model, clients, args.warmup, args.duration)
            )
            cpu[kind] += _cpu(worker) - before
            count_after, ns_after = _served(worker.url, args.model)
            served[kind][0] += count_after - count
            served[kind][1] += ns_after - ns
            windows[kind].append(window)
            rss_peak = max(rss_peak, process.memory_info().rss)
    rss_after = process.memory_info().rss
    rows = [
        _row("cap", args.cap, windows["cap"], cpu["cap"]),
        _row("overload", 10 * args.cap, windows["overload"], cpu["overload"]),
    ]
    for row in rows:
        count, ns = served[row["kind"]]
        # In-server latency of the admitted (warm-up included): the client's own loop, busy
        # with the refusals it handles, is not in it.
        row["admitted_server_mean_ms"] = ns / count / 1e6 if count else None
    return {
        "rows": rows,
        "rss_mib": {
            "before": rss_before / 2**20,
            "peak": rss_peak / 2**20,
            "after": rss_after / 2**20,
        },
    }


def figures(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Admitted in-server latency overload / cap, refusal p99 vs admitted p50, RSS growth."""
    cap, over = report["rows"]
    inside = (
        over["admitted_server_mean_ms"] / cap["admitted_server_mean_ms"]
        if over["admitted_server_mean_ms"] and cap["admitted_server_mean_ms"]
        else None
    )
    p99_ratio = over["admitted_p99_ms"] / cap["admitted_p99_ms"] if cap["admitted_p99_ms"] else None
    growth = report["rss_mib"]["peak"] - report["rss_mib"]["before"]
    refusal = over["refusal_p50_ms"]
    rate = over["admitted_per_s"] / cap["admitted_per_s"] if cap["admitted_per_s"] else None
    return [
        figure(
            "admitted in-server latency at 10x the cap / at the cap (mean)",
            inside,
            "x",
            target=f"<= {P99_TARGET:g}",
            met=inside is not None and inside <= P99_TARGET,
        ),
        figure("admitted client p99 at 10x the cap / at the cap", p99_ratio, "x"),
        figure(
            "refusal p50 at 10x the cap (client-side)",
            refusal,
            "ms",
            target=f"< admitted p50 ({over['admitted_p50_ms']:.2f} ms)",
            met=refusal is not None and refusal < over["admitted_p50_ms"],
        ),
        figure(
            "worker RSS growth under overload",
            growth,
            "MiB",
            target=f"<= {RSS_TARGET_MIB:g}",
            met=growth <= RSS_TARGET_MIB,
        ),
        figure("admitted req/s at 10x the cap / at the cap", rate, "x"),
        figure("refused req/s at 10x the cap", over["refused_per_s"], "req/s"),
    ]


def markdown(report: dict[str, Any]) -> list[str]:
    """The report as Markdown."""
    args = report["args"]
    lines = [
        "# Overload: ten times the in-flight cap",
        "",
        f"Machine: {machine_line(report['machine'])}",
        "",
        f"Command: `{report['command']}`",
        "",
        *(
            f"- {f['name']}: {fmt(f['value'], '.3g')} {f['unit']}"
            + (
                f", target {f['target']} ({'met' if f['met'] else 'NOT met'})"
                if f["target"]
                else ""
            )
            for f in report["figures"]
        ),
        "",
        f"Model `{args['model']}`, in-flight cap {args['cap']} "
        "(`endpoints.max_concurrent_requests`), stock `tritonclient.grpc.aio` clients in closed "
        f"loops, resending at once when refused; {args['rounds']} alternating windows of "
        f"{args['duration']} s per load. The worker on its own CPU(s), the clients on another.",
        "",
        "| load | clients | admitted req/s | admitted p50 / p99 (ms) | in-server mean (ms) "
        "| refused req/s | refusal p50 / p99 (ms) | other statuses | server CPU / admitted (us) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        lines.append(
            f"| {r['kind']} | {r['clients']} | {r['admitted_per_s']:,.0f} | "
            f"{r['admitted_p50_ms']:.2f} / {r['admitted_p99_ms']:.2f} | "
            f"{fmt(r['admitted_server_mean_ms'], '.2f')} | {r['refused_per_s']:,.0f} | "
            f"{fmt(r['refusal_p50_ms'], '.2f')} / "
            f"{fmt(r['refusal_p99_ms'], '.2f')} | {r['other_statuses'] or '-'} | "
            f"{fmt(r['server_cpu_us_per_admitted'], ',.0f')} |"
        )
    rss = report["rss_mib"]
    lines += [
        "",
        f"Worker RSS: {rss['before']:.1f} MiB before, {rss['peak']:.1f} MiB at the peak, "
        f"{rss['after']:.1f} MiB after.",
        "",
    ]
    return lines


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--model", choices=sorted(INPUTS), default="cnn")
    parser.add_argument("--cap", type=int, default=16, help="the worker's in-flight cap")
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--startup-timeout", type=float, default=300.0)
    parser.add_argument("--quick", action="store_true", help="smoke run: 0.5 s windows")
    parser.add_argument("--suite", action="store_true", help="`nox -s bench` size (~40 s)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write JSON + Markdown under ``--out``."""
    args = _parser().parse_args(argv)
    if args.quick:
        args.duration, args.rounds, args.warmup = 0.5, 1, 0.2
    elif args.suite:
        args.duration, args.rounds = 3.0, 2
    split = cpu_split()
    client_cpus, server_cpus = split or (None, None)
    with tempfile.TemporaryDirectory(prefix="rs-bench-overload-") as name:
        tmp = Path(name)
        models = tmp / "models"
        export_examples(models, [args.model])
        env = {"REACTANTSERVER_WORKER_ENDPOINTS_MAX_CONCURRENT_REQUESTS": str(args.cap)}
        worker = start_worker(tmp, models, env, server_cpus)
        try:
            if client_cpus is not None:
                os.sched_setaffinity(0, client_cpus)
            worker.wait_ready([args.model], args.startup_timeout)
            measured = run(args, worker)
        finally:
            exit_status = worker.stop()
    report: dict[str, Any] = {
        "machine": machine("jax", "grpcio", "tritonclient", "h2corn"),
        "command": " ".join([".venv/bin/python -m bench.overload", *(argv or sys.argv[1:])]),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "exit_status": exit_status,
        **measured,
    }
    report["figures"] = figures(report)
    report["errors"] = [
        f"{r['kind']}: {r['other_statuses']} (e.g. {r['other_examples']})"
        for r in report["rows"]
        if r["other_statuses"]
    ]
    write_report(args.out, RESULT_NAME, report, markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
