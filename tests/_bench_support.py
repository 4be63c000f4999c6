"""One way to smoke-test a benchmark: run ``python -m bench.<name> ARGS --out DIR`` to the end.

Benchmark figures are never asserted in tests; the helpers check the run finished, and hand
back its JSON report and Markdown for the test to check their shape.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs

ROOT = Path(__file__).resolve().parent.parent

__all__ = ["ROOT", "BenchRun", "run_bench"]


@attrs.frozen
class BenchRun:
    """A finished benchmark run: its process id, report and Markdown."""

    pid: int
    report: dict[str, Any]
    markdown: str


def run_bench(
    module: str, argv: list[str], out: Path, result: str, *, timeout: float = 240.0
) -> BenchRun:
    """Run ``python -m <module> *argv --out out`` from the repository root; assert it exits 0
    and that every figure in ``out/<result>.json`` has the shared shape."""
    proc = subprocess.Popen(
        [sys.executable, "-m", module, *argv, "--out", str(out)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, output
    report = json.loads((out / f"{result}.json").read_text())
    assert report["machine"]["cpus"] >= 1
    assert report["machine"]["slug"]
    assert report["figures"], "a benchmark reports its headline figures"
    for fig in report["figures"]:
        assert set(fig) == {"name", "value", "unit", "target", "met"}
        assert fig["met"] is None or fig["target"] is not None
    return BenchRun(proc.pid, report, (out / f"{result}.md").read_text())
