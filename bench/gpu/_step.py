"""What every GPU-kit benchmark shares: its arguments, its deadline and a report kept on disk.

The kit stops a benchmark at its time budget (SIGTERM to its process group, then SIGKILL), so
a benchmark writes its JSON after every section it finishes: whatever was measured before
the stop is in the report. A benchmark runs as ``python -m bench.gpu.<name> --mode M --out
DIR --work DIR --deadline T`` and writes ``DIR/<name>.json``::

    step = Step.from_argv("transfers", argv)
    step.report.put("device", describe_device())
    step.report.add_figures([figure("load / raw", 0.93, "x", target=">= 0.8", met=True)])
    step.report.finish()
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import attrs

from bench.gpu._modes import MODES, Mode, remaining_s

__all__ = ["MODEL", "Step", "StepReport", "ensure_bundle", "stopped_by_signal"]


class StepReport:
    """A benchmark's JSON report, rewritten atomically after every change."""

    def __init__(self, path: Path, name: str, mode: str) -> None:
        self.path = path
        self.data: dict[str, Any] = {
            "name": name,
            "mode": mode,
            "complete": False,
            "sections": {},
            "figures": [],
            "notes": [],
        }
        self.save()

    def put(self, key: str, value: Any) -> None:
        """Record a finished section (and save)."""
        self.data["sections"][key] = value
        self.save()

    def add_figures(self, figures: Sequence[dict[str, Any]]) -> None:
        """Append headline figures (``bench._common.figure`` rows) and save."""
        self.data["figures"].extend(figures)
        self.save()

    def note(self, line: str) -> None:
        """Append a note (a skipped part and why, a shortened window) and save."""
        self.data["notes"].append(line)
        print(f"note: {line}", flush=True)
        self.save()

    def finish(self) -> None:
        """Mark the report complete (every section ran)."""
        self.data["complete"] = True
        self.save()

    def save(self) -> None:
        """Write the JSON next to its final name, then rename (a reader never sees half)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.data, indent=2, default=str) + "\n")
        os.replace(tmp, self.path)


@attrs.define
class Step:
    """A benchmark's run: its mode, work directory, deadline and report."""

    mode: Mode
    work: Path
    deadline: float
    report: StepReport

    @classmethod
    def from_argv(cls, name: str, argv: Sequence[str] | None, doc: str = "") -> Step:
        """Parse ``--mode --out --work --deadline`` and open ``<out>/<name>.json``."""
        parser = argparse.ArgumentParser(description=(doc.splitlines() or [name])[0])
        parser.add_argument("--mode", choices=sorted(MODES), default="cpu-dry-run")
        parser.add_argument("--out", type=Path, required=True)
        parser.add_argument("--work", type=Path, required=True, help="shared kit work dir")
        parser.add_argument(
            "--deadline", type=float, default=0.0, help="time.time() to stop by (0: +budget)"
        )
        args = parser.parse_args(argv)
        mode = MODES[args.mode]
        deadline = args.deadline or time.time() + mode.budgets_s[name]
        args.work.mkdir(parents=True, exist_ok=True)
        signal.signal(signal.SIGTERM, stopped_by_signal)
        return cls(
            mode, args.work, deadline, StepReport(args.out / f"{name}.json", name, mode.name)
        )

    def left(self) -> float:
        """Seconds until the deadline."""
        return remaining_s(self.deadline)


class _Stopped(KeyboardInterrupt):
    """Raised in the main thread on SIGTERM, so ``finally`` blocks stop child servers."""


def stopped_by_signal(signum: int, frame: FrameType | None) -> None:
    """SIGTERM handler: unwind (servers stop, partial reports stay as saved)."""
    raise _Stopped(f"stopped by signal {signum} (time budget spent)")


#: The kit network's model name in every repository the kit builds.
MODEL = "resnet"


def ensure_bundle(step: Step, name: str, batches: Sequence[int]) -> Path:
    """``<work>/repos/<name>/resnet``: the kit's network exported once for ``batches``.

    Its parent is a model repository holding only it. A marker file makes reuse safe across
    steps (a step killed mid-export leaves none).
    """
    from bench.gpu._resnet import export_bundle

    root = step.work / "repos" / name / MODEL
    marker = root.parent / ".done"
    want = ",".join(str(b) for b in batches) + f" {step.mode.arch!r}"
    if marker.exists() and marker.read_text() == want:
        return root
    started = time.perf_counter()
    export_bundle(step.mode.arch, root, batch_sizes=batches, platform=step.mode.platform)
    marker.write_text(want)
    print(f"exported {name} ({want}) in {time.perf_counter() - started:.1f} s", flush=True)
    return root
