"""A peer server subprocess: started in its venv, pinned, its CPU read over its process tree.

Peers run children (``tritonserver`` and Triton's Python stubs under PyTriton, MLServer's
inference worker), so pinning, CPU time and stopping cover every process under the one
started, not just that one::

    server = start_peer(venv, "pytriton", spec_file, log, cpus=frozenset({1}))
    server.wait_ready(["tiny_mlp"], 300)
    server.cpu_seconds()          # {"python": 1.2, "tritonserver": 0.8, ...}
    server.stop()
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import psutil

from bench._grpc_servers import ROOT, Server

__all__ = ["PeerServer", "pin_threads", "start_peer"]

_STOP_WAIT_S = 15.0


def pin_threads(pid: int, cpus: frozenset[int]) -> None:
    """Restrict every thread of process ``pid`` to ``cpus`` (gone threads are skipped)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return
    for tid in tids:
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:
            continue


class PeerServer(Server):
    """A peer's server process and its descendants."""

    def _tree(self) -> list[psutil.Process]:
        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.Error:
            return []

    def pin(self) -> None:
        """Restrict every thread of every process in the tree to ``cpus``."""
        if self.cpus is None:
            return
        for process in self._tree():
            pin_threads(process.pid, self.cpus)

    def cpu_seconds(self) -> dict[str, float] | None:
        """User + system CPU seconds of the tree so far, by process name."""
        tree = self._tree()
        if not tree:
            return None
        seconds: dict[str, float] = {}
        for process in tree:
            try:
                name, times = process.name(), process.cpu_times()
            except psutil.Error:
                continue  # exited since the listing
            seconds[name] = seconds.get(name, 0.0) + times.user + times.system
        return seconds

    def stop(self) -> int | None:
        """SIGTERM the server, then kill whatever of its tree outlives a grace."""
        descendants = self._tree()[1:]
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(_STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        _, alive = psutil.wait_procs(descendants, _STOP_WAIT_S)
        for process in alive:
            try:
                process.kill()
            except psutil.Error:
                continue
        return self.proc.returncode


def start_peer(
    python: Path, module: str, spec_file: Path, log: Path, *, cpus: frozenset[int] | None
) -> PeerServer:
    """Start ``python -m module spec_file`` from the repository root (on ``PYTHONPATH``, so
    MLServer's worker processes import our runtime) with the gRPC port of the spec."""
    import json

    port = int(json.loads(spec_file.read_text())["grpc_port"])
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    env.pop("VIRTUAL_ENV", None)
    argv = [str(python), "-m", module, str(spec_file)]
    return PeerServer(module.rsplit(".", 1)[-1], argv, env, port, log, cpus=cpus)
