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
import importlib.metadata
import json
import os
import platform
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench._grpc_load import (
    INPUTS,
    MODELS,
    CpuSampler,
    Load,
    _sample_cpu,
    _Window,
    combine,
    run_load,
)
from bench._grpc_servers import Server, _free_port, cpu_split, export_examples, start_worker

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


def _rest_load(url: str, model: str, window: _Window, concurrency: int) -> None:
    """``concurrency`` threads, each a sync ``tritonclient.http`` client in a closed loop."""
    import tritonclient.http as httpclient

    def client(i: int) -> None:
        inputs, outputs, output, shape = _rest_inputs(model, i)
        triton = httpclient.InferenceServerClient(url, network_timeout=60.0)
        try:
            got = triton.infer(model, inputs, outputs=outputs).as_numpy(output)
            if got is None or tuple(got.shape) != shape:
                raise RuntimeError(f"output {output!r} is {got!r}, expected shape {shape}")
            while time.perf_counter_ns() < window.end_ns:
                begin = time.perf_counter_ns()
                try:
                    triton.infer(model, inputs, outputs=outputs).as_numpy(output)
                except Exception as exc:  # counted and reported
                    window.error(exc)
                    continue
                window.record(i, begin, time.perf_counter_ns())
        except Exception as exc:  # counted and reported
            window.error(exc)
        finally:
            triton.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


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
    window = _Window(concurrency, warmup_s, duration_s)
    cpu: dict[str, Any] = {}
    sampler = threading.Thread(target=_sample_cpu, args=(window, server_cpu, cpu), daemon=True)
    sampler.start()
    _rest_load(url, model, window, concurrency)
    sampler.join()
    return Load(
        model=model,
        concurrency=concurrency,
        client="threads",
        duration_s=duration_s,
        latencies_ns=[ns for per_client in window.latencies for ns in per_client],
        errors=window.errors,
        first_error=window.first_error,
        server_cpu=cpu.get("server"),
        client_cpu_s=cpu.get("client"),
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


def ratios(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """REST / gRPC at each (model, concurrency) where both ran."""
    grpc_rows = {(r["model"], r["concurrency"]): r for r in runs if r["protocol"] == "grpc"}
    out = []
    for r in runs:
        ref = grpc_rows.get((r["model"], r["concurrency"]))
        if r["protocol"] != "rest" or ref is None or not ref["requests_per_s"]:
            continue
        out.append(
            {
                "model": r["model"],
                "concurrency": r["concurrency"],
                "rest_requests_per_s": r["requests_per_s"],
                "grpc_requests_per_s": ref["requests_per_s"],
                "ratio": r["requests_per_s"] / ref["requests_per_s"],
                "p50_ratio": r["p50_ms"] / ref["p50_ms"] if ref["p50_ms"] else None,
                "p99_ratio": r["p99_ms"] / ref["p99_ms"] if ref["p99_ms"] else None,
            }
        )
    return out


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def markdown(report: dict[str, Any]) -> list[str]:
    """The report as Markdown lines."""
    args = report["args"]
    lines = [
        "# REST vs gRPC benchmark (CPU backend, one worker)",
        "",
        f"Machine: {report['machine']}, {report['cpus']} CPUs, Python {report['python']}, "
        f"jax {report['jax']}, grpcio {report['grpcio']}, aiohttp {report['aiohttp']}, "
        f"tritonclient {report['tritonclient']}.",
        "",
        f"Command: `{report['command']}`",
        "",
    ]
    for r in report["ratios"]:
        if (r["model"], r["concurrency"]) == HEADLINE:
            lines.append(
                f"- Tiny MLP at concurrency {HEADLINE[1]}: REST {r['rest_requests_per_s']:,.0f} "
                f"req/s = {r['ratio']:.2f} of gRPC's {r['grpc_requests_per_s']:,.0f} req/s; "
                f"p50 {_fmt(r['p50_ratio'], '.2f')}x, p99 {_fmt(r['p99_ratio'], '.2f')}x gRPC's."
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
            f"{r['mean_ms']:.3f} | {_fmt(r['server_cpu_us_per_request'], '.0f')} | "
            f"{_fmt(r['client_cpu_us_per_request'], '.0f')} | {r['errors']} |"
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
            f"{_fmt(r['p50_ratio'], '.2f')} | {_fmt(r['p99_ratio'], '.2f')} |"
        )
    if report["errors"]:
        lines += ["", "First error per run:", ""]
        lines += [f"- {e}" for e in report["errors"]]
    lines.append("")
    return lines


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
    return parser


def _versions() -> dict[str, str]:
    out = {}
    for dist in ("jax", "grpcio", "aiohttp", "tritonclient"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "-"
    return out


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
    split = None if args.no_pin else cpu_split()
    client_cpus, server_cpus = split or (None, None)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="rs-bench-rest-") as name:
        tmp = Path(name)
        models = args.models
        if models is None:
            models = tmp / "models"
            export_examples(models, args.model)
        http_port = _free_port()
        env = {"INFERENCE_SERVER_ENDPOINTS_METRICS_PORT": str(http_port)}
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
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        **_versions(),
        "command": " ".join([".venv/bin/python -m bench.rest", *(argv or sys.argv[1:])]),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "placement": _placement(
            None if client_cpus is None else sorted(client_cpus),
            None if server_cpus is None else sorted(server_cpus),
        ),
        "ready_after_s": ready_s,
        "exit_status": exit_status,
        "runs": runs,
        "ratios": ratios(runs),
        "errors": [
            f"{r['protocol']} {r['model']} c={r['concurrency']}: {r['first_error']}"
            for r in runs
            if r["first_error"]
        ],
    }
    lines = markdown(report)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{RESULT_NAME}.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / f"{RESULT_NAME}.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
