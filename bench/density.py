"""Density benchmark: a catalog 5x the weight budget on honest (CPU arena) loads vs all-resident.

Run from the repository root with the dev environment::

    .venv/bin/python -m bench.density --out bench/results

Builds ``--count`` (20) copies of the ``deep`` MLP (``bench/_density_catalog.py``: ~100 MB of
distinct weights each, a ResNet-50's size; its batch-1 execution applies the largest layer four
times, so it costs about 1.6x a load of its weights, as a ResNet-50 does on a GPU;
``--kind heavy`` reads every weight once instead, a load then costing 1.5-2x an execution) and
starts workers on it whose weight loads are real copies into a CPU arena
(``runtime.cpu_arena_bytes``): ``resident``, whose budget and arena hold the whole catalog, and
for each variant a ``constrained`` one whose budget (``weight_cache_max_bytes``) is the catalog
/ ``--ratio`` (5) and whose arena is that plus one model. Variants: arena copies ``uncapped``
and ``capped`` at ``--cap-gbps`` (25 GB/s, PCIe-like). In each variant both workers serve a
Zipf(1.1) trace closed-loop in alternating windows and a bursty on/off trace open-loop
(``bench/_density_measure.py``). Reported per variant and trace: req/s and p99 constrained vs
resident, loads and evictions per 1000 requests next to Belady's offline optimum for the same
sequence and slots, and the ratio of one load's time to one batch-1 execution (the worker's
own counters). Targets (issue 37): throughput >= 0.7x and p99 <= 3x all-resident under Zipf,
loads <= 1.5x Belady's, load / execution between 0.5 and 2.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench import _density_measure as measure
from bench._common import loadavg, machine, write_report
from bench._density_catalog import Catalog, build_catalog, top_share, zipf_sequence
from bench._density_report import figures, markdown
from bench._density_workers import ArenaSettings, batch1_execution_ms, start_density_worker
from bench._grpc_servers import Server, cpu_split
from bench._traces import Arrival, bursty_trace

__all__ = ["RESULT_NAME", "main"]

ROOT = Path(__file__).resolve().parent.parent
RESULT_NAME = "density-cpu"
_SEQUENCE_LENGTH = 200_000
#: The rate the bursty trace is drawn at before it is paced to the resident worker's.
_NOMINAL_RATE = 100.0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--count", type=int, default=20, help="models in the catalog")
    parser.add_argument(
        "--kind", default="deep", help="catalog base model: deep (default), heavy or cnn"
    )
    parser.add_argument("--ratio", type=float, default=5.0, help="catalog bytes / budget")
    parser.add_argument("--cap-gbps", type=float, default=25.0, help="the capped variant's link")
    parser.add_argument("--concurrency", type=int, default=16, help="closed-loop Zipf clients")
    parser.add_argument("--rounds", type=int, default=3, help="Zipf windows per worker")
    parser.add_argument("--window", type=float, default=8.0, help="seconds per Zipf window")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds before each window")
    parser.add_argument(
        "--bursty-s", type=float, default=40.0, help="bursty trace length at 100 req/s"
    )
    parser.add_argument(
        "--bursty-load",
        type=float,
        default=0.5,
        help="bursty mean rate as a fraction of the resident worker's Zipf req/s",
    )
    parser.add_argument("--clients", type=int, default=32, help="open-loop replay clients")
    parser.add_argument("--seed", type=int, default=13, help="weights and traffic seed")
    parser.add_argument("--startup-timeout", type=float, default=300.0)
    sized = parser.add_mutually_exclusive_group()
    sized.add_argument("--quick", action="store_true", help="smoke run: 6 small models, seconds")
    sized.add_argument("--suite", action="store_true", help="the `nox -s bench` size (~5 min)")
    return parser


def copy_bandwidth(nbytes: int, repeats: int = 5) -> list[float]:
    """GB/s of copies of ``nbytes`` into memory already touched (what an arena load is)."""
    src = np.random.default_rng(0).standard_normal(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        out.append(src.nbytes / (time.perf_counter() - start) / 1e9)
    return out


def nominal_bursty(catalog: Catalog, args: argparse.Namespace) -> list[Arrival]:
    """The bursty trace at :data:`_NOMINAL_RATE`: the same requests in every run."""
    return bursty_trace(catalog.names, duration_s=args.bursty_s, rate=_NOMINAL_RATE, seed=args.seed)


def paced(trace: Sequence[Arrival], rate: float) -> list[Arrival]:
    """``trace`` (at :data:`_NOMINAL_RATE`) sped up or slowed down to a mean of ``rate``/s:
    the same requests in the same order, so Belady's count does not move with the machine."""
    scale = _NOMINAL_RATE / rate
    return [Arrival(a.at_s * scale, a.model) for a in trace]


def _variant(
    args: argparse.Namespace,
    servers: dict[str, Server],
    catalog: Catalog,
    name: str,
    bursty: dict[str, Any],
) -> dict[str, Any]:
    """Both traces on the resident worker and this variant's constrained one."""
    slots = int(args.budget // catalog.model_bytes)
    exec_ms = batch1_execution_ms(servers["resident"], catalog, catalog.names, args.exec_s)
    sequence, _ = zipf_sequence(catalog.names, _SEQUENCE_LENGTH, seed=args.seed)
    print(f"{name}: batch-1 execution {exec_ms:.2f} ms; Zipf", flush=True)
    zipf = measure.zipf(
        servers,
        catalog,
        sequence,
        slots=slots,
        concurrency=args.concurrency,
        rounds=args.rounds,
        window_s=args.window,
        warmup_s=args.warmup,
    )
    if "trace" not in bursty:
        bursty["rate"] = args.bursty_load * zipf["modes"][1]["requests_per_s"]
        bursty["trace"] = paced(nominal_bursty(catalog, args), bursty["rate"])
    print(f"{name}: bursty at {bursty['rate']:.1f} req/s", flush=True)
    order = measure.MODES if name == "uncapped" else measure.MODES[::-1]
    burst = measure.bursty(
        servers, catalog, bursty["trace"], slots=slots, clients=args.clients, order=order
    )
    rows = [t["modes"][0] for t in (zipf, burst) if t["modes"][0]["ms_per_load"]]
    count = sum(r["weight_loads"] for r in rows)
    load_ms = sum(r["ms_per_load"] * r["weight_loads"] for r in rows) / count if count else None
    return {
        "variant": name,
        "slots": slots,
        "batch1_execution_ms": exec_ms,
        "load_ms": load_ms,
        "load_to_execution": load_ms / exec_ms if load_ms and exec_ms else None,
        "traces": [zipf, burst],
    }


def _run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    split = cpu_split()
    client_cpus, server_cpus = split or (None, None)
    catalog = build_catalog(tmp / "models", args.count, seed=args.seed, kind=args.kind)
    budget = args.budget = int(catalog.total_bytes / args.ratio)
    slots = budget // catalog.model_bytes
    bandwidth = copy_bandwidth(catalog.model_bytes)
    print(
        f"catalog: {args.count} x {catalog.model_bytes:,} B; budget {budget:,} B ({slots} models)"
        f"; copy bandwidth {min(bandwidth):.1f}-{max(bandwidth):.1f} GB/s",
        flush=True,
    )
    arenas = {
        "resident": ArenaSettings.for_budget(catalog.total_bytes, catalog.model_bytes, 0.0),
        "uncapped": ArenaSettings.for_budget(budget, catalog.model_bytes, 0.0),
        "capped": ArenaSettings.for_budget(budget, catalog.model_bytes, args.cap_gbps * 1e9),
    }
    cache = tmp / "cache"  # one executable cache: only the first worker compiles
    servers: dict[str, Server] = {}
    variants: list[dict[str, Any]] = []
    exits: dict[str, int | None] = {}
    bursty: dict[str, Any] = {}
    affinity = os.sched_getaffinity(0) if client_cpus is not None else None
    try:
        servers["resident"] = start_density_worker(
            tmp / "resident", catalog, arenas["resident"], cache, server_cpus
        )
        servers["resident"].wait_ready(catalog.names, args.startup_timeout)
        if client_cpus is not None:
            os.sched_setaffinity(0, client_cpus)  # gRPC's threads, started later, inherit it
        for name in ("uncapped", "capped"):
            server = start_density_worker(tmp / name, catalog, arenas[name], cache, server_cpus)
            servers["constrained"] = server
            try:
                server.wait_ready(catalog.names, args.startup_timeout)
                variants.append(_variant(args, servers, catalog, name, bursty))
            finally:
                exits[name] = server.stop()
    finally:
        exits["resident"] = servers["resident"].stop() if "resident" in servers else None
        if affinity is not None:
            os.sched_setaffinity(0, affinity)
    return {
        "catalog": {
            "kind": catalog.kind,
            "models": len(catalog.names),
            "bytes_per_model": catalog.model_bytes,
            "total_bytes": catalog.total_bytes,
            "budget_bytes": budget,
            "slots": slots,
            "traffic_share_of_top_models_within_budget": top_share(len(catalog.names), slots),
        },
        "arenas": {k: _arena(v) for k, v in arenas.items()},
        "copy_bandwidth_gb_per_s": bandwidth,
        "bursty_rate_per_s": bursty.get("rate"),
        "bursty_requests": len(bursty.get("trace", ())),
        "exit_status": exits,
        "variants": variants,
        "pinned": None
        if client_cpus is None or server_cpus is None
        else {"client": sorted(client_cpus), "workers": sorted(server_cpus)},
    }


def _arena(arena: ArenaSettings) -> dict[str, Any]:
    return {
        "budget_bytes": arena.budget_bytes,
        "arena_bytes": arena.arena_bytes,
        "bandwidth_bytes_per_s": arena.bandwidth_bytes_per_s,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write ``<out>/density-cpu.{json,md}``."""
    args = _parser().parse_args(argv)
    args.exec_s = 2.0
    if args.quick:
        args.kind, args.count, args.rounds, args.window, args.warmup = "cnn", 6, 1, 1.0, 0.3
        args.bursty_s, args.concurrency, args.clients, args.exec_s = 3.0, 4, 8, 0.5
    elif args.suite:
        args.rounds, args.window, args.bursty_s = 2, 6.0, 30.0
    description = machine("jax", "grpcio", "tritonclient")
    with tempfile.TemporaryDirectory(prefix="rs-bench-density-") as name:
        result = _run(args, Path(name))
    report: dict[str, Any] = {
        "machine": description,
        "command": " ".join([".venv/bin/python -m bench.density", *(argv or sys.argv[1:])]),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        **result,
    }
    report["figures"] = figures(report)
    report["machine"]["loadavg_1m_after"] = loadavg()
    write_report(args.out, RESULT_NAME, report, markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
