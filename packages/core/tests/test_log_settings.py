"""Triton's LogSettings over this process's root logger."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator

import pytest

from reactantserver.core.errors import InvalidArgumentError
from reactantserver.core.log_settings import answer_log_settings, apply_log_settings, log_settings
from reactantserver.core.logs import JsonFormatter, TextFormatter
from reactantserver.core.protocol import grpc_service_pb2 as pb


@pytest.fixture(autouse=True)
def root_logger() -> Iterator[logging.Logger]:
    """A root logger with one text handler at INFO, restored afterwards."""
    root = logging.getLogger()
    saved = (root.level, list(root.handlers))
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(TextFormatter())
    root.handlers = [handler]
    root.setLevel(logging.INFO)
    yield root
    root.setLevel(saved[0])
    root.handlers = saved[1]


def test_read_in_tritons_names() -> None:
    assert log_settings() == {
        "log_file": "",
        "log_info": True,
        "log_warning": True,
        "log_error": True,
        "log_verbose_level": 0,
        "log_format": "text",
    }


def test_levels_and_format_change_the_root_logger(root_logger: logging.Logger) -> None:
    after = apply_log_settings({"log_info": False, "log_format": "json"})
    assert root_logger.level == logging.WARNING
    assert isinstance(root_logger.handlers[0].formatter, JsonFormatter)
    assert after["log_info"] is False
    assert after["log_format"] == "json"
    apply_log_settings({"log_verbose_level": 2})
    assert root_logger.level == logging.DEBUG
    off = {"log_verbose_level": 0, "log_info": False, "log_warning": False, "log_error": False}
    apply_log_settings(off)
    assert root_logger.level > logging.CRITICAL


def test_bad_settings_are_all_named_and_change_nothing(root_logger: logging.Logger) -> None:
    with pytest.raises(InvalidArgumentError) as refused:
        apply_log_settings(
            {"log_info": False, "log_file": "/var/log/x", "colour": True, "log_format": "xml"}
        )
    message = str(refused.value)
    for word in ("log_file", "colour", "log_format"):
        assert word in message
    assert root_logger.level == logging.INFO
    with pytest.raises(InvalidArgumentError, match="takes a bool"):
        apply_log_settings({"log_info": 1})


def test_the_rpc_reads_with_no_settings_and_applies_the_ones_it_names() -> None:
    read = answer_log_settings(pb.LogSettingsRequest())
    assert read.settings["log_info"].bool_param is True
    assert read.settings["log_format"].string_param == "text"
    request = pb.LogSettingsRequest()
    request.settings["log_verbose_level"].uint32_param = 1
    changed = answer_log_settings(request)
    assert changed.settings["log_verbose_level"].uint32_param == 1
    empty = pb.LogSettingsRequest()
    empty.settings["log_info"].SetInParent()
    with pytest.raises(InvalidArgumentError, match="no value"):
        answer_log_settings(empty)
