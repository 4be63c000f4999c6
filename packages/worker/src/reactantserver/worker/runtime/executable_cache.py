"""On-disk cache of compiled executables, so a restart skips XLA compilation.

Entries live at ``<cache_dir>/executables/<key[:2]>/<key>.bin`` with a ``.json`` note beside
them. The key covers everything that changes what a compile produces. Each ``.bin`` starts with
a SHA-256 of the serialised bytes, checked before they reach the runtime (a damaged executable
can deserialise and then abort the process on use); a corrupt or stale entry is deleted and
rebuilt, never fatal::

    cache = ExecutableCache(cache_dir / "executables", backend, max_bytes=10 << 30)
    exe = cache.get_or_compile(module_bytes, CompileSpec(), model="mlp", file="model.b8.mlir")
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import stat
import tempfile
import threading
import time
from pathlib import Path

import attrs

from reactantserver.core.dtypes import DType
from reactantserver.worker.runtime.backend import (
    Backend,
    CompileSpec,
    Executable,
    Signature,
    TensorType,
)

__all__ = [
    "CacheCounters",
    "ExecutableCache",
    "cache_key",
    "signature_from_json",
    "signature_to_json",
]

log = logging.getLogger(__name__)

_FORMAT = "rs-exe-1"
_MAGIC = b"RSX1"
"""First bytes of a ``.bin``; the payload's SHA-256 digest follows, then the payload."""


def _seal(payload: bytes) -> bytes:
    """``payload`` framed as a ``.bin`` entry: magic, SHA-256 digest, payload."""
    return _MAGIC + hashlib.sha256(payload).digest() + payload


def _unseal(blob: bytes) -> bytes:
    """The payload of a ``.bin`` entry; ``ValueError`` when it is truncated or damaged."""
    head = len(_MAGIC) + hashlib.sha256().digest_size
    payload = blob[head:]
    if (
        blob[: len(_MAGIC)] != _MAGIC
        or blob[len(_MAGIC) : head] != hashlib.sha256(payload).digest()
    ):
        raise ValueError("checksum mismatch (truncated, damaged or foreign entry)")
    return payload


def cache_key(module: bytes, opts: CompileSpec, backend: Backend) -> str:
    """SHA-256 hex over the module digest, compile options and the exact runtime and device."""
    material = {
        "format": _FORMAT,
        "module": hashlib.sha256(module).hexdigest(),
        "options": opts.cache_material().decode(),
        "runtime": backend.version_material,
        "platform": backend.platform,
        "device_kind": backend.device_kind,
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def signature_to_json(signature: Signature) -> dict[str, list[list[object]]]:
    """A JSON-able form of a signature (stored beside an entry so a hit skips MLIR parsing)."""
    return {
        "inputs": [[t.dtype.token, list(t.shape)] for t in signature.inputs],
        "results": [[t.dtype.token, list(t.shape)] for t in signature.results],
    }


def signature_from_json(data: object) -> Signature:
    """Inverse of :func:`signature_to_json`; ``ValueError`` on anything malformed."""
    try:
        assert isinstance(data, dict)
        parts = [
            tuple(
                TensorType(DType.from_token(str(tok)), tuple(int(d) for d in shape))
                for tok, shape in data[side]
            )
            for side in ("inputs", "results")
        ]
    except (AssertionError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"malformed cached signature: {exc}") from exc
    return Signature(parts[0], parts[1])


@attrs.define
class CacheCounters:
    """Cumulative cache outcomes (the worker exports them as metrics)."""

    hits: int = 0
    misses: int = 0
    compiles: int = 0
    corrupt: int = 0
    pruned: int = 0


class ExecutableCache:
    """Compile-or-load through a size-capped directory of serialised executables."""

    def __init__(self, root: Path | None, backend: Backend, *, max_bytes: int = 10 << 30) -> None:
        self._backend = backend
        self._max_bytes = max_bytes
        self._lock = threading.Lock()
        self.counters = CacheCounters()
        self.root: Path | None = self._usable(root) if root is not None else None
        if self.root is not None:
            self.prune()

    @property
    def enabled(self) -> bool:
        """Whether entries are read and written (off when disabled or unsafe)."""
        return self.root is not None

    @staticmethod
    def _usable(root: Path) -> Path | None:
        # Deserialisation trusts the bytes, so only a directory nobody else can write is used.
        try:
            root.mkdir(parents=True, exist_ok=True, mode=0o700)
            info = root.stat()
        except OSError as exc:
            log.warning("executable cache disabled: cannot use %s: %s", root, exc)
            return None
        if info.st_uid != os.getuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            log.warning(
                "executable cache disabled: %s must be owned by uid %d and not group/world "
                "writable (mode %o)",
                root,
                os.getuid(),
                stat.S_IMODE(info.st_mode),
            )
            return None
        return root

    def _paths(self, key: str) -> tuple[Path, Path]:
        assert self.root is not None
        folder = self.root / key[:2]
        return folder / f"{key}.bin", folder / f"{key}.json"

    def cached_signature(self, module: bytes, opts: CompileSpec) -> Signature | None:
        """The entry signature recorded with a cached executable of ``module``, if any."""
        if self.root is None:
            return None
        _, note_path = self._paths(cache_key(module, opts, self._backend))
        try:
            return signature_from_json(json.loads(note_path.read_bytes())["signature"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def get_or_compile(
        self,
        module: bytes,
        opts: CompileSpec,
        *,
        model: str = "",
        file: str = "",
        signature: Signature | None = None,
    ) -> Executable:
        """The executable for ``module``: from the cache when a valid entry exists.

        ``signature`` (already checked by the caller) is recorded with a new entry.
        """
        if self.root is None:
            self.counters.compiles += 1
            return self._backend.compile(module, opts)
        key = cache_key(module, opts, self._backend)
        blob_path, note_path = self._paths(key)
        exe = self._load(blob_path, note_path, opts)
        if exe is not None:
            self.counters.hits += 1
            return exe
        self.counters.misses += 1
        self.counters.compiles += 1
        exe = self._backend.compile(module, opts)
        try:
            self._store(exe, blob_path, note_path, model=model, file=file, signature=signature)
        except OSError as exc:
            log.warning("executable cache: cannot store %s: %s", blob_path, exc)
        self.prune()
        return exe

    def _load(self, blob_path: Path, note_path: Path, opts: CompileSpec) -> Executable | None:
        try:
            blob = blob_path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("executable cache: cannot read %s: %s", blob_path, exc)
            return None
        try:
            exe = self._backend.deserialize(_unseal(blob), opts)
        except Exception as exc:  # any failure means a bad entry: rebuild it
            self.counters.corrupt += 1
            log.warning("executable cache: dropping unusable entry %s: %s", blob_path, exc)
            for path in (blob_path, note_path):
                path.unlink(missing_ok=True)
            return None
        with contextlib.suppress(OSError):
            os.utime(blob_path)  # least-recently-used pruning goes by mtime
        return exe

    def _store(
        self,
        exe: Executable,
        blob_path: Path,
        note_path: Path,
        *,
        model: str,
        file: str,
        signature: Signature | None,
    ) -> None:
        blob = _seal(self._backend.serialize(exe))
        blob_path.parent.mkdir(mode=0o700, exist_ok=True)
        note: dict[str, object] = {
            "model": model,
            "file": file,
            "created": time.time(),
            "bytes": len(blob),
        }
        if signature is not None:
            note["signature"] = signature_to_json(signature)
        for path, data in ((blob_path, blob), (note_path, json.dumps(note).encode())):
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(data)
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(tmp, path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise

    def prune(self) -> int:
        """Delete least-recently-used entries until the cache is under its byte cap."""
        if self.root is None:
            return 0
        with self._lock:
            entries = []
            for blob in self.root.glob("*/*.bin"):
                with contextlib.suppress(OSError):
                    info = blob.stat()
                    entries.append((info.st_mtime, info.st_size, blob))
            total = sum(size for _, size, _ in entries)
            removed = 0
            for _, size, blob in sorted(entries, key=lambda e: e[0]):
                if total <= self._max_bytes:
                    break
                blob.unlink(missing_ok=True)
                blob.with_suffix(".json").unlink(missing_ok=True)
                total -= size
                removed += 1
            self.counters.pruned += removed
            return removed
