"""Process logging from ``logging.level`` and ``logging.format`` (12 §Logs), any process.

``text``: ``<ISO time> <LEVEL> <logger> <message>``; ``json``: one object per line with
``ts`` (UTC RFC 3339), ``level``, ``logger`` and ``msg`` (plus ``exc`` when there is one)::

    configure_logging(config.logging)
"""

from __future__ import annotations

import ctypes
import datetime
import json
import logging
import os
import signal
import sys
from collections.abc import Mapping

from reactantserver.core.config import LogFormat, LoggingConfig

__all__ = [
    "SUPERVISOR_PID_VARIABLE",
    "JsonFormatter",
    "TextFormatter",
    "configure_logging",
    "die_with_parent",
]

#: Set by the node supervisor on its children: its PID, so a child can follow it out.
SUPERVISOR_PID_VARIABLE = "REACTANT_SUPERVISOR_PID"
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


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts``, ``level``, ``logger``, ``msg`` (and ``exc``)."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as a single-line JSON object."""
        data = {
            "ts": _timestamp(record),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        return json.dumps(data)


def configure_logging(config: LoggingConfig) -> None:
    """Send every record at ``config.level`` or above to stderr in ``config.format``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if config.format is LogFormat.JSON else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(config.level.value.upper())


def die_with_parent(env: Mapping[str, str] = os.environ) -> None:
    """Death-of-parent (03 step 3): SIGTERM when the supervisor goes away (Linux).

    Only when the supervisor announced itself in ``REACTANT_SUPERVISOR_PID``; exits 1 if it
    is already gone.
    """
    parent = env.get(SUPERVISOR_PID_VARIABLE)
    if not parent or not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if str(os.getppid()) != parent.strip():
        _log.error("supervisor %s is gone; exiting", parent)
        raise SystemExit(1)
