"""The derived figures and the Markdown report of ``bench.gateway`` (its JSON report in)."""

from __future__ import annotations

from typing import Any

__all__ = ["TARGET_OVERHEAD", "derive", "markdown"]

#: The issue's target: p50 through the gateway at most 25% above direct to the worker.
TARGET_OVERHEAD = 0.25
_GATEWAYS = ("gateway_1", "gateway_2")
_PROCESSES = ("client", "gateway_1", "gateway_2", "worker_a", "worker_b")


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def _by_point(rows: list[dict[str, Any]]) -> dict[int, dict[str, dict[str, Any]]]:
    out: dict[int, dict[str, dict[str, Any]]] = {}
    for r in rows:
        out.setdefault(r["concurrency"], {})[r["target"]] = r
    return out


def derive(report: dict[str, Any]) -> dict[str, Any]:
    """``overhead`` (MLP, per gateway and concurrency) and ``scaling`` ratios (CNN)."""
    overhead = []
    for concurrency, rows in sorted(_by_point(report["latency"]).items()):
        direct = rows.get("direct")
        if direct is None:
            continue
        for gateway in _GATEWAYS:
            if gateway not in rows:
                continue
            via = rows[gateway]
            p50 = _ratio(via["p50_ms"] - direct["p50_ms"], direct["p50_ms"])
            overhead.append(
                {
                    "gateway": gateway,
                    "concurrency": concurrency,
                    "p50_overhead": p50,
                    "p50_added_ms": via["p50_ms"] - direct["p50_ms"],
                    "p99_added_ms": via["p99_ms"] - direct["p99_ms"],
                    "requests_per_s_ratio": _ratio(via["requests_per_s"], direct["requests_per_s"]),
                    "target_met": p50 is not None and p50 <= TARGET_OVERHEAD,
                }
            )
    scaling = []
    for concurrency, rows in sorted(_by_point(report["scaling"]).items()):
        if not {"direct", *_GATEWAYS} <= set(rows):
            continue
        rps = {t: rows[t]["requests_per_s"] for t in ("direct", *_GATEWAYS)}
        served = rows["gateway_2"]["served_by_worker"]
        total = sum(served.values())
        scaling.append(
            {
                "concurrency": concurrency,
                "requests_per_s": rps,
                "two_over_one_gateway": _ratio(rps["gateway_2"], rps["gateway_1"]),
                "two_over_direct": _ratio(rps["gateway_2"], rps["direct"]),
                "one_over_direct": _ratio(rps["gateway_1"], rps["direct"]),
                "worker_b_share": _ratio(served.get("worker_b", 0), total),
            }
        )
    return {"overhead": overhead, "scaling_ratios": scaling}


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _rows_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| model | concurrency | target | req/s | p50 (ms) | p99 (ms) | mean (ms) | "
        + " | ".join(f"{p} CPU/req (us)" for p in _PROCESSES)
        + " | rows served A / B | errors |",
        "|---|---|---|---|---|---|---|" + "---|" * len(_PROCESSES) + "---|---|",
    ]
    for r in rows:
        cpu = r["cpu_us_per_request"]
        served = r["served_by_worker"]
        lines.append(
            f"| {r['model']} | {r['concurrency']} | {r['target']} | "
            f"{r['requests_per_s']:,.0f} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} | "
            f"{r['mean_ms']:.3f} | "
            + " | ".join(_fmt(cpu.get(p), ".0f") for p in _PROCESSES)
            + f" | {served.get('worker_a', 0)} / {served.get('worker_b', 0)} | {r['errors']} |"
        )
    return lines


def _placement(pinned: dict[str, list[int]] | None) -> str:
    if pinned is None:
        return "All processes share every CPU (no affinity set)."
    return (
        f"This process runs on CPU {', '.join(map(str, pinned['client']))} and every server "
        f"on CPU {', '.join(map(str, pinned['servers']))} (`--pin`)."
    )


def markdown(report: dict[str, Any]) -> list[str]:
    """The report as Markdown lines."""
    m, args = report["machine"], report["args"]
    load = m["loadavg_1m"]
    lines = [
        "# Gateway benchmark (CPU backend)",
        "",
        f"Machine: {m['platform']}, {m['cpus']} CPUs, Python {m['python']}, jax {m['jax']}, "
        f"grpcio {m['grpcio']}, tritonclient {m['tritonclient']}, uvloop {m['uvloop']}; "
        f"1-minute load average {_fmt(load['before'], '.1f')} before, "
        f"{_fmt(load['after'], '.1f')} after. {_placement(report['pinned'])}",
        "",
        f"Command: `{report['command']}`",
        "",
        "Targets: `direct` = worker A; `gateway_1` = a gateway (round_robin) over {A}; "
        "`gateway_2` = a gateway over {A, B}. Both workers share one executable cache (ready "
        "after "
        + ", ".join(f"{k} {v:.1f} s" for k, v in report["ready_after_s"].items())
        + "). Stock `tritonclient.grpc`, one thread and one connection per client, closed "
        f"loop, one-row requests; {args['requests']} measured requests per target and phase, "
        f"{args['rounds']} phases per target and point in alternating order (A B C, C B A), "
        f"each after {args['warmup']} warm-up requests per client. CPU/req = CPU time of "
        "that process over the phases / requests (all its threads).",
        "",
        "## Added latency (tiny MLP, FP32 [1, 16])",
        "",
        f"Overhead = (p50 via gateway - p50 direct) / p50 direct; target <= {TARGET_OVERHEAD:.0%}.",
        "",
        "| gateway | concurrency | p50 overhead | p50 added (ms) | p99 added (ms) | "
        "req/s via / direct | target |",
        "|---|---|---|---|---|---|---|",
    ]
    for o in report["overhead"]:
        lines.append(
            f"| {o['gateway']} | {o['concurrency']} | {_fmt(o['p50_overhead'], '+.0%')} | "
            f"{o['p50_added_ms']:+.3f} | {o['p99_added_ms']:+.3f} | "
            f"{_fmt(o['requests_per_s_ratio'], '.2f')} | "
            f"{'met' if o['target_met'] else 'NOT met'} |"
        )
    lines += ["", *_rows_table(report["latency"])]
    lines += [
        "",
        f"## Two-worker scaling (CNN, {args['scaling_rows']} 1x28x28 images per request)",
        "",
        f"On this machine's {m['cpus']} CPUs the client, both gateways' event loops and both "
        "workers compete for the same cores, so two workers cannot double the throughput of "
        "one: the ratio shows what is left once the cores are shared.",
        "",
        "| concurrency | direct req/s | gateway_1 req/s | gateway_2 req/s | gateway_2 / "
        "gateway_1 | gateway_2 / direct | gateway_1 / direct | worker B share (gateway_2) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in report["scaling_ratios"]:
        rps = s["requests_per_s"]
        lines.append(
            f"| {s['concurrency']} | {rps['direct']:,.0f} | {rps['gateway_1']:,.0f} | "
            f"{rps['gateway_2']:,.0f} | {_fmt(s['two_over_one_gateway'], '.2f')} | "
            f"{_fmt(s['two_over_direct'], '.2f')} | {_fmt(s['one_over_direct'], '.2f')} | "
            f"{_fmt(s['worker_b_share'], '.0%')} |"
        )
    lines += ["", *_rows_table(report["scaling"])]
    if report["errors"]:
        lines += ["", "First error per run:", ""]
        lines += [f"- {e}" for e in report["errors"]]
    lines.append("")
    return lines
