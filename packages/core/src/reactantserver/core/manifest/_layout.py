"""Bundle file layout: which module file serves each (variant, batch size), checked on disk.

The bundle's files (docs/reference/bundle.md): ``model.mlir`` (batch key 0) or one
``model.b{N}.mlir`` per compiled batch size;
with ``input_shapes`` the same per variant under the prefix ``model.v{i}``. Module files the
manifest does not use are ignored with a warning; missing ones are a ``BundleError``.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import attrs

from reactantserver.core.errors import BundleError
from reactantserver.core.manifest._types import Manifest

logger = logging.getLogger("reactantserver.core.manifest")

MANIFEST_FILENAME = "manifest.yaml"
"""The manifest's file name; a directory holding it is a bundle."""

WEIGHTS_FILENAME = "weights.safetensors"
"""The weights file, required for ``kind: model``."""

MODEL_PY_FILENAME = "model.py"
"""The optional hooks module (required for ``kind: meta``)."""

MLIR_BYTECODE_MAGIC = b"ML\xefR"
"""The 4-byte magic (``0x4D 0x4C 0xEF 0x52``) of MLIR bytecode / StableHLO portable artifacts."""

_MODULE_NAME = re.compile(r"model(?:\.v(\d+))?(?:\.b(\d+))?\.mlir")


def module_filename(variant: int | None, batch_size: int) -> str:
    """The module file name for a variant (``None`` without ``input_shapes``) and batch key.

    ``module_filename(None, 0) == "model.mlir"``; ``module_filename(2, 8) == "model.v2.b8.mlir"``.
    """
    prefix = "model" if variant is None else f"model.v{variant}"
    return f"{prefix}.mlir" if batch_size == 0 else f"{prefix}.b{batch_size}.mlir"


def is_mlir_bytecode(path: Path) -> bool:
    """Whether a module file is MLIR bytecode (by its magic) rather than MLIR text."""
    with open(path, "rb") as f:
        return f.read(len(MLIR_BYTECODE_MAGIC)) == MLIR_BYTECODE_MAGIC


@attrs.frozen
class ModuleFile:
    """One StableHLO module of a bundle.

    ``variant`` is the ``input_shapes`` index (``None`` without ``input_shapes``),
    ``batch_size`` the internal batch key (0 = the unbatched ``model[.v{i}].mlir``).
    """

    variant: int | None
    batch_size: int
    path: Path


@attrs.frozen
class BundleLayout:
    """The files a bundle's manifest asks for, all present on disk.

    ``warnings`` repeats what was logged about ignored module files, in name order.
    """

    bundle_dir: Path
    manifest: Path
    modules: tuple[ModuleFile, ...]
    weights: Path | None
    model_py: Path | None
    warnings: tuple[str, ...] = ()

    def module_path(self, variant: int | None, batch_size: int) -> Path:
        """The module file serving ``(variant, batch_size)``; ``KeyError`` if none does."""
        for module in self.modules:
            if module.variant == variant and module.batch_size == batch_size:
                return module.path
        raise KeyError((variant, batch_size))


def resolve_layout(bundle_dir: Path, manifest: Manifest) -> BundleLayout:
    """Check a bundle directory against its manifest and name every file to load.

    Raises :class:`~reactantserver.core.errors.BundleError` naming a missing module file,
    a missing ``weights.safetensors`` (``kind: model``) or a missing ``model.py``
    (``kind: meta``).
    """
    bundle_dir = Path(bundle_dir)
    if not bundle_dir.is_dir():
        raise BundleError(f"{bundle_dir}: not a directory")
    model_py = bundle_dir / MODEL_PY_FILENAME
    has_model_py = model_py.is_file()
    weights: Path | None = None
    modules: list[ModuleFile] = []
    if manifest.is_meta:
        if not has_model_py:
            raise BundleError(f"{model_py}: missing: required for kind: meta (it registers run)")
    else:
        weights = bundle_dir / WEIGHTS_FILENAME
        if not weights.is_file():
            raise BundleError(f"{weights}: missing: required for kind: model")
        modules = _modules(bundle_dir, manifest)
    expected = {module.path.name for module in modules}
    warnings = [
        f"{bundle_dir / name}: ignored: {_ignored_reason(manifest, match)}"
        for name in sorted(os.listdir(bundle_dir))
        if name not in expected and (match := _MODULE_NAME.fullmatch(name))
    ]
    for message in warnings:
        logger.warning("%s", message)
    return BundleLayout(
        bundle_dir=bundle_dir,
        manifest=bundle_dir / MANIFEST_FILENAME,
        modules=tuple(modules),
        weights=weights,
        model_py=model_py if has_model_py else None,
        warnings=tuple(warnings),
    )


def _modules(bundle_dir: Path, manifest: Manifest) -> list[ModuleFile]:
    variants: list[int | None] = [v.index for v in manifest.variants] or [None]
    modules = [
        ModuleFile(variant, batch, bundle_dir / module_filename(variant, batch))
        for variant in variants
        for batch in manifest.batch_keys
    ]
    missing = [module for module in modules if not module.path.is_file()]
    if missing:
        first, rest = missing[0], missing[1:]
        also = f"; also missing: {', '.join(m.path.name for m in rest)}" if rest else ""
        raise BundleError(f"{first.path}: missing module file ({_needed_by(first)}){also}")
    return modules


def _needed_by(module: ModuleFile) -> str:
    parts = []
    if module.variant is not None:
        parts.append(f"input_shapes[{module.variant}]")
    if module.batch_size:
        parts.append(f"batching.compiled_batch_sizes lists {module.batch_size}")
    else:
        parts.append("batching.compiled_batch_sizes is empty")
    return "; ".join(parts)


def _ignored_reason(manifest: Manifest, match: re.Match[str]) -> str:  # noqa: PLR0911
    variant = None if match[1] is None else int(match[1])
    batch = None if match[2] is None else int(match[2])
    if manifest.is_meta:
        return "a meta model has no modules"
    if variant is not None and not manifest.variants:
        return "the manifest declares no input_shapes"
    if variant is None and manifest.variants:
        return "the manifest declares input_shapes; variants use model.v{i}… files"
    if variant is not None and variant >= len(manifest.variants):
        return f"input_shapes has {len(manifest.variants)} entries"
    if batch is None and manifest.compiled_batch_sizes:
        return "batching.compiled_batch_sizes is non-empty; model.b{N}.mlir modules are used"
    if batch is not None and not manifest.compiled_batch_sizes:
        return "batching.compiled_batch_sizes is empty; the unbatched module is used"
    if batch is not None and batch not in manifest.compiled_batch_sizes:
        return f"batch size {batch} is not in batching.compiled_batch_sizes"
    return "not the canonical module file name"
