"""Bundle manifests: parse, validate and normalise ``manifest.yaml``; resolve a bundle's files.

Format 3.0 (row-major letters) and format 2.0 (ReactantServer.jl, column-major letters) are
both accepted; a 2.0 manifest is normalised at parse time, so nothing downstream sees 2.0
::

    manifest = load_manifest(Path("/models/resnet"))
    layout = resolve_layout(Path("/models/resnet"), manifest)
    layout.module_path(None, 8)      # Path("/models/resnet/model.b8.mlir")
    manifest.wire_batch_axis         # 1 for an `nchw` input
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped,unused-ignore]

from reactantserver.core.errors import BundleError, ManifestError
from reactantserver.core.manifest._layout import (
    MANIFEST_FILENAME,
    MLIR_BYTECODE_MAGIC,
    MODEL_PY_FILENAME,
    WEIGHTS_FILENAME,
    BundleLayout,
    ModuleFile,
    is_mlir_bytecode,
    module_filename,
    resolve_layout,
)
from reactantserver.core.manifest._parse import parse_manifest
from reactantserver.core.manifest._tensors import BATCH_LETTER, VARIABLE_SIZE
from reactantserver.core.manifest._types import (
    AxisLetters,
    Kind,
    Manifest,
    SourceFormat,
    VariableAxis,
    Variant,
)

__all__ = [
    "BATCH_LETTER",
    "MANIFEST_FILENAME",
    "MLIR_BYTECODE_MAGIC",
    "MODEL_NAME_PATTERN",
    "MODEL_PY_FILENAME",
    "VARIABLE_SIZE",
    "WEIGHTS_FILENAME",
    "AxisLetters",
    "BundleLayout",
    "Kind",
    "Manifest",
    "ModuleFile",
    "SourceFormat",
    "VariableAxis",
    "Variant",
    "is_bundle_dir_name",
    "is_mlir_bytecode",
    "is_valid_model_name",
    "load_manifest",
    "module_filename",
    "parse_manifest",
    "resolve_layout",
]

MODEL_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
"""What a model name (a bundle's directory basename) must match."""

_MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_SKIPPED_SUFFIXES = (".tmp", ".old")
# The C loader is several times faster; both construct only plain YAML types.
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def is_valid_model_name(name: str) -> bool:
    """Whether ``name`` may name a model (:data:`MODEL_NAME_PATTERN`)."""
    # fullmatch, not `$`: `$` would also accept a name ending in a newline.
    return _MODEL_NAME.fullmatch(name) is not None


def is_bundle_dir_name(name: str) -> bool:
    """Whether a scanner looks at a directory entry: hidden names and in-flight or retired
    copies of an atomic publication (``<name>.tmp``, ``<name>.old``) are skipped."""
    return not name.startswith(".") and not name.endswith(_SKIPPED_SUFFIXES)


def load_manifest(bundle_dir: Path) -> Manifest:
    """Read, validate and normalise ``<bundle_dir>/manifest.yaml``.

    The model name is the directory's basename; ``model.py`` is looked for next to the
    manifest. Raises :class:`~reactantserver.core.errors.BundleError` for an invalid model
    name or an unreadable manifest, and :class:`~reactantserver.core.errors.ManifestError`
    for invalid YAML or a broken manifest rule.
    """
    bundle_dir = Path(bundle_dir)
    # abspath, not resolve(): a symlinked bundle is named by the link, as the scanner sees it.
    model_name = Path(os.path.abspath(bundle_dir)).name
    if not is_valid_model_name(model_name):
        raise BundleError(
            f"{bundle_dir}: invalid model name {model_name!r} (must match {MODEL_NAME_PATTERN})"
        )
    path = bundle_dir / MANIFEST_FILENAME
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        raise BundleError(f"{path}: missing: every bundle needs {MANIFEST_FILENAME}") from None
    except OSError as exc:
        raise BundleError(f"{path}: cannot read: {exc}") from exc
    try:
        data = yaml.load(text, Loader=_LOADER)
    except yaml.YAMLError as exc:
        raise ManifestError(f"{path}: invalid YAML: {exc}") from exc
    return parse_manifest(
        data,
        source=str(path),
        model_name=model_name,
        has_model_py=(bundle_dir / MODEL_PY_FILENAME).is_file(),
    )
