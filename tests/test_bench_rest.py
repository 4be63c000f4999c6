"""``python -m bench.rest --quick`` runs end to end: one worker, both protocols, a report.

Only the shape of the report is checked: benchmark figures are never asserted in tests.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_quick_run_writes_a_report(tmp_path: Path) -> None:
    out = tmp_path / "results"
    argv = ["--quick", "--concurrency", "8", "--out", str(out)]
    done = subprocess.run(
        [sys.executable, "-m", "bench.rest", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr

    report = json.loads((out / "rest-cpu.json").read_text())
    runs = {(r["protocol"], r["model"]): r for r in report["runs"]}
    assert set(runs) == {("grpc", "mlp"), ("rest", "mlp")}
    for run in runs.values():
        assert run["concurrency"] == 8
        assert run["requests"] > 0
        assert run["errors"] == 0, run["first_error"]
        assert 0 < run["p50_ms"] <= run["p99_ms"]
    (ratio,) = report["ratios"]
    assert (ratio["model"], ratio["concurrency"]) == ("mlp", 8)
    assert ratio["ratio"] > 0
    assert report["exit_status"] == 0

    markdown = (out / "rest-cpu.md").read_text()
    assert "Tiny MLP at concurrency 8" in markdown
    assert "| rest | mlp | 8 |" in markdown
    assert "| grpc | mlp | 8 |" in markdown
