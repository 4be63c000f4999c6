"""GPU kit: the tiny MLP's req/s against the native front's threads, on the machine's cores.

Run by ``bench/gpu/run.sh`` (the ``scaling`` step): :mod:`bench.scaling`'s measurement with
the clients in several processes on half the cores and the worker (the tiny ``mlp`` example,
on the kit's platform) on the rest, for 1, 2 and 4 front threads. On the 16-core GPU machine
this is the figure the 2-core development machine cannot give (there the clients and the
worker have one core each).
"""

from __future__ import annotations

import sys
from typing import Any

from bench._common import figure
from bench._grpc_servers import export_examples, start_worker
from bench.gpu._modes import worker_env
from bench.gpu._step import Step
from bench.scaling import MODEL, measure, split_cpus

__all__ = ["main"]

THREADS = (1, 2, 4)
CLIENTS = 64
#: Seconds kept back from the deadline per worker start and stop.
_RESERVE_S = 12.0


def main(argv: list[str] | None = None) -> int:
    """Measure each thread count that fits before the deadline; the report keeps each row."""
    step = Step.from_argv("scaling", argv, __doc__ or "")
    client_cpus, server_cpus = split_cpus(0.5)
    repo = step.work / "repos" / "scaling"
    if not (repo / MODEL).exists():
        export_examples(repo, [MODEL])
    window = step.mode.window_s
    rows: list[dict[str, Any]] = []
    for threads in THREADS:
        if step.left() < window + _RESERVE_S:
            step.report.note(f"{threads} front threads not measured: the step's budget ran out")
            break
        run = step.work / f"scaling-t{threads}"
        run.mkdir(parents=True, exist_ok=True)
        env = worker_env(step.mode, step.work / "cache", mem_fraction=0.1)
        env["REACTANTSERVER_WORKER_ENDPOINTS_FRONT_THREADS"] = str(threads)
        worker = start_worker(run, repo, env, frozenset(server_cpus))
        try:
            worker.wait_ready([MODEL], max(5.0, step.left() - window - 4.0))
            row = measure(
                worker,
                procs=len(client_cpus),
                clients=CLIENTS,
                warmup=step.mode.warmup_s,
                duration=window,
                cpus=client_cpus,
            )
        finally:
            worker.stop()
        rows.append({"threads": threads, **row})
        step.report.put("rows", rows)
    step.report.put("cpus", {"clients": client_cpus, "worker": server_cpus})
    if rows:
        base = rows[0]["requests_per_s"]
        step.report.add_figures(
            [
                figure(
                    f"tiny MLP req/s, {r['threads']} front thread(s)", r["requests_per_s"], "req/s"
                )
                for r in rows
            ]
            + [
                figure(
                    f"req/s with {r['threads']} front threads / with 1",
                    r["requests_per_s"] / base if base else None,
                    "x",
                )
                for r in rows[1:]
            ]
        )
    if len(rows) == len(THREADS):
        step.report.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
