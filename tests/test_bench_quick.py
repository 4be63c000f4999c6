"""``--quick`` runs of the in-process benchmarks (runtime, scheduler) end to end.

Only the shape of the report is checked: benchmark figures are never asserted in tests.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests._bench_support import run_bench


@pytest.mark.slow
@pytest.mark.parametrize(
    ("module", "result", "heading", "targets"),
    [
        ("bench.runtime", "runtime-cpu", "# Worker runtime benchmark", 2),
        ("bench.scheduler", "scheduler-cpu", "# Scheduler benchmark", 2),
    ],
)
def test_quick_run_writes_a_report(
    tmp_path: Path, module: str, result: str, heading: str, targets: int
) -> None:
    bench = run_bench(module, ["--quick"], tmp_path / "out", result)
    assert bench.markdown.startswith(heading)
    assert sum(f["target"] is not None for f in bench.report["figures"]) == targets
    assert all(f["value"] is not None for f in bench.report["figures"])
