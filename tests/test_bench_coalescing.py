"""``python -m bench.coalescing --quick`` runs end to end, and its table joins raw and served.

Only the shape of the report is checked: benchmark figures are never asserted in tests.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench._coalescing_report import TARGET_RATIO, figures, points
from tests._bench_support import run_bench


@pytest.mark.slow
def test_quick_run_writes_a_report(tmp_path: Path) -> None:
    bench = run_bench("bench.coalescing", ["--quick"], tmp_path / "out", "coalescing-cpu")
    report = bench.report
    assert report["exit_status"] == {"worker": 0, "bare": 0, "front": 0}
    assert report["errors"] == []
    # b without its own program runs the size the scheduler pads it to.
    assert report["padded_to"] == {"1": 1, "2": 4, "4": 4, "8": 8, "16": 32, "32": 32}
    by_batch = {p["batch"]: p for p in report["points"]}
    assert sorted(by_batch) == [1, 2, 4, 8, 16, 32]
    for b, point in by_batch.items():
        assert len(report["raw_slices"][str(b)]) == 2
        assert point["raw_rows_per_s"] > 0
        assert point["batched_rows_per_s"] > 0
        assert point["coalesced_rows_per_s"] > 0
        # One client, one b-row request per execution: the worker's counters say exactly b.
        assert point["batched_rows_per_execution"] == pytest.approx(b)
        assert sum(point["batched_executions_by_batch"].values()) > 0
        assert 1 <= point["coalesced_rows_per_execution"] <= 32
    floor = report["floor"]
    assert floor["target"] == "bare server"
    assert floor["concurrency"] == 32
    assert floor["rows_per_s"] > 0
    headline = report["figures"][:2]
    assert all(f["target"].startswith(f">= {TARGET_RATIO:.2f}") for f in headline)
    assert any(f["name"].startswith("gRPC floor") for f in report["figures"])
    front = report["front_floor"]
    assert front["target"] == "bare server on the native front"
    assert (front["concurrency"], front["errors"]) == (32, 0)
    assert front["rows_per_s"] > 0
    named = {f["name"]: f for f in report["figures"]}
    assert named["front floor / raw rows/s (canned answer on our front, 32 clients x 1 row)"][
        "value"
    ] == pytest.approx(front["rows_per_s"] / by_batch[32]["raw_rows_per_s"])
    assert "worker CPU / row above the front floor's (32 clients x 1 row)" in named
    assert "- The front floor (the same canned answer on our own front door)" in bench.markdown
    assert "| b | program | raw rows/s |" in bench.markdown
    assert "| 16 | 32 |" in bench.markdown


def _run(mode: str, rows: int, concurrency: int, rows_per_s: float) -> dict[str, Any]:
    return {
        "mode": mode,
        "target": "worker",
        "rows_per_request": rows,
        "concurrency": concurrency,
        "rows_per_s": rows_per_s,
        "p50_ms": 1.0,
        "p99_ms": 2.0,
        "row_p50_us": 1e3 / rows,
        "rows_per_execution": float(rows),
        "executions_by_batch": {},
        "server_cpu_us_per_row": None,
    }


def test_points_take_the_padded_program_as_the_raw_reference() -> None:
    slice_4 = [{"ms_per_batch": 1.0, "cpu_cores": 1.0}, {"ms_per_batch": 3.0, "cpu_cores": 1.0}]
    report: dict[str, Any] = {
        "padded_to": {"2": 4},
        "raw_slices": {"2": slice_4},
        "runs": [_run("batched", 2, 1, 500.0), _run("coalesced", 1, 2, 250.0)],
        "floor": None,
    }
    (point,) = points(report)
    # Two rows per 2 ms (the mean of both slices of the batch-4 program).
    assert point["raw_rows_per_s"] == pytest.approx(1000.0)
    assert point["raw_us_per_row"] == pytest.approx(1000.0)
    assert point["raw_drift"] == pytest.approx(1 / 3)
    assert point["batched_ratio"] == pytest.approx(0.5)
    assert point["coalesced_ratio"] == pytest.approx(0.25)
    report["points"] = [point]
    ratios = [f for f in figures(report) if f["unit"] == "x"]
    assert [f["value"] for f in ratios] == [pytest.approx(0.25), pytest.approx(0.5)]
    assert [f["met"] for f in ratios] == [False, False]
