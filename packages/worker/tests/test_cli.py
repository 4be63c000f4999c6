"""``reactantserver-worker`` is installed and says plainly that it is not there yet."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reactantserver.worker import _cli


def test_entry_point_refuses_with_a_clear_message(capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli.main([]) != 0
    assert "not yet implemented" in capsys.readouterr().err


def test_console_script_is_installed_and_exits_non_zero() -> None:
    # The script sits next to the interpreter of the environment the tests run in.
    script = shutil.which("reactantserver-worker") or str(
        Path(sys.executable).with_name("reactantserver-worker")
    )
    done = subprocess.run([script], capture_output=True, text=True, check=False)
    assert done.returncode != 0
    assert "not yet implemented" in done.stderr
    assert "#7" in done.stderr
