"""Overhead benchmark: the tiny MLP vs the bare grpc.aio floor, and server CPU per request by stage.

Run from the repository root with the dev environment::

    .venv/bin/python -m bench.overhead --out bench/results

Starts the worker (the exported ``mlp`` example) and the bare server (``bench/_bare_server.py``:
a canned ``ModelInfer`` answer, the floor of Python gRPC) with the same harness as
``bench.worker_grpc``, pinned apart from this process, and drives both with stock
``tritonclient.grpc`` at ``--concurrency`` closed-loop clients (default 1, 8, 32), their windows
alternating. For the worker it reads ``reactantserver_worker_stage_cpu_seconds_total`` from
``/metrics`` and the
process's per-thread CPU from ``/proc`` just before and after each of its windows, so both cover
the same span, and reports CPU per request by stage (decode, queue, dispatch, encode; thread
CPU clocks inside the worker) and ``other`` = process CPU minus the stages (gRPC transport,
XLA's threads), next to the bare server's CPU per request. Target: worker req/s at concurrency
8 >= 0.60 of the bare server's. Also measures what the stage clocks themselves cost, and a
third target, the bare server with ``--handoff`` (each answer through a second thread, as the
worker's dispatch thread delivers results): how much of the gap the thread round trip explains.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from bench._common import figure, machine, write_report
from bench._grpc_load import Load, combine, run_load
from bench._grpc_report import HEADLINE_CONCURRENCY, TARGET_RATIO, ratios
from bench._grpc_servers import Server, cpu_split, export_examples, start_bare, start_worker
from bench._overhead_report import STAGES, markdown
from reactantserver.worker.scheduler import SAMPLE_EVERY

ROOT = Path(__file__).resolve().parent.parent
RESULT_NAME = "overhead-cpu"
MODEL = "mlp"
TARGETS = ("bare", "bare_handoff", "worker", "worker_delay")
"""The plain floor, the floor with the worker's thread round trip per answer, the worker with
the default configuration, and the worker with a queue delay (:data:`QUEUE_DELAY_ENV`)."""
QUEUE_DELAY_US = 2000
#: The tuned worker: wait up to 2 ms for rows on an idle device, pad up to a compiled size
#: when the learned costs say it is cheaper (04, beyond). At c=8 with one-row requests the
#: queue gathers ~8 rows per execution instead of 1; taking in eight requests takes the
#: 2-core box's event loop ~1.5-2 ms, so a 1 ms delay ran out at ~5 rows. A lone client does
#: not wait (its recent batches hold one row).
QUEUE_DELAY_ENV = {
    "REACTANTSERVER_WORKER_SCHEDULER_MAX_QUEUE_DELAY_MICROSECONDS": str(QUEUE_DELAY_US),
    "REACTANTSERVER_WORKER_SCHEDULER_PAD_UP_WHEN_CHEAPER": "true",
}


@attrs.frozen
class Counters:
    """The worker's per-model counters at one instant (``/metrics``) and its threads' CPU."""

    stages: Mapping[str, float]
    """Stage -> CPU seconds (``reactantserver_worker_stage_cpu_seconds_total``)."""
    requests: float
    """``reactantserver_worker_requests_total{status="OK"}``."""
    executions: float
    """``reactantserver_worker_dispatch_total``."""
    threads: Mapping[str, float]
    """Thread group -> CPU seconds (``/proc``, as ``bench.worker_grpc`` groups them)."""

    def __sub__(self, other: Counters) -> Counters:
        return Counters(
            {k: v - other.stages.get(k, 0.0) for k, v in self.stages.items()},
            self.requests - other.requests,
            self.executions - other.executions,
            {k: max(0.0, v - other.threads.get(k, 0.0)) for k, v in self.threads.items()},
        )

    def __add__(self, other: Counters) -> Counters:
        return Counters(
            {k: v + other.stages.get(k, 0.0) for k, v in self.stages.items()},
            self.requests + other.requests,
            self.executions + other.executions,
            {k: v + other.threads.get(k, 0.0) for k, v in self.threads.items()},
        )


def read_counters(worker: Server, model: str) -> Counters:
    """Scrape the worker's ``/metrics`` for ``model``, then read its threads' CPU."""
    from prometheus_client.parser import text_string_to_metric_families

    assert worker.http_url is not None
    with urllib.request.urlopen(f"{worker.http_url}/metrics", timeout=10.0) as answer:
        text = answer.read().decode()
    stages: dict[str, float] = {}
    requests = executions = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.labels.get("model") != model:
                continue
            if s.name == "reactantserver_worker_stage_cpu_seconds_total":
                stages[s.labels["stage"]] = s.value
            elif (
                s.name == "reactantserver_worker_requests_total" and s.labels.get("status") == "OK"
            ):
                requests = s.value
            elif s.name == "reactantserver_worker_dispatch_total":
                executions = s.value
    if set(stages) != set(STAGES):
        raise RuntimeError(
            f"the worker exports no reactantserver_worker_stage_cpu_seconds_total for {model!r}"
        )
    return Counters(stages, requests, executions, worker.cpu_seconds() or {})


def instrumentation_cost(samples: int = 200_000) -> dict[str, float]:
    """Nanoseconds per call of the stage clocks' pieces, measured in this process.

    Per request the worker reads ``time.thread_time_ns`` six times on the event loop (around
    decode, admission and encode); the codec pair rides on the one locked update that counts
    the request anyway. Per execution, two more reads and one locked add for the wake-up and
    one read for the dispatch.
    """
    import threading

    clock = time.thread_time_ns
    begin = time.perf_counter_ns()
    for _ in range(samples):
        clock()
    clock_ns = (time.perf_counter_ns() - begin) / samples
    lock = threading.Lock()
    totals = [0]
    begin = time.perf_counter_ns()
    for _ in range(samples):
        with lock:
            totals[0] += 1
    add_ns = (time.perf_counter_ns() - begin) / samples
    return {"thread_time_ns_call_ns": clock_ns, "locked_add_ns": add_ns}


def _cost_per_request(cost: Mapping[str, float], requests_per_execution: float) -> float:
    """The stage clocks' nanoseconds per request at ``requests_per_execution``."""
    per_execution = 3 * cost["thread_time_ns_call_ns"] + cost["locked_add_ns"]
    # Decode, encode and admission read the clock (6 times) on one request in SAMPLE_EVERY.
    sampled = 6 * cost["thread_time_ns_call_ns"] / SAMPLE_EVERY
    return sampled + per_execution / requests_per_execution


def _point(
    args: argparse.Namespace, servers: Mapping[str, Server], concurrency: int
) -> tuple[dict[str, Load], Counters]:
    """``--rounds`` alternating windows per target; the worker's counters around its own."""
    loads: dict[str, list[Load]] = {t: [] for t in servers}
    spans: Counters | None = None
    for _ in range(args.rounds):
        for target, server in servers.items():
            before = read_counters(server, MODEL) if target == "worker" else None
            loads[target].append(
                run_load(
                    server.url,
                    MODEL,
                    concurrency=concurrency,
                    kind="threads",
                    warmup_s=args.warmup,
                    duration_s=args.duration / args.rounds,
                    server_cpu=server.cpu_seconds,
                )
            )
            if before is not None:
                span = read_counters(server, MODEL) - before
                spans = span if spans is None else spans + span
    assert spans is not None
    return {t: combine(x) for t, x in loads.items()}, spans


def run_row(target: str, load: Load) -> dict[str, Any]:
    """One target at one concurrency: rates, latency, CPU per request over its windows."""
    row: dict[str, Any] = {"target": target, **load.summary()}
    n, cpu = load.requests, load.server_cpu
    row["server_cpu_us_per_request"] = (
        load.server_cpu_s / n * 1e6 if load.server_cpu_s is not None and n else None
    )
    row["server_cpu_us_per_request_by_thread"] = (
        {group: s / n * 1e6 for group, s in sorted(cpu.items())} if cpu and n else {}
    )
    print(
        f"{target:6s} c={load.concurrency:<3d}{row['requests_per_s']:9,.0f} req/s  "
        f"p50 {row['p50_ms']:.3f} ms  server CPU {row['server_cpu_us_per_request'] or 0:.0f} "
        f"us/req  errors {load.errors}",
        flush=True,
    )
    return row


def stage_row(
    concurrency: int, span: Counters, bare: dict[str, Any], cost: Mapping[str, float]
) -> dict[str, Any]:
    """CPU per request by stage over the worker's spans, ``other`` = process minus stages."""
    n = span.requests or 1.0
    us = {stage: span.stages[stage] / n * 1e6 for stage in STAGES}
    total = sum(span.threads.values()) / n * 1e6
    stage_sum = sum(us.values())
    threads = {group: seconds / n * 1e6 for group, seconds in span.threads.items()}
    per_execution = span.requests / span.executions if span.executions else 1.0
    clocks_us = _cost_per_request(cost, per_execution) / 1e3
    return {
        "concurrency": concurrency,
        "requests": span.requests,
        "requests_per_execution": per_execution,
        "us_per_request": {**us, "other": total - stage_sum},
        "stage_sum_us": stage_sum,
        "process_us": total,
        "other_by_thread_us": {
            # decode, queue and encode run on the event loop; dispatch on its own thread.
            "event_loop": threads.get("main", 0.0) - us["decode"] - us["queue"] - us["encode"],
            "dispatch_thread": threads.get("python", 0.0) - us["dispatch"],
            "grpc": threads.get("grpc", 0.0),
            "other_threads": threads.get("other", 0.0),
        },
        "bare_us": bare["server_cpu_us_per_request"],
        "stage_clocks_us": clocks_us,
        "stage_clocks_share": clocks_us / total if total else None,
    }


def figures(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Worker / bare req/s at concurrency 8 and the CPU split per request there."""
    out = []
    point = f"{MODEL}, c={HEADLINE_CONCURRENCY}"
    for r in report["ratios"]:
        if r["concurrency"] == HEADLINE_CONCURRENCY:
            out.append(
                figure(
                    f"worker / bare req/s ({point})",
                    r["ratio"],
                    "x",
                    target=f">= {TARGET_RATIO:.2f}",
                    met=r["ratio"] >= TARGET_RATIO,
                )
            )
    for r in ratios(report["runs"], subject="worker_delay"):
        if r["concurrency"] == HEADLINE_CONCURRENCY:
            name = f"worker with a {QUEUE_DELAY_US} us queue delay / bare req/s ({point})"
            out.append(
                figure(
                    name,
                    r["ratio"],
                    "x",
                    target=f">= {TARGET_RATIO:.2f}",
                    met=r["ratio"] >= TARGET_RATIO,
                )
            )
    for r in ratios(report["runs"], subject="bare_handoff"):
        if r["concurrency"] == HEADLINE_CONCURRENCY:
            name = f"bare with a thread hand-off / bare req/s ({point})"
            out.append(figure(name, r["ratio"], "x"))
    for s in report["stages"]:
        if s["concurrency"] == HEADLINE_CONCURRENCY:
            out.append(figure(f"worker CPU / request ({point})", s["process_us"], "us"))
            out.append(figure(f"bare server CPU / request ({point})", s["bare_us"], "us"))
            for stage, us in s["us_per_request"].items():
                out.append(figure(f"{stage} CPU / request ({point})", us, "us"))
            out.append(
                figure(f"stage clocks' cost / request ({point})", s["stage_clocks_us"], "us")
            )
    return out


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--models", type=Path, default=None, help="a repository holding mlp")
    parser.add_argument(
        "--duration", type=float, default=6.0, help="measured seconds per target and point"
    )
    parser.add_argument("--rounds", type=int, default=3, help="alternating windows per target")
    parser.add_argument("--warmup", type=float, default=0.5, help="seconds before each window")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--startup-timeout", type=float, default=300.0)
    parser.add_argument("--no-pin", action="store_true", help="no CPU affinity")
    parser.add_argument("--quick", action="store_true", help="smoke run: 0.5 s windows")
    parser.add_argument("--suite", action="store_true", help="`nox -s bench` size (~80 s)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write JSON + Markdown under ``--out``."""
    args = _parser().parse_args(argv)
    if args.quick:
        args.duration, args.rounds, args.warmup = 0.5, 1, 0.2
    elif args.suite:
        args.duration, args.rounds, args.warmup = 6.0, 3, 0.3
    cost = instrumentation_cost()
    split = None if args.no_pin else cpu_split()
    client_cpus, server_cpus = split or (None, None)
    servers: dict[str, Server] = {}
    with tempfile.TemporaryDirectory(prefix="rs-bench-overhead-") as name:
        tmp = Path(name)
        try:
            models = args.models
            if models is None:
                models = tmp / "models"
                export_examples(models, [MODEL])
            servers["bare"] = start_bare(tmp, server_cpus)
            servers["bare_handoff"] = start_bare(tmp, server_cpus, handoff=True)
            servers["worker"] = start_worker(tmp, models, {}, server_cpus)
            (tmp / "delay").mkdir()
            servers["worker_delay"] = start_worker(
                tmp / "delay", models, QUEUE_DELAY_ENV, server_cpus
            )
            if client_cpus is not None:
                os.sched_setaffinity(0, client_cpus)  # before any client thread exists
            ready = {
                t: s.wait_ready([MODEL] if t.startswith("worker") else [], args.startup_timeout)
                for t, s in servers.items()
            }
            runs: list[dict[str, Any]] = []
            stages: list[dict[str, Any]] = []
            for concurrency in args.concurrency:
                loads, span = _point(args, servers, concurrency)
                rows = {t: run_row(t, loads[t]) for t in TARGETS}
                runs += rows.values()
                stages.append(stage_row(concurrency, span, rows["bare"], cost))
        finally:
            exits = {target: server.stop() for target, server in servers.items()}
    report: dict[str, Any] = {
        "machine": machine("jax", "grpcio", "tritonclient", "uvloop"),
        "command": " ".join([".venv/bin/python -m bench.overhead", *(argv or sys.argv[1:])]),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "pinned": (
            {"client": sorted(client_cpus), "servers": sorted(server_cpus)}
            if client_cpus is not None and server_cpus is not None
            else None
        ),
        "ready_after_s": ready,
        "exit_status": exits,
        "runs": runs,
        "ratios": ratios(runs),
        "stages": stages,
        "instrumentation": cost,
        "errors": [
            f"{r['target']} c={r['concurrency']}: {r['first_error']}"
            for r in runs
            if r["first_error"]
        ],
    }
    report["figures"] = figures(report)
    write_report(args.out, RESULT_NAME, report, markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
