"""One variant of ``bench.density``: both traces on the constrained and the resident worker.

**Zipf**: ``concurrency`` closed-loop clients send back to back to the model a fixed-seed
Zipf(1.1) sequence names (each worker gets the sequence from its start); the workers alternate
over ``rounds`` windows so the machine's drift falls on both. Closed loop because the throughput
target is a capacity ratio: at a fixed concurrency each worker runs as fast as it can, and the
p99 is taken at that same concurrency. **Bursty**: an on/off trace (``bench._traces``) replayed
open-loop by arrival time at a rate the resident worker sustains, so latency shows what loads
cost when a burst wakes a cold model. Loads and evictions are the worker's counters around all
its requests (warm-ups included) per request sent; Belady's optimum is computed for the same
sequence, in the order sent, with ``budget // model bytes`` slots.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bench._density_catalog import Catalog, Cursor
from bench._density_replay import replay
from bench._density_workers import Counters, delta, scrape
from bench._grpc_load import Load, combine, run_load
from bench._grpc_servers import Server
from bench._traces import Arrival, belady_loads, lru_loads

__all__ = ["MODES", "bursty", "cache_row", "zipf"]

#: The two workers: the budget a fraction of the catalog, and large enough for all of it.
MODES = ("constrained", "resident")


def cache_row(moved: Counters, sent: Sequence[str], slots: int | None) -> dict[str, Any]:
    """Loads and evictions per 1000 requests sent, next to Belady's and LRU's for ``sent``
    with ``slots`` models resident (``None``: the whole catalog fits, no yardstick)."""
    n = len(sent)
    loads = moved["reactantserver_worker_weight_loads_total"]
    optimum = None if slots is None else belady_loads(sent, slots)
    lru = None if slots is None else lru_loads(sent, slots)
    return {
        "requests_sent": n,
        "weight_loads": int(loads),
        "weight_evicts": int(moved["reactantserver_worker_weight_evicts_total"]),
        "loads_per_1000": 1000 * loads / n if n else None,
        "evicts_per_1000": 1000 * moved["reactantserver_worker_weight_evicts_total"] / n
        if n
        else None,
        "belady_loads_per_1000": 1000 * optimum / n if n and optimum is not None else None,
        "lru_loads_per_1000": 1000 * lru / n if n and lru is not None else None,
        "loads_vs_belady": loads / optimum if optimum else None,
        "ms_per_load": 1000 * moved["reactantserver_worker_weight_load_seconds_total"] / loads
        if loads
        else None,
        "bytes_per_load": moved["reactantserver_worker_weight_load_bytes_total"] / loads
        if loads
        else None,
    }


def _row(mode: str, load: Load, moved: Counters, sent: Sequence[str], slots: int) -> Any:
    held = slots if mode == "constrained" else None
    row: dict[str, Any] = {"mode": mode, **load.summary(), **cache_row(moved, sent, held)}
    print(
        f"  {mode:11s} {row['requests_per_s']:7.1f} req/s  p50 {row['p50_ms']:7.2f} ms"
        f"  p99 {row['p99_ms']:7.2f} ms  loads/1000 {row['loads_per_1000'] or 0:6.1f}"
        f" (Belady {row['belady_loads_per_1000'] or 0:.1f})  errors {row['errors']}",
        flush=True,
    )
    return row


def zipf(
    servers: Mapping[str, Server],
    catalog: Catalog,
    sequence: Sequence[str],
    *,
    slots: int,
    concurrency: int,
    rounds: int,
    window_s: float,
    warmup_s: float,
) -> dict[str, Any]:
    """``rounds`` alternating closed-loop windows per worker; rows and per-round ratios."""
    cursors = {mode: Cursor(sequence) for mode in MODES}
    loads: dict[str, list[Load]] = {mode: [] for mode in MODES}
    before = {mode: scrape(servers[mode]) for mode in MODES}
    for _ in range(rounds):
        for mode in MODES:
            loads[mode].append(
                run_load(
                    servers[mode].url,
                    catalog.names[0],
                    concurrency=concurrency,
                    kind="threads",
                    warmup_s=warmup_s,
                    duration_s=window_s,
                    server_cpu=servers[mode].cpu_seconds,
                    route=cursors[mode],
                    signature=catalog.signature,
                )
            )
    rows = []
    for mode in MODES:
        moved = delta(before[mode], scrape(servers[mode]))
        sent = [sequence[i % len(sequence)] for i in range(cursors[mode].issued)]
        rows.append(_row(mode, combine(loads[mode]), moved, sent, slots))
    per_round = [
        {
            "throughput_ratio": _ratio(
                c.summary()["requests_per_s"], r.summary()["requests_per_s"]
            ),
            "p99_ratio": _ratio(c.summary()["p99_ms"], r.summary()["p99_ms"]),
        }
        for c, r in zip(loads["constrained"], loads["resident"], strict=True)
    ]
    return {"trace": "zipf", "modes": rows, "rounds": per_round}


def bursty(
    servers: Mapping[str, Server],
    catalog: Catalog,
    trace: Sequence[Arrival],
    *,
    slots: int,
    clients: int,
    order: Sequence[str] = MODES,
) -> dict[str, Any]:
    """The trace replayed open-loop on each worker in turn (``order``)."""
    sent = [a.model for a in trace]
    rows = {}
    for mode in order:
        before = scrape(servers[mode])
        load = replay(servers[mode].url, catalog.signature, trace, clients=clients)
        rows[mode] = _row(mode, load, delta(before, scrape(servers[mode])), sent, slots)
    return {"trace": "bursty", "modes": [rows[mode] for mode in MODES], "order": list(order)}


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None
