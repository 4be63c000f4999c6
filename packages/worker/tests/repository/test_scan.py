"""The repository scan: which directories are bundles, include filters, duplicate names."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from reactantserver.worker.repository.scan import scan_model_dirs


def _bundle(root: Path, name: str) -> Path:
    path = root / name
    path.mkdir(parents=True)
    (path / "manifest.yaml").write_text("format: '3.0'\n")
    return path


def test_bundles_are_subdirectories_with_a_manifest(tmp_path: Path) -> None:
    a = _bundle(tmp_path, "a")
    b = _bundle(tmp_path, "b")
    (tmp_path / "empty").mkdir()
    (tmp_path / "file.txt").write_text("x")
    for skipped in (".hidden", "c.tmp", "d.old"):
        _bundle(tmp_path, skipped)
    found = scan_model_dirs([tmp_path])
    assert found.bundles == {"a": a, "b": b}
    assert found.conflicts == {}


def test_invalid_model_names_are_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _bundle(tmp_path, "has space")
    with caplog.at_level(logging.WARNING):
        found = scan_model_dirs([tmp_path])
    assert found.bundles == {}
    assert "not a valid model name" in caplog.text


def test_include_filters_and_warns_about_missing_names(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    keep = _bundle(tmp_path, "keep")
    _bundle(tmp_path, "drop")
    with caplog.at_level(logging.WARNING):
        found = scan_model_dirs([tmp_path], include=["keep", "ghost"])
    assert found.bundles == {"keep": keep}
    assert "'ghost'" in caplog.text


def test_a_name_in_two_roots_fails_in_both(tmp_path: Path) -> None:
    first, second = tmp_path / "one", tmp_path / "two"
    _bundle(first, "dup")
    only = _bundle(second, "only")
    _bundle(second, "dup")
    found = scan_model_dirs([first, second])
    assert found.bundles == {"only": only}
    assert "found in" in found.conflicts["dup"]
    assert str(first) in found.conflicts["dup"]
    assert str(second) in found.conflicts["dup"]


def test_an_unreadable_root_is_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        found = scan_model_dirs([tmp_path / "gone"])
    assert found.bundles == {}
    assert "cannot be read" in caplog.text
