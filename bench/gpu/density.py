"""GPU kit: density with real-size models, the budget at 1/5 of the catalog vs all-resident.

Run by ``bench/gpu/run.sh``. A catalog of ResNet-50-size CNNs (30 on the GPU, ~102 MB of
distinct random weights each, generated here; ``bench/gpu/_catalog.py``) is served by three
workers side by side on the one GPU, each with its own device share:

- ``prefetch``: on-demand weight budget = catalog / 5, prefetch on (the default);
- ``no_prefetch``: the same budget, ``scheduler.prefetch_weights: false``;
- ``resident``: a budget that holds the whole catalog.

``density_concurrency`` closed-loop one-image clients send requests to the model named by a
fixed-seed Zipf(1.1) sequence (the same sequence for every worker); the workers alternate over
``density_rounds`` windows each. Per worker: req/s, p50/p99, and from ``/metrics`` the loads,
evictions and prefetches per 1000 requests and the load bandwidth inside the worker; once, the
GPU's NVML series (utilisation, memory, power) and each worker's own device memory.
Targets: throughput >= 0.7x all-resident, p99 <= 3x.
"""

from __future__ import annotations

import sys
from typing import Any

from bench._common import figure
from bench._density_catalog import Cursor, top_share, zipf_sequence
from bench._grpc_load import Load, combine
from bench._grpc_servers import Server, metric_sums, start_worker
from bench.gpu._catalog import Catalog, build_catalog
from bench.gpu._load import run_rows
from bench.gpu._modes import worker_env
from bench.gpu._step import Step

__all__ = ["MODES", "main"]

MODES = ("prefetch", "no_prefetch", "resident")
TARGET_THROUGHPUT = 0.7
TARGET_P99 = 3.0
_COUNTERS = (
    "reactantserver_worker_weight_loads_total",
    "reactantserver_worker_weight_evicts_total",
    "reactantserver_worker_weight_prefetches_total",
    "reactantserver_worker_weight_load_seconds_total",
    "reactantserver_worker_weight_load_bytes_total",
)
_GAUGES = (
    "reactantserver_worker_weight_cache_max_bytes",
    "reactantserver_worker_device_memory_in_use_bytes",
)
#: The NVML series of a CUDA worker (docs/reference/metrics.md); absent on the CPU.
_GPU = (
    "reactantserver_worker_gpu_utilization",
    "reactantserver_worker_gpu_memory_used_bytes",
    "reactantserver_worker_gpu_memory_total_bytes",
    "reactantserver_worker_gpu_power_usage_watts",
    "reactantserver_worker_gpu_power_limit_watts",
    "reactantserver_worker_gpu_energy_joules_total",
)
_PROCESS_USED = "reactantserver_worker_device_memory_process_used_bytes"
_SEQUENCE = 200_000
_SEED = 13
_RESERVE_S = 10.0


def _scrape(server: Server) -> dict[str, float]:
    return metric_sums(server, (*_COUNTERS, *_GAUGES))


def _start(step: Step, catalog: Catalog, mode: str) -> Server:
    budget = catalog.total_bytes if mode == "resident" else catalog.total_bytes // 5
    env = worker_env(step.mode, step.work / "cache", mem_fraction=step.mode.density_mem_fraction)
    env["REACTANTSERVER_WORKER_RUNTIME_WEIGHT_CACHE_MAX_BYTES"] = str(budget)
    env["REACTANTSERVER_WORKER_SCHEDULER_PREFETCH_WEIGHTS"] = (
        "false" if mode == "no_prefetch" else "true"
    )
    tmp = step.work / f"density-{mode}"
    tmp.mkdir(parents=True, exist_ok=True)
    return start_worker(tmp, catalog.root, env, None)


def _row(
    mode: str, loads: list[Load], before: dict[str, float], after: dict[str, float], issued: int
) -> dict[str, Any]:
    load = combine(loads)
    row: dict[str, Any] = {"mode": mode, **load.summary()}
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in _COUNTERS}
    n = delta["reactantserver_worker_weight_loads_total"]
    per_1000 = (lambda v: 1000 * v / issued) if issued else (lambda v: None)
    row.update(
        requests_sent=issued,
        loads_per_1000=per_1000(n),
        evicts_per_1000=per_1000(delta["reactantserver_worker_weight_evicts_total"]),
        prefetches_per_1000=per_1000(delta["reactantserver_worker_weight_prefetches_total"]),
        ms_per_load=1000 * delta["reactantserver_worker_weight_load_seconds_total"] / n
        if n
        else None,
        load_gbps=(
            delta["reactantserver_worker_weight_load_bytes_total"]
            / delta["reactantserver_worker_weight_load_seconds_total"]
            / 1e9
            if delta["reactantserver_worker_weight_load_seconds_total"]
            else None
        ),
        budget_bytes=after.get("reactantserver_worker_weight_cache_max_bytes"),
        device_memory_in_use=after.get("reactantserver_worker_device_memory_in_use_bytes"),
    )
    print(
        f"{mode:12s} {row['requests_per_s']:8,.1f} req/s  p50 {row['p50_ms']:.2f} ms  "
        f"p99 {row['p99_ms']:.2f} ms  loads/1000 {row['loads_per_1000'] or 0:.0f}  "
        f"prefetches/1000 {row['prefetches_per_1000'] or 0:.0f}  errors {row['errors']}",
        flush=True,
    )
    return row


def _measure(step: Step, servers: dict[str, Server], sequence: list[str]) -> list[dict[str, Any]]:
    mode = step.mode
    cursors = {m: Cursor(sequence) for m in MODES}
    loads: dict[str, list[Load]] = {m: [] for m in MODES}
    before = {m: _scrape(servers[m]) for m in MODES}
    windows = mode.density_rounds * len(MODES)
    for r in range(mode.density_rounds):
        for i, m in enumerate(MODES):
            left = step.left() - _RESERVE_S
            duration = min(mode.window_s * 2, left / (windows - r * len(MODES) - i) - mode.warmup_s)
            if duration < 0.3:
                step.report.note(f"round {r} {m}: not measured, the step's budget is spent")
                continue
            loads[m].append(
                run_rows(
                    servers[m].url,
                    cursors[m],
                    arch=mode.arch,
                    concurrency=mode.density_concurrency,
                    warmup_s=mode.warmup_s,
                    duration_s=duration,
                    server_cpu=servers[m].cpu_seconds,
                )
            )
    return [
        _row(m, loads[m], before[m], _scrape(servers[m]), cursors[m].issued)
        for m in MODES
        if loads[m]
    ]


def _gpu(servers: dict[str, Server]) -> dict[str, Any]:
    """The GPU's NVML series from the first worker, each worker's process memory; printed."""
    try:
        device = metric_sums(next(iter(servers.values())), _GPU)
        process = {
            m: metric_sums(s, (_PROCESS_USED,)).get(_PROCESS_USED) for m, s in servers.items()
        }
    except (OSError, ValueError) as error:  # a report line, never the step's failure
        print(f"GPU series: not read ({error})", flush=True)
        return {"error": str(error)}
    if device:
        shown = "  ".join(
            f"{k.removeprefix('reactantserver_worker_gpu_')} {v:,.6g}" for k, v in device.items()
        )
        print(f"GPU series: {shown}", flush=True)
    else:
        print("GPU series: absent (a CPU worker, or no NVML driver)", flush=True)
    print(f"process device memory: {process}", flush=True)
    return {"device": device, "process_used_bytes": process}


def _figures(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by = {row["mode"]: row for row in rows}
    resident = by.get("resident")
    figures = []
    for m in ("prefetch", "no_prefetch"):
        row = by.get(m)
        if row is None or resident is None or not resident["requests_per_s"]:
            continue
        label = "prefetch on" if m == "prefetch" else "prefetch off"
        tput = row["requests_per_s"] / resident["requests_per_s"]
        p99 = row["p99_ms"] / resident["p99_ms"] if resident["p99_ms"] else None
        figures += [
            figure(
                f"density throughput / all-resident ({label})",
                tput,
                "x",
                target=f">= {TARGET_THROUGHPUT}",
                met=tput >= TARGET_THROUGHPUT,
            ),
            figure(
                f"density p99 / all-resident ({label})",
                p99,
                "x",
                target=f"<= {TARGET_P99:g}",
                met=p99 is not None and p99 <= TARGET_P99,
            ),
        ]
    if "prefetch" in by and "no_prefetch" in by and by["no_prefetch"]["requests_per_s"]:
        figures.append(
            figure(
                "density throughput, prefetch on / off",
                by["prefetch"]["requests_per_s"] / by["no_prefetch"]["requests_per_s"],
                "x",
            )
        )
    for row in rows:
        m = row["mode"]
        figures += [
            figure(f"density req/s ({m})", row["requests_per_s"], "req/s"),
            figure(f"density p99 ({m})", row["p99_ms"], "ms"),
            figure(f"weight loads per 1000 requests ({m})", row["loads_per_1000"], "per 1000"),
            figure(f"prefetches per 1000 requests ({m})", row["prefetches_per_1000"], "per 1000"),
            figure(f"load bandwidth inside the worker ({m})", row["load_gbps"], "GB/s"),
        ]
    return figures


def main(argv: list[str] | None = None) -> int:
    """Catalog, three workers, alternating windows; write ``<out>/density.json``."""
    step = Step.from_argv("density", argv, __doc__ or "")
    report, mode = step.report, step.mode
    catalog = build_catalog(step, count=mode.density_models, batches=mode.density_batches)
    fits = catalog.total_bytes // 5 // catalog.model_bytes
    report.put(
        "catalog",
        {
            "models": len(catalog.names),
            "bytes_per_model": catalog.model_bytes,
            "total_bytes": catalog.total_bytes,
            "constrained_budget_bytes": catalog.total_bytes // 5,
            "models_within_budget": fits,
            "traffic_share_of_those": top_share(len(catalog.names), fits),
            "batches": list(mode.density_batches),
        },
    )
    sequence, by_rank = zipf_sequence(catalog.names, _SEQUENCE, seed=_SEED)
    servers: dict[str, Server] = {}
    try:
        # The first worker fills any gap in the executable cache; the others then only hit.
        servers["prefetch"] = _start(step, catalog, "prefetch")
        ready = {"prefetch": servers["prefetch"].wait_ready(catalog.names, step.left() - 20)}
        for m in MODES[1:]:
            servers[m] = _start(step, catalog, m)
        for m in MODES[1:]:
            ready[m] = servers[m].wait_ready(catalog.names, step.left() - 20)
        report.put("ready_after_s", ready)
        rows = _measure(step, servers, sequence)
        report.put("modes", rows)
        report.put("gpu", _gpu(servers))
        report.put("most_popular", by_rank[:10])
        report.add_figures(_figures(rows))
    finally:
        report.put("exit_status", {m: s.stop() for m, s in servers.items()})
        report.put("log_tails", {m: s.log_tail(15) for m, s in servers.items()})
    if len(rows) == len(MODES):
        report.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
