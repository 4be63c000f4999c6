"""The Markdown report of ``bench.peers`` (its JSON report in, lines out)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench._common import error_lines, figure_lines, fmt, machine_line
from bench._peers.cells import short

__all__ = ["markdown"]

Row = dict[str, Any]


def _servers(report: Row) -> list[str]:
    lines = [
        "| server | version | batching | status | idle CPU | venv: prepared in, disk |",
        "|---|---|---|---|---|---|",
    ]
    for s in report["servers"]:
        installed = s.get("installed") or {}
        venv = (
            f"{installed['prepare_s']:.0f} s, {installed['disk_bytes'] / 1e9:.2f} GB"
            if installed
            else "-"
        )
        status = "ran" if s["available"] else f"unavailable: {s['reason']}"
        idle = fmt(s.get("idle_cpu_percent"), ".1f")
        lines.append(
            f"| {s['server']} | {s['version']} | {s['batching']} | {status} | {idle}% | {venv} |"
        )
    return lines


def _grid(report: Row, title: str, cell: Callable[[Row], str]) -> list[str]:
    """One line per server, one column per (model, concurrency)."""
    points = sorted(
        {(r["model"], r["concurrency"]) for r in report["table"]},
        key=lambda p: (report["args"]["models"].index(p[0]), p[1]),
    )
    rows = {(r["server"], r["model"], r["concurrency"]): r for r in report["table"]}
    lines = [
        f"### {title}",
        "",
        "| server | " + " | ".join(f"{short(m)} c={c}" for m, c in points) + " |",
        "|---" * (len(points) + 1) + "|",
    ]
    for server in [s["server"] for s in report["servers"] if s["available"]]:
        values = [cell(rows[server, m, c]) if (server, m, c) in rows else "-" for m, c in points]
        lines.append(f"| {server} | " + " | ".join(values) + " |")
    caps = {(c["model"], c["concurrency"]): c["raw_cap_rows_per_s"] for c in report["cells"]}
    if title.startswith("req/s"):
        lines.append(
            "| raw cap (rows/s at batch min(c, 32)) | "
            + " | ".join(fmt(caps.get(p), ",.0f") for p in points)
            + " |"
        )
    return [*lines, ""]


def _rps(r: Row) -> str:
    s = r["requests_per_s"]
    if r["rounds"] == 1:
        return f"{s['median']:,.0f}"
    return f"{s['median']:,.0f} ({s['min']:,.0f}-{s['max']:,.0f})"


def _latency(r: Row) -> str:
    return f"{fmt(r['p50_ms'], '.2f')} / {fmt(r['p99_ms'], '.2f')}"


def _raw(report: Row) -> list[str]:
    lines = ["| model | batch | rows/s | ms per call |", "|---|---|---|---|"]
    for model, points in report["raw_caps"].items():
        for batch, rows_per_s in points.items():
            lines.append(
                f"| {short(model)} | {batch} | {rows_per_s:,.0f} | "
                f"{int(batch) / rows_per_s * 1e3:.3f} |"
            )
    return lines


def markdown(report: Row) -> list[str]:
    """The report as Markdown lines."""
    args = report["args"]
    return [
        "# Peers benchmark: PyTriton, KServe and MLServer vs our worker",
        "",
        f"Machine: {machine_line(report['machine'])} Load average at the start: "
        f"{fmt(report['machine'].get('loadavg_1m'), '.2f')}, at the end "
        f"{fmt(report.get('loadavg_1m_end'), '.2f')} (other jobs share the machine's cores), "
        "so absolute rates are noisy.",
        "",
        f"Command: `{report['command']}`. Client: stock `tritonclient.grpc.aio` "
        f"({args['client']} loop), one one-row request in flight per client, "
        f"{args['rounds']} round(s) of {args['duration']:g} s windows after {args['warmup']:g} s "
        f"warm-up; in each cell the servers in the order {', '.join(report['order'])} (the "
        f"peers reversed every other round, ours last). Pinned: {report['pinned'] or 'no'}.",
        "",
        "## Figures",
        "",
        *figure_lines(report["figures"]),
        "",
        "## Servers",
        "",
        f"Started together on the servers' CPU, all ready after "
        f"{fmt(report.get('ready_after_s'), '.0f')} s. Idle CPU: each server's while none was "
        "measured (in % of one core; it shares the measured server's core).",
        "",
        *_servers(report),
        "",
        "## Per cell (median over rounds; req/s with min-max)",
        "",
        *_grid(report, "req/s", _rps),
        *_grid(report, "p50 / p99 latency (ms)", _latency),
        *_grid(
            report,
            "server CPU per request (us, whole process tree)",
            lambda r: fmt(r["server_cpu_us_per_request"], ",.0f"),
        ),
        *_grid(report, "rows per execution", lambda r: fmt(r["rows_per_execution"], ".2f")),
        "## Raw executable (in process, jax, median over rounds)",
        "",
        *_raw(report),
        *error_lines(report["errors"]),
        "",
    ]
