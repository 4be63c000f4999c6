"""One generation of a regular model as the scheduler sees it: programs, sizes, batch axes.

Built from a :class:`~reactantserver.worker.runtime.loader.LoadedModel` when a generation is
installed; requests validated against it keep a reference to it, so a reload never mixes
generations in one batch::

    sm = ScheduledModel.from_loaded(loaded, generation=1, weight=2.0)
    arrays, variant, rows = sm.prepare(tensors)
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from reactantserver.core.errors import InvalidArgumentError
from reactantserver.core.hooks import NamedTensor
from reactantserver.core.manifest import VariableAxis
from reactantserver.core.types import TensorSpec
from reactantserver.worker.runtime.backend import Executable
from reactantserver.worker.runtime.loader import LoadedModel
from reactantserver.worker.scheduler.arrivals import Arrivals
from reactantserver.worker.validation import checked_inputs

__all__ = ["ProgramKey", "ScheduledModel"]

#: ``(variant file index or None, compiled batch size; 0 = a lone model.mlir)``.
ProgramKey = tuple[int | None, int]

#: How many recent batches :meth:`ScheduledModel.usual_rows` looks back over.
RECENT_BATCHES = 16


@attrs.define(eq=False)
class ScheduledModel:
    """A model generation: its executables by (variant, size) and how to batch its tensors.

    ``weights`` is the model's key in the weight cache (``None``: no weights). ``weight``,
    ``max_batch_size`` and ``queue_delay_ns`` come from ``scheduler.*``. ``admitting`` turns
    off when a newer generation replaces this one or the model is unloaded; ``on_drained``
    then runs on the dispatch thread after the generation's last queued request.
    """

    name: str
    generation: int
    inputs: tuple[TensorSpec, ...]
    output_axes: tuple[int | None, ...]
    programs: Mapping[ProgramKey, Executable]
    coalescable: bool
    variable_axes: tuple[VariableAxis, ...] = ()
    variant_keys: Mapping[tuple[int, ...], int] = attrs.field(factory=dict)
    lone_rows: int | None = None
    """The static batch extent of a lone ``model.mlir`` with a batch axis."""
    weights: str | None = None
    weight: float = 1.0
    max_batch_size: int | None = None
    queue_delay_ns: int | None = 0
    """How long the oldest queued request may wait for more rows on an idle device; None:
    adaptively, from the arrival gaps and the learned costs (``SchedulerState``)."""
    recent_rows: collections.deque[int] = attrs.field(
        factory=lambda: collections.deque(maxlen=RECENT_BATCHES)
    )
    """Rows of the last :data:`RECENT_BATCHES` batches taken (see :meth:`usual_rows`)."""
    arrivals: Arrivals = attrs.field(factory=Arrivals)
    """Its traffic as the adaptive wait reads it (under the scheduler lock)."""
    admitting: bool = True
    outstanding: int = 0
    """Requests of this generation queued or being dispatched."""
    on_drained: Callable[[], None] | None = None
    sizes: dict[int | None, tuple[int, ...]] = attrs.field(init=False)
    input_axes: tuple[int | None, ...] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        sizes: dict[int | None, list[int]] = {}
        for variant, batch in self.programs:
            sizes.setdefault(variant, []).append(batch)
        self.sizes = {v: tuple(sorted(b)) for v, b in sizes.items()}
        self.input_axes = tuple(spec.batch_axis for spec in self.inputs)

    @classmethod
    def from_loaded(
        cls,
        loaded: LoadedModel,
        *,
        generation: int = 1,
        weight: float = 1.0,
        max_batch_size: int | None = None,
        queue_delay_ns: int | None = 0,
    ) -> ScheduledModel:
        """The scheduler's view of a freshly loaded bundle."""
        manifest = loaded.manifest
        lone_rows: int | None = None
        programs: dict[ProgramKey, Executable] = {}
        for key, module in loaded.modules.items():
            programs[key] = module.executable
            if key[1] == 0 and manifest.has_batch_axis:
                for i, spec in enumerate(manifest.executable_inputs):
                    axis = spec.batch_axis
                    if axis is not None:
                        lone_rows = module.signature.inputs[i].shape[axis]
                        break
        return cls(
            name=loaded.name,
            generation=generation,
            inputs=manifest.executable_inputs,
            output_axes=tuple(spec.batch_axis for spec in manifest.executable_outputs),
            programs=programs,
            coalescable=manifest.coalescable,
            variable_axes=manifest.variable_axes,
            variant_keys={v.key: v.index for v in manifest.variants},
            lone_rows=lone_rows,
            weights=loaded.name if loaded.weight_specs else None,
            weight=weight,
            max_batch_size=max_batch_size,
            queue_delay_ns=queue_delay_ns,
        )

    @property
    def max_batch(self) -> int:
        """Effective max batch: the largest compiled size capped by ``max_batch_size``
        (0 when the model does not coalesce)."""
        if not self.coalescable:
            return 0
        largest = max(s[-1] for s in self.sizes.values())
        return largest if self.max_batch_size is None else min(largest, self.max_batch_size)

    def usual_rows(self) -> int:
        """The most rows among the recent batches (0 before the first): a batch waiting out
        the queue delay stops waiting when it has that many."""
        return max(self.recent_rows, default=0)

    def prepare(
        self, tensors: Sequence[NamedTensor]
    ) -> tuple[list[np.ndarray[Any, Any]], int | None, int]:
        """Check executable-level tensors; returns ``(arrays, variant, rows)``.

        ``arrays`` follow the executable input order. Raises :class:`InvalidArgumentError`
        for any spec mismatch, an uncompiled variant or a row count no program can run.
        """
        arrays, rows = checked_inputs(self.inputs, tensors, model=self.name)
        variant = self._variant(arrays)
        sizes = self.sizes[variant]
        if sizes == (0,):
            if self.lone_rows is not None and rows != self.lone_rows:
                raise InvalidArgumentError(
                    f"model '{self.name}' is compiled for exactly {self.lone_rows} rows, got {rows}"
                )
        elif rows > sizes[-1]:
            raise InvalidArgumentError(
                f"batch size {rows} of model '{self.name}' exceeds its largest compiled "
                f"batch size {sizes[-1]}"
            )
        return arrays, variant, rows

    def _variant(self, arrays: Sequence[np.ndarray[Any, Any]]) -> int | None:
        if not self.variable_axes:
            return None
        slots = max(axis.key_index for axis in self.variable_axes) + 1
        key: list[int | None] = [None] * slots
        for axis in self.variable_axes:
            extent = int(arrays[axis.input_index].shape[axis.axis])
            seen = key[axis.key_index]
            if seen is None:
                key[axis.key_index] = extent
            elif seen != extent:
                raise InvalidArgumentError(
                    f"inputs of model '{self.name}' disagree on variable axis "
                    f"'{axis.letter}': {seen} vs {extent} ('{axis.input_name}')"
                )
        resolved = tuple(k for k in key if k is not None)
        variant = self.variant_keys.get(resolved)
        if variant is None:
            compiled = [list(k) for k in self.variant_keys]
            raise InvalidArgumentError(
                f"no compiled program for input shape variant {list(resolved)}; "
                f"compiled: {compiled}"
            )
        return variant
