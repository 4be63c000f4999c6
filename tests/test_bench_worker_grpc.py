"""``python -m bench.worker_grpc --quick`` runs end to end: both servers, both models, a report.

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
        [sys.executable, "-m", "bench.worker_grpc", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr

    report = json.loads((out / "worker-grpc-cpu.json").read_text())
    runs = {(r["target"], r["model"]): r for r in report["runs"]}
    assert set(runs) == {(t, m) for t in ("bare", "worker") for m in ("mlp", "cnn")}
    for run in runs.values():
        assert run["concurrency"] == 8
        assert run["requests"] > 0
        assert run["errors"] == 0, run["first_error"]
        assert 0 < run["p50_ms"] <= run["p99_ms"]
    # The worker's statistics saw the requests; the bare server has none.
    assert runs["worker", "mlp"]["worker_stats"]["rows_per_execution"] >= 1
    assert runs["bare", "mlp"]["worker_stats"] == {}
    assert {(r["model"], r["concurrency"]) for r in report["ratios"]} == {("mlp", 8), ("cnn", 8)}
    assert all(r["ratio"] > 0 for r in report["ratios"])
    assert report["exit_status"] == {"bare": 0, "worker": 0}

    markdown = (out / "worker-grpc-cpu.md").read_text()
    assert "Tiny MLP at concurrency 8" in markdown
    assert "| worker | mlp | 8 |" in markdown
