"""The typed result of parsing a manifest: :class:`Manifest` and its parts.

Everything here is already normalised to format 3.0 (row-major letters, batch letter ``n``);
``Manifest.source_format`` is the only trace of a 2.0 file.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypeAlias

import attrs

from reactantserver.core.types import TensorSpec, Variable

Kind: TypeAlias = Literal["model", "meta"]
SourceFormat: TypeAlias = Literal["2.0", "3.0"]


@attrs.frozen
class AxisLetters:
    """The row-major 3.0 axis letters of every tensor, parallel to the manifest's lists.

    ``manifest.letters.executable_inputs[0] == "nchw"`` describes
    ``manifest.executable_inputs[0]``.
    """

    executable_inputs: tuple[str, ...] = ()
    executable_outputs: tuple[str, ...] = ()
    client_inputs: tuple[str, ...] = ()
    client_outputs: tuple[str, ...] = ()


@attrs.frozen
class VariableAxis:
    """One VARIABLE axis of an executable input and the variant-key slot that sizes it.

    Letters are scoped to one tensor, but an ``input_shapes`` entry is one flat map, so two
    inputs that use the same variable letter share one slot (``key_index``).
    """

    input_index: int
    input_name: str
    axis: int
    letter: str
    key_index: int


@attrs.frozen
class Variant:
    """One ``input_shapes`` entry: its file index ``i`` (``model.v{i}…``) and its variant key.

    The key holds the sizes of :attr:`Manifest.variable_letters`, in that order.
    """

    index: int
    key: tuple[int, ...]

    @property
    def file_prefix(self) -> str:
        """The module file-name prefix of this variant (``"model.v2"``)."""
        return f"model.v{self.index}"


@attrs.frozen
class Manifest:
    """A validated, normalised ``manifest.yaml``.

    ``name`` is the model name (the bundle's directory name); ``declared_name`` is the
    informational ``name`` written in the file. ``client_inputs``/``client_outputs`` are the
    client-facing lists: the declared ones, else copies of the executable ones.
    ``format_version`` is the value as written (stringified); ``source_format`` its canonical
    form. ``provenance`` is stored, never interpreted.
    """

    source: str
    source_format: SourceFormat
    format_version: str
    name: str
    kind: Kind = "model"
    declared_name: str = ""
    description: str = ""
    meta_calls: tuple[str, ...] = ()
    executable_inputs: tuple[TensorSpec, ...] = ()
    executable_outputs: tuple[TensorSpec, ...] = ()
    client_inputs: tuple[TensorSpec, ...] = ()
    client_outputs: tuple[TensorSpec, ...] = ()
    client_inputs_declared: bool = False
    client_outputs_declared: bool = False
    compiled_batch_sizes: tuple[int, ...] = ()
    variants: tuple[Variant, ...] = ()
    letters: AxisLetters = AxisLetters()
    # Provenance is free-form YAML (unhashable); it takes part in equality, not in the hash.
    provenance: Mapping[str, Any] = attrs.field(factory=dict, hash=False)

    @property
    def is_meta(self) -> bool:
        """Whether this is a meta model (no modules, no weights, ``run`` hook)."""
        return self.kind == "meta"

    @property
    def has_batch_axis(self) -> bool:
        """Whether the executable inputs carry a batch axis (all of them do, or none)."""
        return any(spec.batch_axis is not None for spec in self.executable_inputs)

    @property
    def batch_keys(self) -> tuple[int, ...]:
        """The internal batch keys of the modules: the compiled sizes, or ``(0,)`` for
        a lone ``model.mlir``; ``()`` for a meta model."""
        if self.is_meta:
            return ()
        return self.compiled_batch_sizes or (0,)

    @property
    def coalescable(self) -> bool:
        """Whether requests may be concatenated along the batch axis.

        True iff every executable input and output has a batch axis and the bundle has
        ``model.b{N}`` modules (not a lone ``model.mlir``).
        """
        tensors = self.executable_inputs + self.executable_outputs
        return (
            not self.is_meta
            and bool(self.compiled_batch_sizes)
            and self.has_batch_axis
            and all(spec.batch_axis is not None for spec in tensors)
        )

    @property
    def wire_batch_input(self) -> str:
        """The first client-facing input with a batch axis, ``""`` when none."""
        for spec in self.client_inputs:
            if spec.batch_axis is not None:
                return spec.name
        return ""

    @property
    def wire_batch_axis(self) -> int:
        """The 1-based row-major batch axis of :attr:`wire_batch_input` (0 when none)."""
        for spec in self.client_inputs:
            if spec.batch_axis is not None:
                return spec.batch_axis + 1
        return 0

    @property
    def variable_axes(self) -> tuple[VariableAxis, ...]:
        """Every VARIABLE axis of the executable inputs, in (input, row-major axis) order."""
        slots: dict[str, int] = {}
        axes: list[VariableAxis] = []
        for input_index, spec in enumerate(self.executable_inputs):
            letters = self.letters.executable_inputs[input_index]
            for axis, dim in enumerate(spec.shape):
                if isinstance(dim, Variable):
                    letter = letters[axis]
                    key_index = slots.setdefault(letter, len(slots))
                    axes.append(VariableAxis(input_index, spec.name, axis, letter, key_index))
        return tuple(axes)

    @property
    def variable_letters(self) -> tuple[str, ...]:
        """The letters a variant key sizes, in key order (first occurrence over the
        executable inputs in order, then axes in row-major order)."""
        letters: dict[str, None] = {}
        for axis in self.variable_axes:
            letters.setdefault(axis.letter, None)
        return tuple(letters)

    @property
    def variant_keys(self) -> tuple[tuple[int, ...], ...]:
        """The compiled variant keys, in file-index order."""
        return tuple(variant.key for variant in self.variants)

    def find_variant(self, key: tuple[int, ...]) -> Variant | None:
        """The variant compiled for ``key``, or ``None``."""
        for variant in self.variants:
            if variant.key == key:
                return variant
        return None
