"""The meta model vs the same pipeline chained by the client, through one real worker.

``pipeline`` (embed -> data-dependent row selection -> score) is served as a meta model; the
same two stages and the same glue run on the client as two ``tritonclient`` calls (the worker
exposes the sub-models for that: ``meta.expose_sub_models``). Both are measured side by side in
one run, at concurrency 1 (one synchronous client), alternating rounds::

    python -m bench.meta_pipeline [--requests 500] [--rounds 3] [--items 8] [--out bench/results]

Writes ``meta-pipeline-cpu.json`` and ``.md``: microseconds per pipeline for each way, and the
ratio (client-chained / meta; above 1 the meta is faster).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench._common import figure, machine, machine_line, write_report
from bench._grpc_servers import export_examples, start_worker

__all__ = ["RESULT_NAME", "main", "measure"]

RESULT_NAME = "meta-pipeline-cpu"


def _input(name: str, array: np.ndarray[Any, Any]) -> Any:
    import tritonclient.grpc as grpcclient

    tensor = grpcclient.InferInput(name, list(array.shape), "FP32")
    tensor.set_data_from_numpy(array)
    return tensor


def _select(emb: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The glue of examples/pipeline/meta.py: rows above the median norm, at least one."""
    norms = np.linalg.norm(emb, axis=1)
    keep = np.flatnonzero(norms > np.median(norms))
    return keep if keep.size else np.array([int(np.argmax(norms))])


def measure(url: str, *, requests: int, rounds: int, items: int) -> dict[str, list[float]]:
    """Microseconds per pipeline, per round, for ``meta`` and ``client_chained``."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    x = np.random.default_rng(0).standard_normal((items, 16)).astype(np.float32)

    def meta() -> Any:
        return client.infer("pipeline", [_input("items", x)]).as_numpy("scores")

    def client_chained() -> Any:
        emb = client.infer("pipeline_embed", [_input("x", x)]).as_numpy("emb")
        rows = np.ascontiguousarray(emb[_select(emb)])
        return client.infer("pipeline_score", [_input("emb", rows)]).as_numpy("score")[:, 0]

    np.testing.assert_allclose(meta(), client_chained(), rtol=1e-5, atol=1e-5)
    ways: dict[str, Callable[[], Any]] = {"meta": meta, "client_chained": client_chained}
    for way in ways.values():  # warm both paths
        for _ in range(min(50, requests)):
            way()
    results: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(rounds):
        for name, way in ways.items():
            started = time.perf_counter()
            for _ in range(requests):
                way()
            results[name].append((time.perf_counter() - started) / requests * 1e6)
    client.close()
    return results


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--items", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--quick", action="store_true", help="smoke run: 20 requests, 1 round")
    parser.add_argument(
        "--suite", action="store_true", help="the size `nox -s bench` runs: 200 requests x 3"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.rounds = 20, 1
    elif args.suite:
        args.requests, args.rounds = 200, 3
    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(scratch)
        models = tmp / "models"
        export_examples(models, ["pipeline"])
        worker = start_worker(
            tmp, models, {"REACTANTSERVER_WORKER_META_EXPOSE_SUB_MODELS": "true"}, None
        )
        try:
            worker.wait_ready(["pipeline", "pipeline_embed", "pipeline_score"], 300.0)
            runs = measure(worker.url, requests=args.requests, rounds=args.rounds, items=args.items)
        finally:
            worker.stop()
    median = {name: statistics.median(values) for name, values in runs.items()}
    report = {
        "machine": machine("grpcio", "tritonclient"),
        "items": args.items,
        "requests_per_round": args.requests,
        "us_per_pipeline": runs,
        "median_us": median,
        "client_chained_over_meta": median["client_chained"] / median["meta"],
    }
    ratio = report["client_chained_over_meta"]
    report["figures"] = [
        figure("client-chained / meta model time per pipeline (c=1)", ratio, "x"),
        figure("meta model time per pipeline (c=1)", median["meta"], "us"),
    ]
    lines = [
        "# Meta model vs client-chained pipeline (CPU, concurrency 1)",
        "",
        f"{args.items} items per request, {args.requests} requests x {args.rounds} rounds. "
        f"Machine: {machine_line(report['machine'])}",
        "",
        "| Way | µs per pipeline (median of rounds) |",
        "|---|---|",
        f"| meta model (`pipeline`, one request) | {median['meta']:.0f} |",
        f"| client-chained (two requests + NumPy glue) | {median['client_chained']:.0f} |",
        "",
        f"Ratio client-chained / meta: **{ratio:.2f}**",
        "",
    ]
    write_report(args.out, RESULT_NAME, report, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
