"""SharedWeightStore across real processes: one fill per node, one copy, last holder cleans up."""

from __future__ import annotations

import hashlib
import json
import os
import queue
import signal
import stat
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from reactantserver.core.dtypes import DType
from reactantserver.core.weights import WeightSpec, region_layout, region_name

SHM = Path("/dev/shm")
LINE_TIMEOUT_S = 60.0

# The child materialises three weights and then obeys commands on stdin, one per line.
# Every reply is one JSON line on stdout. Its fill callback appends the child's pid to the
# marker file first, so the test counts fill calls across processes.
CHILD = r"""
import hashlib, json, os, sys, time
import numpy as np
from reactantserver.core.dtypes import DType
from reactantserver.core.weights import SharedWeightStore, WeightSpec

cfg = json.loads(sys.argv[1])
specs = [WeightSpec(n, DType(t), tuple(s)) for n, t, s in cfg["specs"]]

def fill(arrays):
    with open(cfg["marker"], "a") as marker:
        marker.write(f"{os.getpid()}\n")
    if cfg.get("forbid_fill"):
        raise RuntimeError("fill called in a process that must only attach")
    time.sleep(cfg.get("fill_sleep", 0.0))
    rng = np.random.default_rng(cfg["seed"])
    for array in arrays:
        array[...] = rng.integers(0, 100, array.shape).astype(array.dtype)

def reply(**fields):
    print(json.dumps(fields), flush=True)

def mapped_inode(path):
    for line in open("/proc/self/maps"):
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5].strip() == path:
            return int(parts[4])
    return None

reply(started=os.getpid())
if cfg.get("go_file"):
    while not os.path.exists(cfg["go_file"]):
        time.sleep(0.001)
store = SharedWeightStore(int(cfg["mode"], 8))
handle = store.materialize(cfg["model"], cfg["digest"], specs, fill)

def state():
    data = b"".join(a.tobytes() for a in handle.arrays)
    return dict(
        sha=hashlib.sha256(data).hexdigest(),
        inode=mapped_inode(str(handle.region)),
        readonly=not any(a.flags.writeable for a in handle.arrays),
        region=str(handle.region),
    )

reply(attached=True, **state())
for line in sys.stdin:
    command = line.strip()
    if command == "hash":
        reply(**state())
    elif command == "release":
        store.release(handle)
        reply(released=True)
    elif command == "exit":
        break
"""

SPECS = [
    WeightSpec("embed", DType.F32, (256, 33)),
    WeightSpec("bias", DType.I16, (7,)),
    WeightSpec("table", DType.U8, (5000,)),
]


def expected_sha(seed: int) -> str:
    rng = np.random.default_rng(seed)
    data = b"".join(rng.integers(0, 100, s.shape).astype(s.dtype.numpy).tobytes() for s in SPECS)
    return hashlib.sha256(data).hexdigest()


class Child:
    """One worker-like process; replies are read on a thread so waits can time out."""

    def __init__(self, **cfg: Any) -> None:
        cfg.setdefault("specs", [[s.name, s.dtype.token, list(s.shape)] for s in SPECS])
        cfg.setdefault("mode", "640")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, json.dumps(cfg)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._pump, daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def reply(self, timeout: float = LINE_TIMEOUT_S) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"child {self.proc.pid} sent nothing in {timeout} s") from None
        if line is None:
            self.proc.wait(10)
            assert self.proc.stderr is not None
            raise AssertionError(
                f"child {self.proc.pid} exited ({self.proc.returncode}): {self.proc.stderr.read()}"
            )
        reply: dict[str, Any] = json.loads(line)
        return reply

    def send(self, command: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.reply()

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.close()  # EOF ends the command loop; exit drops the locks
                self.proc.wait(10)
            except (subprocess.TimeoutExpired, BrokenPipeError):
                self.proc.kill()
                self.proc.wait(10)
        self._reader.join(10)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None and not stream.closed:
                stream.close()


@pytest.fixture
def model() -> Iterator[str]:
    """A model name unique to the test; its /dev/shm files are removed afterwards."""
    name = f"tp-{uuid.uuid4().hex[:12]}"
    yield name
    for path in SHM.glob(f"rsw-{name}-*"):
        path.unlink(missing_ok=True)


@pytest.fixture
def spawn() -> Iterator[Any]:
    """Starts children and always reaps them, whatever the test did."""
    children: list[Child] = []

    def start(**cfg: Any) -> Child:
        child = Child(**cfg)
        children.append(child)
        return child

    yield start
    for child in children:
        child.close()


def _fills(marker: Path) -> list[int]:
    return [int(x) for x in marker.read_text().split()] if marker.exists() else []


def _region_files(model: str, digest: int) -> tuple[Path, Path]:
    name = region_name(model, digest)
    return SHM / name, SHM / f"{name}.lock"


def test_two_processes_share_one_copy(model: str, tmp_path: Path, spawn: Any) -> None:
    digest = 0xFEEDFACECAFEBEEF
    marker = tmp_path / "fills"
    obj, lock = _region_files(model, digest)
    common = {"model": model, "digest": digest, "marker": str(marker), "seed": 11}

    first = spawn(**common)
    assert "started" in first.reply()
    one = first.reply()
    assert one["attached"]
    assert _fills(marker) == [first.proc.pid]

    # The second process must attach: its fill raises, so a fill call would kill it.
    second = spawn(forbid_fill=True, **common)
    assert "started" in second.reply()
    two = second.reply()
    assert two["attached"]
    assert _fills(marker) == [first.proc.pid]

    assert one["sha"] == two["sha"] == expected_sha(11)
    assert one["readonly"]
    assert two["readonly"]
    assert one["region"] == two["region"] == str(obj)
    assert one["inode"] == two["inode"] == obj.stat().st_ino
    assert obj.stat().st_size == region_layout(SPECS)[1]
    assert stat.S_IMODE(obj.stat().st_mode) == 0o640
    assert stat.S_IMODE(lock.stat().st_mode) == 0o640

    assert first.send("release") == {"released": True}
    assert obj.exists()
    assert lock.exists()
    assert second.send("hash")["sha"] == expected_sha(11)

    assert second.send("release") == {"released": True}
    assert not obj.exists()
    assert not lock.exists()


def test_concurrent_creators_fill_exactly_once(model: str, tmp_path: Path, spawn: Any) -> None:
    digest = 0x1234
    marker = tmp_path / "fills"
    go = tmp_path / "go"
    children = [
        spawn(
            model=model,
            digest=digest,
            marker=str(marker),
            seed=5,
            go_file=str(go),
            fill_sleep=0.3,
        )
        for _ in range(6)
    ]
    for child in children:
        assert "started" in child.reply()
    go.touch()  # release them all at once
    states = [child.reply() for child in children]

    fills = _fills(marker)
    assert len(fills) == 1
    assert fills[0] in {c.proc.pid for c in children}
    assert {s["sha"] for s in states} == {expected_sha(5)}
    obj, lock = _region_files(model, digest)
    assert {s["inode"] for s in states} == {obj.stat().st_ino}

    for child in children[:-1]:
        assert child.send("release") == {"released": True}
        assert obj.exists()
        assert lock.exists()
    assert children[-1].send("release") == {"released": True}
    assert not obj.exists()
    assert not lock.exists()


def test_region_of_a_killed_holder_is_swept_by_the_next_digest(
    model: str, tmp_path: Path, spawn: Any
) -> None:
    marker = tmp_path / "fills"
    old_obj, old_lock = _region_files(model, 0xA)
    held_obj, held_lock = _region_files(model, 0xB)

    crashed = spawn(model=model, digest=0xA, marker=str(marker), seed=1)
    crashed.reply()
    assert crashed.reply()["attached"]
    holder = spawn(model=model, digest=0xB, marker=str(marker), seed=2)
    holder.reply()
    assert holder.reply()["attached"]
    crashed.kill()  # its LOCK_SH dies with it; the region stays behind, holder-free
    assert old_obj.exists()
    assert old_lock.exists()

    fresh = spawn(model=model, digest=0xC, marker=str(marker), seed=3)
    fresh.reply()
    assert fresh.reply()["sha"] == expected_sha(3)
    assert not old_obj.exists()
    assert not old_lock.exists()
    assert held_obj.exists()
    assert held_lock.exists()

    assert holder.send("release") == {"released": True}
    assert fresh.send("release") == {"released": True}
    assert not list(SHM.glob(f"rsw-{model}-*"))


def test_creator_killed_mid_fill_is_replaced(model: str, tmp_path: Path, spawn: Any) -> None:
    marker = tmp_path / "fills"
    common = {"model": model, "digest": 0x77, "marker": str(marker)}
    stuck = spawn(fill_sleep=60.0, seed=1, **common)
    stuck.reply()
    deadline = time.monotonic() + LINE_TIMEOUT_S
    while not _fills(marker):  # wait until it is inside fill, holding LOCK_EX
        assert time.monotonic() < deadline, "first child never started filling"
        time.sleep(0.01)
    stuck.kill()

    survivor = spawn(seed=4, **common)
    survivor.reply()
    state = survivor.reply()
    assert state["sha"] == expected_sha(4)
    assert _fills(marker) == [stuck.proc.pid, survivor.proc.pid]
    assert survivor.send("release") == {"released": True}
    assert not list(SHM.glob(f"rsw-{model}-*"))


def test_exit_without_release_keeps_a_reusable_region(
    model: str, tmp_path: Path, spawn: Any
) -> None:
    marker = tmp_path / "fills"
    common = {"model": model, "digest": 0x99, "marker": str(marker), "seed": 9}
    gone = spawn(**common)
    gone.reply()
    gone.reply()
    gone.close()  # exits holding the region: the kernel drops its lock, the object stays
    assert os.path.exists(_region_files(model, 0x99)[0])

    later = spawn(forbid_fill=True, **common)
    later.reply()
    assert later.reply()["sha"] == expected_sha(9)
    assert _fills(marker) == [gone.proc.pid]
    assert later.send("release") == {"released": True}
    assert not list(SHM.glob(f"rsw-{model}-*"))
