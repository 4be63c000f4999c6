"""``validate``: does a bundle load, compile, and compute what it should?

Every module is compiled with the worker's backend and its entry signature checked against
the manifest and the weights header; every (variant, batch size) then runs on seeded random
inputs through preprocess -> execute -> postprocess and, with a reference function, is
compared with it::

    report = validate("models/mlp", reference=forward, params=params)
    print(report.to_text())
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

from reactantserver.core.dtypes import DType
from reactantserver.core.errors import BundleError, ManifestError
from reactantserver.core.hooks import NamedTensor
from reactantserver.core.manifest import Manifest, load_manifest, resolve_layout
from reactantserver.core.types import Batch, Fixed, TensorSpec
from reactantserver.export._errors import ExportError
from reactantserver.export._export import needs_x64
from reactantserver.export._hooks_loader import load_registration
from reactantserver.export._lower import flatten_outputs
from reactantserver.export._params import unflatten
from reactantserver.export._report import ModuleReport, OutputReport, ValidationReport
from reactantserver.export._session import BundleSession, ModuleIndex
from reactantserver.export._signature import expected_shape, variant_sizes

__all__ = ["DEFAULT_VARIABLE_SIZE", "random_inputs", "validate", "worker_backend"]

DEFAULT_VARIABLE_SIZE = 8
"""Extent given to a variable client axis that no variant sizes."""

_FLOATS = frozenset({DType.F16, DType.F32, DType.F64, DType.BF16, DType.F8_E5M2, DType.F8_E4M3})
_INT_HIGH = 64


def worker_backend(platform: str) -> Any:
    """The worker's jax backend for ``platform`` (``cpu``/``cuda``); a clear error when the
    worker (the ``validate`` extra) is not installed."""
    try:
        from reactantserver.worker.runtime.jax_backend import JaxBackend
    except ImportError as exc:
        raise ExportError(
            "validate compiles with the worker's backend, but reactantserver-worker is not "
            "installed: pip install 'reactantserver-export[validate]' "
            f"({type(exc).__name__}: {exc})"
        ) from exc
    try:
        return JaxBackend(platform)
    except (ValueError, RuntimeError) as exc:
        raise ExportError(f"backend {platform!r} is not available here: {exc}") from exc


def _random_array(
    spec: TensorSpec, letters: str, rows: int | None, sizes: dict[str, int], rng: Any
) -> np.ndarray[Any, Any]:
    shape = []
    for letter, dim in zip(letters, spec.shape, strict=True):
        if isinstance(dim, Fixed):
            shape.append(dim.size)
        elif isinstance(dim, Batch):
            shape.append(rows or 1)
        else:
            shape.append(sizes.get(letter, DEFAULT_VARIABLE_SIZE))
    if spec.dtype is DType.BYTES:
        raise ExportError(f"input {spec.name!r}: cannot generate random bytes tensors")
    if spec.dtype in _FLOATS:
        values = rng.uniform(-1.0, 1.0, shape)
    elif spec.dtype is DType.BOOL:
        values = rng.integers(0, 2, shape)
    else:
        values = rng.integers(0, _INT_HIGH + 1, shape)
    return np.asarray(values).astype(spec.dtype.numpy)


def random_inputs(manifest: Manifest, index: ModuleIndex, seed: int) -> list[NamedTensor]:
    """Seeded random client inputs for one module: floats U[-1, 1), ints [0, 64], random
    bools; the generator is seeded with ``seed + B``."""
    variant, batch = index
    rng = np.random.default_rng(seed + batch)
    sizes = variant_sizes(manifest, variant)
    return [
        NamedTensor(spec.name, _random_array(spec, letters, batch or None, sizes, rng))
        for spec, letters in zip(
            manifest.client_inputs, manifest.letters.client_inputs, strict=True
        )
    ]


def _compare(
    name: str, got: np.ndarray[Any, Any], want: np.ndarray[Any, Any], rtol: float, atol: float
) -> OutputReport:
    report = OutputReport(name, "executable", tuple(got.shape), str(got.dtype), ok=False)
    if got.shape != want.shape:
        report.note = f"shape {list(got.shape)} but the reference gives {list(want.shape)}"
        return report
    if got.dtype != want.dtype:
        report.note = f"dtype {got.dtype} but the reference gives {want.dtype}"
        return report
    dtype = DType.from_numpy(got.dtype)
    a, b = got.astype(np.float64), want.astype(np.float64)
    diff = np.abs(a - b)
    report.max_abs = float(diff.max()) if diff.size else 0.0
    scale = np.maximum(np.abs(b), np.finfo(np.float64).tiny)
    report.max_rel = float((diff / scale).max()) if diff.size else 0.0
    if dtype in _FLOATS:
        report.ok = bool(np.all(diff <= atol + rtol * np.abs(b)))
        if not report.ok:
            report.note = f"exceeds atol {atol:g} + rtol {rtol:g}*|reference|"
    else:
        report.ok = bool(np.array_equal(got, want))
        if not report.ok:
            report.note = "differs from the reference (integers and bools must match exactly)"
    return report


def _plain_check(
    name: str, stage: str, got: np.ndarray[Any, Any], spec: TensorSpec, want: tuple[int | None, ...]
) -> OutputReport:
    report = OutputReport(name, stage, tuple(got.shape), str(got.dtype), ok=True)
    if DType.from_numpy(got.dtype) != spec.dtype:
        report.ok, report.note = False, f"dtype {got.dtype}, manifest says {spec.dtype.token}"
    elif len(got.shape) != len(want) or any(
        w is not None and w != g for w, g in zip(want, got.shape, strict=False)
    ):
        report.ok = False
        report.note = (
            f"shape {list(got.shape)}, manifest says {['?' if w is None else w for w in want]}"
        )
    elif spec.dtype in _FLOATS and not np.all(np.isfinite(got.astype(np.float64))):
        report.ok, report.note = False, "non-finite values"
    return report


def _run_module(
    *,
    session: BundleSession,
    index: ModuleIndex,
    report: ModuleReport,
    reference: Callable[..., Any] | None,
    params: Any,
    options: ValidationReport,
) -> None:
    manifest = session.manifest
    batch = index[1]
    rows = batch or None
    try:
        exe_inputs = session.preprocess(random_inputs(manifest, index, options.seed), rows)
        arrays = [t.data for t in exe_inputs]
        results = session.execute(index, arrays)
    except Exception as exc:
        report.problems.append(f"run failed: {type(exc).__name__}: {exc}")
        return
    report.ran = True
    expected = None
    if reference is not None:
        try:
            values, _ = flatten_outputs(reference(params, *arrays))
            expected = [np.asarray(v) for v in values]
        except Exception as exc:
            report.problems.append(f"reference failed: {type(exc).__name__}: {exc}")
            return
        if len(expected) != len(results):
            report.problems.append(
                f"the module returns {len(results)} outputs, the reference {len(expected)}"
            )
            return
    for i, (spec, result) in enumerate(zip(manifest.executable_outputs, results, strict=True)):
        letters = manifest.letters.executable_outputs[i]
        want = expected_shape(spec, letters, batch, {})
        checked = _plain_check(spec.name, "executable", result, spec, want)
        if checked.ok and expected is not None:
            checked = _compare(spec.name, result, expected[i], options.rtol, options.atol)
        report.outputs.append(checked)
    registration = session.registration
    if registration is None or registration.postprocess is None:
        return
    try:
        named = [
            NamedTensor(s.name, r)
            for s, r in zip(manifest.executable_outputs, results, strict=True)
        ]
        client = session.postprocess(named, rows)
    except Exception as exc:
        report.problems.append(f"postprocess failed: {type(exc).__name__}: {exc}")
        return
    for spec, letters, tensor in zip(
        manifest.client_outputs, manifest.letters.client_outputs, client, strict=True
    ):
        want = expected_shape(spec, letters, batch, {})
        report.outputs.append(_plain_check(spec.name, "client", tensor.data, spec, want))


def _validate_meta(report: ValidationReport, bundle: Path, manifest: Manifest) -> None:
    try:
        resolve_layout(bundle, manifest)
        load_registration(bundle, manifest.name, "meta")
    except (BundleError, ManifestError) as exc:
        report.problems.append(str(exc))
        return
    calls = ", ".join(manifest.meta_calls) or "no sub-models"
    report.notes.append(
        f"meta model: manifest and model.py registration are valid; running it needs the "
        f"server (it calls {calls})"
    )


def validate(
    bundle_dir: str | os.PathLike[str],
    *,
    reference: Callable[..., Any] | None = None,
    params: Any = None,
    rtol: float = 1e-3,
    atol: float = 1e-3,
    seed: int = 1234,
    backend: str = "cpu",
) -> ValidationReport:
    """Validate a bundle; the report's ``ok`` is the verdict.

    ``reference(params, *executable_inputs)`` is the original function; ``params`` defaults
    to the bundle's own weights rebuilt into nested dicts from their ``/``-joined names.
    Problems with the bundle are reported, not raised; :class:`ExportError` is raised only
    when the worker backend is missing or unavailable.
    """
    bundle = Path(bundle_dir)
    report = ValidationReport(
        bundle,
        reference=reference is not None,
        rtol=rtol,
        atol=atol,
        seed=seed,
        backend=backend,
    )
    try:
        manifest = load_manifest(bundle)
    except (BundleError, ManifestError) as exc:
        report.problems.append(str(exc))
        return report
    report.kind = manifest.kind
    if manifest.is_meta:
        _validate_meta(report, bundle, manifest)
        return report
    device = worker_backend(backend)
    try:
        session = BundleSession(bundle, device)
    except (BundleError, ManifestError) as exc:
        report.problems.append(str(exc))
        return report
    report.notes += list(session.layout.warnings)
    dtypes = [s.dtype for s in manifest.executable_inputs + manifest.executable_outputs]
    dtypes += [w.dtype for w in session.weight_specs]
    with session, jax.enable_x64(True) if needs_x64(dtypes) else contextlib.nullcontext():
        if reference is not None and params is None:
            params = unflatten(dict(zip(session.weight_names, session.weights, strict=True)))
        for index in session.indices:
            module = ModuleReport(session.module_path(index).name, *index)
            report.modules.append(module)
            problems = session.check(index)
            if problems:
                module.servable = False
                module.problems += problems
                continue
            try:
                session.compile(index)
            except Exception as exc:
                module.servable = False
                module.problems.append(f"UNSERVABLE: compile failed: {type(exc).__name__}: {exc}")
                continue
            _run_module(
                session=session,
                index=index,
                report=module,
                reference=reference,
                params=params,
                options=report,
            )
    return report
