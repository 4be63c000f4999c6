"""Fleet benchmark: the gateway's routing modes over two workers with small weight budgets.

Run from the repository root with the dev environment::

    .venv/bin/python -m bench.fleet [--suite | --quick] [--out DIR]

Builds a catalog of copies of one model (``bench._density_catalog``; the ``deep`` MLP by default),
then for each routing mode (``round_robin``, ``lpt_packing``, ``model_aware``), each trace and
each round starts two fresh workers (CPU arena, weight budget a few models each, ``fifo``) and
a gateway in that mode (``bench._fleet_servers``), and replays the same seeded trace through
the gateway open-loop with ``tritonclient.grpc.aio`` (``bench._fleet_replay``): a Zipf trace
and a bursty on/off one (``bench._traces``). Rounds alternate the modes' order. Per mode: mean,
p50, p99 latency, answered req/s, cold loads per 1000 requests (the workers'
``reactantserver_worker_weight_loads_total``), and the ratios to round_robin. Then the three
situations of
model-aware scheduling (``bench._fleet_scenarios``), one fresh fleet per mode. The ratio of one
load's time (``reactantserver_worker_weight_load_seconds_total`` / loads) to one batch-1 execution
(``compute_infer`` of batch size 1) is measured in the same runs. Writes ``fleet-cpu.json``,
``fleet-cpu.md`` and ``fleet-cpu.png`` under ``--out``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs

from bench._common import loadavg, machine, write_report
from bench._density_catalog import Catalog, build_catalog
from bench._fleet_replay import replay
from bench._fleet_report import derive, draw, figures, markdown
from bench._fleet_scenarios import Scenario, scenarios
from bench._fleet_servers import (
    MODES,
    POLL_S,
    Arena,
    Fleet,
    batch1_seconds,
    counters,
    fleet,
    warm,
)
from bench._traces import Arrival, belady_loads, bursty_trace, zipf_trace
from reactantserver.gateway.policies.model_aware.estimate import DISPLACEMENT_HORIZON_SECONDS

__all__ = ["RESULT_NAME", "main"]

ROOT = Path(__file__).resolve().parent.parent
RESULT_NAME = "fleet-cpu"
_MIB = 1024 * 1024


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--kind", choices=("deep", "heavy", "cnn"), default="deep")
    parser.add_argument("--ballast-bytes", type=int, default=0, help="cnn catalog only")
    parser.add_argument("--models", type=int, default=14, help="catalog size")
    parser.add_argument("--budget-models", type=float, default=3.0, help="weight budget/worker")
    parser.add_argument("--arena-bandwidth", type=float, default=0.0, help="bytes/s; 0: no cap")
    parser.add_argument("--rate", type=float, default=12.0, help="mean requests/s of a trace")
    parser.add_argument("--duration", type=float, default=25.0, help="seconds per trace")
    parser.add_argument("--rounds", type=int, default=2, help="replays per (mode, trace)")
    parser.add_argument("--seed", type=int, default=37)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument(
        "--traces", nargs="+", choices=("zipf", "bursty"), default=["zipf", "bursty"]
    )
    parser.add_argument("--no-scenarios", action="store_true")
    size = parser.add_mutually_exclusive_group()
    size.add_argument(
        "--quick", action="store_true", help="smoke run: 8 small cnn models, 3 s traces"
    )
    size.add_argument("--suite", action="store_true", help="the `nox -s bench` size")
    return parser


def _traces(args: argparse.Namespace, names: tuple[str, ...]) -> dict[str, list[Arrival]]:
    kw = {"duration_s": args.duration, "rate": args.rate, "seed": args.seed}
    made = {"zipf": zipf_trace, "bursty": bursty_trace}
    return {name: made[name](names, **kw) for name in args.traces}


def _measure(
    tmp: Path,
    catalog: Catalog,
    arena: Arena,
    mode: str,
    trace: tuple[str, list[Arrival]],
) -> dict[str, Any]:
    """The trace's row, replayed on a fresh fleet in ``mode``."""
    name, arrivals = trace
    with fleet(tmp, catalog, arena, mode) as f:
        before = counters(f.workers)
        result = replay(f.gateway.url, arrivals, catalog.signature).summary()
        after = counters(f.workers)
        exec_s, executions = batch1_seconds(f.workers, catalog.names)
    delta = {k: after[k] - before[k] for k in after}
    loads = delta["reactantserver_worker_weight_loads_total"]
    row = {
        "trace": name,
        "mode": mode,
        **result,
        "cold_loads": int(loads),
        "cold_per_1000": 1000 * loads / max(1, len(arrivals)),
        "evictions": int(delta["reactantserver_worker_weight_evicts_total"]),
        "load_s_each": delta["reactantserver_worker_weight_load_seconds_total"] / loads
        if loads
        else None,
        "batch1_exec_s": exec_s,
        "batch1_executions": executions,
        "fleet_ready_s": f.ready_s,
    }
    print(
        f"{name:6s} {mode:12s} mean {row['mean_ms']:7.1f} ms  p99 {row['p99_ms']:7.1f} ms  "
        f"{row['requests_per_s']:5.1f} req/s  cold/1000 {row['cold_per_1000']:5.0f}  "
        f"errors {row['errors']}",
        flush=True,
    )
    return row


def _scenario(f: Fleet, catalog: Catalog, sc: Scenario) -> dict[str, Any]:
    """Make the scenario's models resident, let the gateway see it, replay its trace."""
    for index, model in sc.warm:
        warm(f.workers[index], catalog, [model])
    # The gateway's next polls see the residency, and what the scenario before routed is idle.
    time.sleep(max(3 * POLL_S, DISPLACEMENT_HORIZON_SECONDS + POLL_S))
    before = counters(f.workers)["reactantserver_worker_weight_loads_total"]
    result = replay(f.gateway.url, list(sc.trace), catalog.signature).summary()
    loads = counters(f.workers)["reactantserver_worker_weight_loads_total"] - before
    print(f"{sc.name:28s} {f.mode:12s} mean {result['mean_ms']:7.1f} ms", flush=True)
    return {"scenario": sc.name, "mode": f.mode, **result, "cold_loads": int(loads)}


def _describe(
    args: argparse.Namespace, name: str, trace: list[Arrival], *, slots: int
) -> dict[str, Any]:
    """The trace in words, and the cold loads per 1000 requests of Belady's offline optimum
    over the two budgets pooled (a floor no online router of this fleet can beat)."""
    shape = {
        "zipf": "Poisson arrivals, each model drawn Zipf(1.1)",
        "bursty": "on/off bursts per model (mean on 2 s, off 10 s x rank^0.5)",
    }[name]
    belady = belady_loads([a.model for a in trace], slots)
    return {
        "name": name,
        "description": f"{shape}, mean {args.rate:g}/s for {args.duration:g} s, seed "
        f"{args.seed}, {len(trace)} requests",
        "requests": len(trace),
        "belady_slots": slots,
        "belady_per_1000": 1000 * belady / max(1, len(trace)),
    }


def _size(args: argparse.Namespace) -> None:
    if args.quick:
        args.kind, args.ballast_bytes, args.models = "cnn", 1 << 20, 8
        args.rate, args.duration, args.rounds = 20.0, 3.0, 1
    elif args.suite:
        args.models, args.duration = 12, 15.0


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write JSON, Markdown and a PNG under ``--out``."""
    args = _parser().parse_args(argv)
    _size(args)
    load_before = loadavg()
    runs: list[dict[str, Any]] = []
    scenario_rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="rs-bench-fleet-") as name:
        tmp = Path(name)
        catalog = build_catalog(
            tmp / "models",
            args.models,
            seed=args.seed,
            ballast_bytes=args.ballast_bytes,
            kind=args.kind,
        )
        budget = int(args.budget_models * catalog.model_bytes)
        arena = Arena(2 * budget + catalog.model_bytes, budget, args.arena_bandwidth)
        traces = _traces(args, catalog.names)
        for r in range(args.rounds):
            for trace_name, trace in traces.items():
                for mode in args.modes if r % 2 == 0 else args.modes[::-1]:
                    runs.append(_measure(tmp, catalog, arena, mode, (trace_name, trace)))
        chosen = [] if args.no_scenarios else scenarios(catalog.names)
        for mode in args.modes if chosen else ():
            # A fresh fleet per mode: no model of a scenario is resident from a trace.
            with fleet(tmp, catalog, arena, mode) as f:
                scenario_rows += [_scenario(f, catalog, sc) for sc in chosen]
    load_s = [r["load_s_each"] for r in runs if r["load_s_each"]]
    exec_s = [r["batch1_exec_s"] for r in runs if r["batch1_exec_s"]]
    load_ms = 1e3 * sum(load_s) / len(load_s) if load_s else None
    exec_ms = 1e3 * sum(exec_s) / len(exec_s) if exec_s else None
    ratio = load_ms / exec_ms if load_ms and exec_ms else None
    summary = derive(runs)
    report: dict[str, Any] = {
        "machine": {
            **machine("jax", "grpcio", "tritonclient"),
            "loadavg_1m": {"before": load_before, "after": loadavg()},
        },
        "command": " ".join(
            ["python -m bench.fleet", *(argv if argv is not None else sys.argv[1:])]
        ),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "modes": args.modes,
        "settings": {
            "kind": catalog.kind,
            "models": len(catalog.names),
            "model_mib": catalog.model_bytes / _MIB,
            "budget_models": args.budget_models,
            "budget_mib": budget / _MIB,
            "arena_mib": arena.arena_bytes / _MIB,
            "arena_bandwidth": arena.bandwidth_bytes_per_s,
            "catalog_over_fleet_budget": catalog.total_bytes / (2 * budget),
            "poll_s": POLL_S,
            "workers": 2,
        },
        "traces": [
            _describe(args, name, trace, slots=int(2 * args.budget_models))
            for name, trace in traces.items()
        ],
        "load_ms": load_ms,
        "exec_ms": exec_ms,
        "load_exec_ratio": ratio,
        "runs": runs,
        "summary": summary,
        "scenario_defs": [attrs.asdict(sc) | {"trace": len(sc.trace)} for sc in chosen],
        "scenarios": scenario_rows,
        "errors": [
            f"{r.get('trace', r.get('scenario'))} {r['mode']}: {r['first_error']}"
            for r in runs + scenario_rows
            if r["first_error"]
        ],
    }
    report["figures"] = figures(summary, ratio, report["traces"])
    report["plot"] = draw(report, args.out / f"{RESULT_NAME}.png").name
    write_report(args.out, RESULT_NAME, report, markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
