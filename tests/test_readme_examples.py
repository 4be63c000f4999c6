"""README examples run as written (from a scratch directory, with the repository importable)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
READMES = [ROOT / "packages" / p / "README.md" for p in ("worker", "client", "gateway", "node")]


def _python_blocks(readme: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", readme.read_text(), flags=re.DOTALL)


@pytest.mark.parametrize("readme", READMES, ids=lambda p: str(p.relative_to(ROOT)))
def test_readme_python_blocks_run(readme: Path, tmp_path: Path) -> None:
    blocks = _python_blocks(readme)
    assert blocks, f"{readme} has no python example"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for i, block in enumerate(blocks):
        script = tmp_path / f"example_{i}.py"
        script.write_text(block)
        done = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-4000:]
