"""One run of one child process: start, log pumps, exit, stop.

A :class:`Child` is single-use: the supervisor makes a new one for every (re)start. The child
leads its own process group, so stopping it (or its exit) also kills whatever it spawned.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
import urllib.parse
from typing import Final

from reactantserver.node._logmux import LogMux
from reactantserver.node._spec import ChildSpec

__all__ = ["DRAIN_SECONDS", "Child", "describe_exit", "http_status"]

#: How long the log pumps may take to reach EOF once the child's process group is gone (a
#: process that left the group may still hold the pipes; its output is then dropped).
DRAIN_SECONDS: Final = 5.0

# asyncio's Process.wait() returns only once the pipes are closed too (a grandchild that
# inherited them keeps it waiting); the returncode is set as soon as the child is reaped.
_EXIT_POLL_SECONDS: Final = 0.05


def describe_exit(returncode: int) -> str:
    """``exited with code N`` or ``killed by SIGKILL`` (a negative returncode is a signal)."""
    if returncode >= 0:
        return f"exited with code {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return f"killed by {name}"


class Child:
    """A child process started from a :class:`ChildSpec`, its output pumped into a LogMux."""

    def __init__(self, spec: ChildSpec, mux: LogMux) -> None:
        self.spec = spec
        self._mux = mux
        self._proc: asyncio.subprocess.Process | None = None
        self._started_at: float | None = None
        self._exited = asyncio.Event()
        self._done: asyncio.Task[int] | None = None

    @property
    def name(self) -> str:
        """The child's name (its log prefix)."""
        return self.spec.name

    @property
    def pid(self) -> int:
        """The child's process id (and process group id)."""
        return self._started().pid

    @property
    def started_at(self) -> float:
        """``time.monotonic()`` when the child was started."""
        self._started()
        assert self._started_at is not None
        return self._started_at

    @property
    def returncode(self) -> int | None:
        """The exit status once the child has exited (negative: killed by that signal)."""
        return None if self._proc is None else self._proc.returncode

    async def start(self) -> None:
        """Spawn the process in a new session and start pumping its stdout and stderr.

        Raises ``OSError`` when the executable cannot be started.
        """
        if self._proc is not None:
            raise RuntimeError(f"child {self.name} was already started")
        proc = await asyncio.create_subprocess_exec(
            *self.spec.argv,
            env=dict(self.spec.env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self._proc = proc
        self._started_at = time.monotonic()
        assert proc.stdout is not None
        assert proc.stderr is not None
        pumps = (
            asyncio.create_task(self._mux.pump(self.name, proc.stdout)),
            asyncio.create_task(self._mux.pump(self.name, proc.stderr)),
        )
        self._done = asyncio.create_task(self._watch(proc, pumps))

    async def wait(self) -> int:
        """Wait for the exit and the log pumps to drain; return the returncode."""
        if self._done is None:
            raise RuntimeError(f"child {self.name} was not started")
        return await asyncio.shield(self._done)

    async def stop(self, grace: float | None = None) -> int:
        """SIGTERM the child, SIGKILL its process group after ``grace`` seconds, wait for it.

        ``grace`` defaults to the configured ``grace_seconds``. Returns the returncode.
        """
        proc = self._started()
        if grace is None:
            grace = self.spec.grace_seconds
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(grace):
                    await self._exited.wait()
            except TimeoutError:
                self._mux.supervisor(f"sending SIGKILL to {self.name}")
                self._kill_group()
        return await self.wait()

    def _started(self) -> asyncio.subprocess.Process:
        if self._proc is None:
            raise RuntimeError(f"child {self.name} was not started")
        return self._proc

    def _kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)

    async def _watch(
        self, proc: asyncio.subprocess.Process, pumps: tuple[asyncio.Task[None], ...]
    ) -> int:
        waiter = asyncio.ensure_future(proc.wait())
        try:
            while proc.returncode is None and not waiter.done():
                await asyncio.wait({waiter}, timeout=_EXIT_POLL_SECONDS)
            self._exited.set()
            # Whatever the child left behind in its group goes with it.
            self._kill_group()
            drained, _ = await asyncio.wait({waiter, *pumps}, timeout=DRAIN_SECONDS)
            if len(drained) < len(pumps) + 1:
                self._mux.supervisor(
                    f"output of {self.name} still open after it exited; no longer reading it"
                )
        finally:
            for task in (waiter, *pumps):
                task.cancel()
            await asyncio.gather(waiter, *pumps, return_exceptions=True)
        assert proc.returncode is not None
        return proc.returncode


async def http_status(url: str, timeout: float) -> int | None:
    """``GET url`` over HTTP/1.0; the response's status code, or ``None`` without an answer.

    Small on purpose: the supervisor's liveness probe needs only the status line.
    """
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname
    if parts.scheme != "http" or host is None:
        raise ValueError(f"not an http URL: {url!r}")
    port = parts.port or 80
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(host, port)
            request = f"GET {target} HTTP/1.0\r\nHost: {parts.netloc}\r\nConnection: close\r\n\r\n"
            writer.write(request.encode("ascii"))
            await writer.drain()
            status_line = await reader.readline()
        version, code, *_ = status_line.split(None, 2)
        if not version.startswith(b"HTTP/"):
            return None
        return int(code)
    except (OSError, TimeoutError, ValueError):
        return None
    finally:
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
