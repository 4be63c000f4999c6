"""``python -m bench.meta_pipeline`` runs end to end and writes its report.

Only the shape of the report is checked: benchmark figures are never asserted in tests.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests._bench_support import run_bench


@pytest.mark.slow
def test_quick_run_writes_a_report(tmp_path: Path) -> None:
    bench = run_bench("bench.meta_pipeline", ["--quick"], tmp_path / "out", "meta-pipeline-cpu")
    report = bench.report
    assert set(report["us_per_pipeline"]) == {"meta", "client_chained"}
    assert all(len(v) == 1 and v[0] > 0 for v in report["us_per_pipeline"].values())
    assert report["client_chained_over_meta"] > 0
    assert bench.markdown.startswith("# Meta model")
