"""The benchmark suite: every benchmark in its ``--suite`` size, one combined report with plots.

Run from the repository root with the dev environment (or ``nox -s bench``)::

    .venv/bin/python -m bench.suite                     # ~10-15 min on the 2-core machine
    .venv/bin/python -m bench.suite --only density      # one benchmark, merged into today's
    .venv/bin/python -m bench.suite --quick --only runtime rest --out /tmp/r   # smoke run
    .venv/bin/python -m bench.suite --update-docs       # docs/performance.md from the latest

Runs each benchmark of :data:`BENCHMARKS` as ``python -m bench.<name> --suite`` (``--quick``)
in a subprocess, one after another, each stopped at its own budget and none started once the
whole suite's budget (``--budget``, 15 minutes) is spent; a benchmark that fails, times out or
does not exist is reported as such and the suite goes on. Writes ``<out>/<date>-<machine>.json``
(every benchmark's outcome and JSON report), ``<out>/<date>-<machine>.md`` (every figure against
its target) and PNG plots in ``<out>/plots/<date>-<machine>/``. Exits 1 if any benchmark was not
ok.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs

from bench._common import machine
from bench._suite_plots import draw_all
from bench._suite_report import latest_result, summary, update_docs
from bench._suite_run import Benchmark, Outcome, run_benchmark, skipped

__all__ = ["BENCHMARKS", "SUITE_BUDGET_S", "main", "run_suite"]

ROOT = Path(__file__).resolve().parent.parent
#: The whole suite's budget on the 2-core development machine (issue 13: under 15 minutes).
SUITE_BUDGET_S = 900.0
#: A benchmark is not started with less than this left of the suite's budget.
MIN_START_S = 20.0

#: What the suite runs, in order: the issue's figures first. ``budget_s`` caps each one's
#: ``--suite`` run (typical on the 2-core machine: about half of it). ``bench.worker_grpc``
#: is not here: ``bench.overhead`` measures the same worker / bare floor and the stage split.
BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("runtime", 90, "cold loads: weight load vs raw copy, compile cold vs cache hit"),
    Benchmark("coalescing", 180, "CNN rows/s vs batch size, served (gRPC) vs raw"),
    Benchmark("overhead", 180, "tiny MLP vs the bare grpc.aio floor, server CPU by stage"),
    Benchmark("peers", 360, "PyTriton, KServe, MLServer vs ours: same MLPs, same load"),
    Benchmark(
        "density", 420, "catalog 5x the budget on CPU-arena loads vs all-resident, Zipf and bursty"
    ),
    Benchmark("gateway", 150, "gateway added latency and two-worker scaling"),
    Benchmark("scheduler", 90, "scheduler served vs raw in process, dispatch overhead"),
    Benchmark("rest", 60, "REST vs gRPC req/s"),
    Benchmark("client", 75, "thin client vs tritonclient"),
    Benchmark("scaling", 60, "tiny MLP req/s against the native front's threads (flat on 2 cores)"),
    Benchmark("meta_pipeline", 60, "meta model vs client-chained pipeline"),
    Benchmark("overload", 75, "ten times the in-flight cap: admitted latency, refusals, RSS"),
    Benchmark(
        "fleet", 480, "round_robin vs lpt_packing vs model_aware over 2 small-budget workers"
    ),
)


def _names(known: Sequence[str]) -> Callable[[str], list[str]]:
    """An argparse type: one benchmark name or several joined by commas, each known."""

    def parse(text: str) -> list[str]:
        names = [n for n in text.split(",") if n]
        unknown = [n for n in names if n not in known]
        if unknown or not names:
            raise argparse.ArgumentTypeError(
                f"unknown benchmark {', '.join(unknown) or repr(text)}; known: {', '.join(known)}"
            )
        return names

    return parse


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    names = [b.name for b in BENCHMARKS]
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    listed = _names(names)
    parser.add_argument(
        "--only", nargs="+", type=listed, help="run only these (also comma-separated: a,b)"
    )
    parser.add_argument("--skip", nargs="+", type=listed, default=[], help="leave these out")
    parser.add_argument(
        "--quick", action="store_true", help="each benchmark's --quick smoke size instead"
    )
    parser.add_argument(
        "--budget", type=float, default=SUITE_BUDGET_S, help="seconds for the whole suite"
    )
    parser.add_argument(
        "--date", default=None, help="the report's date (default: today, UTC), YYYY-MM-DD"
    )
    parser.add_argument(
        "--update-docs",
        action="store_true",
        help="run nothing: rewrite the figures block of --docs from the latest report in --out",
    )
    parser.add_argument(
        "--redraw",
        action="store_true",
        help="run nothing: redraw the plots and the summary of the latest report in --out",
    )
    parser.add_argument("--docs", type=Path, default=ROOT / "docs" / "performance.md")
    return parser


def run_suite(
    benchmarks: Sequence[Benchmark], work: Path, *, quick: bool, budget_s: float
) -> list[Outcome]:
    """Run ``benchmarks`` one after another in ``work`` within ``budget_s`` seconds."""
    deadline = time.monotonic() + budget_s
    outcomes = []
    for bench in benchmarks:
        left = deadline - time.monotonic()
        if left < MIN_START_S:
            outcomes.append(skipped(bench, f"suite budget spent ({left:.0f} s left)"))
            continue
        outcomes.append(run_benchmark(bench, work, quick=quick, limit_s=min(bench.budget_s, left)))
    return outcomes


def _merge(path: Path, outcomes: list[Outcome], *, command: str, partial: bool) -> dict[str, Any]:
    """The benchmarks' entries, each with the suite command that ran it; a partial run
    (``--only``/``--skip``) updates the entries of the same day's file."""
    entries: dict[str, Any] = {}
    if partial and path.exists():
        entries = json.loads(path.read_text()).get("benchmarks", {})
    entries.update({o.name: {**o.to_json(), "suite_command": command} for o in outcomes})
    order = [b.name for b in BENCHMARKS]
    return {name: entries[name] for name in sorted(entries, key=order.index)}


def render(combined: dict[str, Any], result: Path) -> None:
    """Draw the plots of ``combined``, then write it to ``result`` and its summary beside."""
    plot_dir = Path("plots") / result.stem
    reports = {n: o["report"] for n, o in combined["benchmarks"].items() if o["status"] == "ok"}
    plots, notes = draw_all(reports, result.parent / plot_dir)
    combined.update(
        plot_dir=plot_dir.as_posix(), plots=[attrs.asdict(p) for p in plots], plot_notes=notes
    )
    result.write_text(json.dumps(combined, indent=2) + "\n")
    lines = summary(combined)
    result.with_suffix(".md").write_text("\n".join(lines))
    print("\n".join(lines), flush=True)
    print(f"wrote {result} and its summary; plots in {result.parent / plot_dir}", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run the suite (or, with ``--update-docs``, only rewrite the docs' figures)."""
    args = _parser().parse_args(argv)
    if args.update_docs:
        result = update_docs(args.docs, args.out)
        print(f"{args.docs}: figures from {result}")
        return 0
    if args.redraw:
        latest = latest_result(args.out)
        if latest is None:
            raise SystemExit(f"no <date>-<machine>.json suite report in {args.out}")
        render(json.loads(latest.read_text()), latest)
        return 0
    only = {name for names in args.only or () for name in names}
    skip = {name for names in args.skip for name in names}
    chosen = [b for b in BENCHMARKS if (not only or b.name in only)]
    chosen = [b for b in chosen if b.name not in skip]
    command = " ".join(["python -m bench.suite", *(argv if argv is not None else sys.argv[1:])])
    description = machine("jax", "jaxlib", "grpcio", "tritonclient", "matplotlib")
    date = args.date or datetime.datetime.now(datetime.UTC).date().isoformat()
    stem = f"{date}-{description['slug']}"
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="rs-bench-suite-") as work:
        outcomes = run_suite(chosen, Path(work), quick=args.quick, budget_s=args.budget)
    wall = time.perf_counter() - start
    args.out.mkdir(parents=True, exist_ok=True)
    result = args.out / f"{stem}.json"
    partial = bool(args.only or args.skip)
    benchmarks = _merge(result, outcomes, command=command, partial=partial)
    combined: dict[str, Any] = {
        "date": date,
        "machine": description,
        "command": command,
        "commands": list(dict.fromkeys(o["suite_command"] for o in benchmarks.values())),
        "mode": "quick" if args.quick else "suite",
        "budget_s": args.budget,
        # The benchmarks' own times added up (over the runs merged here); this command's beside.
        "wall_s": sum(o["wall_s"] for o in benchmarks.values()),
        "command_wall_s": wall,
        "benchmarks": benchmarks,
    }
    render(combined, result)
    return 0 if all(o["status"] == "ok" for o in benchmarks.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
