"""Turns a bundle directory into a loaded model: every module compiled once, signatures checked.

Runs on the loader thread (never the dispatch thread). All batch sizes and variants of a
model share one weights file, read with ``preadv`` from a descriptor kept for the life of
the generation::

    model = load_bundle(path, backend, cache)
    exe = model.module(variant=None, batch_size=8).executable
    host_weights = model.read_weights()
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeAlias

import attrs
import numpy as np

from reactantserver.core.errors import BundleError
from reactantserver.core.manifest import BundleLayout, Manifest, load_manifest, resolve_layout
from reactantserver.core.weights import (
    SafetensorsReader,
    WeightSpec,
    WeightStore,
    weights_digest,
)
from reactantserver.worker.runtime.backend import Backend, CompileSpec, Executable, Signature
from reactantserver.worker.runtime.executable_cache import ExecutableCache
from reactantserver.worker.runtime.signature import check_entry_signature
from reactantserver.worker.runtime.weight_cache import StoreWeightSource

__all__ = ["CompiledModule", "LoadedModel", "ModuleKey", "load_bundle"]

log = logging.getLogger(__name__)

#: (variant file index or ``None``, batch size; 0 = the unbatched ``model.mlir``).
ModuleKey: TypeAlias = tuple[int | None, int]


@attrs.frozen
class CompiledModule:
    """One compiled (variant, batch size) of a model."""

    key: ModuleKey
    path: Path
    executable: Executable
    signature: Signature


@attrs.define
class LoadedModel:
    """A bundle's compiled modules plus an open handle on its weights file."""

    name: str
    manifest: Manifest
    layout: BundleLayout
    modules: Mapping[ModuleKey, CompiledModule]
    weight_specs: tuple[WeightSpec, ...]
    weights: SafetensorsReader | None
    compile_seconds: float = 0.0

    @property
    def weight_nbytes(self) -> int:
        """Bytes of all weights (header arithmetic, nothing read)."""
        return sum(spec.nbytes for spec in self.weight_specs)

    @property
    def reverse_axes(self) -> bool:
        """Whether weights are stored axis-reversed (format 2.0 bundles)."""
        return self.manifest.source_format == "2.0"

    def module(self, variant: int | None, batch_size: int) -> CompiledModule:
        """The compiled module for a key; ``KeyError`` when it was not compiled."""
        return self.modules[(variant, batch_size)]

    def read_weights(self) -> list[np.ndarray[Any, Any]]:
        """Fresh host arrays of every weight, in ``argument_order`` (2.0: axis-reversed)."""
        if self.weights is None:
            return []
        return [
            self.weights.read(spec.name, reverse_axes=self.reverse_axes)
            for spec in self.weight_specs
        ]

    def weight_source(self, store: WeightStore) -> StoreWeightSource:
        """This generation's weights as the weight cache consumes them, floors kept in ``store``.

        The digest covers the file identity, so a weights-only update gets a new shared region.
        """
        if self.weights is None:
            raise BundleError(f"{self.layout.bundle_dir}: model has no weights file")
        digest = weights_digest(self.name, self.weight_specs, self.weights.identity)
        fill = functools.partial(self.weights.fill, reverse_axes=self.reverse_axes)
        return StoreWeightSource(store, self.name, digest, self.weight_specs, fill)

    def close(self) -> None:
        """Release the weights file descriptor (the generation is gone)."""
        if self.weights is not None:
            self.weights.close()


def load_bundle(
    bundle_dir: Path,
    backend: Backend,
    cache: ExecutableCache,
    *,
    opts: CompileSpec | None = None,
) -> LoadedModel:
    """Parse, check and compile a regular model's bundle (``BundleError`` on any mismatch)."""
    opts = opts or CompileSpec()
    manifest = load_manifest(bundle_dir)
    if manifest.is_meta:
        raise BundleError(f"{bundle_dir}: kind 'meta' bundles have no modules to compile")
    layout = resolve_layout(bundle_dir, manifest)
    reader = SafetensorsReader(layout.weights) if layout.weights is not None else None
    try:
        specs = tuple(reader.specs(reverse_axes=manifest.source_format == "2.0")) if reader else ()
        modules: dict[ModuleKey, CompiledModule] = {}
        started = time.perf_counter()
        for module_file in layout.modules:
            variant = None
            if module_file.variant is not None:
                variant = manifest.variants[module_file.variant]
            source = module_file.path.read_bytes()
            # A cache hit carries the signature, which spares an MLIR parse at start-up.
            signature = cache.cached_signature(source, opts) or backend.signature(source)
            check_entry_signature(
                signature,
                manifest,
                specs,
                batch_size=module_file.batch_size,
                variant=variant,
                file=module_file.path.name,
            )
            executable = cache.get_or_compile(
                source,
                opts,
                model=manifest.name,
                file=module_file.path.name,
                signature=signature,
            )
            key: ModuleKey = (module_file.variant, module_file.batch_size)
            modules[key] = CompiledModule(key, module_file.path, executable, signature)
        elapsed = time.perf_counter() - started
    except BaseException:
        if reader is not None:
            reader.close()
        raise
    log.info(
        "loaded %s: %d module(s), %d weight(s) of %d bytes, %.3f s",
        manifest.name,
        len(modules),
        len(specs),
        sum(s.nbytes for s in specs),
        elapsed,
    )
    return LoadedModel(manifest.name, manifest, layout, modules, specs, reader, elapsed)
