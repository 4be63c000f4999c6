"""The figures and the Markdown report of ``bench.density`` (its sections in, lines out)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bench._common import figure, fmt, machine_line

__all__ = ["P99_TARGET", "THROUGHPUT_TARGET", "figures", "markdown"]

#: Issue 13: constrained throughput >= 70% of all-resident, p99 <= 3x.
THROUGHPUT_TARGET = 0.70
P99_TARGET = 3.0


def _suffix(section: Mapping[str, Any]) -> str:
    kib = section["ballast_kib"]
    return f"_ballast_{kib}kib" if kib else ""


def _ratios(section: Mapping[str, Any]) -> tuple[float | None, float | None]:
    rows = {r["mode"]: r for r in section["modes"]}
    low, full = rows["constrained"], rows["resident"]
    rps = low["requests_per_s"] / full["requests_per_s"] if full["requests_per_s"] else None
    p99 = low["p99_ms"] / full["p99_ms"] if full["p99_ms"] else None
    return rps, p99


def figures(sections: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The headline numbers of every section: the two ratios against their targets first."""
    out = []
    for section in sections:
        sfx = _suffix(section)
        rows = {r["mode"]: r for r in section["modes"]}
        rps, p99 = _ratios(section)
        out += [
            figure(
                f"density_throughput_ratio{sfx}",
                rps,
                "x",
                target=f">= {THROUGHPUT_TARGET:.2f}",
                met=rps is not None and rps >= THROUGHPUT_TARGET,
            ),
            figure(
                f"density_p99_ratio{sfx}",
                p99,
                "x",
                target=f"<= {P99_TARGET:g}",
                met=p99 is not None and p99 <= P99_TARGET,
            ),
        ]
        for mode in ("constrained", "resident"):
            r = rows[mode]
            out += [
                figure(f"density_{mode}_requests_per_s{sfx}", r["requests_per_s"], "req/s"),
                figure(f"density_{mode}_p50_ms{sfx}", r["p50_ms"], "ms"),
                figure(f"density_{mode}_p99_ms{sfx}", r["p99_ms"], "ms"),
            ]
        low = rows["constrained"]
        out += [
            figure(f"density_loads_per_1000{sfx}", low["loads_per_1000"], "per 1000 requests"),
            figure(f"density_evicts_per_1000{sfx}", low["evicts_per_1000"], "per 1000 requests"),
        ]
    return out


def _verdict(met: bool | None) -> str:
    return "not measured" if met is None else ("met" if met else "NOT met")


def _title(section: Mapping[str, Any]) -> str:
    kib = section["ballast_kib"]
    return "the CNN as it is" if not kib else f"the CNN + {kib:,} KiB of ballast weights"


def _summary(section: Mapping[str, Any]) -> list[str]:
    rows = {r["mode"]: r for r in section["modes"]}
    low, full = rows["constrained"], rows["resident"]
    rps, p99 = _ratios(section)
    return [
        f"- **{_title(section)}**: constrained {low['requests_per_s']:,.0f} req/s vs "
        f"all-resident {full['requests_per_s']:,.0f} = {fmt(rps, '.2f')}x (target >= "
        f"{THROUGHPUT_TARGET:.2f}: {_verdict(None if rps is None else rps >= THROUGHPUT_TARGET)})"
        f"; p99 {low['p99_ms']:.2f} vs {full['p99_ms']:.2f} ms = {fmt(p99, '.2f')}x (target <= "
        f"{P99_TARGET:g}: {_verdict(None if p99 is None else p99 <= P99_TARGET)}); "
        f"{fmt(low['loads_per_1000'], '.0f')} loads and {fmt(low['evicts_per_1000'], '.0f')} "
        "evictions per 1000 requests."
    ]


def _catalog(section: Mapping[str, Any]) -> list[str]:
    c = section["catalog"]
    log = section["log"]
    budgets = c["budget_bytes"]
    logged = ", ".join(
        f"{mode}: {v['admitted']} models admitted, budget {v['budgets']}" for mode, v in log.items()
    )
    return [
        f"Catalog: {c['models']} models x {c['bytes_per_model']:,} B of weights "
        f"({c['ballast_bytes_per_model']:,} B of them ballast) = {c['total_bytes']:,} B. "
        f"Budget: constrained {budgets['constrained']:,} B (room for {c['models_within_budget']} "
        "models, "
        f"whose popularity ranks carry {c['traffic_share_of_top_models_within_budget']:.0%} of "
        f"the Zipf traffic), all-resident {budgets['resident']:,} B. Worker logs: {logged}.",
    ]


def _table(section: Mapping[str, Any]) -> list[str]:
    lines = [
        "| worker | req/s | p50 ms | p99 ms | mean ms | requests | loads / 1000 | "
        "evicts / 1000 | ms / load | load s / s | server CPU µs / req | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in section["modes"]:
        lines.append(
            f"| {r['mode']} | {r['requests_per_s']:,.0f} | {r['p50_ms']:.2f} | "
            f"{r['p99_ms']:.2f} | {r['mean_ms']:.2f} | {r['requests']:,} | "
            f"{fmt(r['loads_per_1000'], '.1f')} | {fmt(r['evicts_per_1000'], '.1f')} | "
            f"{fmt(r['ms_per_load'], '.3f')} | {r['load_seconds_per_s']:.3f} | "
            f"{fmt(r['server_cpu_us_per_request'], ',.0f')} | {r['errors']} |"
        )
    return lines


def markdown(report: Mapping[str, Any]) -> list[str]:
    """The report as Markdown lines."""
    m, args = report["machine"], report["args"]
    lines = [
        "# Density benchmark (CPU backend)",
        "",
        f"Machine: {machine_line(m)} Load average (1 min) {fmt(m['loadavg_1m'], '.1f')} before, "
        f"{fmt(m.get('loadavg_1m_after'), '.1f')} after: other work on the machine skews the "
        "absolute numbers; the ratios are side by side.",
        "",
        f"Command: `{report['command']}`",
        "",
    ]
    for section in report["sections"]:
        lines += _summary(section)
    lines += [
        "",
        f"Two workers on one catalog, same build and executable cache: `constrained` (on-demand "
        f"weight budget = total weight bytes / {args['ratio']:g}) and `resident` (budget = the "
        f"total). {args['concurrency']} closed-loop `tritonclient.grpc` clients send one image "
        "per request to the model named by a fixed-seed Zipf(1.1) sequence over the catalog "
        "(popularity ranks shuffled with the same seed; each worker gets the sequence from its "
        f"start). The workers alternate over {args['rounds']} windows each of "
        f"{args['duration'] / args['rounds']:g} s after {args['warmup']:g} s of warm-up. Loads "
        "and evictions are the worker's `/metrics` counters around all its windows (warm-ups "
        "included) per request sent. On the CPU backend the device is host memory: a load is a "
        "host-to-host copy from the weights' host floor, so `ms / load` is mostly the fixed cost "
        "of a load, and the ballast section shows what the bytes add.",
    ]
    for section in report["sections"]:
        lines += [
            "",
            f"## {_title(section)[0].upper()}{_title(section)[1:]}",
            "",
            *_catalog(section),
            "",
        ]
        lines += _table(section)
    return lines
