"""Atomic publication: tmp sibling, swap, no leftovers."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from reactantserver.export import ExportError, write_bundle
from reactantserver.export import _publish as publish

MODULE = b"ML\xefR module"


def _write(models: Path, description: str, *, force: bool = False) -> Path:
    return write_bundle(
        models / "m",
        name="m",
        executable_inputs=["x=f32[n,4]"],
        executable_outputs=["y=f32[n,4]"],
        modules={1: MODULE},
        weights=[],
        description=description,
        force=force,
    )


def test_replace_needs_force_and_swaps_atomically(models: Path) -> None:
    bundle = _write(models, "first")
    inode = os.stat(bundle).st_ino
    with pytest.raises(ExportError, match="already exists"):
        _write(models, "second")
    assert "first" in (bundle / "manifest.yaml").read_text()
    _write(models, "second", force=True)
    assert "second" in (bundle / "manifest.yaml").read_text()
    assert os.stat(bundle).st_ino != inode  # a new tree, not files rewritten in place
    assert sorted(p.name for p in models.iterdir()) == ["m"]


def test_replace_without_renameat2_goes_through_old(
    models: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write(models, "first")
    # The fallback path of kernels/filesystems without RENAME_EXCHANGE.
    monkeypatch.setattr(publish, "exchange", lambda a, b: False)
    _write(models, "second", force=True)
    assert "second" in (models / "m" / "manifest.yaml").read_text()
    assert sorted(p.name for p in models.iterdir()) == ["m"]


def test_exchange_swaps_two_directories(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "from_a").touch()
    if not publish.exchange(a, b):
        pytest.skip("renameat2(RENAME_EXCHANGE) is not available here")
    assert (b / "from_a").exists()
    assert not (a / "from_a").exists()


def test_failure_leaves_no_tmp_and_keeps_the_old_bundle(models: Path) -> None:
    _write(models, "first")
    with pytest.raises(RuntimeError, match="boom"), publish.staged_bundle(models / "m", force=True):
        raise RuntimeError("boom")
    assert sorted(p.name for p in models.iterdir()) == ["m"]
    assert "first" in (models / "m" / "manifest.yaml").read_text()


def test_a_failing_write_leaves_nothing_behind(models: Path) -> None:
    with pytest.raises(ExportError, match="weight 'w'"):
        write_bundle(
            models / "m",
            name="m",
            executable_inputs=["x=f32[n,4]"],
            executable_outputs=["y=f32[n,4]"],
            modules={1: MODULE},
            weights=[("w", np.array([b"not", b"numeric"], dtype=object))],
        )
    assert list(models.iterdir()) == []


def test_stale_tmp_is_replaced_and_manifest_is_written_last(models: Path) -> None:
    stale = models / "m.tmp"
    stale.mkdir()
    (stale / "junk").touch()
    bundle = _write(models, "fresh")
    assert not stale.exists()
    assert not (bundle / "junk").exists()
    names = sorted(bundle.iterdir(), key=lambda p: p.stat().st_mtime_ns)
    assert names[-1].name == "manifest.yaml"


def test_invalid_names_and_files_in_the_way(models: Path) -> None:
    with (
        pytest.raises(ExportError, match="invalid model name"),
        publish.staged_bundle(models / "-bad", force=False),
    ):
        pass
    (models / "file").write_text("x")
    with (
        pytest.raises(ExportError, match="not a directory"),
        publish.staged_bundle(models / "file", force=True),
    ):
        pass
