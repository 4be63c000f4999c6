"""The Markdown report of ``bench.worker_grpc`` (its JSON report in, lines out)."""

from __future__ import annotations

from typing import Any

from bench._common import error_lines, fmt, machine_line

__all__ = ["HEADLINE_CONCURRENCY", "HEADLINE_MODEL", "TARGET_RATIO", "markdown", "ratios"]

#: The issue's target: tiny-MLP throughput at concurrency 8 >= 60% of the bare server's.
HEADLINE_MODEL = "mlp"
HEADLINE_CONCURRENCY = 8
TARGET_RATIO = 0.60


def ratios(
    runs: list[dict[str, Any]],
    *,
    key: str = "target",
    subject: str = "worker",
    reference: str = "bare",
) -> list[dict[str, Any]]:
    """``subject`` / ``reference`` (the rows' ``key``) at each (model, concurrency) where both
    ran: req/s of each, their ratio, and the p50 and p99 ratios."""
    ref_rows = {(r["model"], r["concurrency"]): r for r in runs if r[key] == reference}
    out = []
    for r in runs:
        ref = ref_rows.get((r["model"], r["concurrency"]))
        if r[key] != subject or ref is None or not ref["requests_per_s"]:
            continue
        out.append(
            {
                "model": r["model"],
                "concurrency": r["concurrency"],
                f"{subject}_requests_per_s": r["requests_per_s"],
                f"{reference}_requests_per_s": ref["requests_per_s"],
                "ratio": r["requests_per_s"] / ref["requests_per_s"],
                "p50_ratio": r["p50_ms"] / ref["p50_ms"] if ref["p50_ms"] else None,
                "p99_ratio": r["p99_ms"] / ref["p99_ms"] if ref["p99_ms"] else None,
            }
        )
    return out


def _summary(report: dict[str, Any]) -> list[str]:
    for r in report["ratios"]:
        if r["model"] == HEADLINE_MODEL and r["concurrency"] == HEADLINE_CONCURRENCY:
            verdict = "met" if r["ratio"] >= TARGET_RATIO else "NOT met"
            return [
                f"- Tiny MLP at concurrency {HEADLINE_CONCURRENCY}: worker "
                f"{r['worker_requests_per_s']:,.0f} req/s = {r['ratio']:.2f} of the bare "
                f"server's {r['bare_requests_per_s']:,.0f} req/s. Target >= {TARGET_RATIO:.2f}: "
                f"{verdict}."
            ]
    return ["- No worker run at the headline point (tiny MLP, concurrency 8): target not checked."]


def _placement(pinned: dict[str, list[int]] | None) -> str:
    if pinned is None:
        return "Client and servers share every CPU (`--no-pin`)."
    client = ", ".join(map(str, pinned["client"]))
    servers = ", ".join(map(str, pinned["servers"]))
    return (
        f"The client process runs on CPU {client} and the servers on CPU {servers} (thread "
        "affinity), so a server that is the bottleneck shows `server cores` near the number "
        "of its CPUs and req/s = 1 / its CPU per request."
    )


def markdown(report: dict[str, Any]) -> list[str]:
    """The report as Markdown lines."""
    args, m = report["args"], report["machine"]
    lines = [
        "# Worker gRPC benchmark (CPU backend)",
        "",
        f"Machine: {machine_line(m)} jax {m['jax']}, grpcio {m['grpcio']}, "
        f"tritonclient {m['tritonclient']}, uvloop {m['uvloop']}.",
        "",
        f"Command: `{report['command']}`",
        "",
        *_summary(report),
        "",
        f"## Requests/s and latency ({args['client']} client, one-row requests, "
        f"{args['duration']:g} s per target and point in {args['rounds']} windows, each after "
        f"{args['warmup']:g} s warm-up)",
        "",
        "Closed loop: each of `concurrency` clients has its own `InferenceServerClient` (its own "
        "connection) and sends its next request when the previous answer arrives and is decoded "
        "(`as_numpy`). `bare` = the canned-response grpc.aio server (`bench/_bare_server.py`), "
        "same client, same run: at each point the bare server's and the worker's windows "
        "alternate, so the machine's drift falls on both. CPU / request = CPU time of that "
        "process (all threads) over its windows / requests; server cores = that CPU time / "
        "window time. " + _placement(report["pinned"]),
        "",
        "| target | model | concurrency | req/s | p50 (ms) | p99 (ms) | mean (ms) | "
        "server CPU / req (us) | server cores | client CPU / req (us) | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["runs"]:
        lines.append(
            f"| {r['target']} | {r['model']} | {r['concurrency']} | {r['requests_per_s']:,.0f} | "
            f"{r['p50_ms']:.3f} | {r['p99_ms']:.3f} | {r['mean_ms']:.3f} | "
            f"{fmt(r['server_cpu_us_per_request'], '.0f')} | "
            f"{fmt(r['server_cpu_cores'], '.2f')} | "
            f"{fmt(r['client_cpu_us_per_request'], '.0f')} | {r['errors']} |"
        )
    if report["ratios"]:
        lines += [
            "",
            "## Worker / bare server",
            "",
            "| model | concurrency | worker req/s | bare req/s | worker / bare | "
            "p50 worker / bare |",
            "|---|---|---|---|---|---|",
        ]
        for r in report["ratios"]:
            lines.append(
                f"| {r['model']} | {r['concurrency']} | {r['worker_requests_per_s']:,.0f} | "
                f"{r['bare_requests_per_s']:,.0f} | {r['ratio']:.2f} | "
                f"{fmt(r['p50_ratio'], '.2f')} |"
            )
    lines += _where_time_goes(report["runs"])
    if report["client_survey"]:
        lines += [
            "",
            "## Client kinds against the bare server (mlp)",
            "",
            "Which client drives a server hardest from one Python process: `threads` = sync "
            "`tritonclient.grpc`, one thread per client; `asyncio` / `uvloop` = "
            "`tritonclient.grpc.aio`, one task per client on one event loop.",
            "",
            "| client | concurrency | req/s | p50 (ms) | p99 (ms) | client CPU / req (us) |",
            "|---|---|---|---|---|---|",
        ]
        for r in report["client_survey"]:
            lines.append(
                f"| {r['client']} | {r['concurrency']} | {r['requests_per_s']:,.0f} | "
                f"{r['p50_ms']:.3f} | {r['p99_ms']:.3f} | "
                f"{fmt(r['client_cpu_us_per_request'], '.0f')} |"
            )
    lines += error_lines(report["errors"])
    lines.append("")
    return lines


_GROUPS = ("main", "python", "grpc", "other")


def _where_time_goes(runs: list[dict[str, Any]]) -> list[str]:
    """Server CPU per request by thread group, and the worker's own statistics."""
    if not any(r["server_cpu_us_per_request_by_thread"] for r in runs):
        return []
    lines = [
        "",
        "## Where the servers' time goes",
        "",
        "Server CPU per request (us) by thread: `main` = the event loop's thread (gRPC "
        "handlers), `python` = the other threads that keep the process's name (Python "
        "threads: the worker's dispatch thread and hook pool, grpc.aio's poller), `grpc` = "
        "gRPC core's named threads, `other` = the rest (XLA's). The "
        "worker's columns come from its `ModelStatistics` over the same runs (warm-ups "
        "included): requests per execution, queue time per request, and input + execute + "
        "output time per execution.",
        "",
        "| target | model | concurrency | " + " | ".join(_GROUPS) + " | rows / execution | "
        "queue (ms / req) | compute (ms / execution) |",
        "|---|---|---|" + "---|" * (len(_GROUPS) + 3),
    ]
    for r in runs:
        by_thread = r["server_cpu_us_per_request_by_thread"]
        stats = r["worker_stats"]
        cells = [fmt(by_thread.get(g), ".0f") if by_thread else "-" for g in _GROUPS]
        lines.append(
            f"| {r['target']} | {r['model']} | {r['concurrency']} | " + " | ".join(cells) + " | "
            f"{fmt(stats.get('rows_per_execution'), '.2f')} | "
            f"{fmt(stats.get('queue_ms_per_request'), '.3f')} | "
            f"{fmt(stats.get('compute_ms_per_execution'), '.3f')} |"
        )
    return lines
