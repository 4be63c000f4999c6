"""``reactantserver-worker``: arguments, configuration errors and the installed script.

Serving itself is driven end to end by ``tests/worker_e2e`` (a real subprocess and
``tritonclient``); here only what happens before the listeners open.
"""

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

from reactantserver.worker import __version__, _cli


def _script() -> str:
    # The script sits next to the interpreter of the environment the tests run in.
    return shutil.which("reactantserver-worker") or str(
        Path(sys.executable).with_name("reactantserver-worker")
    )


def test_missing_model_repo_is_a_configuration_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _cli.main(["--model-repo", str(tmp_path / "absent")]) == 2
    err = capsys.readouterr().err
    assert "configuration error" in err
    assert "absent is not a directory" in err


def test_model_repo_and_node_file_are_exclusive(capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli.main(["--model-repository", "a", "--node-file", "b"]) == 2
    assert "mutually exclusive" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--load-model", "m"], "--load-model needs --model-control-mode explicit"),
        (["--model-control-mode", "explicit", "--load-model", "*"], "--load-model: name a model"),
        (["--grpc-port", "9000", "--http-port", "9000"], "endpoints.http_port: must differ"),
    ],
)
def test_bad_flags_are_configuration_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert _cli.main(["--model-repository", str(tmp_path), *argv]) == 2
    assert message in capsys.readouterr().err


def test_a_port_out_of_range_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        _cli.main(["--model-repository", ".", "--grpc-port", "70000"])
    assert exited.value.code == 2
    assert "must be in [0, 65535]" in capsys.readouterr().err


def test_bad_environment_override_names_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("REACTANTSERVER_WORKER_ENDPOINTS_PORT", "not-a-port")
    assert _cli.main(["--model-repo", str(tmp_path)]) == 2
    assert "REACTANTSERVER_WORKER_ENDPOINTS_PORT" in capsys.readouterr().err


def test_console_script_is_installed_and_reports_its_version() -> None:
    done = subprocess.run([_script(), "--version"], capture_output=True, text=True, check=False)
    assert done.returncode == 0
    assert done.stdout.strip() == f"reactantserver-worker {__version__}"


def test_module_entry_point_matches_the_script(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "reactantserver.worker", "--model-repo", str(tmp_path / "x")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert "is not a directory" in done.stderr


def test_configuration_warnings_survive_a_configuration_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("REACTANTSERVER_WORKER_RUNTIME_SHARED_HOST_WEIGHTS_MODE", "666")
    assert _cli.main(["--model-repo", str(tmp_path / "absent")]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert "WARNING reactantserver.core.config" in lines[0]
    assert "shared_host_weights_mode '666' lets any local user write" in lines[0]
    assert "configuration error" in lines[-1]


def test_configuration_warnings_are_logged_in_the_configured_format(tmp_path: Path) -> None:
    """Held while the configuration loads, then written as JSON like every later line."""
    with socket.socket() as squatter:  # the gRPC port is taken: the worker exits 1 early
        squatter.bind(("127.0.0.1", 0))
        env = {
            **os.environ,
            "REACTANTSERVER_WORKER_ENDPOINTS_PORT": str(squatter.getsockname()[1]),
            "REACTANTSERVER_WORKER_ENDPOINTS_METRICS_PORT": "0",
            "REACTANTSERVER_WORKER_ENDPOINTS_HTTP_PORT": "0",
            "REACTANTSERVER_WORKER_LOGGING_FORMAT": "json",
            "REACTANTSERVER_WORKER_RUNTIME_SHARED_HOST_WEIGHTS_MODE": "666",
            "REACTANTSERVER_WORKER_CACHE_DIR": str(tmp_path / "cache"),
        }
        done = subprocess.run(
            [_script(), "--model-repo", str(tmp_path)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert done.returncode == 1, done.stderr
    # gRPC's C core reports the failed bind on its own lines; every logging record is JSON.
    lines = [line for line in done.stderr.splitlines() if not re.match(r"[EWIF]\d{4} ", line)]
    records = [json.loads(line) for line in lines]
    messages = [r["msg"] for r in records if r["logger"] == "reactantserver.core.config"]
    assert any("shared_host_weights_mode '666'" in m for m in messages), done.stderr
    assert any("cannot open the listeners" in r["msg"] for r in records), done.stderr
