"""GPU kit: the tiny MLP's req/s against the native front's threads and against front
processes, on the machine's cores.

Run by ``bench/gpu/run.sh`` (the ``scaling`` step): :mod:`bench.scaling`'s measurement with
the clients in several processes on half the cores and the worker (the tiny ``mlp`` example,
on the kit's platform) on the rest, for 1, 2 and 4 front threads; then 2 and 4 front
processes (gateways over the worker's forwarding lane) on cores of their own, the worker on
three. On the 16-core GPU machine these are the figures the 2-core development machine
cannot give (there the clients and the worker have one core each).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from bench._common import figure
from bench._grpc_servers import export_examples, start_worker
from bench.gateway import start_gateway
from bench.gpu._modes import worker_env
from bench.gpu._step import Step
from bench.scaling import MODEL, measure, split_cpus, split_fronts

__all__ = ["main"]

THREADS = (1, 2, 4)
FRONTS = (2, 4)
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
    front_cpus, worker_cpus = split_fronts(client_cpus, server_cpus)
    front_rows: list[dict[str, Any]] = []
    for count in FRONTS:
        if step.left() < window + _RESERVE_S + 2.0 * count:
            step.report.note(f"{count} front processes not measured: the step's budget ran out")
            break
        front_rows.append(
            _through_fronts(
                step,
                repo,
                count,
                client_cpus=client_cpus,
                front_cpus=front_cpus,
                worker_cpus=worker_cpus,
                window=window,
            )
        )
        step.report.put("front_rows", front_rows)
    step.report.put(
        "cpus",
        {
            "clients": client_cpus,
            "worker": server_cpus,
            "fronts": front_cpus,
            "worker_behind_fronts": worker_cpus,
        },
    )
    step.report.add_figures(
        [
            figure(f"tiny MLP req/s, {r['fronts']} front processes", r["requests_per_s"], "req/s")
            for r in front_rows
        ]
        + [
            figure(
                f"worker CPU per request behind {r['fronts']} front processes",
                r["server_cpu_us_per_request"],
                "us",
            )
            for r in front_rows
        ]
    )
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
    if len(rows) == len(THREADS) and len(front_rows) == len(FRONTS):
        step.report.finish()
    return 0


def _through_fronts(
    step: Step,
    repo: Path,
    count: int,
    *,
    client_cpus: list[int],
    front_cpus: list[int],
    worker_cpus: list[int],
    window: float,
) -> dict[str, Any]:
    """One window through ``count`` gateways in front of a fresh worker."""
    run = step.work / f"scaling-f{count}"
    run.mkdir(parents=True, exist_ok=True)
    env = worker_env(step.mode, step.work / "cache", mem_fraction=0.1)
    worker = start_worker(run, repo, env, frozenset(worker_cpus))
    fronts = []
    try:
        worker.wait_ready([MODEL], max(5.0, step.left() - window - 4.0))
        worker.name = "worker"
        for i in range(count):
            fronts.append(start_gateway(run, f"front_{i}", [worker], frozenset(front_cpus)))
            fronts[-1].wait_ready([MODEL], max(5.0, step.left() - window - 2.0))
        row = measure(
            worker,
            procs=len(client_cpus),
            clients=CLIENTS,
            warmup=step.mode.warmup_s,
            duration=window,
            cpus=client_cpus,
            fronts=fronts,
        )
    finally:
        for front in fronts:
            front.stop()
        worker.stop()
    return {"fronts": count, **row}


if __name__ == "__main__":
    sys.exit(main())
