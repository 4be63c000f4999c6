"""``python -m bench.gateway --quick`` runs end to end: two workers, two gateways, a report.

Only the shape of the report is checked: benchmark figures are never asserted in tests.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests._bench_support import run_bench

TARGETS = {"direct", "gateway_1", "gateway_2"}


@pytest.mark.slow
def test_quick_run_writes_a_report(tmp_path: Path) -> None:
    argv = ["--quick", "--latency-concurrency", "1", "--scaling-concurrency", "4"]
    argv += ["--scaling-rows", "4"]
    bench = run_bench("bench.gateway", argv, tmp_path / "out", "gateway-cpu")
    report = bench.report
    assert report["exit_status"] == dict.fromkeys(
        ("worker_a", "worker_b", "gateway_1", "gateway_2"), 0
    )
    for section, model, concurrency, rows in (("latency", "mlp", 1, 1), ("scaling", "cnn", 4, 4)):
        runs = {r["target"]: r for r in report[section]}
        assert set(runs) == TARGETS
        for run in runs.values():
            assert (run["model"], run["concurrency"], run["rows_per_request"]) == (
                model,
                concurrency,
                rows,
            )
            assert run["requests"] == 40
            assert run["errors"] == 0, run["first_error"]
            assert 0 < run["p50_ms"] <= run["p99_ms"]
            assert run["requests_per_s"] > 0
        # Direct and gateway_1 reach worker A only; gateway_2 spreads over both workers.
        for target in ("direct", "gateway_1"):
            assert runs[target]["served_by_worker"]["worker_b"] == 0
            assert runs[target]["served_by_worker"]["worker_a"] > 0
        assert all(n > 0 for n in runs["gateway_2"]["served_by_worker"].values())
    assert {(o["gateway"], o["concurrency"]) for o in report["overhead"]} == {
        ("gateway_1", 1),
        ("gateway_2", 1),
    }
    [scaling] = report["scaling_ratios"]
    assert scaling["concurrency"] == 4
    assert scaling["two_over_one_gateway"] > 0
    assert 0 < scaling["worker_b_share"] < 1
    assert report["errors"] == []

    assert report["figures"][0]["target"] == "<= 25%"
    markdown = bench.markdown
    assert markdown.startswith("# Gateway benchmark")
    assert "| gateway_1 | 1 |" in markdown
    assert "| cnn | 4 | gateway_2 |" in markdown
