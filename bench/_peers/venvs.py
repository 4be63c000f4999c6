"""The peers' virtualenvs: made once under ``build/peers/<peer>/`` with pip, then reused.

``python -m bench.peers --prepare`` makes them (it needs PyPI; a run never downloads). Each
venv gets ``requirements/peers/<peer>.txt`` plus our own jax and jaxlib versions, so every
server runs the same jax; what it installed is recorded in ``bench-peers.json`` with a
fingerprint of those inputs, and a run uses a venv only when the fingerprint still matches::

    state = check(PEERS["kserve"])     # state.python, or state.reason why not
    prepare(PEERS["kserve"])           # minutes, ~1 GB
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench._peers.spec import STUB_VENV

__all__ = ["PEERS", "PEERS_DIR", "REQUIREMENTS", "Peer", "Readiness", "check", "prepare"]

ROOT = Path(__file__).resolve().parent.parent.parent
PEERS_DIR = ROOT / "build" / "peers"
REQUIREMENTS = ROOT / "requirements" / "peers"
_MARKER = "bench-peers.json"
_FAILED = "bench-peers-failed.json"
_PIP_TIMEOUT_S = 1800.0


@dataclasses.dataclass(frozen=True)
class Peer:
    """A peer server: its venv's requirements and the script that serves the MLPs."""

    name: str
    """Also the peer library's import name."""
    dist: str
    """The peer's distribution on PyPI."""
    module: str
    """The server script, run as ``python -m module SPEC`` in the venv."""
    batching: str
    """How it batches, for the report."""
    no_deps: bool = False
    """Also install ``<name>-no-deps.txt`` without dependencies (pins that jax contradicts)."""
    stub_venv: bool = False
    """Also make a venv inside the venv from ``<name>-stub.txt`` (PyTriton's Python stub)."""

    def requirement_files(self) -> list[Path]:
        """The requirement files the venv is made from, in install order."""
        files = [REQUIREMENTS / f"{self.name}.txt"]
        if self.no_deps:
            files.append(REQUIREMENTS / f"{self.name}-no-deps.txt")
        if self.stub_venv:
            files.append(REQUIREMENTS / f"{self.name}-stub.txt")
        return files


PEERS: dict[str, Peer] = {
    p.name: p
    for p in (
        Peer(
            "pytriton",
            "nvidia-pytriton",
            "bench._peers.serve_pytriton",
            "Triton dynamic batcher, max_queue_delay_microseconds=1000, max_batch_size=32",
            no_deps=True,
            stub_venv=True,
        ),
        Peer("kserve", "kserve", "bench._peers.serve_kserve", "none (KServe has no batcher)"),
        Peer(
            "mlserver",
            "mlserver",
            "bench._peers.serve_mlserver",
            "adaptive batching, max_batch_time=0.001 s, max_batch_size=32",
        ),
    )
}


@dataclasses.dataclass(frozen=True)
class Readiness:
    """Whether a peer's venv can serve: its Python, or the reason it cannot."""

    peer: str
    python: Path | None
    reason: str | None = None
    installed: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The venv's record: versions, prepare time, disk use."""


def _jax_version() -> str:
    return importlib.metadata.version("jax")


def fingerprint(peer: Peer) -> str:
    """What the venv is made from: its requirements (comments aside), our jax and Python."""
    digest = hashlib.sha256()
    for path in peer.requirement_files():
        for line in path.read_text().splitlines():
            requirement = line.split("#", 1)[0].strip()
            if requirement:
                digest.update(f"{requirement}\n".encode())
    digest.update(f"jax=={_jax_version()} python=={platform.python_version()}".encode())
    return digest.hexdigest()[:16]


def _venv(peer: Peer, root: Path) -> Path:
    return root / peer.name


def check(peer: Peer, root: Path = PEERS_DIR) -> Readiness:
    """The peer's venv if it was prepared from today's pins, else why not."""
    venv = _venv(peer, root)
    how = f"run `python -m bench.peers --prepare --peers {peer.name}` (needs PyPI)"
    marker, failed = venv / _MARKER, venv / _FAILED
    if not marker.exists():
        if failed.exists():
            error = json.loads(failed.read_text()).get("error", "?")
            return Readiness(peer.name, None, f"its venv failed to prepare: {error}")
        return Readiness(peer.name, None, f"no prepared venv at {venv}: {how}")
    installed = json.loads(marker.read_text())
    if installed.get("fingerprint") != fingerprint(peer):
        return Readiness(peer.name, None, f"{venv} was prepared from other pins: {how}")
    return Readiness(peer.name, venv / "bin" / "python", None, installed)


def _pip(python: Path, args: list[str], log: Path) -> None:
    command = [str(python), "-m", "pip", "install", "--disable-pip-version-check", *args]
    with log.open("a") as sink:
        sink.write(f"$ {' '.join(command)}\n")
        sink.flush()
        done = subprocess.run(
            command, stdout=sink, stderr=subprocess.STDOUT, timeout=_PIP_TIMEOUT_S, check=False
        )
    if done.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        raise RuntimeError(f"pip exited {done.returncode}: " + " | ".join(tail))


def _new_venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(path)], check=True)
    return path / "bin" / "python"


def _disk_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _versions(python: Path, peer: Peer) -> dict[str, str]:
    names = [peer.dist, "jax", "jaxlib", "numpy", "grpcio", "protobuf"]
    code = (
        "import importlib.metadata as m, json, sys\n"
        "print(json.dumps({d: m.version(d) for d in sys.argv[1:]}))"
    )
    done = subprocess.run(
        [str(python), "-c", code, *names], capture_output=True, text=True, check=True
    )
    versions: dict[str, str] = json.loads(done.stdout)
    return versions


def prepare(peer: Peer, root: Path = PEERS_DIR) -> Readiness:
    """Make the peer's venv afresh (pip, network), record what it holds; never raises for a
    failed install: the failure is recorded and returned as the reason."""
    venv = _venv(peer, root)
    if venv.exists():
        shutil.rmtree(venv)
    venv.mkdir(parents=True)
    log = venv.parent / f"{peer.name}-prepare.log"
    log.write_text("")
    start = time.perf_counter()
    files = peer.requirement_files()
    jax = _jax_version()
    try:
        python = _new_venv(venv)
        _pip(python, ["-r", str(files[0]), f"jax=={jax}", f"jaxlib=={jax}"], log)
        if peer.no_deps:
            _pip(python, ["--no-deps", "-r", str(REQUIREMENTS / f"{peer.name}-no-deps.txt")], log)
        if peer.stub_venv:
            stub = _new_venv(venv / STUB_VENV)
            _pip(stub, ["-r", str(REQUIREMENTS / f"{peer.name}-stub.txt")], log)
        subprocess.run(
            [str(python), "-c", f"import jax, {peer.name}"],
            check=True,
            capture_output=True,
        )
        versions = _versions(python, peer)
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        error = f"{type(exc).__name__}: {exc}"
        (venv / _FAILED).write_text(json.dumps({"error": error, "log": str(log)}))
        return Readiness(peer.name, None, f"its venv failed to prepare: {error}")
    installed = {
        "fingerprint": fingerprint(peer),
        "versions": versions,
        "prepare_s": round(time.perf_counter() - start, 1),
        "disk_bytes": _disk_bytes(venv),
        "python": platform.python_version(),
    }
    (venv / _MARKER).write_text(json.dumps(installed, indent=2) + "\n")
    return Readiness(peer.name, python, None, installed)
