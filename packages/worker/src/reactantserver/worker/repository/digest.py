"""Bundle content digests for the repository watcher.

A bundle's digest covers every regular file under it (manifest, modules and variants, weights,
``model.py``, auxiliary files), hidden files and directories excluded. Each file is hashed only
when its stat fingerprint moved, so a poll over an unchanged repository reads no file content::

    digester = BundleDigester()
    digester.digest(Path("/models/mlp"))    # "3f1c..." (hex BLAKE2b-256)
    dir_identity(Path("/models/mlp"))       # (st_dev, st_ino): survives a rename
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from pathlib import Path
from typing import TypeAlias

__all__ = ["BundleDigester", "DirIdentity", "dir_identity"]

DirIdentity: TypeAlias = tuple[int, int]
"""``(st_dev, st_ino)`` of a bundle directory: what stays the same when it is renamed."""

_Fingerprint: TypeAlias = tuple[int, int, int, int]  # (st_ino, st_size, st_mtime_ns, st_ctime_ns)
_CHUNK = 1 << 20
_HASH_BYTES = 32


def dir_identity(path: Path) -> DirIdentity:
    """The ``(st_dev, st_ino)`` of ``path``, following symlinks as the scan does."""
    st = os.stat(path)
    return (st.st_dev, st.st_ino)


def _fingerprint(st: os.stat_result) -> _Fingerprint:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _normalised(path: Path) -> str:
    return os.path.abspath(path)


class BundleDigester:
    """Digests of bundle directories, re-hashing only files whose stat fingerprint moved.

    Each file keeps a fingerprint ``(st_ino, st_size, st_mtime_ns, st_ctime_ns)`` and its
    BLAKE2b-256 content hash, keyed by absolute path. Content changes always move ``ctime``,
    so a copy that restores ``mtime`` is still re-hashed; ``touch``/``chmod`` re-hash but leave
    the digest unchanged. Not thread-safe: the watcher thread owns it.
    """

    def __init__(self) -> None:
        # bundle (absolute, normalised) -> relative posix path -> (fingerprint, content hash)
        self._cache: dict[str, dict[str, tuple[_Fingerprint, bytes]]] = {}
        self._hashed = 0

    @property
    def hashed_files(self) -> int:
        """How many file contents were (re)hashed since construction."""
        return self._hashed

    def digest(self, bundle: Path) -> str:
        """The hex BLAKE2b-256 of ``bundle``'s sorted ``(relative path, content hash)`` list.

        Raises :class:`OSError` (``FileNotFoundError`` included) when the bundle or one of its
        files vanishes mid-walk; the caller treats the bundle as absent or unsettled this poll.
        """
        key = _normalised(bundle)
        previous = self._cache.get(key, {})
        current: dict[str, tuple[_Fingerprint, bytes]] = {}
        try:
            for relative, path in self._files(Path(key)):
                current[relative] = self._file_hash(path, previous.get(relative))
        except OSError:
            # Keep what was hashed so the next poll does not read it again.
            self._cache[key] = {**previous, **current}
            raise
        # Replacing (not merging) drops files deleted since the last poll.
        self._cache[key] = current
        total = hashlib.blake2b(digest_size=_HASH_BYTES)
        for relative in sorted(current):
            # Paths never contain NUL and content hashes have a fixed size: unambiguous.
            total.update(os.fsencode(relative))
            total.update(b"\0")
            total.update(current[relative][1])
        return total.hexdigest()

    def forget(self, bundle: Path) -> None:
        """Drop the cached fingerprints of ``bundle`` (and of any bundle below it)."""
        key = _normalised(bundle)
        prefix = key.rstrip(os.sep) + os.sep
        for cached in [k for k in self._cache if k == key or k.startswith(prefix)]:
            del self._cache[cached]

    def _file_hash(
        self, path: str, cached: tuple[_Fingerprint, bytes] | None
    ) -> tuple[_Fingerprint, bytes]:
        if cached is not None and _fingerprint(os.stat(path)) == cached[0]:
            return cached
        with open(path, "rb") as f:
            # The fingerprint of the file actually read, taken before reading: a write racing
            # the read moves ctime, so the next poll hashes it again.
            fingerprint = _fingerprint(os.fstat(f.fileno()))
            content = hashlib.blake2b(digest_size=_HASH_BYTES)
            while chunk := f.read(_CHUNK):
                content.update(chunk)
        self._hashed += 1
        return fingerprint, content.digest()

    def _files(self, bundle: Path) -> list[tuple[str, str]]:
        """Every visible regular file under ``bundle`` as ``(relative posix path, path)``."""
        root = os.stat(bundle)
        if not stat.S_ISDIR(root.st_mode):
            raise NotADirectoryError(errno.ENOTDIR, "bundle is not a directory", str(bundle))
        found: list[tuple[str, str]] = []
        self._walk(str(bundle), "", {(root.st_dev, root.st_ino)}, found)
        return found

    def _walk(
        self,
        directory: str,
        relative: str,
        ancestors: set[DirIdentity],
        found: list[tuple[str, str]],
    ) -> None:
        with os.scandir(directory) as entries:
            listed = sorted(entries, key=lambda e: e.name)
        for entry in listed:
            if entry.name.startswith("."):
                continue
            name = f"{relative}{entry.name}"
            # is_file()/is_dir() follow symlinks; a dangling link is neither and is skipped.
            if entry.is_file():
                found.append((name, entry.path))
            elif entry.is_dir():
                st = entry.stat()
                identity = (st.st_dev, st.st_ino)
                if identity in ancestors:  # a symlink back up the tree: do not loop
                    continue
                self._walk(entry.path, f"{name}/", ancestors | {identity}, found)
