"""Worker gRPC benchmark: stock tritonclient against the worker and a bare grpc.aio server.

Run from the repository root with the dev environment::

    .venv/bin/python -m bench.worker_grpc --out bench/results

Exports the ``mlp`` and ``cnn`` examples into a temporary model repository, starts
``python -m reactantserver.worker --model-repo DIR`` and ``python -m bench._bare_server`` (a
grpc.aio server on uvloop answering ``ModelInfer`` with a canned response of the same output
shape) as two subprocesses, and drives both with the same ``tritonclient.grpc`` client in this
process: ``--concurrency`` closed-loop clients (default 1, 8, 32) sending one-row requests,
each with its own ``InferenceServerClient``. For every (concurrency, model) the bare server and
the worker run back to back, so their ratio is taken on the same machine state. Reports
requests/s and p50/p99 latency per (target, model, concurrency), the CPU time each server
process and the client spent per request, and the worker / bare ratios. Target: tiny-MLP
throughput at concurrency 8 >= 60% of the bare server's.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench._common import figure, machine, write_report
from bench._grpc_load import CLIENT_KINDS, MODELS, Load, combine, run_load
from bench._grpc_report import (
    HEADLINE_CONCURRENCY,
    HEADLINE_MODEL,
    TARGET_RATIO,
    markdown,
    ratios,
)
from bench._grpc_servers import (
    Server,
    cpu_split,
    export_examples,
    model_stats,
    start_bare,
    start_worker,
)

ROOT = Path(__file__).resolve().parent.parent

TARGETS = ("bare", "worker")
RESULT_NAME = "worker-grpc-cpu"


def _stats_delta(before: dict[str, int] | None, after: dict[str, int] | None) -> dict[str, Any]:
    """Coalescing and the worker's own time split per request, from ``ModelStatistics``."""
    if before is None or after is None:
        return {}
    d = {k: after[k] - before[k] for k in after}
    requests, executions = d["inference_count"], d["execution_count"]
    if not requests or not executions:
        return {}
    return {
        "rows_per_execution": requests / executions,
        "queue_ms_per_request": d["queue_ns"] / requests / 1e6,
        "compute_ms_per_execution": (
            d["compute_input_ns"] + d["compute_infer_ns"] + d["compute_output_ns"]
        )
        / executions
        / 1e6,
        "infer_ms_per_execution": d["compute_infer_ns"] / executions / 1e6,
    }


def _row(target: str, load: Load, stats: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {"target": target, **load.summary()}
    cpu = load.server_cpu
    n = load.requests
    row["server_cpu_us_per_request"] = (
        load.server_cpu_s / n * 1e6 if load.server_cpu_s is not None and n else None
    )
    row["server_cpu_cores"] = (
        load.server_cpu_s / load.duration_s if load.server_cpu_s is not None else None
    )
    row["server_cpu_us_per_request_by_thread"] = (
        {group: seconds / n * 1e6 for group, seconds in sorted(cpu.items())} if cpu and n else {}
    )
    row["worker_stats"] = stats
    print(
        f"{target:6s} {load.model:4s} c={load.concurrency:<3d} {load.client:8s}"
        f"{row['requests_per_s']:9,.0f} req/s  p50 {row['p50_ms']:.3f} ms"
        f"  p99 {row['p99_ms']:.3f} ms  errors {load.errors}",
        flush=True,
    )
    return row


def figures(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The headline: worker / bare req/s on the tiny MLP at concurrency 8, and both rates;
    values are None where that point did not run or answered nothing."""
    point = f"{HEADLINE_MODEL}, c={HEADLINE_CONCURRENCY}"
    headline = (HEADLINE_MODEL, HEADLINE_CONCURRENCY)
    r = next((r for r in rows if (r["model"], r["concurrency"]) == headline), {})
    ratio = r.get("ratio")
    return [
        figure(
            f"worker / bare req/s ({point})",
            ratio,
            "x",
            target=f">= {TARGET_RATIO:.2f}",
            met=ratio is not None and ratio >= TARGET_RATIO,
        ),
        figure(f"worker req/s ({point})", r.get("worker_requests_per_s"), "req/s"),
        figure(f"bare req/s ({point})", r.get("bare_requests_per_s"), "req/s"),
    ]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument(
        "--models",
        type=Path,
        default=None,
        help="model repository holding the mlp and cnn bundles (default: export the examples)",
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=6.0,
        help="measured seconds per target at each point, split over --rounds windows",
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="alternating windows per target at each point"
    )
    parser.add_argument("--warmup", type=float, default=0.5, help="seconds before each window")
    parser.add_argument(
        "--concurrency", type=int, nargs="+", default=[1, 8, 32], help="closed-loop clients"
    )
    parser.add_argument("--model", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--targets", nargs="+", choices=TARGETS, default=list(TARGETS))
    parser.add_argument(
        "--client", choices=CLIENT_KINDS, default="threads", help="client kind of the main runs"
    )
    parser.add_argument(
        "--client-survey",
        action="store_true",
        help="first run every client kind against the bare server (mlp) at each concurrency",
    )
    parser.add_argument(
        "--worker-env",
        action="append",
        default=[],
        metavar="REACTANTSERVER_WORKER_KEY=VALUE",
        help="extra worker configuration (repeatable), e.g. "
        "REACTANTSERVER_WORKER_SCHEDULER_PAD_UP_WHEN_CHEAPER=true",
    )
    parser.add_argument(
        "--startup-timeout", type=float, default=300.0, help="seconds to wait for readiness"
    )
    parser.add_argument(
        "--no-pin",
        action="store_true",
        help="let client and servers share every CPU (default: the client on the first CPU, "
        "the servers on the others)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: one 0.5 s window per target and point after 0.2 s warm-up",
    )
    parser.add_argument(
        "--suite",
        action="store_true",
        help="the size `nox -s bench` runs: the MLP only, 3 s per target and point",
    )
    return parser


def _worker_env(pairs: Sequence[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.startswith("REACTANTSERVER_WORKER_"):
            raise SystemExit(f"--worker-env takes REACTANTSERVER_WORKER_<KEY>=VALUE, not {pair!r}")
        env[key] = value
    return env


def _point(
    args: argparse.Namespace,
    servers: dict[str, Server],
    *,
    targets: Sequence[str],
    model: str,
    concurrency: int,
    client: str,
) -> list[dict[str, Any]]:
    """One (model, concurrency): ``--rounds`` windows per target, the targets alternating.

    The shared machine's speed drifts over seconds; alternating short windows puts the same
    drift into every target's total, so their ratio is fair. The worker's statistics are
    read around all its windows (warm-ups included).
    """
    loads: dict[str, list[Load]] = {t: [] for t in targets}
    before = {t: model_stats(servers[t].url, model) for t in targets if t == "worker"}
    for _ in range(args.rounds):
        for target in targets:
            server = servers[target]
            loads[target].append(
                run_load(
                    server.url,
                    model,
                    concurrency=concurrency,
                    kind=client,
                    warmup_s=args.warmup,
                    duration_s=args.duration / args.rounds,
                    server_cpu=server.cpu_seconds,
                )
            )
    rows = []
    for target in targets:
        stats = {}
        if target in before:
            stats = _stats_delta(before[target], model_stats(servers[target].url, model))
        rows.append(_row(target, combine(loads[target]), stats))
    return rows


def _measure(
    args: argparse.Namespace, servers: dict[str, Server]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    survey = []
    if args.client_survey and "bare" in servers:
        for concurrency in args.concurrency:
            for kind in CLIENT_KINDS:
                survey += _point(
                    args,
                    servers,
                    targets=["bare"],
                    model="mlp",
                    concurrency=concurrency,
                    client=kind,
                )
    runs = []
    for concurrency in args.concurrency:
        for model in args.model:
            runs += _point(
                args,
                servers,
                targets=args.targets,
                model=model,
                concurrency=concurrency,
                client=args.client,
            )
    return survey, runs


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write JSON + Markdown under ``--out``."""
    args = _parser().parse_args(argv)
    if args.quick:
        args.duration, args.rounds, args.warmup = 0.5, 1, 0.2
    elif args.suite:
        args.duration, args.rounds, args.warmup, args.model = 3.0, 3, 0.3, ["mlp"]
    servers: dict[str, Server] = {}
    startup: dict[str, float] = {}
    split = None if args.no_pin else cpu_split()
    client_cpus, server_cpus = split or (None, None)
    with tempfile.TemporaryDirectory(prefix="rs-bench-grpc-") as name:
        tmp = Path(name)
        try:
            models = args.models
            if "worker" in args.targets and models is None:
                models = tmp / "models"
                export_examples(models, args.model)
            if "bare" in args.targets:
                servers["bare"] = start_bare(tmp, server_cpus)
            if "worker" in args.targets:
                env = _worker_env(args.worker_env)
                servers["worker"] = start_worker(tmp, models, env, server_cpus)
            if client_cpus is not None:
                # Before any client thread exists (gRPC's included): they all inherit it.
                os.sched_setaffinity(0, client_cpus)
            for target, server in servers.items():
                wait = args.model if target == "worker" else []
                startup[target] = server.wait_ready(wait, args.startup_timeout)
                print(f"{server.name} ready in {startup[target]:.1f} s at {server.url}", flush=True)
            survey, runs = _measure(args, servers)
        finally:
            exits = {target: server.stop() for target, server in servers.items()}

    report: dict[str, Any] = {
        "machine": machine("jax", "grpcio", "tritonclient", "uvloop"),
        "command": " ".join([".venv/bin/python -m bench.worker_grpc", *(argv or sys.argv[1:])]),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "pinned": (
            {"client": sorted(client_cpus), "servers": sorted(server_cpus)}
            if client_cpus is not None and server_cpus is not None
            else None
        ),
        "ready_after_s": startup,
        "exit_status": exits,
        "client_survey": survey,
        "runs": runs,
        "ratios": ratios(runs),
        "errors": [
            f"{r['target']} {r['model']} c={r['concurrency']}: {r['first_error']}"
            for r in survey + runs
            if r["first_error"]
        ],
    }
    report["figures"] = figures(report["ratios"])
    write_report(args.out, RESULT_NAME, report, markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
