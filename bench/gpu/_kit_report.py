"""The GPU kit's Markdown report: the machine, each step's status, every figure, what failed."""

from __future__ import annotations

from typing import Any

from bench._common import machine_line

__all__ = ["markdown"]


def _value(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.3g}"
    return str(value)


def _met(figure: dict[str, Any]) -> str:
    if figure.get("met") is None:
        return "-"
    return "met" if figure["met"] else "**not met**"


def markdown(kit: dict[str, Any]) -> list[str]:
    """The kit's report as Markdown lines (partial runs included: every step says how it went)."""
    lines = [
        f"# GPU kit ({kit['mode']}), {kit['started']}",
        "",
        f"Machine: {machine_line(kit['machine'])}",
    ]
    for gpu in kit.get("nvidia_smi") or []:
        lines.append(f"GPU: {gpu}")
    versions = ", ".join(
        f"{d} {kit['machine'][d]}"
        for d in ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda13-pjrt", "grpcio")
        if kit["machine"].get(d, "-") != "-"
    )
    lines += [
        f"Versions: {versions}.",
        f"Command: `{kit['command']}`; budget {kit['budget_s']:g} s, wall "
        f"{kit.get('wall_s', '-')} s.",
        "",
        "| step | status | wall s | budget s |",
        "|---|---|---|---|",
    ]
    for step in kit["steps"]:
        lines.append(
            f"| {step['name']} | {step['status']} | {step.get('wall_s', '-')} "
            f"| {step.get('budget_s', '-')} |"
        )
    lines += ["", "| step | figure | value | unit | target | met |", "|---|---|---|---|---|---|"]
    for step in kit["steps"]:
        for figure in (step.get("report") or {}).get("figures", []):
            lines.append(
                f"| {step['name']} | {figure['name']} | {_value(figure['value'])} "
                f"| {figure['unit']} | {figure.get('target') or '-'} | {_met(figure)} |"
            )
    for step in kit["steps"]:
        report = step.get("report") or {}
        notes = list(report.get("notes", []))
        if report.get("summary"):
            notes.insert(0, f"pytest: {report['summary']}")
        notes += report.get("skipped_reasons", [])
        if notes:
            lines += ["", f"Notes ({step['name']}):", "", *(f"- {n}" for n in notes)]
        if step.get("log_tail"):
            lines += ["", f"Last lines of {step['name']} ({step['status']}):", "", "```"]
            lines += [*step["log_tail"], "```"]
    return lines
