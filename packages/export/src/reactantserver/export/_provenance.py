"""Provenance of an export: versions, entry point, and git state.

Git facts are collected only inside a work tree and read-only (``--no-optional-locks``, so
not even the index is refreshed); any failure drops the git keys instead of failing the
export.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import platform as _platform
import subprocess
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _dist_version
from pathlib import Path
from typing import Any

import attrs

__all__ = ["MAX_PATCH_BYTES", "PATCH_FILENAME", "Provenance", "collect_provenance"]

_log = logging.getLogger("reactantserver.export")

PATCH_FILENAME = "working_tree.patch"
"""Where a dirty work tree's diff goes inside the bundle."""

MAX_PATCH_BYTES = 20 << 20
"""Largest diff kept in full; a longer one is truncated with a note."""

_GIT_TIMEOUT_S = 20.0


@attrs.frozen
class Provenance:
    """The manifest's ``provenance`` mapping plus the files it refers to."""

    keys: Mapping[str, Any]
    files: Mapping[str, bytes] = attrs.field(factory=dict)


def _version(dist: str) -> str:
    try:
        return _dist_version(dist)
    except PackageNotFoundError:
        return "unknown"


def _git(cwd: Path, *args: str) -> bytes:
    env = dict(os.environ, GIT_OPTIONAL_LOCKS="0", LC_ALL="C")
    done = subprocess.run(
        ["git", "--no-optional-locks", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        timeout=_GIT_TIMEOUT_S,
        check=True,
    )
    return done.stdout


def _git_text(cwd: Path, *args: str) -> str:
    return _git(cwd, *args).decode(errors="replace").strip()


def _git_facts(cwd: Path) -> tuple[dict[str, Any], dict[str, bytes]]:
    if _git_text(cwd, "rev-parse", "--is-inside-work-tree") != "true":
        return {}, {}
    keys: dict[str, Any] = {
        "git_commit": _git_text(cwd, "rev-parse", "HEAD"),
        "git_tree_sha1": _git_text(cwd, "rev-parse", "HEAD^{tree}"),
        "git_branch": _git_text(cwd, "rev-parse", "--abbrev-ref", "HEAD"),
    }
    status = _git_text(cwd, "status", "--porcelain", "--untracked-files=no")
    keys["git_dirty"] = bool(status)
    # Without an origin the key is simply absent.
    with contextlib.suppress(subprocess.CalledProcessError):
        keys["repo_remote"] = _git_text(cwd, "remote", "get-url", "origin")
    files: dict[str, bytes] = {}
    if status:
        diff = _git(cwd, "diff", "HEAD", "--binary")
        if len(diff) > MAX_PATCH_BYTES:
            note = (
                f"\n# reactantserver-export: diff truncated to {MAX_PATCH_BYTES} of "
                f"{len(diff)} bytes\n"
            ).encode()
            diff = diff[:MAX_PATCH_BYTES] + note
        files[PATCH_FILENAME] = diff
        keys["git_diff_file"] = PATCH_FILENAME
    return keys, files


def collect_provenance(
    *,
    entry: str,
    platform: str,
    source_framework: str = "jax",
    source_dir: Path | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Provenance:
    """The provenance of an export of ``entry`` (``MODULE:FN``) lowered for ``platform``.

    Git keys describe the work tree holding ``source_dir`` (default: the current directory).
    ``extra`` keys are added last and win.
    """
    keys: dict[str, Any] = {
        "exported_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "reactantserver_export_version": _version("reactantserver-export"),
        "jax_version": _version("jax"),
        "jaxlib_version": _version("jaxlib"),
        "python_version": _platform.python_version(),
        "lowering_platform": platform,
        "source_framework": source_framework,
        "entry": entry,
    }
    if source_framework == "pytorch":
        keys["torch_version"] = _version("torch")
        keys["torchax_version"] = _version("torchax")
    if source_framework == "flax":
        keys["flax_version"] = _version("flax")
    files: dict[str, bytes] = {}
    try:
        git_keys, files = _git_facts(source_dir or Path.cwd())
        keys.update(git_keys)
    except (OSError, subprocess.SubprocessError) as exc:
        # Outside a work tree, or git missing: provenance never fails an export.
        _log.debug("no git provenance: %s", exc)
        files = {}
    keys.update(extra or {})
    return Provenance(keys, files)
