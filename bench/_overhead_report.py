"""The Markdown report of ``bench.overhead`` (its JSON report in, lines out)."""

from __future__ import annotations

from typing import Any

from bench._common import figure_lines, fmt, machine_line

__all__ = ["STAGES", "markdown"]

#: The ``stage`` labels of ``reactantserver_worker_stage_cpu_seconds_total``, in request order.
STAGES = ("decode", "queue", "dispatch", "encode")
_OTHER = ("event_loop", "dispatch_thread", "grpc", "other_threads")


def _placement(pinned: dict[str, list[int]] | None) -> str:
    if pinned is None:
        return "Client and servers share every CPU (`--no-pin`)."
    return (
        f"The client runs on CPU {', '.join(map(str, pinned['client']))} and the servers on "
        f"CPU {', '.join(map(str, pinned['servers']))}: a saturated server shows as req/s = "
        "1 / its CPU per request."
    )


def _runs(report: dict[str, Any]) -> list[str]:
    args = report["args"]
    lines = [
        f"## Worker vs bare server (tiny MLP, one-row requests, {args['duration']:g} s per "
        f"target and point in {args['rounds']} alternating windows after {args['warmup']:g} s "
        "warm-up each)",
        "",
        "Stock `tritonclient.grpc`, one thread and connection per client, closed loop. Server "
        "CPU / request = the process's CPU (all threads, `/proc`) over its windows / requests. "
        + _placement(report["pinned"]),
        "",
        "| target | concurrency | req/s | p50 (ms) | p99 (ms) | server CPU / req (us) | "
        "client CPU / req (us) | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in report["runs"]:
        lines.append(
            f"| {r['target']} | {r['concurrency']} | {r['requests_per_s']:,.0f} | "
            f"{r['p50_ms']:.3f} | {r['p99_ms']:.3f} | "
            f"{fmt(r['server_cpu_us_per_request'], '.0f')} | "
            f"{fmt(r['client_cpu_us_per_request'], '.0f')} | {r['errors']} |"
        )
    lines += [
        "",
        "| concurrency | worker req/s | bare req/s | worker / bare | p50 worker / bare |",
        "|---|---|---|---|---|",
    ]
    for r in report["ratios"]:
        lines.append(
            f"| {r['concurrency']} | {r['worker_requests_per_s']:,.0f} | "
            f"{r['bare_requests_per_s']:,.0f} | {r['ratio']:.2f} | "
            f"{fmt(r['p50_ratio'], '.2f')} |"
        )
    return lines


def _stages(report: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "## Worker CPU per request by stage (us)",
        "",
        "From `reactantserver_worker_stage_cpu_seconds_total` (thread CPU clocks inside the "
        "worker) and the "
        "process's per-thread CPU (`/proc`), both read just before and after each worker window "
        "(warm-up included) and divided by the requests `reactantserver_worker_requests_total` "
        "counted over "
        "the same spans. `decode` / `encode`: `codec.decode_request` / `encode_response` on "
        "the event loop; `queue`: admission (`Scheduler.submit`) plus settling the callers' "
        "futures on the loop; `dispatch`: the dispatch thread's CPU per execution (wake-up, "
        "selection, batch assembly, `to_device` / `execute` / `to_host`, slicing, delivery) "
        "shared by the requests it served; `other` = process - stages (gRPC/HTTP transport, "
        "the handler glue, XLA's threads). `bare` = the bare server's CPU / request.",
        "",
        "| concurrency | req / execution | " + " | ".join(STAGES) + " | other | worker total | "
        "bare | worker - bare |",
        "|---|---|" + "---|" * (len(STAGES) + 4),
    ]
    for s in report["stages"]:
        us = s["us_per_request"]
        cells = [fmt(us[stage], ".1f") for stage in (*STAGES, "other")]
        bare = s["bare_us"]
        lines.append(
            f"| {s['concurrency']} | {s['requests_per_execution']:.2f} | "
            + " | ".join(cells)
            + f" | {s['process_us']:.1f} | {fmt(bare, '.1f')} | "
            f"{fmt(None if bare is None else s['process_us'] - bare, '.1f')} |"
        )
    lines += [
        "",
        "`other` by thread (us / request): the event loop's CPU outside decode, queue and "
        "encode (grpc.aio's handler, protobuf, the data plane's checks), the dispatch thread's "
        "outside its charges, gRPC core's threads, and the rest (XLA's compute threads).",
        "",
        "| concurrency | " + " | ".join(_OTHER) + " |",
        "|---|" + "---|" * len(_OTHER),
    ]
    for s in report["stages"]:
        other = s["other_by_thread_us"]
        lines.append(
            f"| {s['concurrency']} | " + " | ".join(fmt(other[k], ".1f") for k in _OTHER) + " |"
        )
    return lines


def _cost(report: dict[str, Any]) -> list[str]:
    cost = report["instrumentation"]
    lines = [
        "",
        "## What the stage clocks cost",
        "",
        f"Measured in the benchmark's process: `time.thread_time_ns()` "
        f"{cost['thread_time_ns_call_ns']:.0f} ns per call, a locked add "
        f"{cost['locked_add_ns']:.0f} ns. One request in eight (`SAMPLE_EVERY`) reads the "
        "clock 6 times around its decode, admission and encode, and counts for the eight; an "
        "execution reads it 3 more times and adds once under a lock, shared by its requests. "
        "Live, between the server's other threads, a read costs more than here: reading it 6 "
        "times on every request cost ~12 us per request at 32 clients.",
        "",
        "| concurrency | clocks (us / request) | share of worker CPU |",
        "|---|---|---|",
    ]
    for s in report["stages"]:
        share = s["stage_clocks_share"]
        lines.append(
            f"| {s['concurrency']} | {s['stage_clocks_us']:.2f} | "
            f"{fmt(None if share is None else share * 100, '.1f')}% |"
        )
    return lines


def markdown(report: dict[str, Any]) -> list[str]:
    """The report as Markdown lines."""
    m = report["machine"]
    lines = [
        "# Overhead: worker vs the bare gRPC floor, CPU per request by stage",
        "",
        f"Machine: {machine_line(m)} jax {m['jax']}, grpcio {m['grpcio']}, "
        f"tritonclient {m['tritonclient']}, uvloop {m['uvloop']}; load average "
        f"{fmt(m.get('loadavg_1m'), '.1f')} at the start.",
        "",
        f"Command: `{report['command']}`",
        "",
        *figure_lines(report["figures"]),
        "",
        *_runs(report),
        *_stages(report),
        *_cost(report),
    ]
    if report["errors"]:
        lines += ["", "First error per run:", "", *(f"- {e}" for e in report["errors"])]
    lines.append("")
    return lines
