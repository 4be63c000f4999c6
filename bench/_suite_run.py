"""Running one benchmark of ``bench.suite``: a subprocess with a time budget, its report read back.

Each benchmark runs as ``python -m bench.<name> --suite --out DIR`` (``--quick`` for a smoke
run) in its own session, so that a benchmark over its budget is stopped together with the
servers it started. Its output goes to ``DIR.log``; its JSON report (``DIR/*.json``) comes back
in the :class:`Outcome`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import attrs

__all__ = ["STATUSES", "Benchmark", "Outcome", "run_benchmark", "skipped"]

ROOT = Path(__file__).resolve().parent.parent
#: ok: exited 0 with a report; failed: non-zero exit or no report; timeout: stopped at its
#: budget; missing: no such module; skipped: the suite's budget was spent before its turn.
STATUSES = ("ok", "failed", "timeout", "missing", "skipped")
_STOP_GRACE_S = 15.0
_LOG_TAIL_LINES = 40


@attrs.frozen
class Benchmark:
    """A benchmark the suite runs: ``bench.<name>`` and its time budget in seconds."""

    name: str
    budget_s: float
    measures: str


@attrs.define
class Outcome:
    """How one benchmark's run went, and its report."""

    name: str
    status: str
    budget_s: float
    wall_s: float = 0.0
    returncode: int | None = None
    report: dict[str, Any] | None = None
    log_tail: str = ""
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        """The outcome as a JSON-ready dict (the report under ``report``)."""
        return attrs.asdict(self)


def skipped(bench: Benchmark, note: str) -> Outcome:
    """The outcome of a benchmark that did not run."""
    return Outcome(bench.name, "skipped", bench.budget_s, note=note)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the benchmark's whole session (its servers too), SIGKILL it after a grace."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(_STOP_GRACE_S)
            return
        except subprocess.TimeoutExpired:
            continue


def _tail(log: Path) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-_LOG_TAIL_LINES:])
    except OSError:
        return ""


def _read_report(out: Path) -> dict[str, Any] | None:
    reports = sorted(out.glob("*.json"))
    if not reports:
        return None
    loaded: dict[str, Any] = json.loads(reports[0].read_text())
    loaded.setdefault("result_name", reports[0].stem)
    return loaded


def run_benchmark(bench: Benchmark, work: Path, *, quick: bool, limit_s: float) -> Outcome:
    """Run ``bench`` for at most ``limit_s`` seconds with its output under ``work``."""
    if importlib.util.find_spec(f"bench.{bench.name}") is None:
        return Outcome(bench.name, "missing", bench.budget_s, note=f"no module bench.{bench.name}")
    out, log = work / bench.name, work / f"{bench.name}.log"
    argv = [sys.executable, "-m", f"bench.{bench.name}", "--quick" if quick else "--suite"]
    argv += ["--out", str(out)]
    print(f"== {bench.name}: {' '.join(argv[1:])} (at most {limit_s:.0f} s)", flush=True)
    start = time.perf_counter()
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            argv, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            returncode: int | None = proc.wait(limit_s)
        except subprocess.TimeoutExpired:
            returncode = None
            _stop(proc)
        finally:
            if proc.poll() is None:
                _stop(proc)
    wall = time.perf_counter() - start
    outcome = Outcome(bench.name, "ok", bench.budget_s, wall, returncode, _read_report(out))
    if returncode is None:
        outcome.status, outcome.note = "timeout", f"stopped after {limit_s:.0f} s"
    elif returncode != 0:
        outcome.status, outcome.note = "failed", f"exit status {returncode}"
    elif outcome.report is None:
        outcome.status, outcome.note = "failed", "no JSON report written"
    if outcome.status != "ok":
        outcome.log_tail = _tail(log)
    print(f"== {bench.name}: {outcome.status} in {wall:.0f} s {outcome.note}", flush=True)
    return outcome
