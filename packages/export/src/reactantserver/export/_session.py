"""A bundle loaded for local runs through the worker backend: modules, weights, hooks.

``validate`` drives it module by module; :meth:`BundleSession.infer` runs a request the way
the server would (preprocess, pad to a compiled batch size, execute, slice, postprocess), which
is enough to drive a meta model's sub-calls in tests::

    with BundleSession(Path("models/mlp"), JaxBackend("cpu")) as session:
        (logits,) = session.infer([NamedTensor("x", x)])
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from reactantserver.core.errors import BundleError
from reactantserver.core.hooks import NamedTensor, Registration
from reactantserver.core.manifest import BundleLayout, Manifest, load_manifest, resolve_layout
from reactantserver.core.weights import SafetensorsReader, WeightSpec
from reactantserver.export._hooks_loader import hook_problems, load_registration

__all__ = ["BundleSession", "ModuleIndex"]

ModuleIndex = tuple[int | None, int]


class BundleSession:
    """One bundle on one backend (``reactantserver.worker.runtime.jax_backend.JaxBackend``).

    Construction parses the manifest, resolves the files, reads the weights and imports
    ``model.py``; it raises ``ManifestError``/``BundleError`` naming the problem.
    """

    def __init__(self, bundle_dir: Path, backend: Any) -> None:
        self.bundle_dir = Path(bundle_dir)
        self.backend = backend
        self.manifest: Manifest = load_manifest(self.bundle_dir)
        self.layout: BundleLayout = resolve_layout(self.bundle_dir, self.manifest)
        self.registration: Registration | None = None
        if self.layout.model_py is not None:
            self.registration = load_registration(
                self.bundle_dir, self.manifest.name, self.manifest.kind
            )
        self.weight_specs: list[WeightSpec] = []
        self.weights: list[np.ndarray[Any, Any]] = []
        self.weight_names: tuple[str, ...] = ()
        if self.layout.weights is not None:
            reverse = self.manifest.source_format == "2.0"
            with SafetensorsReader(self.layout.weights) as reader:
                self.weight_specs = reader.specs(reverse_axes=reverse)
                self.weights = [reader.read(n, reverse_axes=reverse) for n in reader.argument_order]
                self.weight_names = reader.argument_order
        self._device_weights: list[Any] | None = None
        self._executables: dict[ModuleIndex, Any] = {}

    # -- modules -----------------------------------------------------------------------------

    @property
    def indices(self) -> list[ModuleIndex]:
        """Every (variant, batch size) with a module, in file order."""
        return [(m.variant, m.batch_size) for m in self.layout.modules]

    def module_path(self, index: ModuleIndex) -> Path:
        """The module file of ``index``."""
        return self.layout.module_path(*index)

    def check(self, index: ModuleIndex) -> list[str]:
        """Signature problems of a module (empty when it is servable)."""
        module = self.module_path(index).read_bytes()
        try:
            signature = self.backend.signature(module)
        except BundleError as exc:
            return [f"UNSERVABLE: {exc}"]
        from reactantserver.worker.runtime.signature import signature_problems

        variant, batch = index
        return signature_problems(
            signature,
            self.manifest,
            self.weight_specs,
            batch_size=batch,
            variant=None if variant is None else self.manifest.variants[variant],
            file=self.module_path(index).name,
        )

    def compile(self, index: ModuleIndex) -> Any:
        """Compile (once) and return the executable of a module."""
        exe = self._executables.get(index)
        if exe is None:
            from reactantserver.worker.runtime.backend import CompileSpec

            exe = self.backend.compile(self.module_path(index).read_bytes(), CompileSpec())
            self._executables[index] = exe
        return exe

    def execute(
        self, index: ModuleIndex, inputs: Sequence[np.ndarray[Any, Any]]
    ) -> list[np.ndarray[Any, Any]]:
        """Run a module on executable inputs (manifest order); host results."""
        exe = self.compile(index)
        if self._device_weights is None:
            self._device_weights = [self.backend.to_device(w) for w in self.weights]
        args = [self.backend.to_device(np.ascontiguousarray(x)) for x in inputs]
        try:
            results = self.backend.execute(exe, [*args, *self._device_weights])
            try:
                return [self.backend.to_host(r) for r in results]
            finally:
                for result in results:
                    self.backend.free(result)
        finally:
            for arg in args:
                self.backend.free(arg)

    # -- hooks -------------------------------------------------------------------------------

    def preprocess(self, inputs: list[NamedTensor], rows: int | None) -> list[NamedTensor]:
        """Client inputs -> executable inputs in manifest order, checked like the server."""
        tensors = inputs
        if self.registration is not None and self.registration.preprocess is not None:
            tensors = self.registration.preprocess(inputs)
            problems = hook_problems(
                "preprocess", tensors, self.manifest.executable_inputs, rows=rows
            )
            if problems:
                raise BundleError("; ".join(problems))
        by_name = {t.name: t for t in tensors}
        return [by_name[spec.name] for spec in self.manifest.executable_inputs]

    def postprocess(self, outputs: list[NamedTensor], rows: int | None) -> list[NamedTensor]:
        """Executable outputs -> client outputs in manifest order, checked like the server."""
        tensors = outputs
        if self.registration is not None and self.registration.postprocess is not None:
            tensors = self.registration.postprocess(outputs)
            problems = hook_problems(
                "postprocess", tensors, self.manifest.client_outputs, rows=rows
            )
            if problems:
                raise BundleError("; ".join(problems))
        by_name = {t.name: t for t in tensors}
        return [by_name[spec.name] for spec in self.manifest.client_outputs]

    # -- one request -------------------------------------------------------------------------

    def _pick(self, rows: int | None, key: tuple[int, ...]) -> ModuleIndex:
        variant = None
        if self.manifest.variants:
            found = self.manifest.find_variant(key)
            if found is None:
                raise BundleError(f"no variant compiled for sizes {key}")
            variant = found.index
        sizes = self.manifest.compiled_batch_sizes
        if not sizes:
            return (variant, 0)
        assert rows is not None
        fitting = [b for b in sizes if b >= rows]
        if not fitting:
            raise BundleError(f"{rows} rows exceed the largest compiled batch size {sizes[-1]}")
        return (variant, fitting[0])

    def infer(self, inputs: list[NamedTensor]) -> list[NamedTensor]:
        """Run one request (client inputs -> client outputs), padding the batch as needed."""
        if self.manifest.is_meta:
            raise BundleError(f"{self.manifest.name} is a meta model; run its sub-models")
        batched = [s for s in self.manifest.client_inputs if s.batch_axis is not None]
        by_name = {t.name: t for t in inputs}
        rows = by_name[batched[0].name].shape[batched[0].batch_axis or 0] if batched else None
        exe_inputs = self.preprocess(inputs, rows)
        specs = self.manifest.executable_inputs
        key = tuple(
            exe_inputs[axis.input_index].shape[axis.axis] for axis in self.manifest.variable_axes
        )
        if rows is None and specs and specs[0].batch_axis is not None:
            rows = exe_inputs[0].shape[specs[0].batch_axis]
        index = self._pick(rows, key)
        arrays = []
        for spec, tensor in zip(specs, exe_inputs, strict=True):
            data = tensor.data
            axis = spec.batch_axis
            if axis is not None and index[1] and rows is not None and index[1] > rows:
                pad = [(0, 0)] * data.ndim
                pad[axis] = (0, index[1] - rows)
                data = np.pad(data, pad)
            arrays.append(data)
        results = self.execute(index, arrays)
        outputs = []
        for spec, result in zip(self.manifest.executable_outputs, results, strict=True):
            axis = spec.batch_axis
            sliced = result
            if axis is not None and rows is not None:
                sliced = np.take(result, np.arange(rows), axis=axis)
            outputs.append(NamedTensor(spec.name, sliced))
        return self.postprocess(outputs, rows)

    # -- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        """Free the device weights and drop the executables."""
        for buffer in self._device_weights or []:
            self.backend.free(buffer)
        self._device_weights = None
        self._executables.clear()

    def __enter__(self) -> BundleSession:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
