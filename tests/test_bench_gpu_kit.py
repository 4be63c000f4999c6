"""The GPU kit never rots: its CPU dry run runs every step to the end, and budgets are enforced.

``bench/gpu/run.sh --cpu-dry-run`` is the GPU run at smoke size on the CPU backend (same
steps, same code, same report); figures are never asserted, only that each step delivered.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections import deque
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bench.gpu import kit
from bench.gpu._modes import MODES

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_cpu_dry_run_runs_every_step(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable, "TMPDIR": str(tmp_path)}
    done = subprocess.run(
        ["bash", "bench/gpu/run.sh", "--cpu-dry-run", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=290,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-8000:] + done.stderr[-4000:]
    report = json.loads((out / "gpu-kit.json").read_text())
    assert report["mode"] == "cpu-dry-run"
    assert [step["name"] for step in report["steps"]] == list(kit.STEPS)
    for step in report["steps"]:
        assert step["status"] == "ok", step
        assert step["report"]["complete"]
        assert step["report"]["figures"], step["name"]
        for fig in step["report"]["figures"]:
            assert set(fig) == {"name", "value", "unit", "target", "met"}
    tests = report["steps"][0]["report"]
    assert tests["counts"]["passed"] >= 5
    assert tests["counts"].get("failed", 0) == 0
    markdown = (out / "gpu-kit.md").read_text()
    assert all(f"| {name} | ok |" in markdown for name in kit.STEPS)
    assert "[density]" in (out / "kit.log").read_text()
    assert "==== served-worker/worker.log" in (out / "worker-logs.txt").read_text()
    # The work directory and the private site are gone; only the report stays.
    assert not list(tmp_path.glob("rs-gpu-kit-*"))


_OVERRUN = """
import json, subprocess, sys, time
from pathlib import Path
reports = Path(sys.argv[1])
reports.mkdir(parents=True, exist_ok=True)
(reports / "served.json").write_text(json.dumps({"complete": False, "figures": [], "n": 1}))
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
Path(sys.argv[2]).write_text(str(child.pid))
print("measured one point", flush=True)
time.sleep(120)
"""


def test_an_overrunning_step_is_stopped_and_keeps_its_partial_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pid_file = tmp_path / "child.pid"
    script = textwrap.dedent(_OVERRUN)

    def command(name: str, mode: Any, work: Path, deadline: float) -> list[str]:
        return [sys.executable, "-c", script, str(work / "reports"), str(pid_file)]

    monkeypatch.setattr(kit, "_command", command)
    monkeypatch.setattr(kit, "_KILL_GRACE_S", 2.0)
    log = (tmp_path / "kit.log").open("w")
    started = time.monotonic()
    step = kit._run_step("served", MODES["cpu-dry-run"], tmp_path, 3.0, log)
    log.close()
    assert time.monotonic() - started < 30
    assert step["status"] == "timeout"
    assert step["report"] == {"complete": False, "figures": [], "n": 1}
    assert "measured one point" in step["log_tail"]
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)  # reaped by init once killed; the group kill reached it
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text()


def test_pytest_summary_is_parsed() -> None:
    tail = deque(["....s.", "SKIPPED [1] x.py:3: no arena", "=== 5 passed, 1 skipped in 9.7s ==="])
    report = kit._tests_report(tail, 0)
    assert report["counts"] == {"passed": 5, "skipped": 1}
    assert report["figures"][0]["met"] is True
    assert report["skipped_reasons"] == ["SKIPPED [1] x.py:3: no arena"]
    failed = kit._tests_report(deque(["= 1 failed, 4 passed in 3s ="]), 1)
    assert failed["figures"][0]["met"] is False
    assert not failed["complete"]


def test_gpu_shaped_results_make_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    """The report paths only a GPU run reaches: allocator statistics, page-locked loads."""
    from bench.gpu import density, served, transfers
    from reactantserver.worker.runtime import MemoryStats
    from reactantserver.worker.runtime.jax_backend import JaxBackend

    stats = MemoryStats(bytes_in_use=5, bytes_limit=80, peak_bytes_in_use=9, bytes_reserved=0)
    monkeypatch.setattr(JaxBackend, "memory_stats", lambda self: stats)
    device = transfers._device(SimpleNamespace(mode=MODES["cpu-dry-run"]))  # type: ignore[arg-type]
    assert device["memory_stats"]["free"] == 75
    rates = {"raw_pageable": 20.0, "raw_page_locked": 50.0, "load_page_locked": 45.0}
    bandwidth = {"model_arrays": 161, **{k: {"gbps": v} for k, v in rates.items()}}
    ratio, time_ratio, *rest = transfers._bandwidth_figures(bandwidth, "cuda")
    assert (ratio["value"], ratio["met"]) == (pytest.approx(0.9), True)
    assert (time_ratio["value"], time_ratio["met"]) == (pytest.approx(1 / 0.9), True)
    assert len(rest) == 3
    points = {
        "weight_bytes": 100,
        "before_load": 1000,
        "after_load": 1102,
        "after_eviction": 1001,
        "after_compaction": 1000,
    }
    loaded, freed, compacted = transfers._memory_figures(points)
    assert loaded["value"] == pytest.approx(1.02)
    assert (freed["value"], freed["met"]) == (pytest.approx(101 / 102), True)
    assert compacted["value"] == 0
    row = {
        "requests_per_s": 100.0,
        "p99_ms": 10.0,
        "loads_per_1000": 5.0,
        "prefetches_per_1000": 2.0,
        "load_gbps": 20.0,
    }
    rows = [
        {**row, "mode": "prefetch", "requests_per_s": 80.0, "p99_ms": 25.0},
        {**row, "mode": "no_prefetch", "requests_per_s": 60.0, "p99_ms": 40.0},
        {**row, "mode": "resident"},
    ]
    by_name = {f["name"]: f for f in density._figures(rows)}
    assert by_name["density throughput / all-resident (prefetch on)"]["met"] is True
    assert by_name["density p99 / all-resident (prefetch off)"]["met"] is False
    assert by_name["density throughput, prefetch on / off"]["value"] == pytest.approx(80 / 60)
    point = {
        "batch": 32,
        "ratio": 0.9,
        "raw": {"rows_per_s": 1e4},
        "served": {"rows_per_s": 9e3, "p99_ms": 30.0},
    }
    headline = served._figures([point])[0]
    assert (headline["target"], headline["met"]) == (">= 0.85", True)
