"""Scaling benchmark: the tiny MLP's req/s against the native front's thread count.

Run from the repository root with the dev environment::

    .venv/bin/python -m bench.scaling --out bench/results

For each ``--threads`` count the worker (the exported ``mlp`` example) starts with
``endpoints.front_threads`` set to it, on every CPU but the clients' share, and
``--client-procs`` processes of stock ``tritonclient.grpc.aio`` clients drive it (``--clients``
closed-loop one-row clients in all) for the same window. Reports req/s, latency and the
server's CPU per request and cores used per thread count.

What scales and what cannot: the front's HTTP/2 runtime runs on those threads, but every
call's Python (decode, admission, encode) runs on the one event loop, and executions on the
one dispatch thread, so one worker uses at most about three cores whatever the count. On the
2-core development machine the clients take one core and the worker the other: nothing can
scale there, and the figure shows the flat line and the CPU it costs. The 16-core GPU machine
(``bench/gpu``) runs the same measurement.

``--fronts K ...`` measures the other way to use more cores, front processes: ``K`` gateways
(``python -m reactantserver.gateway``) in front of the one worker, each forwarding its calls
over the worker's forwarding lane (the unchanged ``ModelInferRequest`` bytes over a Unix
socket), the clients spread over them. The gateways take the HTTP/2 and gRPC work out of the
worker's process; what the worker still spends per request (its CPU per request in these rows
against the direct rows) bounds what any number of fronts can get from one worker. The fronts
run on their own CPUs where the machine has them (the worker keeps at most three), else on the
clients' CPUs.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs

from bench._common import figure, fmt, machine, machine_line, write_report
from bench._grpc_load import run_load
from bench._grpc_servers import Server, export_examples, model_stats, start_worker
from bench.gateway import start_gateway

ROOT = Path(__file__).resolve().parent.parent
RESULT_NAME = "scaling-cpu"
MODEL = "mlp"
#: The most cores one worker can use (its event loop, its dispatch thread, the front's thread).
WORKER_CORES = 3


def split_cpus(client_share: float) -> tuple[list[int], list[int]]:
    """(client CPUs, server CPUs): at least one each; the clients get ``client_share``."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    if len(cpus) < 2:
        return cpus, cpus
    clients = max(1, int(len(cpus) * client_share))
    return cpus[:clients], cpus[clients:]


def split_fronts(client_cpus: list[int], server_cpus: list[int]) -> tuple[list[int], list[int]]:
    """(front CPUs, worker CPUs) out of the server's: the worker keeps up to
    :data:`WORKER_CORES`, the fronts get the rest, or share the clients' CPUs if none is left."""
    worker = server_cpus[: max(1, min(WORKER_CORES, len(server_cpus) // 2))]
    fronts = server_cpus[len(worker) :]
    return (fronts or client_cpus), worker


def _rows_per_execution(
    before: dict[str, int] | None, after: dict[str, int] | None
) -> float | None:
    if before is None or after is None:
        return None
    executions = after["execution_count"] - before["execution_count"]
    if executions <= 0:
        return None
    return (after["inference_count"] - before["inference_count"]) / executions


def _cpu(servers: list[Server]) -> float:
    return sum(sum((s.cpu_seconds() or {}).values()) for s in servers)


def _client_proc(args: tuple[str, int, float, float, list[int]]) -> dict[str, Any]:
    url, clients, warmup, duration, cpus = args
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)
    load = run_load(
        url,
        MODEL,
        concurrency=clients,
        kind="asyncio",
        warmup_s=warmup,
        duration_s=duration,
        server_cpu=lambda: None,
    )
    return {"latencies_ns": load.latencies_ns, "errors": load.errors}


def measure(
    worker: Server,
    *,
    procs: int,
    clients: int,
    warmup: float,
    duration: float,
    cpus: list[int],
    fronts: list[Server] | None = None,
) -> dict[str, Any]:
    """One window with ``procs`` client processes sharing ``clients`` closed-loop clients,
    sent to the worker, or spread over ``fronts`` (at least one process per front)."""
    targets = [f.url for f in fronts] if fronts else [worker.url]
    procs = max(procs, len(targets))
    per = [clients // procs + (1 if i < clients % procs else 0) for i in range(procs)]
    jobs = [(targets[i % len(targets)], n, warmup, duration, cpus) for i, n in enumerate(per) if n]
    context = multiprocessing.get_context("spawn")
    with context.Pool(len(jobs)) as pool:
        pending = pool.map_async(_client_proc, jobs)
        time.sleep(warmup + 0.5)  # every process imported and running by then
        cpu0, front0, t0 = _cpu([worker]), _cpu(fronts or []), time.perf_counter()
        stats0 = model_stats(worker.url, MODEL)
        time.sleep(max(0.0, duration - 1.0))
        stats1 = model_stats(worker.url, MODEL)
        cpu1, front1, t1 = _cpu([worker]), _cpu(fronts or []), time.perf_counter()
        results = pending.get()
    latencies = sorted(ns for r in results for ns in r["latencies_ns"])
    requests = len(latencies)
    span = t1 - t0
    # Requests answered during the CPU span (the window's rate over the span).
    spanned = requests * span / duration if duration > 0 else 0.0
    row: dict[str, Any] = {
        "requests_per_s": requests / duration,
        "p50_ms": latencies[len(latencies) // 2] / 1e6 if latencies else None,
        "p99_ms": latencies[int(len(latencies) * 0.99)] / 1e6 if latencies else None,
        "errors": sum(r["errors"] for r in results),
        "server_cores": (cpu1 - cpu0) / span if span > 0 else None,
        "server_cpu_us_per_request": (cpu1 - cpu0) / spanned * 1e6 if spanned else None,
        "rows_per_execution": _rows_per_execution(stats0, stats1),
    }
    if fronts:
        row["front_cores"] = (front1 - front0) / span if span > 0 else None
        row["front_cpu_us_per_request"] = (front1 - front0) / spanned * 1e6 if spanned else None
    return row


def markdown(report: dict[str, Any]) -> list[str]:
    """The report as Markdown."""
    args = report["args"]
    lines = [
        "# Scaling: tiny MLP req/s against the front's threads",
        "",
        f"Machine: {machine_line(report['machine'])}",
        "",
        f"Command: `{report['command']}`",
        "",
        f"Clients: {args['clients']} closed-loop `tritonclient.grpc.aio` clients in "
        f"{args['client_procs']} process(es) on CPUs {report['client_cpus']}; the worker on "
        f"CPUs {report['server_cpus']}; {args['duration']} s windows.",
        "",
        "| front threads | req/s | p50 / p99 (ms) | server CPU / request (us) "
        "| server cores used | rows / execution |",
        "|---|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        lines.append(
            f"| {row['threads']} | {row['requests_per_s']:,.0f} | {fmt(row['p50_ms'], '.2f')} / "
            f"{fmt(row['p99_ms'], '.2f')} | {fmt(row['server_cpu_us_per_request'], ',.0f')} | "
            f"{fmt(row['server_cores'], '.2f')} | {fmt(row['rows_per_execution'], '.1f')} |"
        )
    lines += ["", report["note"], ""]
    if report.get("front_rows"):
        direct = report["rows"][0]
        lines += [
            "## Front processes",
            "",
            f"Gateways forwarding over the worker's lane, on CPUs {report['front_cpus']}; the "
            f"worker on CPUs {report['worker_cpus']}. The first row is the worker alone, with "
            f"{direct['threads']} front thread(s), from the table above.",
            "",
            "| front processes | req/s | p50 / p99 (ms) | worker CPU / request (us) "
            "| worker cores used | rows / execution | fronts' CPU / request (us) "
            "| fronts' cores used |",
            "|---|---|---|---|---|---|---|---|",
            f"| 0 (direct) | {direct['requests_per_s']:,.0f} | {fmt(direct['p50_ms'], '.2f')} / "
            f"{fmt(direct['p99_ms'], '.2f')} | "
            f"{fmt(direct['server_cpu_us_per_request'], ',.0f')} | "
            f"{fmt(direct['server_cores'], '.2f')} | "
            f"{fmt(direct['rows_per_execution'], '.1f')} | - | - |",
        ]
        for row in report["front_rows"]:
            lines.append(
                f"| {row['fronts']} | {row['requests_per_s']:,.0f} | "
                f"{fmt(row['p50_ms'], '.2f')} / {fmt(row['p99_ms'], '.2f')} | "
                f"{fmt(row['server_cpu_us_per_request'], ',.0f')} | "
                f"{fmt(row['server_cores'], '.2f')} | "
                f"{fmt(row['rows_per_execution'], '.1f')} | "
                f"{fmt(row['front_cpu_us_per_request'], ',.0f')} | "
                f"{fmt(row['front_cores'], '.2f')} |"
            )
        lines += ["", report["front_note"], ""]
    return lines


@attrs.frozen
class Load:
    """How every point is driven: client processes, clients, window, the clients' CPUs."""

    procs: int
    clients: int
    warmup: float
    duration: float
    client_cpus: list[int]


def measure_point(
    run: Path,
    repo: Path,
    env: dict[str, str],
    load: Load,
    *,
    worker_cpus: list[int],
    ready_timeout: float,
    fronts: int = 0,
    front_cpus: list[int] | None = None,
) -> dict[str, Any]:
    """One window against a fresh worker (``env``: its overrides) serving ``repo``, directly
    or through ``fronts`` gateways on ``front_cpus``; everything stopped after."""
    run.mkdir(parents=True, exist_ok=True)
    worker = start_worker(run, repo, env, frozenset(worker_cpus))
    started: list[Server] = []
    try:
        worker.wait_ready([MODEL], ready_timeout)
        worker.name = "worker"
        for i in range(fronts):
            front = start_gateway(run, f"front_{i}", [worker], frozenset(front_cpus or []))
            started.append(front)
            front.wait_ready([MODEL], ready_timeout)
        return measure(
            worker,
            procs=load.procs,
            clients=load.clients,
            warmup=load.warmup,
            duration=load.duration,
            cpus=load.client_cpus,
            fronts=started,
        )
    finally:
        for front in started:
            front.stop()
        worker.stop()


def _front_note(
    rows: list[dict[str, Any]],
    front_rows: list[dict[str, Any]],
    front_cpus: list[int],
    client_cpus: list[int],
) -> str:
    if not rows or not front_rows:
        return ""
    direct = rows[0]["server_cpu_us_per_request"]
    laned = min(
        (r["server_cpu_us_per_request"] for r in front_rows if r["server_cpu_us_per_request"]),
        default=None,
    )
    note = ""
    if direct and laned:
        note = (
            f"Behind fronts the worker spends {laned:,.0f} us per request against {direct:,.0f} "
            f"direct: at most {direct / laned:.2f}x the requests one worker's process can serve, "
            "however many fronts feed it. "
        )
    if front_cpus == client_cpus:
        note += (
            "The fronts share the clients' CPUs here (the machine has none to spare), so their "
            "req/s shows the cost of the extra hop, not what fronts on cores of their own give."
        )
    return note


def _front_figures(
    rows: list[dict[str, Any]], front_rows: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    if not rows:
        return []
    direct = rows[0]
    out = []
    for r in front_rows:
        cpu = r["server_cpu_us_per_request"]
        base_cpu = direct["server_cpu_us_per_request"]
        out += [
            figure(f"req/s with {r['fronts']} front processes", r["requests_per_s"], "req/s"),
            figure(
                f"worker CPU per request behind {r['fronts']} front processes / direct",
                cpu / base_cpu if cpu and base_cpu else None,
                "x",
            ),
        ]
    return out


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument(
        "--fronts", type=int, nargs="*", default=[1, 2], help="front processes (gateways)"
    )
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--client-procs", type=int, default=0, help="0: one per client CPU")
    parser.add_argument("--client-share", type=float, default=0.5)
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--startup-timeout", type=float, default=300.0)
    parser.add_argument("--quick", action="store_true", help="smoke run: 1.5 s windows")
    parser.add_argument("--suite", action="store_true", help="`nox -s bench` size (~30 s)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write JSON + Markdown under ``--out``."""
    args = _parser().parse_args(argv)
    if args.quick:
        args.duration, args.warmup, args.threads = 1.5, 0.3, args.threads[:2]
        args.fronts = args.fronts[:1]
    elif args.suite:
        args.duration = 3.0
    client_cpus, server_cpus = split_cpus(args.client_share)
    if not args.client_procs:
        args.client_procs = len(client_cpus)
    rows = []
    with tempfile.TemporaryDirectory(prefix="rs-bench-scaling-") as name:
        tmp = Path(name)
        models = tmp / "models"
        export_examples(models, [MODEL])
        load = Load(args.client_procs, args.clients, args.warmup, args.duration, client_cpus)
        for threads in args.threads:
            env = {"REACTANTSERVER_WORKER_ENDPOINTS_FRONT_THREADS": str(threads)}
            row = measure_point(
                tmp / f"t{threads}",
                models,
                env,
                load,
                worker_cpus=server_cpus,
                ready_timeout=args.startup_timeout,
            )
            rows.append({"threads": threads, **row})
        front_cpus, worker_cpus = split_fronts(client_cpus, server_cpus)
        front_rows = []
        for count in args.fronts:
            row = measure_point(
                tmp / f"f{count}",
                models,
                {},
                load,
                worker_cpus=worker_cpus,
                ready_timeout=args.startup_timeout,
                fronts=count,
                front_cpus=front_cpus,
            )
            front_rows.append({"fronts": count, **row})
    cores = len(server_cpus)
    note = (
        f"The worker had {cores} CPU(s). One worker's Python runs on one event loop and its "
        "executions on one dispatch thread, so more front threads only spread the HTTP/2 work."
    )
    if cores < 2:
        note += " With one core for the worker nothing can scale: the flat line is the point."
    report: dict[str, Any] = {
        "machine": machine("jax", "h2corn", "tritonclient"),
        "command": " ".join([".venv/bin/python -m bench.scaling", *(argv or sys.argv[1:])]),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "client_cpus": client_cpus,
        "server_cpus": server_cpus,
        "rows": rows,
        "note": note,
        "front_cpus": front_cpus,
        "worker_cpus": worker_cpus,
        "front_rows": front_rows,
        "front_note": _front_note(rows, front_rows, front_cpus, client_cpus),
        "errors": [f"threads={r['threads']}: {r['errors']} errors" for r in rows if r["errors"]]
        + [f"fronts={r['fronts']}: {r['errors']} errors" for r in front_rows if r["errors"]],
    }
    base = rows[0]["requests_per_s"] if rows else None
    report["figures"] = [
        figure(
            f"req/s with {r['threads']} front threads / with {rows[0]['threads']}",
            r["requests_per_s"] / base if base else None,
            "x",
        )
        for r in rows[1:]
    ] + [
        figure(f"req/s with {r['threads']} front threads", r["requests_per_s"], "req/s")
        for r in rows
    ]
    report["figures"] += _front_figures(rows, front_rows)
    write_report(args.out, RESULT_NAME, report, markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
