"""``python -m bench.overload --quick`` runs end to end: the worker at its cap and at ten
times it, a report with every figure. Only the report's shape is checked, never its numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests._bench_support import run_bench


@pytest.mark.slow
def test_quick_run_writes_a_report(tmp_path: Path) -> None:
    bench = run_bench(
        "bench.overload", ["--quick", "--model", "mlp", "--cap", "4"], tmp_path, "overload-cpu"
    )
    report = bench.report
    assert report["exit_status"] == 0
    cap, over = report["rows"]
    assert (cap["kind"], cap["clients"], over["kind"], over["clients"]) == (
        "cap",
        4,
        "overload",
        40,
    )
    assert cap["admitted_per_s"] > 0
    assert over["admitted_per_s"] > 0
    assert over["refused_per_s"] > 0  # ten times the cap is refused in part
    assert over["other_statuses"] == {}  # only OK and RESOURCE_EXHAUSTED
    assert report["errors"] == []
    assert {f["name"] for f in report["figures"]} >= {
        "worker RSS growth under overload",
        "admitted in-server latency at 10x the cap / at the cap (mean)",
    }
