"""The tables, figures and Markdown of ``bench.coalescing`` (its JSON report in).

``points`` joins the raw reference and both served ways per batch size b into one flat row
(the plot's data); ``figures`` picks the headline numbers at b = 32; ``markdown`` renders it.
"""

from __future__ import annotations

import statistics
from typing import Any

from bench._common import figure, machine_line

__all__ = ["HEADLINE_BATCH", "MODES", "TARGET_RATIO", "figures", "headline", "markdown", "points"]

#: 04's coalescing target: served >= 85% of the raw executable at concurrency 32.
HEADLINE_BATCH = 32
TARGET_RATIO = 0.85
#: ``batched``: one client, b-row requests; ``coalesced``: b clients, one-row requests.
MODES = ("batched", "coalesced")
_TARGET = f">= {TARGET_RATIO:.2f} (04, at concurrency 32; measured here through gRPC)"


def _raw(slices: list[dict[str, Any]]) -> dict[str, Any]:
    """One batch size's raw reference: mean ms per batch of its slices, drift (last / first)."""
    ms = [r["ms_per_batch"] for r in slices]
    return {
        "ms_per_batch": statistics.fmean(ms),
        "ms_per_batch_by_slice": ms,
        "drift": ms[0] / ms[-1],  # rows/s of the last slice / the first
        "cpu_cores": statistics.fmean(r["cpu_cores"] for r in slices),
    }


def points(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per batch size b: raw and both served ways, ratios to raw."""
    runs = {(r["mode"], r["rows_per_request"] * r["concurrency"]): r for r in report["runs"]}
    out = []
    for b_text, size in report["padded_to"].items():
        b = int(b_text)
        ref = _raw(report["raw_slices"][b_text])
        raw_rows_per_s = b / (ref["ms_per_batch"] / 1e3)
        point: dict[str, Any] = {
            "batch": b,
            "compiled_batch": size,
            "raw_rows_per_s": raw_rows_per_s,
            "raw_us_per_row": ref["ms_per_batch"] * 1e3 / b,
            "raw_drift": ref["drift"],
        }
        for mode in MODES:
            run = runs.get((mode, b))
            if run is None:
                continue
            point.update(
                {
                    f"{mode}_rows_per_s": run["rows_per_s"],
                    f"{mode}_ratio": run["rows_per_s"] / raw_rows_per_s,
                    f"{mode}_p50_ms": run["p50_ms"],
                    f"{mode}_p99_ms": run["p99_ms"],
                    f"{mode}_row_p50_us": run["row_p50_us"],
                    f"{mode}_rows_per_execution": run["rows_per_execution"],
                    f"{mode}_executions_by_batch": run["executions_by_batch"],
                    f"{mode}_server_cpu_us_per_row": run["server_cpu_us_per_row"],
                }
            )
        out.append(point)
    return out


def headline(report: dict[str, Any]) -> dict[str, Any]:
    """The point at b = 32 (the largest measured b when 32 was left out)."""
    at: dict[int, dict[str, Any]] = {p["batch"]: p for p in report["points"]}
    return at.get(HEADLINE_BATCH) or at[max(at)]


def figures(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Served / raw at the headline b for both ways (against 04's target) and the numbers."""
    p = headline(report)
    b = p["batch"]
    out = []
    for mode, way in (
        ("coalesced", f"{b} clients x 1-row requests"),
        ("batched", f"1 client x {b}-row requests"),
    ):
        ratio = p.get(f"{mode}_ratio")
        met = None if ratio is None else ratio >= TARGET_RATIO
        out.append(figure(f"served / raw rows/s, {way}", ratio, "x", target=_TARGET, met=met))
    out += [
        figure(f"raw rows/s, batch {b}", p["raw_rows_per_s"], "rows/s"),
        figure(f"served rows/s, {b} clients x 1 row", p.get("coalesced_rows_per_s"), "rows/s"),
        figure(f"served rows/s, 1 client x {b} rows", p.get("batched_rows_per_s"), "rows/s"),
        figure(
            f"rows per execution, {b} clients x 1 row",
            p.get("coalesced_rows_per_execution"),
            "rows",
        ),
    ]
    if b != HEADLINE_BATCH:
        return out
    for key, name in (
        ("floor", "gRPC floor / raw rows/s (bare grpc.aio server"),
        ("front_floor", "front floor / raw rows/s (canned answer on our front"),
    ):
        run = report.get(key)
        if run is not None:
            ratio = run["rows_per_s"] / p["raw_rows_per_s"]
            out.append(figure(f"{name}, {b} clients x 1 row)", ratio, "x"))
    front = report.get("front_floor")
    if front is not None:
        worker_cpu = p.get("coalesced_server_cpu_us_per_row")
        front_cpu = front["server_cpu_us_per_row"]
        above = None if worker_cpu is None or front_cpu is None else worker_cpu - front_cpu
        out.append(
            figure(f"worker CPU / row above the front floor's ({b} clients x 1 row)", above, "us")
        )
    return out


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _hist(executions: dict[str, int] | None) -> str:
    return ", ".join(f"{b}: {n}" for b, n in (executions or {}).items()) or "-"


def _summary(report: dict[str, Any]) -> list[str]:
    p = headline(report)
    b = p["batch"]
    lines = []
    for mode, way in (
        ("coalesced", f"{b} clients sending one-row requests"),
        ("batched", f"one client sending {b}-row requests"),
    ):
        ratio = p.get(f"{mode}_ratio")
        if ratio is None:
            continue
        verdict = "met" if ratio >= TARGET_RATIO else "NOT met"
        lines.append(
            f"- Served / raw at b = {b}, {way}: {p[f'{mode}_rows_per_s']:,.0f} vs "
            f"{p['raw_rows_per_s']:,.0f} rows/s = {ratio:.2f} "
            f"({_fmt(p[f'{mode}_rows_per_execution'], '.1f')} rows per execution). "
            f"Target >= {TARGET_RATIO:.2f}: {verdict}."
        )
    if b != HEADLINE_BATCH:
        return lines
    floor, front = report.get("floor"), report.get("front_floor")
    if floor is not None:
        lines.append(
            f"- The gRPC floor at the same load (bare grpc.aio server, {b} clients, one-row "
            f"requests, canned answer): {floor['rows_per_s']:,.0f} rows/s = "
            f"{floor['rows_per_s'] / p['raw_rows_per_s']:.2f} of raw. 04's target is the "
            "scheduler's (`bench.scheduler` measures it in process); here the full gRPC path "
            "is in the way, and this floor bounds what one-row requests can reach."
        )
    if front is None:
        return lines
    worker_cpu = _fmt(p.get("coalesced_server_cpu_us_per_row"), ".0f")
    return [
        *lines,
        f"- The front floor (the same canned answer on our own front door): "
        f"{front['rows_per_s']:,.0f} rows/s at {_fmt(front['server_cpu_us_per_row'], '.0f')} "
        f"us of server CPU per row, against the worker's {worker_cpu}: the difference is the "
        "worker's own request path and the execution.",
    ]


def _placement(report: dict[str, Any]) -> str:
    pinned = report["pinned"]
    if pinned is None:
        return "Unpinned (`--no-pin`): clients, worker and raw loops share every CPU."
    client = ", ".join(map(str, pinned["client"]))
    servers = ", ".join(map(str, pinned["servers"]))
    load = report["machine"]
    return (
        f"The worker (and the bare server) on CPU {servers}, the clients on CPU {client} "
        "(thread affinity). The raw loops run in this process on the worker's CPUs while the "
        "worker is idle and no client runs. Load average (1 min) "
        f"{_fmt(load.get('loadavg_1m'), '.2f')} before the run, "
        f"{_fmt(load.get('loadavg_1m_after'), '.2f')} after: other work on the machine skews "
        "every rate, less so the ratios of adjacent windows."
    )


def markdown(report: dict[str, Any]) -> list[str]:
    """The report as Markdown lines."""
    args = report["args"]
    lines = [
        "# Coalescing benchmark (CNN, CPU backend)",
        "",
        f"Machine: {machine_line(report['machine'])}",
        "",
        f"Command: `{report['command']}`",
        "",
        *_summary(report),
        "",
        f"## Rows/s and per-row latency vs batch size b ({args['duration']:g} s windows after "
        f"{args['warmup']:g} s warm-up)",
        "",
        "Raw: the compiled program the scheduler would run for b rows (compiled sizes "
        f"{', '.join(map(str, report['compiled_sizes']))}; b pads up to the next), "
        "`to_device` + `execute` + `to_host` + `free` in a loop, rows/s = b / time per batch. "
        "Batched: one `tritonclient.grpc` client, b-row requests, per-row latency = p50 "
        "request latency / b. Coalesced: b clients, one-row requests; rows / execution and "
        "executions per compiled size from the worker's `ModelStatistics` (warm-up included).",
        "",
        "| b | program | raw rows/s | raw us/row | batched rows/s | batched / raw | "
        "batched us/row (p50) | coalesced rows/s | coalesced / raw | coalesced p50 / p99 (ms) "
        "| rows / execution | executions per size |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in report["points"]:
        lines.append(
            f"| {p['batch']} | {p['compiled_batch']} | {p['raw_rows_per_s']:,.0f} | "
            f"{p['raw_us_per_row']:.0f} | {_fmt(p.get('batched_rows_per_s'), ',.0f')} | "
            f"{_fmt(p.get('batched_ratio'), '.2f')} | {_fmt(p.get('batched_row_p50_us'), '.0f')} | "
            f"{_fmt(p.get('coalesced_rows_per_s'), ',.0f')} | "
            f"{_fmt(p.get('coalesced_ratio'), '.2f')} | "
            f"{_fmt(p.get('coalesced_p50_ms'), '.2f')} / {_fmt(p.get('coalesced_p99_ms'), '.2f')} "
            f"| {_fmt(p.get('coalesced_rows_per_execution'), '.1f')} | "
            f"{_hist(p.get('coalesced_executions_by_batch'))} |"
        )
    lines += [
        "",
        _placement(report),
        "",
        "## Raw reference",
        "",
        "Each batch size's program timed just before and just after its served runs; the "
        "reference is the mean. Drift = rows/s of the second slice / the first. CPU cores = "
        "process CPU time / wall time (the XLA thread pool shares the worker's CPUs).",
        "",
        "| b | program | ms / batch (mean) | before / after | drift | CPU cores |",
        "|---|---|---|---|---|---|",
    ]
    for b, size in report["padded_to"].items():
        r = _raw(report["raw_slices"][b])
        by_slice = " / ".join(f"{ms:.3f}" for ms in r["ms_per_batch_by_slice"])
        lines.append(
            f"| {b} | {size} | {r['ms_per_batch']:.3f} | {by_slice} | {r['drift']:.2f} | "
            f"{r['cpu_cores']:.2f} |"
        )
    lines += [
        "",
        "## Served runs",
        "",
        "| target | way | rows / request | clients | req/s | rows/s | p50 (ms) | p99 (ms) | "
        "server CPU / row (us) | client CPU / request (us) | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    floors = [report[key] for key in ("floor", "front_floor") if report.get(key)]
    for r in [*report["runs"], *floors]:
        lines.append(
            f"| {r['target']} | {r['mode']} | {r['rows_per_request']} | {r['concurrency']} | "
            f"{r['requests_per_s']:,.0f} | {r['rows_per_s']:,.0f} | {r['p50_ms']:.2f} | "
            f"{r['p99_ms']:.2f} | {_fmt(r['server_cpu_us_per_row'], '.0f')} | "
            f"{_fmt(r['client_cpu_us_per_request'], '.0f')} | {r['errors']} |"
        )
    if report["errors"]:
        lines += ["", "Errors:", "", *(f"- {e}" for e in report["errors"])]
    lines.append("")
    return lines
