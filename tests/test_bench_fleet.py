"""``python -m bench.fleet --quick`` runs end to end: a tiny catalog, two workers with the CPU
arena, a gateway per routing mode, stock tritonclient, a report.

Only the shape of the report is checked: benchmark figures are never asserted in tests.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests._bench_support import run_bench

MODES = ["round_robin", "lpt_packing", "model_aware"]


@pytest.mark.slow
def test_quick_run_writes_a_report(tmp_path: Path) -> None:
    out = tmp_path / "out"
    bench = run_bench("bench.fleet", ["--quick"], out, "fleet-cpu", timeout=400.0)
    report = bench.report
    assert report["modes"] == MODES
    assert report["settings"]["workers"] == 2
    assert report["settings"]["catalog_over_fleet_budget"] > 1  # the budgets hold part of it
    assert {t["name"] for t in report["traces"]} == {"zipf", "bursty"}
    assert {(r["trace"], r["mode"]) for r in report["runs"]} == {
        (t, m) for t in ("zipf", "bursty") for m in MODES
    }
    for run in report["runs"]:
        assert run["errors"] == 0, run["first_error"]
        assert run["answered"] == run["requests"] > 0
        assert 0 < run["p50_ms"] <= run["p99_ms"]
        assert run["cold_loads"] > 0  # the caches start empty
        assert run["batch1_executions"] > 0
    for row in report["summary"]:
        if row["mode"] == "round_robin":
            assert row["mean_ms_vs_rr"] == pytest.approx(1.0)
        assert row["cold_per_1000_vs_rr"] is not None
    assert report["load_exec_ratio"] > 0
    assert {(r["scenario"], r["mode"]) for r in report["scenarios"]} == {
        (s, m)
        for s in ("colocation without queuing", "colocation with queuing", "registry win")
        for m in MODES
    }
    assert all(r["errors"] == 0 for r in report["scenarios"])
    assert report["figures"][0]["name"] == "one load / one batch-1 execution"
    assert (out / report["plot"]).stat().st_size > 0
    assert bench.markdown.startswith("# Routing across a fleet")
    assert "| zipf | model_aware |" in bench.markdown
