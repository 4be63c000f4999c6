"""Density benchmark: a catalog 5x the weight budget under Zipf traffic vs all-resident.

Run from the repository root with the dev environment::

    .venv/bin/python -m bench.density --out bench/results

Builds a catalog of ``--count`` copies of the ``cnn`` example, each with its own weights
(``bench/_density_catalog.py``), and starts two workers on it from the same build and the same
executable cache (the second compiles nothing): ``constrained``, whose on-demand weight budget
(``INFERENCE_SERVER_RUNTIME_WEIGHT_CACHE_MAX_BYTES``) is the catalog's total weight bytes /
``--ratio`` (5), and ``resident``, whose budget holds the whole catalog. Both are self-managed
(``static`` model control: the worker loads and evicts on demand, 03 §On-demand weight cache).
``--concurrency`` (16) closed-loop ``tritonclient.grpc`` clients send one image per request to
the model named by a fixed-seed Zipf(1.1) sequence over the catalog (the same sequence, from
its start, for both workers); the workers alternate over ``--rounds`` windows (A B A B ...) so
the machine's drift falls on both. Reported per worker: req/s, p50/p99, and weight loads and
evictions per 1000 requests from the worker's ``/metrics``; the targets are throughput >= 70%
of all-resident and p99 <= 3x. ``--ballast-kib`` repeats the comparison with every model's
weights grown by that much (the CNN's own weights are 5.6 KiB, so its loads are cheap).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

from bench._common import loadavg, machine, write_report
from bench._density_catalog import (
    ZIPF_S,
    Catalog,
    Cursor,
    build_catalog,
    top_share,
    zipf_sequence,
)
from bench._density_report import figures, markdown
from bench._grpc_load import Load, combine, run_load
from bench._grpc_servers import Server, cpu_split, start_worker

__all__ = ["MODES", "RESULT_NAME", "main"]

ROOT = Path(__file__).resolve().parent.parent
RESULT_NAME = "density-cpu"
#: The two workers: the budget a fraction of the catalog, and large enough for all of it.
MODES = ("constrained", "resident")
#: Weight-cache series read from the worker's ``/metrics`` around each window.
_COUNTERS = (
    "worker_weight_loads_total",
    "worker_weight_evicts_total",
    "worker_weight_load_seconds_total",
    "worker_weight_load_bytes_total",
)
_GAUGES = ("worker_weight_cache_max_bytes", "worker_weight_cache_resident_bytes")
_SAMPLE = re.compile(r"^(\w+)(?:\{[^}]*\})? (\S+)$")
_ADMITTED = re.compile(r"weights of '[^']+' admitted as \w+; weights resident=\d+ budget=(\d+)")
_SEQUENCE_LENGTH = 400_000


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--count", type=int, default=100, help="models in the catalog")
    parser.add_argument(
        "--ratio", type=float, default=5.0, help="catalog weight bytes / constrained budget"
    )
    parser.add_argument(
        "--ballast-kib",
        type=int,
        nargs="+",
        default=[0, 1024],
        help="extra KiB of weights per model, one comparison per value (0: the CNN as it is)",
    )
    parser.add_argument("--concurrency", type=int, default=16, help="closed-loop clients")
    parser.add_argument("--duration", type=float, default=30.0, help="measured s per worker")
    parser.add_argument("--rounds", type=int, default=3, help="alternating windows per worker")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds before each window")
    parser.add_argument("--seed", type=int, default=13, help="weights and traffic seed")
    parser.add_argument(
        "--startup-timeout", type=float, default=300.0, help="seconds to wait for readiness"
    )
    parser.add_argument(
        "--no-pin",
        action="store_true",
        help="let the client and the workers share every CPU (default: the client on the "
        "first CPU, the workers on the others)",
    )
    sized = parser.add_mutually_exclusive_group()
    sized.add_argument(
        "--quick", action="store_true", help="smoke run: 6 models, one 1 s window per worker"
    )
    sized.add_argument(
        "--suite", action="store_true", help="the `nox -s bench` size (<= 150 s on 2 cores)"
    )
    return parser


def _scrape(server: Server) -> dict[str, float]:
    """The weight-cache series of the worker's ``/metrics`` (one worker: labels dropped)."""
    assert server.http_url is not None
    with urllib.request.urlopen(f"{server.http_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    out = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match and match[1] in (*_COUNTERS, *_GAUGES):
            out[match[1]] = float(match[2])
    return out


def _admitted(server: Server) -> dict[str, Any]:
    """What the worker's log says of the budget: the "weights ... admitted" lines."""
    budgets = [int(m[1]) for m in _ADMITTED.finditer(server.log.read_text(errors="replace"))]
    return {"admitted": len(budgets), "budgets": sorted(set(budgets))}


def _start(tmp: Path, catalog: Catalog, budgets: dict[str, int], cpus: Any) -> dict[str, Server]:
    servers: dict[str, Server] = {}
    cache = tmp / "cache"  # one executable cache: the second worker compiles nothing
    for mode in MODES:
        env = {
            "INFERENCE_SERVER_RUNTIME_WEIGHT_CACHE_MAX_BYTES": str(budgets[mode]),
            "INFERENCE_SERVER_CACHE_DIR": str(cache),
            "INFERENCE_SERVER_LOGGING_LEVEL": "info",  # the "weights ... admitted" lines
        }
        (tmp / mode).mkdir()
        servers[mode] = start_worker(tmp / mode, catalog.root, env, cpus)
    return servers


def _mode_row(
    mode: str, loads: list[Load], before: dict[str, float], after: dict[str, float], issued: int
) -> dict[str, Any]:
    load = combine(loads)
    row: dict[str, Any] = {"mode": mode, **load.summary()}
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in _COUNTERS}
    n_loads = delta["worker_weight_loads_total"]
    row.update(
        requests_sent=issued,
        weight_loads=int(n_loads),
        weight_evicts=int(delta["worker_weight_evicts_total"]),
        loads_per_1000=1000 * n_loads / issued if issued else None,
        evicts_per_1000=1000 * delta["worker_weight_evicts_total"] / issued if issued else None,
        ms_per_load=1000 * delta["worker_weight_load_seconds_total"] / n_loads if n_loads else None,
        load_seconds_per_s=delta["worker_weight_load_seconds_total"] / load.duration_s,
        bytes_per_load=delta["worker_weight_load_bytes_total"] / n_loads if n_loads else None,
        budget_bytes=after.get("worker_weight_cache_max_bytes"),
        resident_bytes_after=after.get("worker_weight_cache_resident_bytes"),
        server_cpu_us_per_request=(
            load.server_cpu_s / load.requests * 1e6
            if load.server_cpu_s is not None and load.requests
            else None
        ),
    )
    print(
        f"{mode:11s} {row['requests_per_s']:8,.0f} req/s  p50 {row['p50_ms']:.2f} ms"
        f"  p99 {row['p99_ms']:.2f} ms  loads/1000 {row['loads_per_1000'] or 0:.0f}"
        f"  errors {row['errors']}",
        flush=True,
    )
    return row


def _measure(args: argparse.Namespace, servers: dict[str, Server], sequence: list[str]) -> Any:
    """``--rounds`` windows per worker, alternating; counters read around each window."""
    cursors = {mode: Cursor(sequence) for mode in MODES}
    loads: dict[str, list[Load]] = {mode: [] for mode in MODES}
    before = {mode: _scrape(servers[mode]) for mode in MODES}
    for _ in range(args.rounds):
        for mode in MODES:
            loads[mode].append(
                run_load(
                    servers[mode].url,
                    "cnn",
                    concurrency=args.concurrency,
                    kind="threads",
                    warmup_s=args.warmup,
                    duration_s=args.duration / args.rounds,
                    server_cpu=servers[mode].cpu_seconds,
                    route=cursors[mode],
                )
            )
    return [
        _mode_row(mode, loads[mode], before[mode], _scrape(servers[mode]), cursors[mode].issued)
        for mode in MODES
    ]


def _section(args: argparse.Namespace, tmp: Path, ballast_kib: int) -> dict[str, Any]:
    """One catalog (``ballast_kib`` extra per model): both workers, the windows, the rows."""
    split = None if args.no_pin else cpu_split()
    client_cpus, server_cpus = split or (None, None)
    catalog = build_catalog(
        tmp / "models", args.count, seed=args.seed, ballast_bytes=ballast_kib * 1024
    )
    budgets = {
        "constrained": int(catalog.total_bytes / args.ratio),
        "resident": catalog.total_bytes,
    }
    sequence, by_rank = zipf_sequence(catalog.names, _SEQUENCE_LENGTH, seed=args.seed)
    fits = budgets["constrained"] // catalog.model_bytes
    print(
        f"catalog: {len(catalog.names)} x {catalog.model_bytes:,} B = "
        f"{catalog.total_bytes:,} B; constrained budget {budgets['constrained']:,} B "
        f"({fits} models, {top_share(len(catalog.names), fits):.0%} of the traffic)",
        flush=True,
    )
    servers: dict[str, Server] = {}
    affinity = os.sched_getaffinity(0) if client_cpus is not None else None
    try:
        servers = _start(tmp, catalog, budgets, server_cpus)
        ready = {m: s.wait_ready(catalog.names, args.startup_timeout) for m, s in servers.items()}
        if client_cpus is not None:
            os.sched_setaffinity(0, client_cpus)  # gRPC's threads, started later, inherit it
        rows = _measure(args, servers, sequence)
    finally:
        exits = {mode: server.stop() for mode, server in servers.items()}
        if affinity is not None:
            os.sched_setaffinity(0, affinity)
    return {
        "ballast_kib": ballast_kib,
        "catalog": {
            "models": len(catalog.names),
            "bytes_per_model": catalog.model_bytes,
            "ballast_bytes_per_model": catalog.ballast_bytes,
            "total_bytes": catalog.total_bytes,
            "budget_bytes": budgets,
            "models_within_budget": fits,
            "traffic_share_of_top_models_within_budget": top_share(len(catalog.names), fits),
            "zipf_s": ZIPF_S,
            "most_popular": by_rank[:10],
        },
        "log": {mode: _admitted(server) for mode, server in servers.items()},
        "ready_after_s": ready,
        "exit_status": exits,
        "modes": rows,
        "pinned": (
            {"client": sorted(client_cpus), "workers": sorted(server_cpus)}
            if client_cpus is not None and server_cpus is not None
            else None
        ),
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write ``<out>/density-cpu.{json,md}``."""
    args = _parser().parse_args(argv)
    if args.quick:
        args.count, args.ballast_kib, args.duration, args.rounds, args.warmup = 6, [0], 1, 1, 0.3
    elif args.suite:
        args.count, args.ballast_kib, args.duration, args.rounds = 60, [0, 1024], 10, 2
    description = machine("jax", "grpcio", "tritonclient")
    sections = []
    for ballast_kib in args.ballast_kib:
        with tempfile.TemporaryDirectory(prefix="rs-bench-density-") as name:
            sections.append(_section(args, Path(name), ballast_kib))
    report: dict[str, Any] = {
        "machine": description,
        "command": " ".join([".venv/bin/python -m bench.density", *(argv or sys.argv[1:])]),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "sections": sections,
    }
    report["figures"] = figures(sections)
    report["machine"]["loadavg_1m_after"] = loadavg()
    write_report(args.out, RESULT_NAME, report, markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
