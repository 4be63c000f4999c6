"""A meta and its sub-models as one group: footprint, residency, residency changes.

The gateway only ever sees the meta, so the worker reports the group as one model and
applies residency changes to every sub-model::

    weights = group_weights(state, entry, snapshot.get)     # ModelControlStatus
    floor = set_group_residency(state, runtime, "pipeline", Residency.PINNED_DEVICE)
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence

import attrs

from reactantserver.core.errors import ModelNotFoundError
from reactantserver.worker.registry import ModelEntry, ModelState
from reactantserver.worker.repository.lifecycle import apply_residency
from reactantserver.worker.runtime.probe import model_runs
from reactantserver.worker.runtime.residency import Residency
from reactantserver.worker.runtime.weight_cache import WeightCache
from reactantserver.worker.state import Runtime, WorkerState

__all__ = [
    "WEIGHTLESS",
    "ModelWeights",
    "fold_group",
    "group_weights",
    "least_resident",
    "model_weights",
    "set_group_residency",
]

_RANK = {Residency.UNPINNED: 0, Residency.PINNED_SYSTEM: 1, Residency.PINNED_DEVICE: 2}


@attrs.frozen
class ModelWeights:
    """One model's weights as the cache holds them (or a group's, folded)."""

    residency: Residency
    device_resident: bool
    host_resident: bool
    nbytes: int
    loads: int = 0


WEIGHTLESS = ModelWeights(Residency.UNPINNED, device_resident=True, host_resident=True, nbytes=0)
"""A model without weights: nothing to load, so always resident."""

_NOTHING = ModelWeights(Residency.UNPINNED, device_resident=False, host_resident=False, nbytes=0)
"""A compute-only meta, or a group with a sub-model that is not loaded."""


def model_weights(weights: WeightCache, name: str) -> ModelWeights | None:
    """``name``'s weights in the cache (``None`` when the cache does not hold it)."""
    if name not in weights:
        return None
    return ModelWeights(
        weights.residency(name),
        weights.is_resident(name),
        weights.host_resident(name),
        weights.nbytes(name),
        weights.model_loads(name),
    )


def least_resident(floors: Iterable[Residency]) -> Residency:
    """The least-resident floor (``UNPINNED`` < ``PINNED_SYSTEM`` < ``PINNED_DEVICE``)."""
    return min(floors, key=_RANK.__getitem__, default=Residency.UNPINNED)


def fold_group(members: Sequence[ModelWeights | None]) -> ModelWeights:
    """A group from its sub-models' weights (``None``: that sub-model is not loaded).

    Footprint and loads are sums, the flags ANDs, the floor the least resident one among
    sub-models with weights (all weightless: ``PINNED_DEVICE``, nothing can move). A
    compute-only meta or a missing sub-model is reported not resident.
    """
    if not members or any(m is None for m in members):
        loaded = [m for m in members if m is not None]
        return attrs.evolve(
            _NOTHING,
            residency=least_resident(m.residency for m in loaded) if loaded else _NOTHING.residency,
            nbytes=sum(m.nbytes for m in loaded),
            loads=sum(m.loads for m in loaded),
        )
    present = [m for m in members if m is not None]
    with_weights = [m for m in present if m is not WEIGHTLESS]
    floor = (
        least_resident(m.residency for m in with_weights)
        if with_weights
        else Residency.PINNED_DEVICE
    )
    return ModelWeights(
        floor,
        device_resident=all(m.device_resident for m in present),
        host_resident=all(m.host_resident for m in present),
        nbytes=sum(m.nbytes for m in present),
        loads=sum(m.loads for m in present),
    )


def _members(state: WorkerState, meta: ModelEntry) -> list[ModelEntry | None]:
    assert meta.meta is not None
    members: list[ModelEntry | None] = []
    for callee in meta.meta.calls:
        sub = state.registry.get(callee)
        ok = sub is not None and sub.state is ModelState.READY and sub.scheduled is not None
        members.append(sub if ok else None)
    return members


def group_weights(
    state: WorkerState, meta: ModelEntry, weights_of: Callable[[str], ModelWeights | None]
) -> ModelWeights:
    """The group of ``meta``: each loaded sub-model's weights from ``weights_of`` (``None``:
    the cache does not hold it, so it is weightless), folded by :func:`fold_group`."""
    return fold_group(
        [
            None if sub is None else (weights_of(sub.name) or WEIGHTLESS)
            for sub in _members(state, meta)
        ]
    )


def set_group_residency(
    state: WorkerState, runtime: Runtime, name: str, target: Residency
) -> Residency:
    """Dispatch thread: move every sub-model of meta ``name`` to ``target``; the group floor.

    When lowering, a sub-model that another meta holds at a higher floor keeps that floor.
    """
    meta = state.registry.get(name)
    if meta is None or meta.meta is None:
        raise ModelNotFoundError(f"Request for unknown model: '{name}' is not found")
    state.meta_floors[name] = target
    for sub in _members(state, meta):
        if sub is None:
            continue
        wanted = target
        for other in state.registry.owners(sub.name):
            held = state.meta_floors.get(other)
            if other != name and held is not None and _RANK[held] > _RANK[wanted]:
                wanted = held
        runs = model_runs(sub.loaded) if sub.loaded is not None else None
        apply_residency(runtime, sub.name, wanted, runs)
    return group_weights(state, meta, functools.partial(model_weights, runtime.weights)).residency
