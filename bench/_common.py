"""Plumbing every benchmark shares: the machine description, figures, ports, report files.

A benchmark's JSON report carries ``"machine"`` (:func:`machine`) and ``"figures"`` (a list of
:func:`figure` rows: its headline numbers against their targets), and is written with its
Markdown twin by :func:`write_report`::

    report = {"machine": machine("jax", "grpcio"), "figures": [figure("x / y", 0.9, "x")]}
    write_report(out, "thing-cpu", report, lines)
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import re
import shutil
import socket
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "error_lines",
    "figure",
    "figure_lines",
    "fmt",
    "free_port",
    "gpu_names",
    "loadavg",
    "machine",
    "machine_line",
    "machine_slug",
    "versions",
    "write_report",
]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def fmt(value: float | None, spec: str) -> str:
    """``value`` formatted with ``spec``, ``-`` where it is missing."""
    return "-" if value is None else format(value, spec)


def versions(*dists: str) -> dict[str, str]:
    """Installed version of each distribution, ``-`` where it is missing."""
    out = {}
    for dist in dists:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "-"
    return out


def loadavg() -> float | None:
    """The 1-minute load average (other work on the machine skews every figure)."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_names() -> list[str]:
    """The NVIDIA GPUs ``nvidia-smi`` lists (empty without one); never imports jax."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        done = subprocess.run(
            [smi, "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in done.stdout.splitlines() if line.strip()]


def _slug(text: str) -> str:
    text = re.sub(r"\((R|TM)\)|\bCPU\b|@.*$|\bProcessor\b", " ", text, flags=re.IGNORECASE)
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def machine_slug(description: dict[str, Any]) -> str:
    """A short file-name-safe name: the GPU's name, else ``<cpu model>-<n>c-cpu``."""
    if description.get("gpus"):
        return _slug(description["gpus"][0])
    return f"{_slug(description['cpu_model'])}-{description['cpus']}c-cpu"


def machine(*dists: str) -> dict[str, Any]:
    """The machine a benchmark ran on: CPU model and count, GPUs, Python and ``dists``."""
    description: dict[str, Any] = {
        "platform": platform.platform(),
        "cpu_model": _cpu_model(),
        "cpus": os.cpu_count(),
        "affinity": (sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None),
        "gpus": gpu_names(),
        "python": platform.python_version(),
        **versions(*dists),
        "loadavg_1m": loadavg(),
    }
    description["device"] = "gpu" if description["gpus"] else "cpu"
    description["slug"] = machine_slug(description)
    return description


def machine_line(description: dict[str, Any]) -> str:
    """The machine in one Markdown sentence."""
    device = ", ".join(description.get("gpus") or []) or "no GPU"
    return (
        f"{description['cpu_model']}, {description['cpus']} CPUs, {device}; "
        f"{description['platform']}, Python {description['python']}."
    )


def figure(
    name: str,
    value: float | None,
    unit: str,
    *,
    target: str | None = None,
    met: bool | None = None,
) -> dict[str, Any]:
    """One headline number: ``target`` says the goal in words (``">= 0.60"``), ``met`` if
    it is reached (None where there is no target or no value)."""
    return {
        "name": name,
        "value": value,
        "unit": unit,
        "target": target,
        "met": None if target is None or value is None else met,
    }


def figure_lines(figures: Sequence[dict[str, Any]]) -> list[str]:
    """The Markdown list of :func:`figure` s: ``- name: value unit, target T (met)``."""
    lines = []
    for f in figures:
        verdict = "" if f["met"] is None else (" (met)" if f["met"] else " (NOT met)")
        target = f", target {f['target']}" if f["target"] else ""
        lines.append(f"- {f['name']}: {fmt(f['value'], '.2f')} {f['unit']}{target}{verdict}")
    return lines


def error_lines(errors: Sequence[str]) -> list[str]:
    """The Markdown list of the first error of each run that had one (nothing if none)."""
    if not errors:
        return []
    return ["", "First error per run:", "", *(f"- {e}" for e in errors)]


def write_report(out: Path, name: str, report: dict[str, Any], lines: Sequence[str]) -> None:
    """Write ``out/name.json`` and ``out/name.md`` and print the Markdown."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / f"{name}.md").write_text("\n".join(lines))
    print("\n".join(lines), flush=True)
