"""Atomic publication of a bundle directory.

Files are written into the sibling ``<name>.tmp`` (each fsynced), the directory is fsynced,
then renamed into place. Replacing swaps the two trees with ``renameat2(RENAME_EXCHANGE)``
where the kernel and filesystem allow it, else goes through ``<name>.old``. A watcher
therefore sees the old bundle or the new one, never a mixture::

    with staged_bundle(Path("models/mlp"), force=True) as staging:
        write_file(staging / "weights.safetensors", data)
        write_file(staging / "manifest.yaml", manifest)   # last
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from reactantserver.core.manifest import MODEL_NAME_PATTERN, is_valid_model_name
from reactantserver.export._errors import ExportError

__all__ = ["TMP_SUFFIX", "exchange", "fsync_dir", "staged_bundle", "write_file"]

TMP_SUFFIX = ".tmp"
"""Suffix of the staging sibling; scanners skip directories ending in it."""

_OLD_SUFFIX = ".old"
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def write_file(path: Path, data: bytes | memoryview) -> None:
    """Write ``data`` to a new file and fsync it."""
    with open(path, "xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    """fsync a directory so the entries created or renamed in it are durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _libc_renameat2() -> Any | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    function = getattr(libc, "renameat2", None)
    if function is None:
        return None
    function.argtypes = [
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_uint,
    ]
    function.restype = ctypes.c_int
    return function


def exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths with ``renameat2(RENAME_EXCHANGE)``.

    Returns ``False`` when the call is unavailable (no glibc symbol, old kernel, filesystem
    without support), so the caller can fall back; raises ``OSError`` for other failures.
    """
    function = _libc_renameat2()
    if function is None:
        return False
    result = function(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if result == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(code, f"renameat2(RENAME_EXCHANGE) {a} <-> {b}: {os.strerror(code)}")


def _swap_into_place(staging: Path, final: Path) -> None:
    if exchange(staging, final):
        # The old tree now sits at <name>.tmp.
        fsync_dir(final.parent)
        shutil.rmtree(staging)
        return
    old = final.with_name(final.name + _OLD_SUFFIX)
    if old.exists():
        shutil.rmtree(old)
    os.rename(final, old)
    os.rename(staging, final)
    fsync_dir(final.parent)
    shutil.rmtree(old)


@contextlib.contextmanager
def staged_bundle(final: Path, *, force: bool) -> Iterator[Path]:
    """A fresh ``<final>.tmp`` directory to write a bundle into, published on success.

    An existing ``final`` is an error unless ``force`` (then it is replaced atomically). A
    stale ``<final>.tmp`` left by a crashed run is removed first. On any exception the
    staging directory is removed and ``final`` is left untouched.
    """
    final = Path(os.path.abspath(final))
    if not is_valid_model_name(final.name):
        raise ExportError(
            f"{final}: invalid model name {final.name!r} (the bundle directory's name is the "
            f"model name and must match {MODEL_NAME_PATTERN})"
        )
    if final.exists() and not final.is_dir():
        raise ExportError(f"{final}: exists and is not a directory")
    if final.exists() and not force:
        raise ExportError(f"{final}: bundle already exists (use --force / force=True to replace)")
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = final.with_name(final.name + TMP_SUFFIX)
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir()
    try:
        yield staging
        fsync_dir(staging)
        if final.exists():
            _swap_into_place(staging, final)
        else:
            os.rename(staging, final)
            fsync_dir(final.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
