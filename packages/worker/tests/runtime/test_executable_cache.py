"""The on-disk executable cache: hits across processes, corrupt entries rebuilt, size cap."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from packages.worker.tests.conftest import BundleMaker, Tensor, export_module
from reactantserver.worker.runtime.backend import CompileSpec
from reactantserver.worker.runtime.executable_cache import ExecutableCache, cache_key
from reactantserver.worker.runtime.jax_backend import JaxBackend

X = Tensor("x", "f32", "nk", {"k": 4})


def _module(scale: float = 2.0) -> bytes:
    return export_module(lambda x: jnp.sin(x) * scale, [X], [], 3)


@pytest.fixture(scope="module")
def backend() -> JaxBackend:
    return JaxBackend("cpu")


def _entries(root: Path) -> list[Path]:
    return sorted(root.glob("*/*.bin"))


def test_miss_then_hit(backend: JaxBackend, tmp_path: Path) -> None:
    cache = ExecutableCache(tmp_path, backend)
    module = _module()
    cache.get_or_compile(module, CompileSpec(), model="m", file="model.b3.mlir")
    assert (cache.counters.misses, cache.counters.hits, cache.counters.compiles) == (1, 0, 1)
    (entry,) = _entries(tmp_path)
    assert entry.name == f"{cache_key(module, CompileSpec(), backend)}.bin"
    note = json.loads(entry.with_suffix(".json").read_text())
    assert (note["model"], note["file"]) == ("m", "model.b3.mlir")
    exe = cache.get_or_compile(module, CompileSpec())
    assert (cache.counters.hits, cache.counters.compiles) == (1, 1)
    (out,) = backend.execute(exe, [backend.to_device(np.ones((3, 4), np.float32))])
    np.testing.assert_allclose(backend.to_host(out), np.sin(np.ones((3, 4))) * 2, rtol=1e-6)


def test_key_changes_with_module_and_options(backend: JaxBackend) -> None:
    keys = {
        cache_key(_module(2.0), CompileSpec(), backend),
        cache_key(_module(3.0), CompileSpec(), backend),
        cache_key(_module(2.0), CompileSpec(numerics="f32"), backend),
        cache_key(_module(2.0), CompileSpec(autotune=False), backend),
    }
    assert len(keys) == 4


def test_corrupt_entry_is_dropped_and_rebuilt(backend: JaxBackend, tmp_path: Path) -> None:
    module = _module()
    ExecutableCache(tmp_path, backend).get_or_compile(module, CompileSpec())
    (entry,) = _entries(tmp_path)
    entry.write_bytes(b"garbage" * 10)
    cache = ExecutableCache(tmp_path, backend)
    exe = cache.get_or_compile(module, CompileSpec())
    assert (cache.counters.corrupt, cache.counters.compiles) == (1, 1)
    assert entry.read_bytes() != b"garbage" * 10
    (out,) = backend.execute(exe, [backend.to_device(np.zeros((3, 4), np.float32))])
    assert backend.to_host(out).shape == (3, 4)


@pytest.mark.parametrize("damage", ["memory-kind", "truncated", "unsealed"])
def test_damaged_entry_never_reaches_the_runtime(
    backend: JaxBackend, tmp_path: Path, damage: str
) -> None:
    # "memory-kind": one flipped bit the runtime deserialises happily, then aborts the process
    # on first use (a fault test found it); the checksum catches it before deserialisation.
    module = _module()
    ExecutableCache(tmp_path, backend).get_or_compile(module, CompileSpec())
    (entry,) = _entries(tmp_path)
    sealed = entry.read_bytes()
    damaged = {
        "memory-kind": sealed.replace(b"device", b"ddvice", 1),
        "truncated": sealed[:-1],
        "unsealed": backend.serialize(backend.compile(module, CompileSpec())),
    }[damage]
    assert damaged != sealed
    entry.write_bytes(damaged)
    cache = ExecutableCache(tmp_path, backend)
    exe = cache.get_or_compile(module, CompileSpec())
    assert (cache.counters.corrupt, cache.counters.compiles) == (1, 1)
    assert entry.read_bytes() != damaged
    (out,) = backend.execute(exe, [backend.to_device(np.ones((3, 4), np.float32))])
    np.testing.assert_allclose(backend.to_host(out), np.sin(np.ones((3, 4))) * 2, rtol=1e-6)


def test_unsafe_directory_disables_the_cache(backend: JaxBackend, tmp_path: Path) -> None:
    root = tmp_path / "shared"
    root.mkdir()
    root.chmod(0o777)
    cache = ExecutableCache(root, backend)
    assert not cache.enabled
    cache.get_or_compile(_module(), CompileSpec())
    assert cache.counters.compiles == 1
    assert _entries(root) == []


def test_size_cap_prunes_least_recently_used(backend: JaxBackend, tmp_path: Path) -> None:
    cache = ExecutableCache(tmp_path, backend)
    first, second = _module(2.0), _module(3.0)
    cache.get_or_compile(first, CompileSpec())
    (old,) = _entries(tmp_path)
    os.utime(old, (1, 1))  # make it the least recently used
    size = old.stat().st_size
    capped = ExecutableCache(tmp_path, backend, max_bytes=size + size // 2)
    capped.get_or_compile(second, CompileSpec())
    assert not old.exists()
    assert len(_entries(tmp_path)) == 1
    assert capped.counters.pruned == 1


START = textwrap.dedent(
    """
    import hashlib, json, sys
    from pathlib import Path
    import numpy as np
    from reactantserver.worker.runtime.jax_backend import JaxBackend
    from reactantserver.worker.runtime.executable_cache import ExecutableCache
    from reactantserver.worker.runtime.loader import load_bundle

    backend = JaxBackend("cpu")
    cache = ExecutableCache(Path(sys.argv[2]), backend)
    model = load_bundle(Path(sys.argv[1]), backend, cache)
    digest = hashlib.sha256()
    for key in sorted(model.modules, key=str):
        batch = key[1]
        x = np.linspace(-1, 1, batch * 4, dtype=np.float32).reshape(batch, 4)
        args = [backend.to_device(x)] + [backend.to_device(w) for w in model.read_weights()]
        for out in backend.execute(model.modules[key].executable, args):
            digest.update(backend.to_host(out).tobytes())
    c = cache.counters
    print(json.dumps({"compiles": c.compiles, "hits": c.hits, "digest": digest.hexdigest()}))
    """
)


@pytest.mark.slow
def test_second_process_start_skips_compilation(make_bundle: BundleMaker, tmp_path: Path) -> None:
    weights = [("w", np.full((4, 4), 0.5, np.float32))]
    bundle = make_bundle(
        "proc",
        lambda x, w: jnp.tanh(x @ w),
        inputs=[X],
        outputs=[Tensor("y", "f32", "nk", {"k": 4})],
        weights=weights,
        batch_sizes=[1, 2, 8],
    )
    runs = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", START, str(bundle), str(tmp_path / "cache")],
            capture_output=True,
            text=True,
            check=True,
        )
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert (runs[0]["compiles"], runs[0]["hits"]) == (3, 0)
    assert (runs[1]["compiles"], runs[1]["hits"]) == (0, 3)
    assert runs[0]["digest"] == runs[1]["digest"]


def test_signature_is_recorded_with_the_entry(backend: JaxBackend, tmp_path: Path) -> None:
    cache = ExecutableCache(tmp_path, backend)
    module = _module()
    assert cache.cached_signature(module, CompileSpec()) is None
    parsed = backend.signature(module)
    cache.get_or_compile(module, CompileSpec(), signature=parsed)
    assert cache.cached_signature(module, CompileSpec()) == parsed
    (entry,) = _entries(tmp_path)
    entry.with_suffix(".json").write_text("{not json")
    assert cache.cached_signature(module, CompileSpec()) is None
