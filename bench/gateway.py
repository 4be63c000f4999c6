"""Gateway benchmark: added latency and two-worker scaling, side by side in one run.

Run from the repository root with the dev environment::

    .venv/bin/python -m bench.gateway [--requests N] [--out DIR] [--quick]

Exports the ``mlp`` and ``cnn`` examples into a temporary model repository and starts two
workers A and B (``python -m reactantserver.worker``, CPU backend, static model control, one
shared executable cache: B starts from A's executables) and two gateways
(``python -m reactantserver.gateway --config FILE``, ``round_robin``): ``gateway_1`` over {A} and
``gateway_2`` over {A, B}. Stock ``tritonclient.grpc`` in this process drives three targets,
``direct`` (worker A), ``gateway_1`` and ``gateway_2``, with ``concurrency`` closed-loop clients
sending one-row requests (``bench._gateway_load``):

1. **Added latency** on the tiny MLP (FP32 [1, 16]) at concurrency 1 and 8: p50, p99, req/s
   per target and overhead = (p50 via gateway - p50 direct) / p50 direct. Target: <= 25%.
2. **Two-worker scaling** on the CNN at concurrency 8 and 16: req/s through ``gateway_2`` vs
   ``gateway_1`` (and direct), with the share of requests each worker served.

Each (section, concurrency) runs ``--rounds`` rounds of one phase per target, the order
reversed every other round (A B C, C B A, ...), so the machine's drift falls on every target;
every client sends ``--warmup`` unmeasured requests before each phase. Writes
``gateway-cpu.json`` and ``gateway-cpu.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from bench._common import figure, free_port, loadavg, machine, write_report
from bench._gateway_load import CpuReader, Phase, closed_loop, combine
from bench._gateway_report import TARGET_OVERHEAD, derive, markdown
from bench._grpc_servers import (
    Server,
    cpu_split,
    export_examples,
    model_stats,
    start_worker,
    thread_cpu,
)

__all__ = ["RESULT_NAME", "TARGETS", "main", "start_gateway"]

ROOT = Path(__file__).resolve().parent.parent
RESULT_NAME = "gateway-cpu"
TARGETS = ("direct", "gateway_1", "gateway_2")
MODELS = ("mlp", "cnn")


def start_gateway(
    directory: Path,
    name: str,
    workers: Sequence[Server],
    cpus: frozenset[int] | None,
    *,
    settings: Mapping[str, Any] | None = None,
) -> Server:
    """Start ``python -m reactantserver.gateway --config FILE`` over ``workers``: round_robin,
    status every second, unless ``settings`` (top-level config keys) say otherwise."""
    port = free_port()
    config: dict[str, Any] = {
        "listen": {"grpc": f"127.0.0.1:{port}", "metrics": f"127.0.0.1:{free_port()}"},
        "endpoints": [w.url for w in workers],
        "worker_names": [w.name for w in workers],
        "health": {"interval_seconds": 1.0},
        "logging": {"level": "warning"},
        "scheduling": {"mode": "round_robin"},
        **(settings or {}),
    }
    config_file = directory / f"{name}.yml"
    config_file.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if not k.startswith("REACTANTSERVER_GATEWAY_")}
    argv = [sys.executable, "-m", "reactantserver.gateway", "--config", str(config_file)]
    return Server(name, argv, env, port, directory / f"{name}.log", cpus=cpus)


def _cpu_reader(server: Server) -> CpuReader:
    def read() -> float | None:
        groups = thread_cpu(server.proc.pid)
        return None if groups is None else sum(groups.values())

    return read


def _counts(workers: dict[str, Server], model: str) -> dict[str, int]:
    out = {}
    for name, worker in workers.items():
        stats = model_stats(worker.url, model)
        out[name] = stats["inference_count"] if stats else 0
    return out


def _section(
    args: argparse.Namespace,
    servers: dict[str, Server],
    *,
    model: str,
    concurrencies: Sequence[int],
    rows_per_request: int = 1,
) -> list[dict[str, Any]]:
    """Per concurrency: ``--rounds`` rounds of one phase per target, alternating order."""
    urls = {
        "direct": servers["worker_a"].url,
        "gateway_1": servers["gateway_1"].url,
        "gateway_2": servers["gateway_2"].url,
    }
    cpu = {name: _cpu_reader(server) for name, server in servers.items()}
    workers = {"worker_a": servers["worker_a"], "worker_b": servers["worker_b"]}
    rows = []
    for concurrency in concurrencies:
        phases: dict[str, list[Phase]] = {t: [] for t in TARGETS}
        served: dict[str, dict[str, int]] = {t: dict.fromkeys(workers, 0) for t in TARGETS}
        for r in range(args.rounds):
            for target in TARGETS if r % 2 == 0 else TARGETS[::-1]:
                before = _counts(workers, model)
                phases[target].append(
                    closed_loop(
                        urls[target],
                        model,
                        target=target,
                        concurrency=concurrency,
                        requests=args.requests,
                        warmup=args.warmup,
                        cpu=cpu,
                        rows=rows_per_request,
                    )
                )
                after = _counts(workers, model)
                for w in workers:
                    served[target][w] += after[w] - before[w]
        for target in TARGETS:
            row = combine(phases[target]).summary()
            row["served_by_worker"] = served[target]
            rows.append(row)
            print(
                f"{model:4s} c={concurrency:<3d} {target:9s} {row['requests_per_s']:8,.0f} req/s"
                f"  p50 {row['p50_ms']:.3f} ms  p99 {row['p99_ms']:.3f} ms"
                f"  served {served[target]}  errors {row['errors']}",
                flush=True,
            )
    return rows


def figures(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The headlines: p50 added by one gateway (MLP) per concurrency against the 25% target,
    and the two-worker gateway's req/s over the one-worker gateway's (CNN)."""
    out = []
    for o in report["overhead"]:
        if o["gateway"] != "gateway_1" or o["p50_overhead"] is None:
            continue
        out += [
            figure(
                f"gateway p50 overhead (mlp, c={o['concurrency']})",
                o["p50_overhead"] * 100,
                "%",
                target=f"<= {TARGET_OVERHEAD:.0%}",
                met=o["target_met"],
            ),
            figure(f"gateway p50 added (mlp, c={o['concurrency']})", o["p50_added_ms"], "ms"),
        ]
    for r in report["scaling_ratios"]:
        out.append(
            figure(
                f"2 workers / 1 worker req/s via gateway (cnn, c={r['concurrency']})",
                r["two_over_one_gateway"],
                "x",
            )
        )
    return out


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument(
        "--requests", type=int, default=1500, help="measured requests per target, phase and round"
    )
    parser.add_argument("--rounds", type=int, default=3, help="phases per target and point")
    parser.add_argument(
        "--warmup", type=int, default=20, help="unmeasured requests per client before each phase"
    )
    parser.add_argument(
        "--latency-concurrency", type=int, nargs="+", default=[1, 8], help="MLP section"
    )
    parser.add_argument(
        "--scaling-concurrency", type=int, nargs="+", default=[8, 16], help="CNN section"
    )
    parser.add_argument(
        "--scaling-rows",
        type=int,
        default=32,
        help="images per CNN request (the example compiles batch sizes 1, 4, 8, 32)",
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="run this process on the first CPU and every server on the others "
        "(default: all processes share every CPU)",
    )
    parser.add_argument(
        "--startup-timeout", type=float, default=300.0, help="seconds to wait for readiness"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 40 requests per phase, one round, 3 warm-up requests per client",
    )
    parser.add_argument(
        "--suite",
        action="store_true",
        help="the size `nox -s bench` runs: 400 requests per phase, two rounds",
    )
    return parser


def _start(
    tmp: Path, args: argparse.Namespace, cpus: frozenset[int] | None, servers: dict[str, Server]
) -> dict[str, float]:
    """Workers A then B (B compiles nothing: same cache), then both gateways; ready times."""
    models = tmp / "models"
    export_examples(models, MODELS)
    cache = {"REACTANTSERVER_WORKER_CACHE_DIR": str(tmp / "cache")}
    ready: dict[str, float] = {}
    steps: list[tuple[str, Callable[[], Server]]] = [
        ("worker_a", lambda: start_worker(_dir(tmp, "a"), models, cache, cpus)),
        ("worker_b", lambda: start_worker(_dir(tmp, "b"), models, cache, cpus)),
        (
            "gateway_1",
            lambda: start_gateway(tmp, "gateway_1", [servers["worker_a"]], cpus),
        ),
        (
            "gateway_2",
            lambda: start_gateway(
                tmp, "gateway_2", [servers["worker_a"], servers["worker_b"]], cpus
            ),
        ),
    ]
    for name, start in steps:
        server = servers[name] = start()
        server.name = name
        ready[name] = server.wait_ready(MODELS, args.startup_timeout)
        print(f"{name} ready in {ready[name]:.1f} s at {server.url}", flush=True)
    return ready


def _dir(tmp: Path, name: str) -> Path:
    path = tmp / name
    path.mkdir(exist_ok=True)
    return path


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write JSON + Markdown under ``--out``."""
    args = _parser().parse_args(argv)
    if args.quick:
        args.requests, args.rounds, args.warmup = 40, 1, 3
    elif args.suite:
        args.requests, args.rounds, args.warmup = 400, 2, 10
    split = cpu_split() if args.pin else None
    client_cpus, server_cpus = split or (None, None)
    servers: dict[str, Server] = {}
    load_before = loadavg()
    with tempfile.TemporaryDirectory(prefix="rs-bench-gateway-") as name:
        tmp = Path(name)
        try:
            ready = _start(tmp, args, server_cpus, servers)
            if client_cpus is not None:
                os.sched_setaffinity(0, client_cpus)
            latency = _section(args, servers, model="mlp", concurrencies=args.latency_concurrency)
            scaling = _section(
                args,
                servers,
                model="cnn",
                concurrencies=args.scaling_concurrency,
                rows_per_request=args.scaling_rows,
            )
        finally:
            # Gateways first, so they do not see their workers go away.
            exits = {n: servers[n].stop() for n in reversed(list(servers))}
    report: dict[str, Any] = {
        "machine": {
            **machine("jax", "grpcio", "tritonclient", "uvloop"),
            "loadavg_1m": {"before": load_before, "after": loadavg()},
        },
        "command": " ".join([".venv/bin/python -m bench.gateway", *(argv or sys.argv[1:])]),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "pinned": (
            {"client": sorted(client_cpus), "servers": sorted(server_cpus)}
            if client_cpus is not None and server_cpus is not None
            else None
        ),
        "ready_after_s": ready,
        "exit_status": exits,
        "latency": latency,
        "scaling": scaling,
        "errors": [
            f"{r['target']} {r['model']} c={r['concurrency']}: {r['first_error']}"
            for r in latency + scaling
            if r["first_error"]
        ],
    }
    report.update(derive(report))
    report["figures"] = figures(report)
    write_report(args.out, RESULT_NAME, report, markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
