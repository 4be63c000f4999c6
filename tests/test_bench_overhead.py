"""``python -m bench.overhead --quick`` runs end to end: both servers, the stage split, a report.

Only the shape of the report is checked: benchmark figures are never asserted in tests.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench._overhead_report import STAGES
from bench.overhead import QUEUE_DELAY_US
from reactantserver.worker.views.metrics import CPU_STAGES
from tests._bench_support import run_bench


def test_the_report_names_the_stages_the_worker_exports() -> None:
    assert STAGES == CPU_STAGES


@pytest.mark.slow
def test_quick_run_writes_a_report(tmp_path: Path) -> None:
    bench = run_bench("bench.overhead", ["--quick", "--concurrency", "8"], tmp_path, "overhead-cpu")
    report = bench.report
    assert {(r["target"], r["concurrency"]) for r in report["runs"]} == {
        ("bare", 8),
        ("bare_handoff", 8),
        ("worker", 8),
        ("worker_delay", 8),
    }
    for run in report["runs"]:
        assert run["requests"] > 0
        assert run["errors"] == 0, run["first_error"]
    assert report["exit_status"] == {"bare": 0, "bare_handoff": 0, "worker": 0, "worker_delay": 0}
    (stages,) = report["stages"]
    assert stages["requests"] > 0
    assert set(stages["us_per_request"]) == {*STAGES, "other"}
    # Every stage moved: the worker counted real CPU for each of them.
    assert all(stages["us_per_request"][stage] > 0 for stage in STAGES)
    assert stages["process_us"] > stages["stage_sum_us"] > 0
    assert report["instrumentation"]["thread_time_ns_call_ns"] > 0

    names = [f["name"] for f in report["figures"]]
    assert names[0] == "worker / bare req/s (mlp, c=8)"
    assert report["figures"][0]["target"] == ">= 0.60"
    assert {f"{stage} CPU / request (mlp, c=8)" for stage in (*STAGES, "other")} <= set(names)
    assert "bare with a thread hand-off / bare req/s (mlp, c=8)" in names
    assert f"worker with a {QUEUE_DELAY_US} us queue delay / bare req/s (mlp, c=8)" in names
    assert "| worker | 8 |" in bench.markdown
    assert "## Worker CPU per request by stage (us)" in bench.markdown
