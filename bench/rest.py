"""REST vs gRPC benchmark: stock ``tritonclient.http`` and ``tritonclient.grpc``, one worker.

Run from the repository root with the dev environment::

    .venv/bin/python -m bench.rest --out bench/results

Exports the ``mlp`` example (``--model cnn`` adds or replaces it) into a temporary model
repository, starts ``python -m reactantserver.worker --model-repo DIR`` once, and drives its
gRPC port with ``tritonclient.grpc`` and its HTTP port (KServe V2 REST, the binary tensor
extension for inputs and outputs) with ``tritonclient.http`` from this process:
``--concurrency`` closed-loop clients (default 8), one thread and one ``InferenceServerClient``
each, sending one-row requests. At each point the two protocols' windows alternate, so the
machine's drift falls on both. Reports requests/s and p50/p99 latency per (protocol, model,
concurrency), the CPU time the worker and the client spent per request, and the REST / gRPC
ratios.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench._common import error_lines, figure, fmt, free_port, machine, machine_line, write_report
from bench._grpc_load import (
    INPUTS,
    MODELS,
    CpuSampler,
    Load,
    Window,
    closed_loop,
    combine,
    on_threads,
    run_load,
    run_window,
)
from bench._grpc_report import ratios
from bench._grpc_servers import Server, cpu_split, export_examples, start_worker

ROOT = Path(__file__).resolve().parent.parent
PROTOCOLS = ("grpc", "rest")
RESULT_NAME = "rest-cpu"
HEADLINE = ("mlp", 8)


def _rest_inputs(model: str, seed: int) -> tuple[list[Any], list[Any], str, tuple[int, ...]]:
    import tritonclient.http as httpclient

    name, shape, output, out_shape = INPUTS[model]
    data = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    tensor = httpclient.InferInput(name, list(shape), "FP32")
    tensor.set_data_from_numpy(data, binary_data=True)
    outputs = [httpclient.InferRequestedOutput(output, binary_data=True)]
    return [tensor], outputs, output, out_shape


def _rest_load(url: str, model: str, window: Window, concurrency: int) -> None:
    """``concurrency`` threads, each a sync ``tritonclient.http`` client in a closed loop."""
    import tritonclient.http as httpclient

    def client(i: int) -> None:
        inputs, outputs, output, shape = _rest_inputs(model, i)
        triton = httpclient.InferenceServerClient(url, network_timeout=60.0)

        def check(got: Any) -> None:
            if got is None or tuple(got.shape) != shape:
                raise RuntimeError(f"output {output!r} is {got!r}, expected shape {shape}")

        try:
            closed_loop(
                window,
                i,
                lambda: triton.infer(model, inputs, outputs=outputs).as_numpy(output),
                check,
            )
        finally:
            triton.close()

    on_threads(concurrency, client)


def run_rest_load(
    url: str,
    model: str,
    *,
    concurrency: int,
    warmup_s: float,
    duration_s: float,
    server_cpu: CpuSampler,
) -> Load:
    """Like :func:`bench._grpc_load.run_load` (``threads``), over REST at ``url``."""
    return run_window(
        lambda window: _rest_load(url, model, window, concurrency),
        model=model,
        concurrency=concurrency,
        client="threads",
        warmup_s=warmup_s,
        duration_s=duration_s,
        server_cpu=server_cpu,
    )


def _row(protocol: str, load: Load) -> dict[str, Any]:
    row: dict[str, Any] = {"protocol": protocol, **load.summary()}
    n = load.requests
    row["server_cpu_us_per_request"] = (
        load.server_cpu_s / n * 1e6 if load.server_cpu_s is not None and n else None
    )
    print(
        f"{protocol:4s} {load.model:4s} c={load.concurrency:<3d}"
        f"{row['requests_per_s']:9,.0f} req/s  p50 {row['p50_ms']:.3f} ms"
        f"  p99 {row['p99_ms']:.3f} ms  errors {load.errors}",
        flush=True,
    )
    return row


def _point(
    args: argparse.Namespace, worker: Server, http_url: str, model: str, concurrency: int
) -> list[dict[str, Any]]:
    """``--rounds`` alternating windows per protocol at one (model, concurrency)."""
    loads: dict[str, list[Load]] = {p: [] for p in PROTOCOLS}
    window = {
        "concurrency": concurrency,
        "warmup_s": args.warmup,
        "duration_s": args.duration / args.rounds,
        "server_cpu": worker.cpu_seconds,
    }
    for _ in range(args.rounds):
        loads["grpc"].append(run_load(worker.url, model, kind="threads", **window))
        loads["rest"].append(run_rest_load(http_url, model, **window))
    return [_row(p, combine(loads[p])) for p in PROTOCOLS]


def markdown(report: dict[str, Any]) -> list[str]:
    """The report as Markdown lines."""
    args, m = report["args"], report["machine"]
    lines = [
        "# REST vs gRPC benchmark (CPU backend, one worker)",
        "",
        f"Machine: {machine_line(m)} jax {m['jax']}, grpcio {m['grpcio']}, "
        f"aiohttp {m['aiohttp']}, tritonclient {m['tritonclient']}.",
        "",
        f"Command: `{report['command']}`",
        "",
    ]
    for r in report["ratios"]:
        if (r["model"], r["concurrency"]) == HEADLINE:
            lines.append(
                f"- Tiny MLP at concurrency {HEADLINE[1]}: REST {r['rest_requests_per_s']:,.0f} "
                f"req/s = {r['ratio']:.2f} of gRPC's {r['grpc_requests_per_s']:,.0f} req/s; "
                f"p50 {fmt(r['p50_ratio'], '.2f')}x, p99 {fmt(r['p99_ratio'], '.2f')}x gRPC's."
            )
    lines += [
        "",
        f"## Requests/s and latency (one-row requests, {args['duration']:g} s per protocol and "
        f"point in {args['rounds']} windows, each after {args['warmup']:g} s warm-up)",
        "",
        "Closed loop: each of `concurrency` client threads has its own `InferenceServerClient` "
        "(its own connection) and sends its next request when the previous answer is decoded "
        "(`as_numpy`). `grpc` = `tritonclient.grpc` to the worker's gRPC port; `rest` = "
        "`tritonclient.http` to its HTTP port with binary inputs and outputs (the binary "
        "tensor extension). Same worker, same run, windows alternating. " + report["placement"],
        "",
        "| protocol | model | concurrency | req/s | p50 (ms) | p99 (ms) | mean (ms) | "
        "worker CPU / req (us) | client CPU / req (us) | errors |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["runs"]:
        lines.append(
            f"| {r['protocol']} | {r['model']} | {r['concurrency']} | "
            f"{r['requests_per_s']:,.0f} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} | "
            f"{r['mean_ms']:.3f} | {fmt(r['server_cpu_us_per_request'], '.0f')} | "
            f"{fmt(r['client_cpu_us_per_request'], '.0f')} | {r['errors']} |"
        )
    lines += [
        "",
        "## REST / gRPC",
        "",
        "| model | concurrency | REST req/s | gRPC req/s | REST / gRPC | p50 REST / gRPC | "
        "p99 REST / gRPC |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in report["ratios"]:
        lines.append(
            f"| {r['model']} | {r['concurrency']} | {r['rest_requests_per_s']:,.0f} | "
            f"{r['grpc_requests_per_s']:,.0f} | {r['ratio']:.2f} | "
            f"{fmt(r['p50_ratio'], '.2f')} | {fmt(r['p99_ratio'], '.2f')} |"
        )
    lines += error_lines(report["errors"])
    lines.append("")
    return lines


def figures(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The headline: REST / gRPC req/s on the tiny MLP at concurrency 8 (no target); values
    are None where that point did not run or answered nothing."""
    r = next((r for r in rows if (r["model"], r["concurrency"]) == HEADLINE), {})
    return [
        figure("REST / gRPC req/s (mlp, c=8)", r.get("ratio"), "x"),
        figure("REST req/s (mlp, c=8)", r.get("rest_requests_per_s"), "req/s"),
        figure("gRPC req/s (mlp, c=8)", r.get("grpc_requests_per_s"), "req/s"),
    ]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument(
        "--models", type=Path, default=None, help="model repository (default: export examples)"
    )
    parser.add_argument(
        "--duration", type=float, default=6.0, help="measured seconds per protocol and point"
    )
    parser.add_argument("--rounds", type=int, default=3, help="alternating windows per point")
    parser.add_argument("--warmup", type=float, default=0.5, help="seconds before each window")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8])
    parser.add_argument("--model", nargs="+", choices=MODELS, default=["mlp"])
    parser.add_argument("--startup-timeout", type=float, default=300.0)
    parser.add_argument(
        "--no-pin",
        action="store_true",
        help="let client and worker share every CPU (default: the client on the first CPU)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: one 0.5 s window per protocol and point"
    )
    parser.add_argument(
        "--suite", action="store_true", help="the size `nox -s bench` runs: 3 s per protocol"
    )
    return parser


def _placement(client: Sequence[int] | None, server: Sequence[int] | None) -> str:
    if client is None or server is None:
        return "Client and worker share every CPU (`--no-pin`)."
    return (
        f"The client process runs on CPU {', '.join(map(str, client))} and the worker on CPU "
        f"{', '.join(map(str, server))} (thread affinity)."
    )


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write JSON + Markdown under ``--out``."""
    args = _parser().parse_args(argv)
    if args.quick:
        args.duration, args.rounds, args.warmup = 0.5, 1, 0.2
    elif args.suite:
        args.duration, args.rounds, args.warmup = 3.0, 3, 0.3
    split = None if args.no_pin else cpu_split()
    client_cpus, server_cpus = split or (None, None)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="rs-bench-rest-") as name:
        tmp = Path(name)
        models = args.models
        if models is None:
            models = tmp / "models"
            export_examples(models, args.model)
        http_port = free_port()
        env = {"REACTANTSERVER_WORKER_ENDPOINTS_METRICS_PORT": str(http_port)}
        worker = start_worker(tmp, models, env, server_cpus)
        try:
            if client_cpus is not None:
                os.sched_setaffinity(0, client_cpus)  # before any client thread exists
            ready_s = worker.wait_ready(args.model, args.startup_timeout)
            print(f"worker ready in {ready_s:.1f} s at {worker.url}", flush=True)
            http_url = f"127.0.0.1:{http_port}"
            for concurrency in args.concurrency:
                for model in args.model:
                    runs += _point(args, worker, http_url, model, concurrency)
        finally:
            exit_status = worker.stop()

    report: dict[str, Any] = {
        "machine": machine("jax", "grpcio", "aiohttp", "tritonclient"),
        "command": " ".join([".venv/bin/python -m bench.rest", *(argv or sys.argv[1:])]),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "placement": _placement(
            None if client_cpus is None else sorted(client_cpus),
            None if server_cpus is None else sorted(server_cpus),
        ),
        "ready_after_s": ready_s,
        "exit_status": exit_status,
        "runs": runs,
        "ratios": ratios(runs, key="protocol", subject="rest", reference="grpc"),
        "errors": [
            f"{r['protocol']} {r['model']} c={r['concurrency']}: {r['first_error']}"
            for r in runs
            if r["first_error"]
        ],
    }
    report["figures"] = figures(report["ratios"])
    write_report(args.out, RESULT_NAME, report, markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
