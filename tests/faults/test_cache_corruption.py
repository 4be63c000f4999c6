"""Fault: the executable cache corrupted on disk.

A worker compiles the suite's models into a fresh private cache and stops. Every entry is then
damaged a different way (truncated, emptied, replaced by random bytes, bytes flipped inside,
its note garbled, its blob removed). A new worker on that cache must detect the bad entries,
drop and recompile them, serve the right numbers and not crash; a third worker then finds every
entry good again (all hits).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.worker_e2e._bundles import assert_close, load_weights, mlp_reference, two_io_reference
from tests.worker_e2e._harness import WorkerProcess, infer_input, rows, running_worker, spin_input

pytestmark = pytest.mark.slow

HITS = "reactantserver_worker_executable_cache_hits_total"
MISSES = "reactantserver_worker_executable_cache_misses_total"


def _truncate(blob: Path) -> None:
    data = blob.read_bytes()
    blob.write_bytes(data[: len(data) // 2])


def _empty(blob: Path) -> None:
    blob.write_bytes(b"")


def _random(blob: Path) -> None:
    blob.write_bytes(np.random.default_rng(3).bytes(blob.stat().st_size))


def _flip(blob: Path) -> None:
    data = bytearray(blob.read_bytes())
    middle = len(data) // 2
    for i in range(middle, min(middle + 64, len(data))):
        data[i] ^= 0xFF
    blob.write_bytes(bytes(data))


def _memory_kind(blob: Path) -> None:
    # One flipped bit in a string the deserialiser accepts: the runtime aborts on use.
    data = blob.read_bytes()
    assert b"device" in data
    blob.write_bytes(data.replace(b"device", b"ddvice", 1))


def _garble_note(blob: Path) -> None:
    blob.with_suffix(".json").write_bytes(b"\x00{not json")


def _remove_blob(blob: Path) -> None:
    blob.unlink()


DAMAGE: tuple[Callable[[Path], None], ...] = (
    _truncate,
    _empty,
    _random,
    _flip,
    _memory_kind,
    _garble_note,
    _remove_blob,
)
"""One way to damage an entry each; entries take them in turn."""


def _serve_correctly(worker: WorkerProcess, repo: Path) -> None:
    x = rows(3, 16, seed=16)
    a, b = rows(2, 8, seed=17), rows(2, 8, seed=18)
    with grpcclient.InferenceServerClient(worker.url) as client:
        logits = client.infer("mlp", [infer_input("x", x, "FP32")]).as_numpy("logits")
        assert_close(logits, mlp_reference(load_weights(repo / "mlp"), x))
        result = client.infer("two_io", [infer_input("a", a, "FP32"), infer_input("b", b, "FP32")])
        want = two_io_reference(load_weights(repo / "two_io"), a, b)
        assert_close(result.as_numpy("sum"), want[0])
        assert_close(result.as_numpy("dot"), want[1])
        assert client.infer("spin", [spin_input(3)]).as_numpy("y").shape == (1, 16)


def _entries(cache: Path) -> list[Path]:
    return sorted((cache / "executables").glob("*/*.bin"))


def test_corrupt_cache_entries_are_recompiled(repo: Path, tmp_path: Path, capsys: Any) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    env = {"REACTANTSERVER_WORKER_CACHE_DIR": str(cache)}
    with running_worker(repo, tmp_path / "fill.log", env) as worker:
        _serve_correctly(worker, repo)
        compiled = worker.metric(MISSES)
    entries = _entries(cache)
    assert len(entries) == compiled >= len(DAMAGE)
    sizes = {blob.name: blob.stat().st_size for blob in entries}
    damaged: dict[str, str] = {}
    for i, blob in enumerate(entries):
        damage = DAMAGE[i % len(DAMAGE)]
        damage(blob)
        damaged[blob.name] = damage.__name__
    with running_worker(repo, tmp_path / "damaged.log", env) as worker:
        _serve_correctly(worker, repo)
        hits, misses = worker.metric(HITS), worker.metric(MISSES)
        log = worker.log_tail(200_000)
    with capsys.disabled():
        print(f"\n[faults] cache entries damaged={len(damaged)} -> hits={hits:g} misses={misses:g}")
    # Only the note was garbled on some entries: their blob is intact and still a hit.
    notes_only = sum(1 for how in damaged.values() if how == "_garble_note")
    assert (hits, misses) == (notes_only, len(entries) - notes_only), (damaged, log)
    assert "dropping unusable entry" in log
    assert {blob.name: blob.stat().st_size for blob in _entries(cache)} == sizes
    for blob in _entries(cache):
        if damaged[blob.name] != "_garble_note":
            json.loads(blob.with_suffix(".json").read_bytes())
    with running_worker(repo, tmp_path / "healed.log", env) as worker:
        _serve_correctly(worker, repo)
        assert (worker.metric(HITS), worker.metric(MISSES)) == (len(entries), 0)
