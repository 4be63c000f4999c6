"""Importing a bundle's ``model.py`` the way the server does,
and checking hook results the way the server does.

The file is imported under a unique module name, with ``register_model``,
``register_meta_model``, ``NamedTensor``, ``InvalidArgumentError`` and ``BUNDLE_DIR`` injected,
and must make exactly one registration of the bundle's kind.
"""

from __future__ import annotations

import importlib.util
import itertools
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from reactantserver.core import hooks
from reactantserver.core.errors import BundleError, InvalidArgumentError
from reactantserver.core.manifest import MODEL_PY_FILENAME
from reactantserver.core.types import Batch, Fixed, TensorSpec

__all__ = ["hook_problems", "load_registration"]

_generation = itertools.count()
_NOT_IDENTIFIER = re.compile(r"\W")


def load_registration(bundle_dir: Path, model_name: str, kind: str) -> hooks.Registration:
    """Import ``<bundle_dir>/model.py`` and return its one registration of ``kind``.

    Raises :class:`BundleError` for an import failure, no or several registrations, or the
    wrong kind.
    """
    path = bundle_dir / MODEL_PY_FILENAME
    module_name = (
        f"reactantserver_bundle_{_NOT_IDENTIFIER.sub('_', model_name)}_{next(_generation)}"
    )
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise BundleError(f"{path}: cannot be imported")
    module = importlib.util.module_from_spec(spec)
    module.__dict__.update(
        register_model=hooks.register_model,
        register_meta_model=hooks.register_meta_model,
        NamedTensor=hooks.NamedTensor,
        InvalidArgumentError=InvalidArgumentError,
        BUNDLE_DIR=bundle_dir,
    )
    with hooks.collect_registrations() as registrations:
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            raise BundleError(f"{path}: import failed: {type(exc).__name__}: {exc}") from exc
        finally:
            sys.modules.pop(module_name, None)
    if len(registrations) != 1:
        raise BundleError(
            f"{path}: made {len(registrations)} registrations; exactly one "
            f"register_{'model' if kind == 'model' else 'meta_model'}() call is required"
        )
    registration = registrations[0]
    if registration.kind != kind:
        raise BundleError(
            f"{path}: kind: {kind} bundles must call "
            f"register_{'model' if kind == 'model' else 'meta_model'}(), not "
            f"register_{'model' if registration.kind == 'model' else 'meta_model'}()"
        )
    return registration


def hook_problems(
    hook: str,
    tensors: Sequence[hooks.NamedTensor],
    specs: Sequence[TensorSpec],
    *,
    rows: int | None,
) -> list[str]:
    """How a hook's result breaks the server's checks: exact name set, dtype, rank, fixed
    extents and one common batch-axis row count (``rows`` when given)."""
    if not isinstance(tensors, list) or not all(isinstance(t, hooks.NamedTensor) for t in tensors):
        return [f"{hook} must return a list of NamedTensor, got {type(tensors).__name__}"]
    got = {t.name: t for t in tensors}
    want = {s.name: s for s in specs}
    problems = []
    if len(got) != len(tensors):
        problems.append(f"{hook} returned a tensor name twice")
    if set(got) != set(want):
        problems.append(f"{hook} returned tensors {sorted(got)}, expected {sorted(want)}")
    for name in sorted(set(got) & set(want)):
        tensor, spec = got[name], want[name]
        where = f"{hook} output {name!r}"
        try:
            dtype = tensor.dtype
        except ValueError as exc:
            problems.append(f"{where}: {exc}")
            continue
        if dtype != spec.dtype:
            problems.append(f"{where}: dtype {dtype.token}, expected {spec.dtype.token}")
        if len(tensor.shape) != len(spec.shape):
            problems.append(f"{where}: rank {len(tensor.shape)}, expected {len(spec.shape)}")
            continue
        for axis, (size, dim) in enumerate(zip(tensor.shape, spec.shape, strict=True)):
            if isinstance(dim, Fixed) and size != dim.size:
                problems.append(f"{where}: axis {axis} has {size}, expected {dim.size}")
            if isinstance(dim, Batch):
                if rows is None:
                    rows = size  # the first batched tensor sets the count the others must match
                elif size != rows:
                    problems.append(f"{where}: batch axis {axis} has {size} rows, expected {rows}")
    return problems
