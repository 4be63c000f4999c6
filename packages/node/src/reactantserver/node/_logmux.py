"""One output stream for every child's logs (09 §Log multiplexing).

Each line of each child's stdout and stderr becomes ``[<name>] <line>`` on the supervisor's
stdout; the supervisor's own lines are ``[supervisor] ...``. A line is one ``write`` plus a
``flush`` under a lock, so lines never interleave. Bytes pass through undecoded.
"""

from __future__ import annotations

import asyncio
import threading
from typing import BinaryIO, Final

__all__ = ["MAX_LINE_BYTES", "SUPERVISOR_NAME", "LogMux"]

#: The prefix name of the supervisor's own lines.
SUPERVISOR_NAME: Final = "supervisor"

#: A longer line (no newline within this many bytes) is emitted in pieces of about this size,
#: so one runaway child cannot make the supervisor buffer without bound.
MAX_LINE_BYTES: Final = 1 << 20


class LogMux:
    """Writes prefixed lines to ``out`` (the supervisor's stdout, as bytes).

    Usage: ``mux = LogMux(sys.stdout.buffer); mux.supervisor("starting")``.
    """

    def __init__(self, out: BinaryIO) -> None:
        self._out = out
        self._lock = threading.Lock()

    def write_line(self, name: str, line: bytes) -> None:
        """Write ``[<name>] <line>`` (one trailing newline at most is replaced) in one write."""
        line = line.removesuffix(b"\n").removesuffix(b"\r")
        data = b"[" + name.encode("utf-8", "backslashreplace") + b"] " + line + b"\n"
        with self._lock:
            try:
                self._out.write(data)
                self._out.flush()
            except (OSError, ValueError):
                # A closed or broken stdout must not take the children down with it.
                pass

    def supervisor(self, message: str) -> None:
        """Write one of the supervisor's own lines, ``[supervisor] <message>``."""
        self.write_line(SUPERVISOR_NAME, message.encode("utf-8", "backslashreplace"))

    async def pump(self, name: str, stream: asyncio.StreamReader) -> None:
        """Copy every line of ``stream`` as ``[<name>] <line>`` until EOF.

        A final line without a newline is emitted at EOF. A line longer than the stream's
        buffer limit is read in chunks (pieces of about :data:`MAX_LINE_BYTES` are emitted).
        """
        pending = bytearray()
        while True:
            try:
                chunk = await stream.readuntil(b"\n")
            except asyncio.IncompleteReadError as exc:
                pending += exc.partial
                break
            except asyncio.LimitOverrunError as exc:
                # The bytes stay buffered: take them and keep looking for the newline.
                pending += await stream.read(max(exc.consumed, 1))
                if len(pending) >= MAX_LINE_BYTES:
                    self.write_line(name, bytes(pending))
                    pending.clear()
                continue
            except ConnectionError:
                break
            pending += chunk
            self.write_line(name, bytes(pending))
            pending.clear()
        if pending:
            self.write_line(name, bytes(pending))
