"""``python -m bench.meta_pipeline`` runs end to end and writes its report.

Only the shape of the report is checked: benchmark figures are never asserted in tests.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_quick_run_writes_a_report(tmp_path: Path) -> None:
    out = tmp_path / "results"
    argv = ["--requests", "20", "--rounds", "1", "--out", str(out)]
    done = subprocess.run(
        [sys.executable, "-m", "bench.meta_pipeline", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((out / "meta-pipeline-cpu.json").read_text())
    assert set(report["us_per_pipeline"]) == {"meta", "client_chained"}
    assert all(len(v) == 1 and v[0] > 0 for v in report["us_per_pipeline"].values())
    assert report["client_chained_over_meta"] > 0
    assert (out / "meta-pipeline-cpu.md").read_text().startswith("# Meta model")
