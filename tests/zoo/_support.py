"""What the zoo tests share: requirements, exporting a catalogue, serving it, parity checks."""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from reactantserver.export import validate
from tests.worker_e2e._harness import WorkerProcess
from tests.zoo._catalogue import ZooModel

__all__ = [
    "ZOO_START_S",
    "assert_parity",
    "export_all",
    "infer",
    "require",
    "sample",
    "serve",
    "validate_against_eager",
]

ZOO_START_S = 900.0
"""The worker compiles every (bundle x batch size) module before it is ready (not a timing
assertion)."""


def require(*modules: str) -> None:
    """Skip the module when a framework is missing, except under ``nox -s zoo``
    (``REACTANT_ZOO=1``), which installs them all: there a missing one is an error."""
    for name in modules:
        if os.environ.get("REACTANT_ZOO") == "1":
            importlib.import_module(name)
        else:
            pytest.importorskip(name)


def export_all(entries: Sequence[ZooModel], models: Path) -> dict[str, BaseException]:
    """Export every entry into ``models``; the failures by bundle name (the others passed)."""
    failures: dict[str, BaseException] = {}
    for entry in entries:
        try:
            entry.export(models)
        except Exception as exc:  # reported by that entry's tests, not the others'
            failures[entry.name] = exc
    return failures


def sample(entry: ZooModel, batch: int, seed: int = 0) -> np.ndarray[Any, Any]:
    """A seeded input batch for ``entry``: floats uniform in [-1, 1), token ids in [0, 64]."""
    rng = np.random.default_rng(seed + batch)
    spec = entry.inputs[0]
    dims = spec[spec.index("[") + 1 : -1].split(",")
    shape = [batch if d == "n" else int(d.split("=")[1]) for d in dims]
    if "=i32[" in spec:
        return rng.integers(0, 65, size=shape, dtype=np.int32)
    return rng.uniform(-1.0, 1.0, size=shape).astype(np.float32)


def assert_parity(entry: ZooModel, x: np.ndarray[Any, Any], got: np.ndarray[Any, Any]) -> float:
    """``got`` matches the f32 eager output within the entry's bound; the relative error."""
    want = entry.eager_f32(x)
    assert got.shape == want.shape, (entry.name, got.shape, want.shape)
    scale = float(np.abs(want).max())
    assert scale > 0, f"{entry.name}: the eager output is all zeros; parity would be vacuous"
    error = float(np.abs(got.astype(np.float32) - want).max()) / scale
    bound = entry.tolerance(x)
    assert error <= bound, (
        f"{entry.name} batch {x.shape[0]}: max |served - eager f32| = {error:.3g} x max |eager| "
        f"({scale:.3g}), above {bound:.3g}"
    )
    print(f"parity {entry.name} batch {x.shape[0]}: {error:.2e} (bound {bound:.2e}) of {scale:.3g}")
    return error


def validate_against_eager(entry: ZooModel, bundle: Path) -> None:
    """``validate``: every module compiles with the worker backend, is servable, and runs on
    seeded inputs within the entry's bound of the f32 eager output (the bound and the scale
    taken from a seeded batch of 8)."""
    probe = sample(entry, 8, seed=99)
    scale = float(np.abs(entry.eager_f32(probe)).max())
    atol = entry.tolerance(probe) * scale

    def reference(params: Any, x: Any) -> Any:
        del params
        return entry.eager_f32(np.asarray(x))

    report = validate(bundle, reference=reference, rtol=0.0, atol=atol * 2)
    assert report.ok, report.to_text()
    assert sorted(m.batch_size for m in report.modules) == [1, 8, 32], report.to_text()


def infer(worker: WorkerProcess, entry: ZooModel, x: np.ndarray[Any, Any]) -> Any:
    """``entry``'s first output for ``x``, served by ``worker`` through tritonclient."""
    name = entry.inputs[0].split("=")[0]
    output = entry.outputs[0].split("=")[0]
    datatype = "INT32" if x.dtype == np.int32 else "FP32"
    given = grpcclient.InferInput(name, list(x.shape), datatype)
    given.set_data_from_numpy(x)
    with grpcclient.InferenceServerClient(worker.url) as client:
        result = client.infer(entry.name, [given], client_timeout=300)
    return result.as_numpy(output)


def serve(repo: Path, log: Path) -> Iterator[WorkerProcess]:
    """A ready worker over ``repo`` (static mode); stopped at the end."""
    process = WorkerProcess(repo, log, {"REACTANTSERVER_WORKER_MODEL_CONTROL_MODE": "static"})
    process.start()
    try:
        process.wait_ready(ZOO_START_S)
        yield process
    finally:
        code = process.stop()
    assert code == 0, f"the worker exited with {code}:\n{process.log_tail()}"
