"""``python -m bench.rest --quick`` runs end to end: one worker, both protocols, a report.

Only the shape of the report is checked: benchmark figures are never asserted in tests.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests._bench_support import run_bench


@pytest.mark.slow
def test_quick_run_writes_a_report(tmp_path: Path) -> None:
    bench = run_bench("bench.rest", ["--quick", "--concurrency", "8"], tmp_path / "out", "rest-cpu")
    report = bench.report
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

    markdown = bench.markdown
    assert "Tiny MLP at concurrency 8" in markdown
    assert "| rest | mlp | 8 |" in markdown
    assert "| grpc | mlp | 8 |" in markdown
