"""The peers benchmark's numbers: windows summed up per server and cell, caps, figures.

Pure functions over the JSON rows the harness records, so the report can be rebuilt (and
tested) from fake windows. A *cell* is one (model, concurrency); a *window* row is one server
measured in one cell in one round::

    table = servers_table(windows)  # per (server, model, concurrency)
    caps = raw_caps(raw_rounds)     # model -> batch -> rows/s; a cell's cap is at min(c, 32)
    rows = cells(table, caps, ours="reactantserver", floor="floor")
    figures(rows)

The *floor* is a server that answers every call with a canned response over our front door
(no decoding, no model): what the load generator and the front allow at all in a cell, so
``floor / best peer`` says how far above the best peer any server on this front could go.
It is never a peer.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from bench._common import figure
from bench._peers.models import MAX_BATCH

__all__ = [
    "CAP_TARGET",
    "P99_TARGET",
    "PEER_TARGET",
    "cap_batch",
    "cells",
    "figures",
    "raw_caps",
    "servers_table",
    "short",
]

Row = dict[str, Any]

#: The issue's targets: ours >= 1.5x the best peer's req/s with a p99 no worse than that
#: peer's, except where the raw executable caps the cell: there ours >= 90% of the cap.
PEER_TARGET = 1.5
P99_TARGET = 1.0
CAP_TARGET = 0.90


def short(model: str) -> str:
    """``tiny`` for ``tiny_mlp``."""
    return model.removesuffix("_mlp")


def _spread(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def servers_table(windows: Iterable[Row]) -> list[Row]:
    """One row per (server, model, concurrency) over its rounds: req/s median and min-max,
    the medians of p50, p99 (over windows with answers) and server CPU per request, rows per
    execution over all rounds."""
    groups: dict[tuple[str, str, int], list[Row]] = {}
    for w in windows:
        groups.setdefault((w["server"], w["model"], w["concurrency"]), []).append(w)
    table = []
    for (server, model, concurrency), rows in groups.items():
        # A window without answers has no latency: the other rounds give it.
        answered = [r for r in rows if r["requests"] > 0]
        cpu = [r["server_cpu_us_per_request"] for r in rows if r["server_cpu_us_per_request"]]
        executions = sum(r["executions"] or 0 for r in rows)
        counted = sum(r["rows"] or 0 for r in rows if r["executions"])
        table.append(
            {
                "server": server,
                "model": model,
                "concurrency": concurrency,
                "rounds": len(rows),
                "requests": sum(r["requests"] for r in rows),
                "errors": sum(r["errors"] for r in rows),
                "requests_per_s": _spread([r["requests_per_s"] for r in rows]),
                "p50_ms": statistics.median(r["p50_ms"] for r in answered) if answered else None,
                "p99_ms": statistics.median(r["p99_ms"] for r in answered) if answered else None,
                "server_cpu_us_per_request": statistics.median(cpu) if cpu else None,
                "rows_per_execution": counted / executions if executions else None,
            }
        )
    return table


def raw_caps(rounds: Sequence[Mapping[str, Sequence[Row]]]) -> dict[str, dict[int, float]]:
    """Model -> batch -> the median over rounds of the raw executable's rows/s."""
    samples: dict[str, dict[int, list[float]]] = {}
    for points in rounds:
        for model, rows in points.items():
            for p in rows:
                samples.setdefault(model, {}).setdefault(int(p["batch"]), []).append(
                    p["rows_per_s"]
                )
    return {
        model: {b: statistics.median(v) for b, v in sorted(batches.items())}
        for model, batches in samples.items()
    }


def cap_batch(concurrency: int) -> int:
    """The batch whose rows/s caps ``concurrency`` one-row clients."""
    return min(concurrency, MAX_BATCH)


def cells(
    table: Sequence[Row],
    caps: Mapping[str, Mapping[int, float]],
    *,
    ours: str,
    floor: str | None = None,
) -> list[Row]:
    """Per (model, concurrency): ours, the best peer (highest median req/s), the cap, the
    ratios, and whether the cap binds (1.5x the best peer would exceed it); with ``floor``
    (the canned-answer server), its req/s and its and ours against each other."""
    by_cell: dict[tuple[str, int], dict[str, Row]] = {}
    for row in table:
        by_cell.setdefault((row["model"], row["concurrency"]), {})[row["server"]] = row
    out = []
    for (model, concurrency), servers in by_cell.items():
        mine = servers.get(ours)
        bottom = servers.get(floor) if floor is not None else None
        peers = [
            r for s, r in servers.items() if s not in (ours, floor) and r["p99_ms"] is not None
        ]
        best = max(peers, key=lambda r: r["requests_per_s"]["median"], default=None)
        cap = caps.get(model, {}).get(cap_batch(concurrency))
        ours_rps = mine["requests_per_s"]["median"] if mine else None
        best_rps = best["requests_per_s"]["median"] if best else None
        floor_rps = bottom["requests_per_s"]["median"] if bottom else None
        out.append(
            {
                "model": model,
                "concurrency": concurrency,
                "ours_requests_per_s": ours_rps,
                "best_peer": best["server"] if best else None,
                "best_peer_requests_per_s": best_rps,
                "raw_cap_rows_per_s": cap,
                "cap_binds": bool(best_rps and cap and PEER_TARGET * best_rps > cap),
                "ours_over_best_peer": ours_rps / best_rps if ours_rps and best_rps else None,
                "ours_p99_over_peer_p99": (
                    mine["p99_ms"] / best["p99_ms"]
                    if mine and mine["p99_ms"] is not None and best and best["p99_ms"]
                    else None
                ),
                "ours_over_cap": ours_rps / cap if ours_rps and cap else None,
                "floor_requests_per_s": floor_rps,
                "floor_over_best_peer": floor_rps / best_rps if floor_rps and best_rps else None,
                "ours_over_floor": ours_rps / floor_rps if ours_rps and floor_rps else None,
            }
        )
    return out


def figures(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """Three figures per cell: ours / best peer req/s (target 1.5 unless the cap binds), ours
    p99 / that peer's (target <= 1), ours / raw cap (target 0.90 where the cap binds); where
    the floor ran, also floor / best peer (how high any server on our front could go) and
    ours / floor, without targets."""
    out = []
    for c in rows:
        where = f"{short(c['model'])}, c={c['concurrency']}"
        peer = c["best_peer"] or "no peer ran"
        ratio, p99 = c["ours_over_best_peer"], c["ours_p99_over_peer_p99"]
        to_cap = c["ours_over_cap"]
        binds = c["cap_binds"]
        out.append(
            figure(
                f"ours / best peer ({peer}) req/s ({where})",
                ratio,
                "x",
                target=None if binds else f">= {PEER_TARGET:g}",
                met=None if ratio is None else ratio >= PEER_TARGET,
            )
        )
        out.append(
            figure(
                f"ours p99 / {peer} p99 ({where})",
                p99,
                "x",
                target=f"<= {P99_TARGET:g}",
                met=None if p99 is None else p99 <= P99_TARGET,
            )
        )
        out.append(
            figure(
                f"ours / raw cap at batch {cap_batch(c['concurrency'])} ({where})",
                to_cap,
                "x",
                target=f">= {CAP_TARGET:.2f}" if binds else None,
                met=None if to_cap is None else to_cap >= CAP_TARGET,
            )
        )
        if c.get("floor_requests_per_s") is None:
            continue
        if c["best_peer_requests_per_s"] is not None:
            out.append(
                figure(
                    f"floor / best peer ({peer}) req/s ({where})", c["floor_over_best_peer"], "x"
                )
            )
        out.append(figure(f"ours / floor req/s ({where})", c["ours_over_floor"], "x"))
    return out
