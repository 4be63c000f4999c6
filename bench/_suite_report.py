"""The suite's Markdown: the summary of one run, and the figures block of docs/performance.md.

Both come from the combined JSON report that ``bench.suite`` writes (``results/<date>-<machine>
.json``): every benchmark's outcome and report, the plots drawn and the notes on those skipped.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bench._common import machine_line

__all__ = [
    "DOCS_BEGIN",
    "DOCS_END",
    "figure_rows",
    "latest_result",
    "summary",
    "update_docs",
]

DOCS_BEGIN = "<!-- bench:figures:begin (written by python -m bench.suite --update-docs) -->"
DOCS_END = "<!-- bench:figures:end -->"
_RESULT_NAME = re.compile(r"^\d{4}-\d{2}-\d{2}-.+\.json$")


def _value(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "x" or abs(value) < 10:
        return f"{value:,.3g}" if abs(value) < 1 else f"{value:,.2f}"
    return f"{value:,.0f}"


def _verdict(met: bool | None) -> str:
    return {True: "met", False: "**not met**", None: "-"}[met]


def figure_rows(benchmarks: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """A Markdown table of every benchmark's figures against their targets."""
    lines = [
        "| benchmark | figure | value | unit | target | met |",
        "|---|---|---|---|---|---|",
    ]
    for name, outcome in benchmarks.items():
        report = outcome.get("report") or {}
        figures = report.get("figures") or []
        if outcome["status"] != "ok" or not figures:
            why = outcome.get("note") or "no figures in its report"
            lines.append(f"| {name} | ({outcome['status']}: {why}) | - | - | - | - |")
            continue
        for f in figures:
            lines.append(
                f"| {name} | {f['name']} | {_value(f['value'], f['unit'])} | {f['unit']} | "
                f"{f['target'] or '-'} | {_verdict(f['met'])} |"
            )
    return lines


def _counts(benchmarks: Mapping[str, Mapping[str, Any]]) -> str:
    figures = [
        f
        for o in benchmarks.values()
        for f in ((o.get("report") or {}).get("figures") or [])
        if f["target"] is not None
    ]
    met = sum(1 for f in figures if f["met"])
    return f"{met} of {len(figures)} figures with a target meet it"


def _status_rows(benchmarks: Mapping[str, Mapping[str, Any]]) -> list[str]:
    lines = [
        "| benchmark | status | wall (s) | budget (s) | run by | note |",
        "|---|---|---|---|---|---|",
    ]
    for name, o in benchmarks.items():
        lines.append(
            f"| {name} | {o['status']} | {o['wall_s']:.0f} | {o['budget_s']:.0f} | "
            f"`{o.get('suite_command', '-')}` | {o.get('note') or ''} |"
        )
    return lines


def _plots(combined: Mapping[str, Any], prefix: str) -> list[str]:
    lines = []
    for plot in combined["plots"]:
        lines += [f"![{plot['caption']}]({prefix}{plot['file']})", "", f"*{plot['caption']}*", ""]
    lines += [f"- Plot {note}" for note in combined["plot_notes"]]
    return lines


def _commands(combined: Mapping[str, Any]) -> str:
    commands = [f"`{c}`" for c in combined.get("commands") or [combined["command"]]]
    if len(commands) == 1:
        return f"Command: {commands[0]}"
    return f"Commands: {', then '.join(commands)} (merged: the later run's benchmarks replace)"


def summary(combined: Mapping[str, Any]) -> list[str]:
    """The Markdown summary of one suite run (plots linked relative to the results folder)."""
    benchmarks = combined["benchmarks"]
    failed = [n for n, o in benchmarks.items() if o["status"] != "ok"]
    lines = [
        f"# Benchmark suite, {combined['date']}, {combined['machine']['slug']}",
        "",
        f"Machine: {machine_line(combined['machine'])}",
        "",
        f"{_commands(combined)} ({combined['mode']} sizes); the benchmarks took "
        f"{combined['wall_s']:.0f} s of a {combined['budget_s']:.0f} s budget. "
        f"{_counts(benchmarks)}."
        + (f" Not ok: {', '.join(failed)}." if failed else " Every benchmark ran."),
        "",
        "## Figures",
        "",
        *figure_rows(benchmarks),
        "",
        "## Benchmarks",
        "",
        *_status_rows(benchmarks),
        "",
        "## Plots",
        "",
        *_plots(combined, f"{combined['plot_dir']}/"),
    ]
    for name, o in benchmarks.items():
        if o.get("log_tail"):
            lines += ["", f"### {name}: end of its output", "", "```", o["log_tail"], "```"]
    lines.append("")
    return lines


def latest_result(results: Path) -> Path | None:
    """The newest combined report in ``results`` (by the date in its name, then mtime)."""
    found = [p for p in results.glob("*.json") if _RESULT_NAME.match(p.name)]
    if not found:
        return None
    return max(found, key=lambda p: (p.name[:10], p.stat().st_mtime))


def _docs_block(combined: Mapping[str, Any], result: Path, docs: Path) -> list[str]:
    prefix = _relative(result.parent, docs.parent)
    benchmarks = combined["benchmarks"]
    return [
        DOCS_BEGIN,
        "",
        f"Latest run: {combined['date']} on {machine_line(combined['machine'])} "
        f"{_commands(combined)}: the benchmarks took {combined['wall_s']:.0f} s; "
        f"{_counts(benchmarks)}. "
        f"Full summary: [{result.stem}.md]({prefix}{result.stem}.md).",
        "",
        *figure_rows(benchmarks),
        "",
        *_plots(combined, f"{prefix}{combined['plot_dir']}/"),
        DOCS_END,
    ]


def _relative(target: Path, start: Path) -> str:
    """``target`` relative to ``start`` as a link prefix ending in ``/``."""
    rel = os.path.relpath(target.resolve(), start.resolve())
    return "" if rel == "." else rel.replace(os.sep, "/") + "/"


def update_docs(docs: Path, results: Path) -> Path:
    """Rewrite the block between the markers in ``docs`` from the newest combined report in
    ``results``; returns that report's path."""
    result = latest_result(results)
    if result is None:
        raise FileNotFoundError(f"no <date>-<machine>.json suite report in {results}")
    combined = json.loads(result.read_text())
    text = docs.read_text()
    begin, end = text.find(DOCS_BEGIN), text.find(DOCS_END)
    if begin < 0 or end < begin:
        raise ValueError(f"{docs} lacks the markers {DOCS_BEGIN!r} ... {DOCS_END!r}")
    block = "\n".join(_docs_block(combined, result, docs))
    docs.write_text(text[:begin] + block + text[end + len(DOCS_END) :])
    return result
