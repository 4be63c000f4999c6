"""The fleet of ``bench.fleet``: two workers with the CPU arena and a small weight budget, and a
gateway over them in one routing mode; what the workers say about loads and executions.

Each :func:`start_fleet` starts fresh worker processes (empty weight caches) that share one
executable cache, so only the first fleet of a run compiles. All workers run the ``fifo``
discipline, which every mode accepts (``lpt_packing`` refuses ``fair``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs

from bench._density_catalog import Catalog
from bench._grpc_servers import Server, _statistics, metric_sums, start_worker
from bench.gateway import start_gateway

__all__ = [
    "MODES",
    "Arena",
    "Fleet",
    "batch1_seconds",
    "counters",
    "fleet",
    "warm",
]

#: The routing modes compared, in report order.
MODES = ("round_robin", "lpt_packing", "model_aware")
#: Seconds between the gateway's status polls (``health.interval_seconds``).
POLL_S = 0.5
#: ``/metrics`` counters read from every worker around a replay.
COUNTERS = (
    "reactantserver_worker_weight_loads_total",
    "reactantserver_worker_weight_load_seconds_total",
    "reactantserver_worker_weight_load_bytes_total",
    "reactantserver_worker_weight_evicts_total",
)

#: Gateway settings per mode: status polls every :data:`POLL_S`; ``lpt_packing`` places the
#: models at start-up and repacks after every second of compute.
SETTINGS: Mapping[str, dict[str, Any]] = {
    "round_robin": {"scheduling": {"mode": "round_robin"}},
    "lpt_packing": {
        "scheduling": {"mode": "lpt_packing", "compaction_mode": "off"},
        "startup_wait_seconds": 60,
    },
    "model_aware": {"scheduling": {"mode": "model_aware"}, "startup_wait_seconds": 60},
}


@attrs.frozen
class Arena:
    """Per-worker CPU arena and weight budget (bytes), and the arena's bandwidth cap (0: none)."""

    arena_bytes: int
    budget_bytes: int
    bandwidth_bytes_per_s: float = 0.0

    def env(self) -> dict[str, str]:
        """The worker's ``REACTANTSERVER_WORKER_RUNTIME_*`` overrides."""
        out = {
            "REACTANTSERVER_WORKER_RUNTIME_CPU_ARENA_BYTES": str(self.arena_bytes),
            "REACTANTSERVER_WORKER_RUNTIME_WEIGHT_CACHE_MAX_BYTES": str(self.budget_bytes),
            "REACTANTSERVER_WORKER_SCHEDULER_DISCIPLINE": "fifo",
        }
        if self.bandwidth_bytes_per_s > 0:
            out["REACTANTSERVER_WORKER_RUNTIME_CPU_ARENA_BANDWIDTH_BYTES_PER_S"] = str(
                self.bandwidth_bytes_per_s
            )
        return out


@attrs.define
class Fleet:
    """Two workers and a gateway over them."""

    workers: list[Server]
    gateway: Server
    mode: str
    ready_s: float


def counters(workers: Sequence[Server]) -> dict[str, float]:
    """:data:`COUNTERS` summed over ``workers``' ``/metrics``."""
    out = dict.fromkeys(COUNTERS, 0.0)
    for worker in workers:
        for name, value in metric_sums(worker, COUNTERS).items():
            out[name] += value
    return out


def batch1_seconds(workers: Sequence[Server], models: Sequence[str]) -> tuple[float, int]:
    """(Mean seconds of one batch-1 execution over ``models`` on ``workers``, executions)."""
    ns = count = 0
    for worker in workers:
        for model in models:
            stats = _statistics(worker.url, model)
            for b in stats.batch_stats if stats is not None else ():
                if int(b.batch_size) == 1:
                    ns += int(b.compute_infer.ns)
                    count += int(b.compute_infer.count)
    return (ns / count / 1e9 if count else 0.0), count


def warm(worker: Server, catalog: Catalog, models: Sequence[str]) -> None:
    """One request per model sent straight to ``worker`` (bypassing the gateway)."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    name, one, _, _ = catalog.signature
    tensor = grpcclient.InferInput(name, list(one), "FP32")
    tensor.set_data_from_numpy(np.zeros(one, np.float32))
    client = grpcclient.InferenceServerClient(worker.url)
    try:
        for model in models:
            client.infer(model, [tensor])
    finally:
        client.close()


@contextmanager
def fleet(
    tmp: Path, catalog: Catalog, arena: Arena, mode: str, *, startup_timeout_s: float = 300.0
) -> Iterator[Fleet]:
    """Fresh workers (started together) and a ``mode`` gateway; everything stopped after."""
    start = time.perf_counter()
    env = {**arena.env(), "REACTANTSERVER_WORKER_CACHE_DIR": str(tmp / "executables")}
    servers: list[Server] = []
    try:
        for i in range(2):
            directory = tmp / f"{mode}-worker_{i}"
            directory.mkdir(parents=True, exist_ok=True)
            servers.append(start_worker(directory, catalog.root, env, None))
            servers[-1].name = f"worker_{i}"
        for worker in servers:
            worker.wait_ready(catalog.names, startup_timeout_s)
        workers = list(servers)
        settings = {**SETTINGS[mode], "health": {"interval_seconds": POLL_S}}
        gateway = start_gateway(tmp, f"gateway-{mode}", workers, None, settings=settings)
        servers.append(gateway)
        gateway.wait_ready(catalog.names, startup_timeout_s)
        yield Fleet(workers, gateway, mode, time.perf_counter() - start)
    finally:
        for server in reversed(servers):  # the gateway first
            server.stop()
