"""The node end-to-end harness: a real ``reactantserver-node`` supervising real children.

The node runs as ``python -m reactantserver.node --node-file FILE`` with a node file written by
the test: its own free public ports (through ``REACTANTSERVER_GATEWAY_LISTEN_*``, as an operator
would override them), free worker port ranges, a private runtime directory, and the suite's model
repository and executable cache. Its multiplexed log goes to a file the tests read.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import psutil
import yaml

from tests.worker_e2e._bundles import ROOT
from tests.worker_e2e._harness import STARTUP_TIMEOUT_S, free_port, wait_for, wait_server_ready

__all__ = ["NODES", "NodeProcess", "free_range", "running_node"]

STOP_TIMEOUT_S = 60.0
"""SIGTERM to the node, then this long for the whole tree (grace periods included)."""


def free_range(count: int) -> int:
    """A base port such that ``base … base+count-1`` were all free on 127.0.0.1 a moment ago."""
    for _ in range(200):
        base = free_port()
        if base + count > 65535:
            continue
        sockets = []
        try:
            for port in range(base, base + count):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sockets.append(sock)
                sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
        return base
    raise AssertionError("no free port range found")


class NodeProcess:
    """One ``reactantserver-node`` subprocess with its node file, ports and captured log."""

    def __init__(
        self,
        directory: Path,
        settings: Mapping[str, Any],
        *,
        env: Mapping[str, str] | None = None,
        workers: int = 2,
        name: str = "node",
    ) -> None:
        self.directory = directory
        self.grpc_port = free_port()
        self.http_port = free_port()
        while self.http_port == self.grpc_port:
            self.http_port = free_port()
        self.base_port = free_range(workers)
        self.metrics_base_port = free_range(workers)
        self.node_file = directory / f"{name}.yaml"
        self.runtime_dir = directory / f"{name}-run"
        self.runtime_dir.mkdir(mode=0o700, exist_ok=True)
        self.log = directory / f"{name}.log"
        data = {
            "base_port": self.base_port,
            "metrics_base_port": self.metrics_base_port,
            **settings,
        }
        self.node_file.write_text(yaml.safe_dump(data, sort_keys=False))
        self.env = dict(env or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self.pids: set[int] = set()

    @property
    def url(self) -> str:
        """The public gRPC address, as tritonclient wants it."""
        return f"127.0.0.1:{self.grpc_port}"

    def environment(self) -> dict[str, str]:
        """The node's environment: no inherited server variables, the test's ports."""
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("REACTANTSERVER_", "REACTANT_", "INFERENCE_SERVER_"))
        }
        env.update(
            {
                "REACTANTSERVER_GATEWAY_LISTEN_GRPC": self.url,
                "REACTANTSERVER_GATEWAY_LISTEN_METRICS": f"127.0.0.1:{self.http_port}",
                # REST shares the metrics port (one HTTP port, as the tests address it).
                "REACTANTSERVER_GATEWAY_LISTEN_HTTP": f"127.0.0.1:{self.http_port}",
                "XDG_RUNTIME_DIR": str(self.runtime_dir),
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.update(self.env)
        return env

    def command(self, *args: str) -> list[str]:
        """``python -m reactantserver.node [args] --node-file FILE``."""
        return [
            sys.executable,
            "-m",
            "reactantserver.node",
            *args,
            "--node-file",
            str(self.node_file),
        ]

    def start(self) -> None:
        """Spawn the supervisor (returns at once; see :meth:`wait_ready`)."""
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                self.command(),
                cwd=ROOT,
                env=self.environment(),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        NODES.append(self)

    def run(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run another command of the node CLI (``healthcheck``, ``materialize``) to completion."""
        return subprocess.run(
            self.command(*args),
            cwd=ROOT,
            env=self.environment(),
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
        )

    def wait_ready(self, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        """Poll ``ServerReady`` on the public port until true; fail if the node exits."""
        assert self.proc is not None
        wait_server_ready(self.url, self.proc, self.tail, timeout_s, "node")
        self.pids |= {child.pid for child in self.children()}

    def children(self) -> list[psutil.Process]:
        """The supervisor's live descendants."""
        assert self.proc is not None
        with contextlib.suppress(psutil.NoSuchProcess):
            return psutil.Process(self.proc.pid).children(recursive=True)
        return []

    def child(self, module: str, name: str | None = None) -> psutil.Process:
        """The live child running ``python -m <module>`` (the worker called ``name``)."""
        for process in self.children():
            with contextlib.suppress(psutil.NoSuchProcess):
                argv = process.cmdline()
                if module in argv and (name is None or name in argv):
                    return process
        raise AssertionError(f"no {module} {name or ''} child:\n{self.tail()}")

    def stop(self) -> int | None:
        """SIGTERM the supervisor and wait for it; the exit status (``None`` if never started)."""
        if self.proc is None:
            return None
        self.pids |= {child.pid for child in self.children()}
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                for child in self.children():
                    with contextlib.suppress(psutil.NoSuchProcess):
                        child.kill()
                self.proc.kill()
                self.proc.wait(STOP_TIMEOUT_S)
        return self.proc.returncode

    def survivors(self) -> list[int]:
        """Live processes this node ever had, or that read its runtime directory (zombies are gone).

        Children name files under the node's private runtime directory on their command lines,
        so a child the harness never saw (started and orphaned between polls) is found too.
        """
        marker = str(self.runtime_dir)
        alive = set()
        for process in psutil.process_iter(["pid", "cmdline", "status"]):
            cmdline = process.info["cmdline"] or []
            ours = process.info["pid"] in self.pids or any(marker in arg for arg in cmdline)
            if ours and process.info["status"] != psutil.STATUS_ZOMBIE:
                alive.add(process.info["pid"])
        return sorted(alive)

    def text(self) -> str:
        """The node's whole multiplexed log."""
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def tail(self, nchars: int = 12000) -> str:
        """The end of the node's log."""
        return self.text()[-nchars:] or "(no log)"

    def wait_log(self, pattern: str, timeout_s: float = STARTUP_TIMEOUT_S) -> re.Match[str]:
        """Wait until a log line matches ``pattern``; the match."""
        found: list[re.Match[str]] = []

        def seen() -> bool:
            match = re.search(pattern, self.text(), re.MULTILINE)
            if match:
                found.append(match)
            return match is not None

        wait_for(seen, f"log line {pattern!r}", timeout_s)
        return found[0]


NODES: list[NodeProcess] = []
"""Every node started by this test session (their logs are attached to failures)."""


@contextlib.contextmanager
def running_node(
    directory: Path,
    settings: Mapping[str, Any],
    *,
    env: Mapping[str, str] | None = None,
    workers: int = 2,
    name: str = "node",
) -> Iterator[NodeProcess]:
    """A ready node; on exit it gets SIGTERM and must leave nothing running."""
    node = NodeProcess(directory, settings, env=env, workers=workers, name=name)
    node.start()
    try:
        node.wait_ready()
        yield node
    finally:
        node.stop()
    assert not node.survivors(), f"processes left behind: {node.survivors()}\n{node.tail()}"
