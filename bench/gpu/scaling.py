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
from typing import Any

from bench._common import figure
from bench._grpc_servers import export_examples
from bench.gpu._modes import worker_env
from bench.gpu._step import Step
from bench.scaling import MODEL, Load, measure_point, split_cpus, split_fronts

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
    load = Load(len(client_cpus), CLIENTS, step.mode.warmup_s, window, client_cpus)
    rows: list[dict[str, Any]] = []
    for threads in THREADS:
        if step.left() < window + _RESERVE_S:
            step.report.note(f"{threads} front threads not measured: the step's budget ran out")
            break
        env = worker_env(step.mode, step.work / "cache", mem_fraction=0.1)
        env["REACTANTSERVER_WORKER_ENDPOINTS_FRONT_THREADS"] = str(threads)
        row = measure_point(
            step.work / f"scaling-t{threads}",
            repo,
            env,
            load,
            worker_cpus=server_cpus,
            ready_timeout=max(5.0, step.left() - window - 4.0),
        )
        rows.append({"threads": threads, **row})
        step.report.put("rows", rows)
    front_cpus, worker_cpus = split_fronts(client_cpus, server_cpus)
    front_rows: list[dict[str, Any]] = []
    for count in FRONTS:
        if step.left() < window + _RESERVE_S + 2.0 * count:
            step.report.note(f"{count} front processes not measured: the step's budget ran out")
            break
        row = measure_point(
            step.work / f"scaling-f{count}",
            repo,
            worker_env(step.mode, step.work / "cache", mem_fraction=0.1),
            load,
            worker_cpus=worker_cpus,
            ready_timeout=max(5.0, step.left() - window - 4.0),
            fronts=count,
            front_cpus=front_cpus,
        )
        front_rows.append({"fronts": count, **row})
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


if __name__ == "__main__":
    sys.exit(main())
