"""Worker-runtime benchmark: on-demand weight loads and executable-cache start-up.

Run from the repository root with the dev environment::

    .venv/bin/python -m bench.runtime --out bench/results

Two measurements, each a ratio of two things timed side by side in one run:

1. **On-demand load vs raw copy.** A model with ~100 MB of weights is loaded through the
   loader and the LRU weight cache (budget too small for two models, so every acquire
   reloads). Its load time is compared with ``backend.to_device`` of the same host arrays.
   Target: PINNED_SYSTEM load <= 1.5x the raw copy. UNPINNED adds the file read.
2. **Cold compile vs cache hit.** Every bundle under ``--models`` (default: the examples,
   exported into a temporary directory) is loaded in a fresh process with an empty
   executable cache, then again in a fresh process with the warm cache. Target: the hit
   start-up <= 10% of the cold one (compile time only; process start and imports are
   reported separately).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._common import figure, machine, machine_line, write_report
from bench._grpc_servers import export_examples

ROOT = Path(__file__).resolve().parent.parent
RESULT_NAME = "runtime-cpu"

LAYERS = 6
WIDTH = 2048  # 6 x 2048 x 2048 x 4 B = ~100.7 MB of f32 weights
REPEATS = 7
#: The issue's targets: PINNED_SYSTEM load <= 1.5x the raw copy; cache-hit start-up <= 10%.
TARGET_LOAD_RATIO = 1.5
TARGET_HIT_RATIO = 0.10


def _build_big_model(root: Path, width: int) -> Path:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import yaml
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    weights = {
        f"layer{i}/w": (rng.standard_normal((width, width)) / width).astype(np.float32)
        for i in range(LAYERS)
    }

    def fn(x: jax.Array, *ws: jax.Array) -> jax.Array:
        for w in ws:
            x = jnp.tanh(x @ w)
        return x

    bundle = root / "big"
    bundle.mkdir(parents=True)
    args = [jax.ShapeDtypeStruct((1, width), jnp.float32)]
    args += [jax.ShapeDtypeStruct(w.shape, w.dtype) for w in weights.values()]
    exported = jax.export.export(jax.jit(fn, keep_unused=True), platforms=("cpu",))(*args)
    (bundle / "model.b1.mlir").write_bytes(exported.mlir_module_serialized)
    save_file(
        weights,
        str(bundle / "weights.safetensors"),
        metadata={"argument_order": json.dumps(list(weights))},
    )
    tensor = {"dtype": "f32", "shape": "nk", "dims": {"k": width}}
    (bundle / "manifest.yaml").write_text(
        yaml.safe_dump(
            {
                "format_version": "3.0",
                "executable_inputs": [{"name": "x", **tensor}],
                "executable_outputs": [{"name": "y", **tensor}],
                "batching": {"compiled_batch_sizes": [1]},
            }
        )
    )
    return bundle


def bench_weight_loads(
    workdir: Path, *, width: int = WIDTH, repeats: int = REPEATS
) -> dict[str, Any]:
    """Time on-demand loads through the cache against raw copies of the same bytes."""
    from reactantserver.core.weights import PrivateWeightStore
    from reactantserver.worker.runtime import (
        ExecutableCache,
        Residency,
        WeightCache,
        load_bundle,
    )
    from reactantserver.worker.runtime.jax_backend import JaxBackend

    backend = JaxBackend("cpu")
    model = load_bundle(_build_big_model(workdir, width), backend, ExecutableCache(None, backend))
    nbytes = model.weight_nbytes
    host = model.read_weights()
    results: dict[str, Any] = {"weight_bytes": nbytes, "repeats": repeats}

    def raw_copy() -> float:
        start = time.perf_counter()
        bufs = [backend.to_device(a) for a in host]
        elapsed = time.perf_counter() - start
        for b in bufs:
            backend.free(b)
        return elapsed

    def host_memcpy() -> float:
        # Reference scale: on the CPU backend device_put may alias host memory, so a plain
        # host copy of the same bytes shows what a real copy costs on this machine.
        start = time.perf_counter()
        copies = [a.copy() for a in host]
        elapsed = time.perf_counter() - start
        del copies
        return elapsed

    results["host_memcpy_s_median"] = statistics.median(host_memcpy() for _ in range(repeats))
    for floor in (Residency.PINNED_SYSTEM, Residency.UNPINNED):
        # Budget for exactly this model; a second (tiny) model evicts it between acquires.
        cache = WeightCache(backend, budget=nbytes)
        store = PrivateWeightStore()
        cache.add_model("big", model.weight_source(store), floor)
        loads, raws = [], []
        for _ in range(repeats):
            raws.append(raw_copy())
            before = cache.load_seconds
            cache.acquire("big")
            loads.append(cache.load_seconds - before)
            cache.evict_unpinned()
        results[floor.name.lower()] = {
            "load_s_median": statistics.median(loads),
            "raw_copy_s_median": statistics.median(raws),
            "ratio": statistics.median(loads) / statistics.median(raws),
            "load_gbps": nbytes / statistics.median(loads) / 1e9,
        }
        cache.remove_model("big")
    model.close()
    return results


_START = """
import json, sys, time
t0 = time.perf_counter()
from pathlib import Path
from reactantserver.worker.runtime.jax_backend import JaxBackend
from reactantserver.worker.runtime import ExecutableCache, load_bundle
backend = JaxBackend("cpu")
t1 = time.perf_counter()
cache = ExecutableCache(Path(sys.argv[2]), backend)
t2 = time.perf_counter()
names = []
for bundle in sorted(Path(sys.argv[1]).iterdir()):
    manifest = bundle / "manifest.yaml"
    if manifest.exists() and "kind: meta" not in manifest.read_text():
        load_bundle(bundle, backend, cache).close()
        names.append(bundle.name)
t3 = time.perf_counter()
print(json.dumps({"imports_s": t1 - t0, "load_s": t3 - t2, "compiles": cache.counters.compiles,
                  "hits": cache.counters.hits, "models": names}))
"""


def _examples() -> list[str]:
    from examples._available import available_examples

    return available_examples()


def bench_startup(models: Path, workdir: Path) -> dict[str, Any]:
    """Load every bundle in a fresh process, cold cache then warm cache."""
    cache_dir = workdir / "exe-cache"
    runs = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", _START, str(models), str(cache_dir)],
            capture_output=True,
            text=True,
            check=True,
        )
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    cold, hit = runs
    return {
        "models": cold["models"],
        "cold": cold,
        "hit": hit,
        "ratio": hit["load_s"] / cold["load_s"] if cold["load_s"] else None,
    }


def figures(weights: dict[str, Any], startup: dict[str, Any]) -> list[dict[str, Any]]:
    """Load vs raw copy (PINNED_SYSTEM against its target, UNPINNED beside it) and cache-hit
    vs cold start-up, each with its absolute times."""
    mb = f"{weights['weight_bytes'] / 1e6:.1f} MB"
    pinned, unpinned = weights["pinned_system"], weights["unpinned"]
    hit = startup["ratio"]
    return [
        figure(
            f"on-demand load / raw copy (pinned_system, {mb})",
            pinned["ratio"],
            "x",
            target=f"<= {TARGET_LOAD_RATIO:g}",
            met=pinned["ratio"] <= TARGET_LOAD_RATIO,
        ),
        figure(f"on-demand load (pinned_system, {mb})", pinned["load_s_median"] * 1e3, "ms"),
        figure(f"raw copy ({mb})", pinned["raw_copy_s_median"] * 1e3, "ms"),
        figure(f"on-demand load / raw copy (unpinned: file read, {mb})", unpinned["ratio"], "x"),
        figure(
            "start-up with cache hits / cold compile",
            hit,
            "x",
            target=f"<= {TARGET_HIT_RATIO:g}",
            met=hit is not None and hit <= TARGET_HIT_RATIO,
        ),
        figure("start-up, cold compile", startup["cold"]["load_s"], "s"),
        figure("start-up, cache hits", startup["hit"]["load_s"], "s"),
    ]


def main(argv: list[str] | None = None) -> int:
    """Run both measurements and write JSON + Markdown under ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument(
        "--models",
        type=Path,
        default=None,
        help="directory of bundles (default: export the examples)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: ~6 MB of weights, 3 repeats, the mlp example only",
    )
    parser.add_argument(
        "--suite", action="store_true", help="the size `nox -s bench` runs (the default sizes)"
    )
    args = parser.parse_args(argv)
    width, repeats, examples = WIDTH, REPEATS, _examples()
    if args.quick:
        width, repeats, examples = 512, 3, ["mlp"]
    with tempfile.TemporaryDirectory(prefix="rs-bench-") as tmp:
        work = Path(tmp)
        weights = bench_weight_loads(work, width=width, repeats=repeats)
        models = args.models
        if models is None:
            models = work / "models"
            models.mkdir()
            export_examples(models, examples)
        startup = bench_startup(models, work)
    report: dict[str, Any] = {
        "machine": machine("jax"),
        "weights": weights,
        "startup": startup,
    }
    report["figures"] = figures(weights, startup)
    lines = [
        "# Worker runtime benchmark (CPU backend)",
        "",
        f"Machine: {machine_line(report['machine'])}",
        "",
        f"## On-demand weight load vs raw copy ({weights['weight_bytes'] / 1e6:.1f} MB, "
        f"median of {repeats})",
        "",
        "| floor | load (s) | raw copy (s) | ratio | load GB/s |",
        "|---|---|---|---|---|",
    ]
    memcpy = weights["host_memcpy_s_median"]
    for floor in ("pinned_system", "unpinned"):
        r = weights[floor]
        lines.append(
            f"| {floor} | {r['load_s_median']:.4f} | {r['raw_copy_s_median']:.4f} | "
            f"{r['ratio']:.2f} | {r['load_gbps']:.2f} |"
        )
    lines += [
        "",
        f"Host memcpy of the same bytes: {memcpy:.4f} s "
        f"({weights['weight_bytes'] / memcpy / 1e9:.1f} GB/s). On the CPU backend "
        "`device_put` aliases aligned host arrays, so the raw copy and a PINNED_SYSTEM load "
        "move no bytes; UNPINNED pays the file read.",
        "",
        f"## Start-up: cold compile vs executable-cache hit ({len(startup['models'])} models: "
        f"{', '.join(startup['models'])})",
        "",
        "| run | load all models (s) | compiles | cache hits | imports (s) |",
        "|---|---|---|---|---|",
    ]
    for run in ("cold", "hit"):
        r = startup[run]
        lines.append(
            f"| {run} | {r['load_s']:.3f} | {r['compiles']} | {r['hits']} | {r['imports_s']:.2f} |"
        )
    lines += ["", f"Hit / cold = {startup['ratio']:.3f}.", ""]
    write_report(args.out, RESULT_NAME, report, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
