"""The derived figures, the Markdown and the plot of ``bench.fleet``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench._common import error_lines, figure, fmt, machine_line

__all__ = ["TARGET_COLD", "TARGET_MEAN", "derive", "draw", "figures", "markdown"]

#: model_aware / round_robin targets (issue 37): mean latency, cold loads; throughput >= 1.
TARGET_MEAN = 0.6
TARGET_COLD = 0.25


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _spread(values: Sequence[float]) -> dict[str, float] | None:
    return {"min": min(values), "max": max(values)} if values else None


def derive(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per trace: each mode's rounds combined (mean of rounds, min-max spread) and its ratios
    to round_robin's."""
    out = []
    for trace in dict.fromkeys(r["trace"] for r in runs):
        rows: dict[str, dict[str, Any]] = {}
        for mode in dict.fromkeys(r["mode"] for r in runs if r["trace"] == trace):
            mine = [r for r in runs if r["trace"] == trace and r["mode"] == mode]
            row: dict[str, Any] = {"trace": trace, "mode": mode, "rounds": len(mine)}
            for key in ("mean_ms", "p50_ms", "p99_ms", "requests_per_s", "cold_per_1000"):
                values = [r[key] for r in mine]
                row[key] = sum(values) / len(values)
                row[f"{key}_spread"] = _spread(values)
            rows[mode] = row
        base = rows.get("round_robin")
        for row in rows.values():
            for key in ("mean_ms", "p99_ms", "requests_per_s", "cold_per_1000"):
                row[f"{key}_vs_rr"] = _ratio(row[key], base[key] if base else None)
            out.append(row)
    return out


def figures(
    summary: list[dict[str, Any]], load_exec: float | None, traces: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The headlines: model_aware / round_robin per trace against the targets, the load /
    execution ratio against its 0.5-2 range, and per trace the floor of the cold-load ratio
    (Belady's offline optimum over the pooled budgets / round_robin's loads)."""
    out = [
        figure(
            "one load / one batch-1 execution",
            load_exec,
            "x",
            target="0.5-2",
            met=load_exec is not None and 0.5 <= load_exec <= 2.0,
        )
    ]
    floors = {t["name"]: t["belady_per_1000"] for t in traces}
    for row in summary:
        if row["mode"] == "round_robin" and row["trace"] in floors:
            out.append(
                figure(
                    f"offline optimum / round_robin cold loads ({row['trace']})",
                    _ratio(floors[row["trace"]], row["cold_per_1000"]),
                    "x",
                )
            )
        if row["mode"] != "model_aware":
            continue
        goals: tuple[tuple[str, str, str, Callable[[float], bool]], ...] = (
            ("mean latency", "mean_ms_vs_rr", f"<= {TARGET_MEAN}", lambda v: v <= TARGET_MEAN),
            ("cold loads", "cold_per_1000_vs_rr", f"<= {TARGET_COLD}", lambda v: v <= TARGET_COLD),
            ("req/s", "requests_per_s_vs_rr", ">= 1.0 (within 2%)", lambda v: v >= 0.98),
        )
        for label, key, target, ok in goals:
            value = row[key]
            out.append(
                figure(
                    f"model_aware / round_robin {label} ({row['trace']})",
                    value,
                    "x",
                    target=target,
                    met=value is not None and ok(value),
                )
            )
    return out


def _spread_text(row: dict[str, Any], key: str, spec: str) -> str:
    s = row.get(f"{key}_spread")
    if not s or row["rounds"] < 2:
        return fmt(row[key], spec)
    return f"{fmt(row[key], spec)} ({fmt(s['min'], spec)}-{fmt(s['max'], spec)})"


def markdown(report: dict[str, Any]) -> list[str]:
    """The report as Markdown."""
    s = report["settings"]
    lines = [
        "# Routing across a fleet: round_robin vs lpt_packing vs model_aware",
        "",
        f"Machine: {machine_line(report['machine'])}",
        f"Command: `{report['command']}`",
        "",
        f"Catalog: {s['models']} `{s['kind']}` models of {s['model_mib']:.1f} MiB of weights; "
        f"2 workers, each a CPU arena of {s['arena_mib']:.0f} MiB "
        f"(bandwidth cap: {s['arena_bandwidth'] or 'none'}) and a weight budget of "
        f"{s['budget_mib']:.0f} MiB ({s['budget_models']:g} models; the catalog is "
        f"{s['catalog_over_fleet_budget']:.1f}x the two budgets together). Gateway status polls "
        f"every {s['poll_s']:g} s; fresh workers (empty caches) for every mode, trace and "
        "round, and one more fleet per mode for the scenarios.",
        f"One load {fmt(report['load_ms'], '.1f')} ms / one batch-1 execution "
        f"{fmt(report['exec_ms'], '.2f')} ms = **{fmt(report['load_exec_ratio'], '.1f')}x** "
        "(the issue asks 0.5-2).",
        "",
        "Traces (open loop, seeded): "
        + "; ".join(
            f"`{t['name']}`: {t['description']} (Belady's offline optimum over the pooled "
            f"{t['belady_slots']} slots: {t['belady_per_1000']:.0f} cold loads / 1000)"
            for t in report["traces"]
        ),
        "",
        "| trace | mode | mean ms | p50 ms | p99 ms | req/s | cold loads / 1000 | mean vs rr "
        "| cold vs rr | req/s vs rr |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in report["summary"]:
        lines.append(
            f"| {row['trace']} | {row['mode']} | {_spread_text(row, 'mean_ms', '.1f')} "
            f"| {fmt(row['p50_ms'], '.1f')} | {_spread_text(row, 'p99_ms', '.0f')} "
            f"| {_spread_text(row, 'requests_per_s', '.1f')} "
            f"| {_spread_text(row, 'cold_per_1000', '.0f')} | {fmt(row['mean_ms_vs_rr'], '.2f')} "
            f"| {fmt(row['cold_per_1000_vs_rr'], '.2f')} "
            f"| {fmt(row['requests_per_s_vs_rr'], '.3f')} |"
        )
    lines += [
        "",
        "Spread: (min-max over rounds). Scenarios (mean latency ms, cold loads):",
        "",
        "| scenario | " + " | ".join(report["modes"]) + " |",
        "|---|" + "---|" * len(report["modes"]),
    ]
    for name in dict.fromkeys(r["scenario"] for r in report["scenarios"]):
        cells = []
        for mode in report["modes"]:
            r = next(
                (x for x in report["scenarios"] if x["scenario"] == name and x["mode"] == mode),
                None,
            )
            cells.append("-" if r is None else f"{r['mean_ms']:.1f} ms, {r['cold_loads']} cold")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", *(f"- {sc['name']}: {sc['summary']}" for sc in report["scenario_defs"])]
    lines += ["", "| figure | value | target | met |", "|---|---|---|---|"]
    for f in report["figures"]:
        met = "-" if f["met"] is None else ("yes" if f["met"] else "**no**")
        lines.append(
            f"| {f['name']} | {fmt(f['value'], '.3f')} {f['unit']} | {f['target'] or '-'} | {met} |"
        )
    lines += error_lines(report["errors"])
    return [*lines, ""]


def draw(report: dict[str, Any], path: Path) -> Path:
    """Bars per trace: mean latency, p99 and cold loads per 1000 requests, one bar per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    traces = list(dict.fromkeys(r["trace"] for r in report["summary"]))
    modes = report["modes"]
    keys = (
        ("mean_ms", "mean latency (ms)"),
        ("p99_ms", "p99 latency (ms)"),
        ("cold_per_1000", "cold loads / 1000 requests"),
    )
    fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3.4))
    width = 0.8 / len(modes)
    for ax, (key, title) in zip(axes, keys, strict=True):
        for j, mode in enumerate(modes):
            rows = [
                next(r for r in report["summary"] if r["trace"] == t and r["mode"] == mode)
                for t in traces
            ]
            values = [r[key] for r in rows]
            errs = [
                [r[key] - (r[f"{key}_spread"] or {"min": r[key]})["min"] for r in rows],
                [(r[f"{key}_spread"] or {"max": r[key]})["max"] - r[key] for r in rows],
            ]
            xs = [i + (j - (len(modes) - 1) / 2) * width for i in range(len(traces))]
            ax.bar(xs, values, width, yerr=errs, label=mode, capsize=2)
        ax.set_xticks(range(len(traces)), traces)
        ax.set_title(title, fontsize=10)
    axes[0].legend(fontsize=8)
    fig.suptitle(
        f"2 workers, {report['settings']['models']} models, budget "
        f"{report['settings']['budget_models']:g} models each; load/exec "
        f"{fmt(report['load_exec_ratio'], '.1f')}x",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
