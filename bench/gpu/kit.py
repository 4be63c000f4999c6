"""The GPU kit's driver: every step in a process group of its own, stopped at its budget.

``bench/gpu/run.sh`` sets the path up and runs ``python -m bench.gpu.kit``. Steps, in order:
``tests`` (the ``gpu``-marked pytest tests), ``transfers``, ``startup``, ``served``,
``density`` (each ``python -m bench.gpu.<name>``). Each gets its budget from the mode
(``bench/gpu/_modes.py``), cut to what is left of the kit's own; a step that overruns gets
SIGTERM (its servers stop, its partial report stays), then SIGKILL. No step starts once the
kit's budget is spent. After every step the kit rewrites ``<out>/gpu-kit.json`` (every
step's report), ``<out>/gpu-kit.md`` and keeps ``<out>/kit.log`` (every line of every step);
at the end ``<out>/worker-logs.txt`` gets the tail of every worker's log::

    python -m bench.gpu.kit --mode gpu --out "$OUT" --work /tmp/kit --budget 455
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import IO, Any

from bench._common import machine
from bench.gpu._kit_report import markdown
from bench.gpu._modes import MODES, Mode, bench_env

__all__ = ["STEPS", "main"]

STEPS = ("tests", "transfers", "startup", "served", "density", "scaling")
#: Seconds kept for the kit's own end (reports) and the stop of an overrunning step.
_RESERVE_S = 12.0
#: A step is not started with less than this left.
_MIN_STEP_S = 15.0
#: SIGTERM -> SIGKILL for an overrunning step (its workers shut down gracefully meanwhile).
_KILL_GRACE_S = 12.0
_GPU_TESTS = "packages/worker/tests/runtime/test_backend_gpu.py"
_DISTS = (
    "jax",
    "jaxlib",
    "jax-cuda13-plugin",
    "jax-cuda13-pjrt",
    "grpcio",
    "protobuf",
    "numpy",
    "tritonclient",
)
_SUMMARY = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--mode", choices=sorted(MODES), default="gpu")
    parser.add_argument("--out", type=Path, required=True, help="where the report goes")
    parser.add_argument("--work", type=Path, required=True, help="bundles, caches, step logs")
    parser.add_argument("--budget", type=float, default=455.0, help="seconds for the whole kit")
    parser.add_argument("--only", nargs="+", choices=STEPS, help="run only these steps")
    return parser


def _command(name: str, mode: Mode, work: Path, deadline: float) -> list[str]:
    if name == "tests":
        return [
            sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rs", "-p", "no:cacheprovider",
            "-W", "ignore::DeprecationWarning", "-o", "timeout=120", _GPU_TESTS,
        ]  # fmt: skip
    return [
        sys.executable, "-m", f"bench.gpu.{name}", "--mode", mode.name,
        "--out", str(work / "reports"), "--work", str(work), "--deadline", f"{deadline:.3f}",
    ]  # fmt: skip


def _pump(stream: IO[str], name: str, log: IO[str], tail: deque[str]) -> None:
    for raw in stream:
        line = raw.rstrip("\n")
        tail.append(line)
        text = f"[{name}] {line}"
        log.write(text + "\n")
        log.flush()
        print(text, flush=True)


def _stop(proc: subprocess.Popen[str]) -> None:
    """SIGTERM the step's process group; SIGKILL whatever of it is left after the grace."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(_KILL_GRACE_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # the step, or stragglers of its group (servers)
    proc.wait()


def _tests_report(tail: deque[str], rc: int | None) -> dict[str, Any]:
    line = next((t for t in reversed(tail) if _SUMMARY.search(t)), "")
    counts = {kind.rstrip("s"): int(n) for n, kind in _SUMMARY.findall(line)}
    bad = counts.get("failed", 0) + counts.get("error", 0)
    return {
        "name": "tests",
        "complete": rc == 0,
        "summary": line.strip("= "),
        "counts": counts,
        "skipped_reasons": [t for t in tail if t.startswith("SKIPPED")],
        "figures": [
            {
                "name": "gpu-marked tests passed",
                "value": counts.get("passed", 0),
                "unit": "tests",
                "target": "all pass",
                "met": rc == 0 and bad == 0,
            }
        ],
    }


def _run_step(name: str, mode: Mode, work: Path, budget: float, log: IO[str]) -> dict[str, Any]:
    started = time.time()
    deadline = started + budget
    env = bench_env(mode)
    if name == "tests":
        env["REACTANT_TEST_PLATFORM"] = mode.platform
    tail: deque[str] = deque(maxlen=60)
    proc = subprocess.Popen(
        _command(name, mode, work, deadline - _KILL_GRACE_S / 2),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    assert proc.stdout is not None
    pump = threading.Thread(target=_pump, args=(proc.stdout, name, log, tail), daemon=True)
    pump.start()
    timed_out = False
    try:
        proc.wait(budget)
    except subprocess.TimeoutExpired:
        timed_out = True
        _stop(proc)
    pump.join(5.0)
    proc.stdout.close()
    rc = proc.returncode
    path = work / "reports" / f"{name}.json"
    if name == "tests":
        report: dict[str, Any] | None = _tests_report(tail, rc)
    else:
        report = json.loads(path.read_text()) if path.exists() else None
    complete = bool(report and report.get("complete"))
    status = "ok" if rc == 0 and complete else "timeout" if timed_out else "failed"
    return {
        "name": name,
        "status": status,
        "exit": rc,
        "budget_s": round(budget, 1),
        "wall_s": round(time.time() - started, 1),
        "report": report,
        "log_tail": None if status == "ok" else list(tail)[-40:],
    }


def _write(out: Path, kit: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, text in (
        ("gpu-kit.json", json.dumps(kit, indent=2, default=str) + "\n"),
        ("gpu-kit.md", "\n".join(markdown(kit)) + "\n"),
    ):
        tmp = out / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, out / name)


def _collect_worker_logs(work: Path, target: Path, since: float, lines: int = 300) -> None:
    """The last ``lines`` lines of every worker's log written since ``since``, in one file."""
    parts = []
    for log in sorted(work.glob("*/worker.log")):
        if log.stat().st_mtime < since:
            continue  # a previous run's, in a work directory kept while the machine is warm
        text = log.read_text(errors="replace").splitlines()[-lines:]
        parts += [f"==== {log.parent.name}/worker.log (last {len(text)} lines)", *text, ""]
    target.write_text("\n".join(parts) + "\n")


def _nvidia_smi() -> list[str]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    query = "--query-gpu=name,driver_version,memory.total,pci.bus_id,pcie.link.gen.max"
    try:
        done = subprocess.run(
            [smi, query, "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in done.stdout.splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    """Run the steps; write the report after each; exit 0 only if every step was ``ok``."""
    args = _parser().parse_args(argv)
    mode = MODES[args.mode]
    started = time.time()
    deadline = started + args.budget
    args.work.mkdir(parents=True, exist_ok=True)
    kit: dict[str, Any] = {
        "kit": "bench/gpu",
        "mode": mode.name,
        "command": " ".join(
            ["python -m bench.gpu.kit", *(argv if argv is not None else sys.argv[1:])]
        ),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(started)),
        "budget_s": args.budget,
        "machine": machine(*_DISTS),
        "nvidia_smi": _nvidia_smi(),
        "steps": [],
    }
    _write(args.out, kit)
    with (args.out / "kit.log").open("a") as log:
        for name in args.only or STEPS:
            left = deadline - time.time() - _RESERVE_S
            if left < _MIN_STEP_S:
                kit["steps"].append({"name": name, "status": "not-started", "budget_s": 0})
                continue
            budget = min(mode.budgets_s[name], left)
            print(f"== {name} (budget {budget:.0f} s)", flush=True)
            kit["steps"].append(_run_step(name, mode, args.work, budget, log))
            kit["wall_s"] = round(time.time() - started, 1)
            _write(args.out, kit)
    kit["wall_s"] = round(time.time() - started, 1)
    _write(args.out, kit)
    _collect_worker_logs(args.work, args.out / "worker-logs.txt", started)
    print("\n".join(markdown(kit)), flush=True)
    return 0 if all(step["status"] == "ok" for step in kit["steps"]) else 1


if __name__ == "__main__":
    sys.exit(main())
