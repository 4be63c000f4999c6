"""``reactantserver-export``: the console script end to end, and clear argument errors."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reactantserver.core.manifest import load_manifest
from reactantserver.export import _cli

MODEL_SOURCE = """
import jax.numpy as jnp
import numpy as np


def init(seed=0):
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_normal((6, 3)).astype(np.float32), "b": np.zeros(3, np.float32)}


def forward(params, x):
    return jnp.tanh(x @ params["w"] + params["b"])
"""


def _script() -> str:
    # The script sits next to the interpreter of the environment the tests run in.
    return shutil.which("reactantserver-export") or str(
        Path(sys.executable).with_name("reactantserver-export")
    )


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_script(), *args], cwd=cwd, capture_output=True, text=True, check=False, timeout=300
    )


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory holding an importable model module ``climodel``; the test runs in it."""
    (tmp_path / "climodel.py").write_text(MODEL_SOURCE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


@pytest.mark.slow
@pytest.mark.usefixtures("needs_worker")
def test_export_then_validate_end_to_end(project: Path) -> None:
    done = _run(
        "jax",
        "climodel:forward",
        "--params",
        "climodel:init",
        "--input",
        "x=f32[n,f=6]",
        "--output",
        "y",
        "--batch-sizes",
        "1,4",
        "--out",
        "models/cli",
        "--description",
        "from the CLI",
        "--text-copies",
        cwd=project,
    )
    assert done.returncode == 0, done.stderr
    assert "exported" in done.stdout
    bundle = project / "models" / "cli"
    manifest = load_manifest(bundle)
    assert manifest.description == "from the CLI"
    assert manifest.provenance["entry"] == "climodel:forward"
    assert (bundle / "model.b4.mlir.txt").is_file()
    assert "\r" not in done.stderr  # no progress bar without a terminal

    checked = _run(
        "validate",
        "models/cli",
        "--reference",
        "climodel:forward",
        "--params",
        "climodel:init",
        "--report",
        "report.md",
        cwd=project,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "model.b4.mlir  servable" in checked.stdout
    assert checked.stdout.rstrip().endswith("PASSED")
    assert "**PASSED**" in (project / "report.md").read_text()

    (bundle / "model.b1.mlir").unlink()
    failed = _run("validate", "models/cli", cwd=project)
    assert failed.returncode == 1
    assert "model.b1.mlir: missing module file" in failed.stdout


@pytest.mark.usefixtures("needs_worker")
def test_params_files_and_force_in_process(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import numpy as np

    np.savez(project / "p.npz", w=np.ones((6, 3), np.float32), b=np.zeros(3, np.float32))
    args = ["jax", "climodel:forward", "--params", "p.npz", "--input", "x=f32[n,6]"]
    args += ["--batch-sizes", "2", "--out", "models/npz", "--no-progress"]
    assert _cli.main(args) == 0
    assert _cli.main(args) == 2
    assert "already exists (use --force" in capsys.readouterr().err
    assert _cli.main([*args, "--force", "--with-hooks"]) == 0
    assert (project / "models" / "npz" / "model.py").is_file()
    assert _cli.main(["validate", "models/npz", "--reference", "climodel:forward"]) == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "the following arguments are required: COMMAND"),
        (["jax", "climodel:forward", "--input", "x=f32[n,6]", "--out", "o"], "--params"),
        (
            ["jax", "climodel:forward", "--params", "climodel:init", "--out", "o"],
            "the following arguments are required: --input",
        ),
        (
            ["jax", "climodel:forward", "--params", "climodel:init", "--input", "x=f32[n,6]",
             "--batch-sizes", "1,x", "--out", "o"],
            "expected comma-separated ints",
        ),
        (
            ["jax", "climodel:forward", "--params", "climodel:init", "--input", "x=f32[n,q]",
             "--batch-sizes", "1", "--out", "o"],
            "a lettered axis needs a size",
        ),
        (
            ["jax", "climodel:forward", "--params", "climodel:init", "--input", "x=f32[n,6]",
             "--batch-sizes", "1", "--out", "models/a", "--name", "b"],
            "must match the basename of --out",
        ),
        (
            ["jax", "nomodule_here:forward", "--params", "climodel:init", "--input", "x=f32[6]",
             "--out", "o"],
            "cannot import module 'nomodule_here'",
        ),
        (
            ["jax", "climodel:forward", "--params", "missing.safetensors", "--input", "x=f32[6]",
             "--out", "o"],
            "no such file",
        ),
        (
            ["jax", "climodel:forward", "--params", "climodel:init", "--input", "x=f32[n,6]",
             "--variant", "w", "--out", "o"],
            "expected LETTER=SIZE",
        ),
        (["validate", "somewhere", "--params", "p.npz"], "--params is only used with --reference"),
        (["validate", "somewhere", "--backend", "tpu"], "invalid choice: 'tpu'"),
    ],
)  # fmt: skip
def test_bad_arguments_exit_2_with_a_clear_message(
    project: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert _cli.main(args) == 2
    assert message in capsys.readouterr().err
    assert not (project / "o").exists()


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch is installed here")
def test_torch_without_torch_says_how_to_install(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["torch", "climodel:forward", "--input", "x=f32[n,6]", "--batch-sizes", "1"]
    assert _cli.main([*args, "--out", "models/t"]) == 2
    err = capsys.readouterr().err
    assert "the PyTorch path needs torch and torchax" in err
    assert "pip install 'reactantserver-export[torch]'" in err


def test_console_script_without_arguments_prints_usage() -> None:
    done = subprocess.run([_script()], capture_output=True, text=True, check=False)
    assert done.returncode == 2
    assert "usage: reactantserver-export" in done.stderr
    assert "{jax,torch,validate}" in done.stderr or "COMMAND" in done.stderr
