"""The suite's PNG plots (matplotlib, Agg backend), one per topic, from the benchmarks' reports.

Each plot reads the detailed tables of one or two benchmark reports; where they are missing
(the benchmark failed, was skipped, or its report lacks the table) the plot is skipped and a
note says why. :func:`draw_all` returns the plots drawn and the notes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

__all__ = ["PLOTS", "Plot", "draw_all"]

Reports = Mapping[str, dict[str, Any]]


@attrs.frozen
class Plot:
    """A drawn plot: its file (relative to the plot folder) and caption."""

    file: str
    caption: str


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path)
    _pyplot().close(fig)


def _num(value: float | None) -> float:
    return float("nan") if value is None else float(value)


def _need(reports: Reports, *names: str) -> dict[str, Any]:
    for name in names:
        if reports.get(name) is not None:
            return reports[name]
    raise LookupError(f"no report from {' or '.join(names)}")


def _bars(ax: Any, groups: list[str], series: Mapping[str, list[float]], ylabel: str) -> None:
    """Grouped bars: one group per label in ``groups``, one bar per series."""
    width = 0.8 / max(1, len(series))
    for k, (label, values) in enumerate(series.items()):
        xs = [i + (k - (len(series) - 1) / 2) * width for i in range(len(groups))]
        ax.bar(xs, values, width, label=label)
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel(ylabel)
    ax.legend()


def plot_coalescing(reports: Reports, path: Path) -> str:
    """Rows/s against batch size: raw executable, one client with b rows, b one-row clients."""
    report = _need(reports, "coalescing")
    points = sorted(report["points"], key=lambda p: p["batch"])
    batch = [p["batch"] for p in points]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, label in (
        ("raw_rows_per_s", "raw executable (padded to a compiled size)"),
        ("batched_rows_per_s", "served: 1 client, b-row requests"),
        ("coalesced_rows_per_s", "served: b clients, 1-row requests"),
    ):
        ax.plot(batch, [_num(p.get(key)) for p in points], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(batch, [str(b) for b in batch])
    ax.set_xlabel("batch size b (rows)")
    ax.set_ylabel("rows/s")
    ax.set_title("Coalescing: CNN rows/s vs batch size, served (gRPC) vs raw")
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    _save(fig, path)
    return "CNN rows/s against batch size: the raw executable and the two served ways"


def _worker_bare_runs(reports: Reports) -> list[dict[str, Any]]:
    report = _need(reports, "overhead", "worker_grpc")
    runs = report.get("runs") or report.get("floor", {}).get("runs")
    if not runs:
        raise LookupError("no worker / bare runs in the overhead report")
    return [r for r in runs if r["model"] == "mlp"]


def _stage_split(reports: Reports) -> tuple[dict[int, dict[str, float]], dict[int, float]]:
    """Worker CPU per request by stage, and the bare floor's CPU per request, by concurrency."""
    split: dict[int, dict[str, float]] = {}
    bare: dict[int, float] = {}
    for row in (reports.get("overhead") or {}).get("stages", []):
        if row.get("us_per_request"):
            split[row["concurrency"]] = row["us_per_request"]
            if row.get("bare_us") is not None:
                bare[row["concurrency"]] = row["bare_us"]
    return split, bare


def plot_overhead(reports: Reports, path: Path) -> str:
    """Req/s against concurrency, worker vs bare floor; the worker's CPU per request by stage."""
    runs = _worker_bare_runs(reports)
    split, bare = _stage_split(reports)
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2 if split else 1, figsize=(12.5 if split else 6, 4.5))
    ax = axes[0] if split else axes
    for target in ("bare", "worker", "worker_delay"):
        rows = sorted((r for r in runs if r["target"] == target), key=lambda r: r["concurrency"])
        if not rows:
            continue
        ax.plot(
            [r["concurrency"] for r in rows],
            [r["requests_per_s"] for r in rows],
            marker="o",
            label=f"{target} (tiny MLP)",
        )
    concurrencies = sorted({r["concurrency"] for r in runs})
    ax.set_xscale("log", base=2)
    ax.set_xticks(concurrencies, [str(c) for c in concurrencies])
    ax.set_xlabel("concurrency (closed-loop clients)")
    ax.set_ylabel("req/s")
    ax.set_title("Worker vs bare grpc.aio floor")
    ax.legend()
    ax.grid(alpha=0.3)
    if split:
        stages = list(next(iter(split.values())))
        concurrencies = sorted(split)
        bottom = [0.0] * len(concurrencies)
        for stage in stages:
            values = [split[c].get(stage, 0.0) for c in concurrencies]
            axes[1].bar([str(c) for c in concurrencies], values, bottom=bottom, label=stage)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        if bare:
            axes[1].plot(
                [str(c) for c in concurrencies],
                [_num(bare.get(c)) for c in concurrencies],
                "k_",
                markersize=30,
                label="bare server, whole process",
            )
        axes[1].set_xlabel("concurrency")
        axes[1].set_ylabel("server CPU per request (us)")
        axes[1].set_title("Worker CPU per request by stage")
        axes[1].legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _save(fig, path)
    what = "; the worker's CPU per request split by stage" if split else ""
    return f"Tiny MLP req/s against concurrency, worker vs bare grpc.aio floor{what}"


def plot_density(reports: Reports, path: Path) -> str:
    """Throughput and p99, constrained (budget 1/5 of the catalog) vs all-resident, per trace
    and arena variant."""
    variants = _need(reports, "density")["variants"]
    groups, modes = [], ("constrained", "resident")
    rps: dict[str, list[float]] = {m: [] for m in modes}
    p99: dict[str, list[float]] = {m: [] for m in modes}
    for variant in variants:
        for trace in variant["traces"]:
            groups.append(f"{trace['trace']}\n{variant['variant']}")
            for row in trace["modes"]:
                rps[row["mode"]].append(row["requests_per_s"])
                p99[row["mode"]].append(row["p99_ms"])
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    _bars(left, groups, rps, "req/s")
    left.set_title("Throughput")
    _bars(right, groups, p99, "p99 latency (ms)")
    right.set_title("p99 latency")
    fig.suptitle("Density on CPU-arena loads: weight budget 1/5 of the catalog vs all-resident")
    _save(fig, path)
    return "Density: throughput and p99 with the budget at 1/5 of the catalog vs all-resident"


def plot_gateway(reports: Reports, path: Path) -> str:
    """p50 latency direct vs through one and two-worker gateways, per concurrency (MLP)."""
    latency = _need(reports, "gateway")["latency"]
    targets = ("direct", "gateway_1", "gateway_2")
    concurrencies = sorted({r["concurrency"] for r in latency})
    by = {(r["target"], r["concurrency"]): r for r in latency}
    series = {t: [by[t, c]["p50_ms"] for c in concurrencies] for t in targets}
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    _bars(ax, [f"c={c}" for c in concurrencies], series, "p50 latency (ms)")
    ax.set_title("Gateway: added latency (tiny MLP, one row)")
    _save(fig, path)
    return "p50 latency direct to the worker vs through the gateway, per concurrency"


def plot_fleet(reports: Reports, path: Path) -> str:
    """Mean, p99 and cold loads per 1000 requests per routing mode and trace (bench.fleet)."""
    from bench._fleet_report import draw

    draw(_need(reports, "fleet"), path)
    return "Fleet: round_robin vs lpt_packing vs model_aware over 2 small-budget workers"


def plot_cold_loads(reports: Reports, path: Path) -> str:
    """On-demand weight load vs raw copy, and start-up with cold compile vs cache hits."""
    report = _need(reports, "runtime")
    weights, startup = report["weights"], report["startup"]
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    floors = ("pinned_system", "unpinned")
    _bars(
        left,
        list(floors),
        {
            "on-demand load": [weights[f]["load_s_median"] * 1e3 for f in floors],
            "raw copy": [weights[f]["raw_copy_s_median"] * 1e3 for f in floors],
        },
        "ms (median)",
    )
    left.set_title(f"Weight load vs raw copy ({weights['weight_bytes'] / 1e6:.0f} MB)")
    right.bar(["cold compile", "cache hit"], [startup["cold"]["load_s"], startup["hit"]["load_s"]])
    right.set_ylabel("s to load every example")
    right.set_title("Start-up: cold compile vs executable-cache hit")
    _save(fig, path)
    return "Cold loads: weight load vs raw copy of the same bytes; compile cold vs cache hit"


def _peers_panel(ax: Any, report: dict[str, Any], model: str) -> None:
    """One model's cells: a bar per server, the raw cap as a line (as text when far above)."""
    rows = {(r["server"], r["concurrency"]): r for r in report["table"] if r["model"] == model}
    concurrencies = sorted({c for _, c in rows})
    servers = [s["server"] for s in report["servers"] if s["available"]]
    series = {
        s: [
            _num(rows[s, c]["requests_per_s"]["median"] if (s, c) in rows else None)
            for c in concurrencies
        ]
        for s in servers
    }
    _bars(ax, [f"c={c}" for c in concurrencies], series, "req/s (median over rounds)")
    ax.set_yscale("log")
    top = 4 * max((v for vs in series.values() for v in vs if not math.isnan(v)), default=1.0)
    caps = {
        c["concurrency"]: c["raw_cap_rows_per_s"] for c in report["cells"] if c["model"] == model
    }
    for i, c in enumerate(concurrencies):
        cap = caps.get(c)
        if cap is None:
            continue
        if cap <= top:
            ax.plot([i - 0.45, i + 0.45], [cap, cap], "k-", linewidth=2)
        else:
            ax.annotate(f"raw cap {cap:,.0f}", (i, top), ha="center", va="top", fontsize="small")
    ax.set_ylim(top=top)
    ax.set_title(f"{model}: req/s (black: raw cap, rows/s at batch min(c, 32))")
    ax.grid(alpha=0.3, axis="y")
    ax.get_legend().remove()  # one legend for both panels


def plot_peers(reports: Reports, path: Path) -> str:
    """Req/s per concurrency, one panel per MLP, one bar per server, the raw executable's cap."""
    report = _need(reports, "peers")
    models = [m for m in report["args"]["models"] if any(r["model"] == m for r in report["table"])]
    if not models:
        raise LookupError("no windows in the peers report")
    plt = _pyplot()
    fig, axes = plt.subplots(
        1, len(models), figsize=(6.5 * len(models), 5), squeeze=False, layout="constrained"
    )
    for ax, model in zip(axes[0], models, strict=True):
        _peers_panel(ax, report, model)
        ax.set_xlabel("concurrency (closed-loop one-row clients, tritonclient.grpc.aio)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=len(labels))
    fig.savefig(path)  # constrained layout: not _save's tight_layout
    plt.close(fig)
    return (
        "Req/s per MLP and concurrency: the floor (a canned answer on our front), PyTriton, "
        "KServe, MLServer and ours; the raw cap"
    )


#: Plot file stem -> drawing function (returns the caption; raises where data is missing).
PLOTS: Mapping[str, Callable[[Reports, Path], str]] = {
    "coalescing": plot_coalescing,
    "overhead": plot_overhead,
    "density": plot_density,
    "gateway": plot_gateway,
    "fleet": plot_fleet,
    "cold_loads": plot_cold_loads,
    "peers": plot_peers,
}


def draw_all(reports: Reports, folder: Path) -> tuple[list[Plot], list[str]]:
    """Every plot whose data is there, as PNG files in ``folder``; notes for the others."""
    folder.mkdir(parents=True, exist_ok=True)
    drawn, notes = [], []
    for stem, draw in PLOTS.items():
        path = folder / f"{stem}.png"
        try:
            caption = draw(reports, path)
        except (LookupError, TypeError, ValueError) as exc:
            notes.append(f"{stem}: skipped, data missing ({type(exc).__name__}: {exc})")
            continue
        drawn.append(Plot(path.name, caption))
    return drawn, notes
