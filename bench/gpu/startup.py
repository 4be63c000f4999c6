"""GPU kit: start-up with a cold executable cache (every size compiled) vs one full of hits.

Run by ``bench/gpu/run.sh``. The kit network's bundle at every served batch size is loaded
in a fresh process (``load_bundle`` through the worker's executable cache, autotuning off) with
an empty cache, then again in another fresh process with the cache it filled. Target: the
hit start-up <= 10% of the cold one. The filled cache becomes the kit's shared one, so
the later steps' workers start without compiling.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench._common import figure
from bench.gpu._modes import bench_env
from bench.gpu._step import Step, ensure_bundle

__all__ = ["PROBE", "main"]

#: The issue's target: cache-hit start-up <= 10% of the cold compile.
TARGET_HIT_RATIO = 0.10

#: One start-up, timed in a fresh process: imports + backend, then the bundle's compile/load.
PROBE = """
import json, sys, time
t0 = time.perf_counter()
from pathlib import Path
from reactantserver.worker.runtime.jax_backend import JaxBackend
from reactantserver.worker.runtime import CompileSpec, ExecutableCache, load_bundle
backend = JaxBackend(sys.argv[3])
t1 = time.perf_counter()
cache = ExecutableCache(Path(sys.argv[2]), backend)
t2 = time.perf_counter()
model = load_bundle(Path(sys.argv[1]), backend, cache, opts=CompileSpec(autotune=False))
t3 = time.perf_counter()
print(json.dumps({"imports_and_backend_s": t1 - t0, "load_s": t3 - t2,
                  "modules": len(model.modules), "compiles": cache.counters.compiles,
                  "hits": cache.counters.hits, "device_kind": backend.device_kind}))
"""


def _probe(step: Step, bundle: Path, cache: Path) -> dict[str, Any]:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(bundle), str(cache), step.mode.platform],
        capture_output=True,
        text=True,
        env=bench_env(step.mode),
        timeout=max(5.0, step.left() - 5.0),
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"start-up probe failed ({done.returncode}):\n{done.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["process_wall_s"] = time.perf_counter() - started
    return result


def main(argv: list[str] | None = None) -> int:
    """Cold then warm start-up; write ``<out>/startup.json``."""
    step = Step.from_argv("startup", argv, __doc__ or "")
    report = step.report
    bundle = ensure_bundle(step, "served", step.mode.served_batches)
    cache = step.work / "startup-cache" / "executables"
    shutil.rmtree(cache.parent, ignore_errors=True)
    cold = _probe(step, bundle, cache)
    report.put("cold", cold)
    report.add_figures([figure("start-up, cold compile of every size", cold["load_s"], "s")])
    hit = _probe(step, bundle, cache)
    report.put("hit", hit)
    ratio = hit["load_s"] / cold["load_s"] if cold["load_s"] else None
    report.add_figures(
        [
            figure(
                f"start-up with cache hits / cold compile ({cold['modules']} sizes)",
                ratio,
                "x",
                target=f"<= {TARGET_HIT_RATIO:g}",
                met=ratio is not None and ratio <= TARGET_HIT_RATIO,
            ),
            figure("start-up, cache hits", hit["load_s"], "s"),
        ]
    )
    shared = step.work / "cache" / "executables"
    if not shared.exists():
        shutil.copytree(cache, shared)
    report.put("batches", list(step.mode.served_batches))
    report.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
