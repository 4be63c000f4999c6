"""The figures and the Markdown report of ``bench.density`` (its JSON report in, lines out)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bench._common import figure, fmt, machine_line

__all__ = [
    "BELADY_TARGET",
    "LOAD_EXEC_TARGET",
    "P99_TARGET",
    "THROUGHPUT_TARGET",
    "figures",
    "markdown",
    "ratios",
    "throughput_bound",
]

#: Issue 37, under Zipf(1.1): constrained throughput >= 70% of all-resident, p99 <= 3x.
THROUGHPUT_TARGET = 0.70
P99_TARGET = 3.0
#: Loads per 1000 requests at most 1.5x Belady's offline optimum for the same sequence.
BELADY_TARGET = 1.5
#: One load's time / one batch-1 execution's, so loads cost about what they do on a GPU.
LOAD_EXEC_TARGET = (0.5, 2.0)

Row = Mapping[str, Any]


def ratios(trace: Mapping[str, Any]) -> tuple[float | None, float | None]:
    """(constrained / resident req/s, constrained / resident p99) of one trace's rows."""
    low, full = trace["modes"]
    rps = low["requests_per_s"] / full["requests_per_s"] if full["requests_per_s"] else None
    p99 = low["p99_ms"] / full["p99_ms"] if full["p99_ms"] else None
    return rps, p99


def throughput_bound(trace: Mapping[str, Any]) -> float | None:
    """About the best constrained / resident req/s an offline-optimal cache reaches when loads
    do not overlap execution: resident time per request ``t``, plus Belady's loads per request
    times this run's time per load, gives ``t / (t + loads x load)`` (approximate: batches
    differ between the workers)."""
    low, full = trace["modes"]
    if not full["requests_per_s"] or low["belady_loads_per_1000"] is None:
        return None
    if low["ms_per_load"] is None:
        return None
    t = 1 / float(full["requests_per_s"])
    extra = float(low["belady_loads_per_1000"]) / 1000 * float(low["ms_per_load"]) / 1000
    return t / (t + extra)


def _spread(trace: Mapping[str, Any], key: str) -> tuple[float, float] | None:
    values = [r[key] for r in trace.get("rounds", ()) if r[key] is not None]
    return (min(values), max(values)) if len(values) > 1 else None


def _bounded(
    name: str, value: float | None, low: float | None = None, high: float | None = None
) -> dict[str, Any]:
    """A ratio figure with its target: at least ``low``, at most ``high``, or between."""
    if low is not None and high is not None:
        target: str | None = f"{low:g} to {high:g}"
    elif low is not None:
        target = f">= {low:.2f}"
    else:
        target = None if high is None else f"<= {high:g}"
    met = (
        None
        if target is None
        else value is not None and (low is None or value >= low) and (high is None or value <= high)
    )
    return figure(name, value, "x", target=target, met=met)


def _trace_figures(variant: str, trace: Mapping[str, Any]) -> list[dict[str, Any]]:
    name = f"density_{trace['trace']}_{variant}"
    zipf = trace["trace"] == "zipf"
    rps, p99 = ratios(trace)
    low = trace["modes"][0]
    vs = low["loads_vs_belady"]
    out = [
        _bounded(f"{name}_throughput_ratio", rps, low=THROUGHPUT_TARGET if zipf else None),
        _bounded(f"{name}_p99_ratio", p99, high=P99_TARGET if zipf else None),
    ]
    if zipf:
        out.append(figure(f"{name}_throughput_bound_at_belady", throughput_bound(trace), "x"))
    for row in trace["modes"]:
        out += [
            figure(f"{name}_{row['mode']}_requests_per_s", row["requests_per_s"], "req/s"),
            figure(f"{name}_{row['mode']}_p99_ms", row["p99_ms"], "ms"),
        ]
    out += [
        figure(f"{name}_loads_per_1000", low["loads_per_1000"], "per 1000 requests"),
        figure(f"{name}_evicts_per_1000", low["evicts_per_1000"], "per 1000 requests"),
        figure(f"{name}_belady_loads_per_1000", low["belady_loads_per_1000"], "per 1000"),
        _bounded(f"{name}_loads_vs_belady", vs, high=BELADY_TARGET),
    ]
    return out


def figures(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The headline numbers: per variant the load / execution ratio, then per trace."""
    lo, hi = LOAD_EXEC_TARGET
    out = [
        figure(
            "density_copy_bandwidth_gb_per_s",
            max(report["copy_bandwidth_gb_per_s"]),
            "GB/s",
        )
    ]
    for variant in report["variants"]:
        ratio = variant["load_to_execution"]
        out.append(_bounded(f"density_{variant['variant']}_load_to_execution", ratio, lo, hi))
        for trace in variant["traces"]:
            out += _trace_figures(variant["variant"], trace)
    return out


def _verdict(value: float | None, ok: bool) -> str:
    return "not measured" if value is None else ("met" if ok else "**NOT met**")


def _range(pair: tuple[float, float] | None) -> str:
    return "" if pair is None else f" (rounds {pair[0]:.2f}-{pair[1]:.2f})"


def _summary(report: Mapping[str, Any], variant: Mapping[str, Any]) -> list[str]:
    arena = report["arenas"][variant["variant"]]
    link = arena["bandwidth_bytes_per_s"]
    lo, hi = LOAD_EXEC_TARGET
    ratio = variant["load_to_execution"]
    lines = [
        f"- **{variant['variant']}** (arena copies "
        f"{'capped at ' + format(link / 1e9, 'g') + ' GB/s' if link else 'uncapped'}): one load "
        f"{fmt(variant['load_ms'], '.1f')} ms / one batch-1 execution "
        f"{variant['batch1_execution_ms']:.1f} ms = {fmt(ratio, '.2f')} (target {lo:g}-{hi:g}: "
        f"{_verdict(ratio, ratio is not None and lo <= ratio <= hi)})."
    ]
    for trace in variant["traces"]:
        rps, p99 = ratios(trace)
        low, full = trace["modes"]
        vs = low["loads_vs_belady"]
        zipf = trace["trace"] == "zipf"
        targets = (
            f" (target >= {THROUGHPUT_TARGET:.2f}: "
            f"{_verdict(rps, rps is not None and rps >= THROUGHPUT_TARGET)})"
            if zipf
            else ""
        )
        p99_target = (
            f" (target <= {P99_TARGET:g}: {_verdict(p99, p99 is not None and p99 <= P99_TARGET)})"
            if zipf
            else ""
        )
        bound = (
            f" (an optimal cache, loads not overlapping execution: about "
            f"{fmt(throughput_bound(trace), '.2f')}x)"
            if zipf
            else ""
        )
        lines.append(
            f"  - {trace['trace']}: {low['requests_per_s']:.1f} vs {full['requests_per_s']:.1f} "
            f"req/s = {fmt(rps, '.2f')}x{_range(_spread(trace, 'throughput_ratio'))}{targets}"
            f"{bound}; "
            f"p99 {low['p99_ms']:.1f} vs {full['p99_ms']:.1f} ms = {fmt(p99, '.2f')}x"
            f"{_range(_spread(trace, 'p99_ratio'))}{p99_target}; "
            f"{fmt(low['loads_per_1000'], '.1f')} loads / 1000 vs Belady's "
            f"{fmt(low['belady_loads_per_1000'], '.1f')} = {fmt(vs, '.2f')}x (target <= "
            f"{BELADY_TARGET:g}: {_verdict(vs, vs is not None and vs <= BELADY_TARGET)}); "
            f"{fmt(low['evicts_per_1000'], '.1f')} evictions / 1000."
        )
    return lines


def _table(variant: Mapping[str, Any]) -> list[str]:
    lines = [
        f"### {variant['variant']}",
        "",
        "| trace | worker | req/s | p50 ms | p99 ms | requests | loads / 1000 | "
        "Belady / 1000 | LRU / 1000 | evicts / 1000 | ms / load | errors |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for trace in variant["traces"]:
        for r in trace["modes"]:
            lines.append(
                f"| {trace['trace']} | {r['mode']} | {r['requests_per_s']:.1f} | "
                f"{r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['requests']:,} | "
                f"{fmt(r['loads_per_1000'], '.1f')} | {fmt(r['belady_loads_per_1000'], '.1f')} | "
                f"{fmt(r['lru_loads_per_1000'], '.1f')} | {fmt(r['evicts_per_1000'], '.1f')} | "
                f"{fmt(r['ms_per_load'], '.1f')} | {r['errors']} |"
            )
    return lines


def _settings(report: Mapping[str, Any]) -> list[str]:
    c, args, arenas = report["catalog"], report["args"], report["arenas"]
    bw = report["copy_bandwidth_gb_per_s"]
    cap = args["cap_gbps"]
    binds = "can bind" if cap < min(bw) else "cannot bind here (copies are slower than the cap)"
    return [
        f"Catalog: {c['models']} `{c['kind']}` models x {c['bytes_per_model']:,} B of distinct "
        f"weights = {c['total_bytes']:,} B. Constrained budget {c['budget_bytes']:,} B = "
        f"{c['slots']} models (the {c['slots']} most popular carry "
        f"{c['traffic_share_of_top_models_within_budget']:.0%} of Zipf(1.1) traffic); arena "
        f"{arenas['uncapped']['arena_bytes']:,} B. Resident: budget and arena hold the catalog "
        f"(arena {arenas['resident']['arena_bytes']:,} B).",
        "",
        f"This machine copies {c['bytes_per_model']:,} B into touched memory at "
        f"{min(bw):.1f}-{max(bw):.1f} GB/s ({len(bw)} copies), so a {cap:g} GB/s cap {binds}.",
        "",
        f"Zipf(1.1): {args['concurrency']} closed-loop clients, {args['rounds']} alternating "
        f"windows of {args['window']:g} s per worker after {args['warmup']:g} s of warm-up "
        f"(seed {args['seed']}). Bursty: on/off trace (`bench._traces.bursty_trace`: mean on "
        f"2 s, off 10 s x rank^0.5) drawn for {args['bursty_s']:g} s at 100 req/s "
        f"({report['bursty_requests']:,} requests, seed {args['seed']}), then paced to "
        f"{fmt(report['bursty_rate_per_s'], '.1f')} req/s = {args['bursty_load']:g}x the "
        "resident worker's Zipf req/s (same requests every run), replayed open-loop by "
        f"{args['clients']} clients, latency from each "
        "scheduled arrival. Loads are the worker's counters per request sent; Belady's and "
        "LRU's for the same sequence in the order sent, with the same slots, cache empty at the "
        "start. Load time: the constrained worker's load seconds / loads; execution: the "
        "resident worker's compute seconds / executions of one client sending batch-1 requests "
        "(the ratio's load time is over both traces' loads; each trace's own is in the tables).",
    ]


def markdown(report: Mapping[str, Any]) -> list[str]:
    """The report as Markdown lines."""
    m = report["machine"]
    lines = [
        "# Density benchmark on honest loads (CPU arena)",
        "",
        f"Machine: {machine_line(m)} Load average (1 min) {fmt(m['loadavg_1m'], '.1f')} before, "
        f"{fmt(m.get('loadavg_1m_after'), '.1f')} after.",
        "",
        f"Command: `{report['command']}`",
        "",
    ]
    for variant in report["variants"]:
        lines += _summary(report, variant)
    lines += ["", *_settings(report), ""]
    for variant in report["variants"]:
        lines += [*_table(variant), ""]
    return lines
