"""Process logging from ``logging.level`` and ``logging.format``, any process.

``text``: ``<ISO time> <LEVEL> <logger> <message>``; ``json``: one object per line with
``ts`` (UTC RFC 3339), ``level``, ``logger`` and ``msg``, plus ``exc`` when there is one and
``model`` / ``request_id`` when the record is about a request (``extra=`` of the call, see
:data:`RECORD_FIELDS`).
Loading the configuration logs (overrides, risky settings) before the format is known, so a
process holds those records and replays them once logging is configured::

    with hold_records() as held:
        config = load_worker_config(...)
    configure_logging(config.logging, held.records)
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import json
import logging
import os
import signal
import sys
from collections.abc import Iterator, Mapping, Sequence

from reactantserver.core.config import SUPERVISOR_PID_VARIABLE, LogFormat, LoggingConfig, lookup

__all__ = [
    "RECORD_FIELDS",
    "SUPERVISOR_PID_VARIABLE",
    "HeldRecords",
    "JsonFormatter",
    "TextFormatter",
    "configure_logging",
    "die_with_parent",
    "hold_records",
    "print_held",
]

_PR_SET_PDEATHSIG = 1

_log = logging.getLogger("reactantserver")


def _timestamp(record: logging.LogRecord) -> str:
    moment = datetime.datetime.fromtimestamp(record.created, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class TextFormatter(logging.Formatter):
    """``<ISO time> <LEVEL> <logger> <message>`` (tracebacks on the following lines)."""

    def format(self, record: logging.LogRecord) -> str:
        """One line per record, plus the traceback if any."""
        line = f"{_timestamp(record)} {record.levelname} {record.name} {record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


#: Attributes a record may carry (``logger.warning(..., extra={"model": name})``) that the
#: JSON format writes as fields of their own, so log queries can filter on them.
RECORD_FIELDS = ("model", "request_id")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts``, ``level``, ``logger``, ``msg`` (``exc``, ``model``,
    ``request_id`` where the record has them)."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as a single-line JSON object."""
        data = {
            "ts": _timestamp(record),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for field in RECORD_FIELDS:
            value = getattr(record, field, None)
            if value:
                data[field] = str(value)
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        return json.dumps(data)


class HeldRecords(logging.Handler):
    """Keeps every record it is given, for :func:`configure_logging` to replay."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        """Keep ``record``."""
        self.records.append(record)


@contextlib.contextmanager
def hold_records() -> Iterator[HeldRecords]:
    """Inside, records of every level are held instead of printed (logging is not set up yet)."""
    root = logging.getLogger()
    held = HeldRecords()
    level = root.level
    root.addHandler(held)
    root.setLevel(logging.DEBUG)
    try:
        yield held
    finally:
        root.removeHandler(held)
        root.setLevel(level)


def print_held(held: Sequence[logging.LogRecord]) -> None:
    """Held warnings and errors as text on stderr: for a process whose configuration failed,
    which therefore knows no format (the rest of the logging setup is left alone)."""
    formatter = TextFormatter()
    for record in held:
        if record.levelno >= logging.WARNING:
            print(formatter.format(record), file=sys.stderr)


def configure_logging(config: LoggingConfig, held: Sequence[logging.LogRecord] = ()) -> None:
    """Send every record at ``config.level`` or above to stderr in ``config.format``.

    ``held`` records (see :func:`hold_records`) are written first, those at the level or above.
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if config.format is LogFormat.JSON else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(config.level.value.upper())
    for record in held:
        if record.levelno >= root.level:
            handler.handle(record)


def die_with_parent(env: Mapping[str, str] = os.environ) -> None:
    """Death-of-parent: SIGTERM when the supervisor goes away (Linux).

    Only when the supervisor announced itself in ``REACTANTSERVER_SUPERVISOR_PID`` (or its older
    name); exits 1 if it is already gone.
    """
    parent, _name = lookup(env, SUPERVISOR_PID_VARIABLE)
    if not parent or not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if str(os.getppid()) != parent.strip():
        _log.error("supervisor %s is gone; exiting", parent)
        raise SystemExit(1)
