"""``python -m bench.worker_grpc --quick`` runs end to end: both servers, both models, a report.

Only the shape of the report is checked: benchmark figures are never asserted in tests.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests._bench_support import run_bench


@pytest.mark.slow
def test_quick_run_writes_a_report(tmp_path: Path) -> None:
    argv = ["--quick", "--concurrency", "8"]
    bench = run_bench("bench.worker_grpc", argv, tmp_path / "out", "worker-grpc-cpu")
    report = bench.report
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

    assert report["figures"][0]["target"] == ">= 0.60"
    assert "Tiny MLP at concurrency 8" in bench.markdown
    assert "| worker | mlp | 8 |" in bench.markdown
