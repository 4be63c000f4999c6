"""Process logging from ``logging.level`` and ``logging.format`` (12 §Logs).

``text``: ``<ISO time> <LEVEL> <logger> <message>``; ``json``: one object per line with
``ts`` (UTC RFC 3339), ``level``, ``logger`` and ``msg`` (plus ``exc`` when there is one)::

    configure_logging(config.logging)
"""

from __future__ import annotations

import datetime
import json
import logging
import sys

from reactantserver.core.config import LogFormat, LoggingConfig

__all__ = ["JsonFormatter", "TextFormatter", "configure_logging"]


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
