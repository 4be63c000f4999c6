"""The workers of ``bench.density``: started on a CPU arena, read through their ``/metrics``.

Every worker of the benchmark loads its weights into a CPU arena (``runtime.cpu_arena_bytes``,
docs/development.md "Honest weight loads on the CPU"), so a load is a real copy that costs what
the bytes cost; ``weight_cache_max_bytes`` sets its on-demand budget. The constrained worker's
arena is its budget plus one model of headroom; the resident worker's holds the catalog.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from bench._density_catalog import Catalog
from bench._grpc_load import run_load
from bench._grpc_servers import Server, metric_sums, start_worker

__all__ = [
    "COUNTERS",
    "ArenaSettings",
    "Counters",
    "batch1_execution_ms",
    "delta",
    "scrape",
    "start_density_worker",
]

#: Weight-cache and compute series read from the worker's ``/metrics`` (summed over models).
COUNTERS = (
    "reactantserver_worker_weight_loads_total",
    "reactantserver_worker_weight_evicts_total",
    "reactantserver_worker_weight_load_seconds_total",
    "reactantserver_worker_weight_load_bytes_total",
    "reactantserver_worker_compute_seconds_total",
    "reactantserver_worker_dispatch_total",
)
_GAUGES = (
    "reactantserver_worker_weight_cache_max_bytes",
    "reactantserver_worker_device_memory_limit_bytes",
)
#: Slack on top of what an arena must hold (alignment, the OOM retry's second try).
_HEADROOM_BYTES = 64 << 20

Counters = dict[str, float]


@attrs.frozen
class ArenaSettings:
    """One worker's weight memory: its on-demand budget, its arena and the arena's link."""

    budget_bytes: int
    arena_bytes: int
    bandwidth_bytes_per_s: float = 0.0

    @classmethod
    def for_budget(cls, budget: int, model_bytes: int, bandwidth: float) -> ArenaSettings:
        """An arena of ``budget`` plus one model and some slack."""
        return cls(budget, budget + model_bytes + _HEADROOM_BYTES, bandwidth)

    def env(self) -> dict[str, str]:
        """The ``REACTANTSERVER_WORKER_*`` overrides that set it."""
        return {
            "REACTANTSERVER_WORKER_RUNTIME_WEIGHT_CACHE_MAX_BYTES": str(self.budget_bytes),
            "REACTANTSERVER_WORKER_RUNTIME_CPU_ARENA_BYTES": str(self.arena_bytes),
            "REACTANTSERVER_WORKER_RUNTIME_CPU_ARENA_BANDWIDTH_BYTES_PER_S": repr(
                self.bandwidth_bytes_per_s
            ),
        }


def start_density_worker(
    tmp: Path, catalog: Catalog, arena: ArenaSettings, cache: Path, cpus: Any
) -> Server:
    """A worker on ``catalog`` with ``arena``; ``cache`` is the executable cache all share."""
    tmp.mkdir(parents=True)
    env = {**arena.env(), "REACTANTSERVER_WORKER_CACHE_DIR": str(cache)}
    return start_worker(tmp, catalog.root, env, cpus)


def scrape(server: Server) -> Counters:
    """The series of :data:`COUNTERS` and the budget gauges now, summed over their labels."""
    return metric_sums(server, (*COUNTERS, *_GAUGES))


def delta(before: Mapping[str, float], after: Mapping[str, float]) -> Counters:
    """``after - before`` for every counter."""
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in COUNTERS}


def batch1_execution_ms(
    server: Server, catalog: Catalog, models: Sequence[str], duration_s: float
) -> float:
    """Mean compute ms of one batch-1 execution, from the worker's own counters.

    One client sends requests back to back for ``duration_s``, cycling over ``models``
    (resident already), so every execution is of one row: the worker's compute seconds over
    its executions.
    """
    cycle = iter(range(1 << 62))
    before = scrape(server)
    run_load(
        server.url,
        models[0],
        concurrency=1,
        kind="threads",
        warmup_s=0.0,
        duration_s=duration_s,
        server_cpu=lambda: None,
        route=lambda: models[next(cycle) % len(models)],
        signature=catalog.signature,
    )
    time.sleep(0.1)  # the last answer's counters
    moved = delta(before, scrape(server))
    runs = moved["reactantserver_worker_dispatch_total"]
    return (
        1000 * moved["reactantserver_worker_compute_seconds_total"] / runs if runs else float("nan")
    )
