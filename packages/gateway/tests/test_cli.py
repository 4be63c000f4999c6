"""``reactantserver-gateway``: installed, configuration errors exit 2, ``ctl`` dispatches."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from reactantserver.gateway import __version__, _cli


def _script() -> str:
    # The script sits next to the interpreter of the environment the tests run in.
    return shutil.which("reactantserver-gateway") or str(
        Path(sys.executable).with_name("reactantserver-gateway")
    )


def test_missing_endpoints_is_a_configuration_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("REACTANTSERVER_GATEWAY_FILE", "REACTANTSERVER_GATEWAY_WORKERS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("reactantserver.gateway.config.DEFAULT_GATEWAY_FILE", tmp_path / "none")
    assert _cli.main([]) == 2
    err = capsys.readouterr().err
    assert "configuration error" in err
    assert "endpoints" in err


def test_unknown_key_in_the_file_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "gateway.yml"
    config.write_text("endpoints: ['127.0.0.1:1']\nno_such_key: 1\n")
    assert _cli.main(["--config", str(config)]) == 2
    assert "no_such_key" in capsys.readouterr().err


def test_console_script_is_installed_and_reports_its_version() -> None:
    done = subprocess.run([_script(), "--version"], capture_output=True, text=True, check=False)
    assert done.returncode == 0
    assert __version__ in done.stdout


def test_ctl_is_dispatched_to_the_operator_cli() -> None:
    done = subprocess.run([_script(), "ctl", "--help"], capture_output=True, text=True, check=False)
    assert done.returncode == 0
    assert "set-replicas" in done.stdout


def test_configuration_warnings_are_logged_in_the_configured_format(tmp_path: Path) -> None:
    """Held while the configuration loads, then written as JSON like every later line."""
    with socket.socket() as squatter:  # the gRPC address is taken: start-up fails, exit 1
        squatter.bind(("127.0.0.1", 0))
        config = tmp_path / "gateway.yml"
        config.write_text(
            "endpoints: ['127.0.0.1:1']\n"
            f"listen: {{grpc: '127.0.0.1:{squatter.getsockname()[1]}', metrics: '127.0.0.1:0'}}\n"
            "logging: {format: json}\n"
            "scheduling: {model_aware: {network_seconds: {'10.9.9.9:8001': 0.001}}}\n"
        )
        done = subprocess.run(
            [_script(), "--config", str(config)],
            env={k: v for k, v in os.environ.items() if not k.startswith("REACTANTSERVER_GATEWAY")},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 1, done.stderr
    # gRPC's C core reports the failed bind on its own lines; every logging record is JSON.
    lines = [line for line in done.stderr.splitlines() if not re.match(r"[EWIF]\d{4} ", line)]
    records = [json.loads(line) for line in lines]
    warned = [r for r in records if r["logger"] == "reactantserver.gateway.config"]
    assert any("'10.9.9.9:8001'" in r["msg"] for r in warned), done.stderr
    assert warned[0]["level"] == "WARNING"
