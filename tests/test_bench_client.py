"""``python -m bench.client`` runs end to end against a real worker and writes its report.

Only the shape of the report is checked: benchmark figures are never asserted in tests.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests._bench_support import run_bench


@pytest.mark.slow
def test_quick_run_writes_a_report(tmp_path: Path) -> None:
    bench = run_bench("bench.client", ["--quick"], tmp_path / "out", "client-cpu", timeout=300)
    # The benchmark's staging pools were unregistered and unlinked before it exited.
    assert not list(Path("/dev/shm").glob(f"reactantserver-client-{bench.pid}-*"))

    report = bench.report
    assert {"cpus", "python", "grpcio", "tritonclient"} <= set(report["machine"])
    assert report["worker_exit_status"] == 0

    def check(row: dict[str, Any], unit: str, count: int) -> None:
        assert len(row[f"{unit}s_per_s_rounds"]) == 1
        assert row[f"{unit}s_per_s"] > 0
        assert row[f"{unit}s"] == count
        assert row[f"cpu_us_per_{unit}"] > 0
        assert row[f"thread_cpu_us_per_{unit}"] >= 0

    single, conc = report["single"], report["concurrent"]
    assert set(single["ways"]) == {"reactant_sync", "triton_sync"}
    assert set(conc["ways"]) == {"reactant_async", "triton_async_infer", "triton_aio"}
    assert conc["concurrency"] == 8
    for row in [*single["ways"].values(), *conc["ways"].values()]:
        check(row, "request", 20)
        assert 0 < row["p50_ms"] <= row["p99_ms"]
    assert single["reactant_over_triton"] > 0
    assert conc["reactant_over_triton_async_infer"] > 0
    assert conc["reactant_over_triton_aio"] > 0

    [bulk] = report["bulk"]
    assert bulk["chunk"] == 8
    assert set(bulk["ways"]) == {"reactant_shm", "reactant_inline", "triton_chunks"}
    for row in bulk["ways"].values():
        check(row, "item", 16)
    assert set(bulk["ratios"]) == {"shm_over_inline", "shm_over_triton", "inline_over_triton"}
    # The SHM way really went through shared memory (registered, never latched to inline).
    assert bulk["shm"] == {"pool_registered": True, "pool_latched_inline": False}

    markdown = bench.markdown
    assert markdown.startswith("# Thin client vs tritonclient")
    assert "| reactant_sync |" in markdown
    assert "| 8 | reactant_shm |" in markdown
