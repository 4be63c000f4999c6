"""One output stream for every child's logs.

Text logs: each line of each child's stdout and stderr becomes ``[<name>] <line>`` on the
supervisor's stdout, bytes passed through undecoded; the supervisor's own lines are
``[supervisor] ...``. JSON logs (``logging.format: json``): every line stays one JSON object,
so log shippers (Loki, Fluent Bit, Vector) parse the node's stdout as JSON lines: a child's
JSON record gets ``"process": "<name>"`` added; anything else a child prints (a traceback, a
stray ``print``) and the supervisor's own lines are wrapped as records with ``ts``, ``level``,
``logger``, ``msg`` and ``process``. A line is one ``write`` plus a ``flush`` under a lock, so
lines never interleave.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import threading
from typing import BinaryIO, Final

__all__ = ["MAX_LINE_BYTES", "NODE_LOGGER", "SUPERVISOR_NAME", "LogMux", "json_line"]

#: The prefix name of the supervisor's own lines.
SUPERVISOR_NAME: Final = "supervisor"

#: A longer line (no newline within this many bytes) is emitted in pieces of about this size,
#: so one runaway child cannot make the supervisor buffer without bound.
MAX_LINE_BYTES: Final = 1 << 20


#: The ``logger`` of records the node writes for lines that were not JSON records.
NODE_LOGGER: Final = "reactantserver.node"


def _now() -> str:
    moment = datetime.datetime.now(tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def json_line(name: str, line: bytes) -> bytes:
    """``line`` of process ``name`` as one JSON object (``process`` set, the rest kept)."""
    try:
        record = json.loads(line)
    except ValueError:
        record = None
    if not isinstance(record, dict):
        text = line.decode("utf-8", "backslashreplace")
        record = {"ts": _now(), "level": "INFO", "logger": NODE_LOGGER, "msg": text}
    record.setdefault("process", name)
    return json.dumps(record, ensure_ascii=False).encode("utf-8", "backslashreplace")


class LogMux:
    """Writes the children's lines and the supervisor's own to ``out`` (stdout, as bytes).

    ``json_lines``: keep every line a JSON object (see the module); else prefix it.
    Usage: ``mux = LogMux(sys.stdout.buffer); mux.supervisor("starting")``.
    """

    def __init__(self, out: BinaryIO, *, json_lines: bool = False) -> None:
        self._out = out
        self._json = json_lines
        self._lock = threading.Lock()

    def write_line(self, name: str, line: bytes) -> None:
        """Write ``[<name>] <line>`` or its JSON form (one trailing newline at most is
        replaced) in one write."""
        line = line.removesuffix(b"\n").removesuffix(b"\r")
        if self._json:
            data = json_line(name, line) + b"\n"
        else:
            data = b"[" + name.encode("utf-8", "backslashreplace") + b"] " + line + b"\n"
        with self._lock:
            try:
                self._out.write(data)
                self._out.flush()
            except (OSError, ValueError):
                # A closed or broken stdout must not take the children down with it.
                pass

    def supervisor(self, message: str) -> None:
        """Write one of the supervisor's own lines, ``[supervisor] <message>`` (or a record)."""
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
