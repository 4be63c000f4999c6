"""Triton's ``LogSettings`` over this process's logging: read it, change it at run time.

The settings are Triton's names over Python's root logger: ``log_info``, ``log_warning`` and
``log_error`` (which severities are written), ``log_verbose_level`` (above 0: debug records
too), ``log_format`` (``text``, or ``json`` for one object per line; Triton's ``default`` and
``ISO8601`` read as ``text``, whose timestamps are ISO 8601) and ``log_file`` (always empty:
logs go to stderr, where the node or the container runtime collects them)::

    current = log_settings()                       # {"log_info": True, ...}
    apply_log_settings({"log_verbose_level": 1})   # debug records from now on
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from reactantserver.core.errors import InvalidArgumentError
from reactantserver.core.logs import JsonFormatter, TextFormatter
from reactantserver.core.protocol import grpc_service_pb2 as pb

__all__ = ["LOG_FORMATS", "answer_log_settings", "apply_log_settings", "log_settings"]

SettingValue = bool | int | str

#: ``log_format`` values accepted, and the formatter each selects.
LOG_FORMATS: Mapping[str, type[logging.Formatter]] = {
    "text": TextFormatter,
    "default": TextFormatter,
    "ISO8601": TextFormatter,
    "json": JsonFormatter,
}
_TYPES: Mapping[str, type] = {
    "log_file": str,
    "log_info": bool,
    "log_warning": bool,
    "log_error": bool,
    "log_verbose_level": int,
    "log_format": str,
}
_OFF = logging.CRITICAL + 1


def _format_of(root: logging.Logger) -> str:
    for handler in root.handlers:
        if isinstance(handler.formatter, JsonFormatter):
            return "json"
    return "text"


def log_settings() -> dict[str, SettingValue]:
    """This process's log settings, in Triton's names."""
    root = logging.getLogger()
    level = root.getEffectiveLevel()
    return {
        "log_file": "",
        "log_info": level <= logging.INFO,
        "log_warning": level <= logging.WARNING,
        "log_error": level <= logging.ERROR,
        "log_verbose_level": 1 if level <= logging.DEBUG else 0,
        "log_format": _format_of(root),
    }


def _checked(settings: Mapping[str, SettingValue]) -> dict[str, SettingValue]:
    problems = []
    for key, value in settings.items():
        wanted = _TYPES.get(key)
        if wanted is None:
            problems.append(f"unknown log setting '{key}' (known: {', '.join(sorted(_TYPES))})")
        elif type(value) is not wanted:
            problems.append(f"log setting '{key}' takes a {wanted.__name__}, got {value!r}")
    if settings.get("log_file"):
        problems.append("log_file is not supported: logs go to stderr")
    log_format = settings.get("log_format")
    if log_format is not None and log_format not in LOG_FORMATS:
        problems.append(f"log_format must be one of {', '.join(LOG_FORMATS)}, got {log_format!r}")
    if problems:
        raise InvalidArgumentError("; ".join(problems))
    return dict(settings)


def apply_log_settings(settings: Mapping[str, SettingValue]) -> dict[str, SettingValue]:
    """Change the settings named in ``settings`` (the rest stay); returns them all, after.

    ``InvalidArgumentError`` names every bad key or value and changes nothing.
    """
    wanted = {**log_settings(), **_checked(settings)}
    if int(wanted["log_verbose_level"]) > 0:
        level = logging.DEBUG
    elif wanted["log_info"]:
        level = logging.INFO
    elif wanted["log_warning"]:
        level = logging.WARNING
    elif wanted["log_error"]:
        level = logging.ERROR
    else:
        level = _OFF
    root = logging.getLogger()
    root.setLevel(level)
    if "log_format" in settings:
        formatter = LOG_FORMATS[str(settings["log_format"])]()
        # Only the handlers configure_logging set up: others (a host application's) keep theirs.
        for handler in root.handlers:
            if isinstance(handler.formatter, TextFormatter | JsonFormatter):
                handler.setFormatter(formatter)
    return log_settings()


def answer_log_settings(request: pb.LogSettingsRequest) -> pb.LogSettingsResponse:
    """The ``LogSettings`` RPC: apply the request's settings (none: read only), answer all."""
    wanted: dict[str, SettingValue] = {}
    for key, value in request.settings.items():
        choice = value.WhichOneof("parameter_choice")
        if choice is None:
            raise InvalidArgumentError(f"log setting '{key}' has no value")
        wanted[key] = getattr(value, choice)
    current = apply_log_settings(wanted) if wanted else log_settings()
    response = pb.LogSettingsResponse()
    for key, setting in current.items():
        entry = response.settings[key]
        if isinstance(setting, bool):
            entry.bool_param = setting
        elif isinstance(setting, int):
            entry.uint32_param = setting
        else:
            entry.string_param = setting
    return response
