"""Log lines in both formats (text and JSON)."""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Iterator

import pytest

from reactantserver.core.config import LogFormat, LoggingConfig, LogLevel
from reactantserver.core.logs import JsonFormatter, TextFormatter, configure_logging, hold_records


def _record(message: str = "model loaded model=%s", *args: object) -> logging.LogRecord:
    return logging.LogRecord(
        "reactantserver.worker", logging.INFO, __file__, 1, message, args, None
    )


def test_text_lines_start_with_an_iso_time_level_and_logger() -> None:
    line = TextFormatter().format(_record("model loaded model=%s", "mlp"))
    stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"
    assert re.fullmatch(stamp + r" INFO reactantserver\.worker model loaded model=mlp", line)


def test_json_lines_are_one_object_with_the_named_fields() -> None:
    data = json.loads(JsonFormatter().format(_record("x=%d", 3)))
    assert set(data) == {"ts", "level", "logger", "msg"}
    assert data["msg"] == "x=3"
    assert data["level"] == "INFO"
    assert data["ts"].endswith("Z")


def test_json_lines_carry_the_model_and_request_id_a_record_names() -> None:
    logger = logging.getLogger("reactantserver.test.fields")
    lines: list[str] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(JsonFormatter().format(record))

    handler = Capture()
    logger.addHandler(handler)
    try:
        logger.warning("request failed", extra={"model": "mlp", "request_id": "r-7"})
        logger.warning("no request here")
    finally:
        logger.removeHandler(handler)
    about, plain = (json.loads(line) for line in lines)
    assert about["model"] == "mlp"
    assert about["request_id"] == "r-7"
    assert set(plain) == {"ts", "level", "logger", "msg"}


def test_exceptions_travel_with_the_record() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord(
            "w", logging.ERROR, __file__, 1, "failed", (), exc_info=sys.exc_info()
        )
    assert "ValueError: boom" in JsonFormatter().format(record)
    assert "ValueError: boom" in TextFormatter().format(record)


@pytest.fixture
def restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.usefixtures("restore_root")
def test_configure_logging_sets_level_and_format() -> None:
    configure_logging(LoggingConfig(level=LogLevel.WARNING, format=LogFormat.JSON))
    root = logging.getLogger()
    assert root.level == logging.WARNING
    assert len(root.handlers) == 1
    assert isinstance(root.handlers[0].formatter, JsonFormatter)


@pytest.mark.usefixtures("restore_root")
def test_held_records_are_replayed_in_the_configured_format(
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    config_log = logging.getLogger("reactantserver.core.config")
    with hold_records() as held:
        config_log.info("config override X=%r sets %s", "1", "a.b")
        config_log.warning("config: mode %s is risky", "666")
    assert (list(root.handlers), root.level) == (handlers, level)
    assert capsys.readouterr().err == ""  # nothing printed while the format was unknown
    assert [r.getMessage() for r in held.records] == [
        "config override X='1' sets a.b",
        "config: mode 666 is risky",
    ]

    configure_logging(LoggingConfig(level=LogLevel.WARNING, format=LogFormat.JSON), held.records)
    lines = capsys.readouterr().err.splitlines()
    assert [json.loads(line)["msg"] for line in lines] == ["config: mode 666 is risky"]
    assert json.loads(lines[0])["logger"] == "reactantserver.core.config"
