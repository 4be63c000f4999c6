"""The worker's model registry: every model name it knows, its state and its current generation.

Transport handlers resolve names here: unknown or hidden names are
``NOT_FOUND``, models still loading or failed are ``UNAVAILABLE``::

    registry.put(ModelEntry.loading("resnet"))
    registry.put(ModelEntry.ready(manifest, hooks, scheduled=sm, loaded=loaded))
    entry = registry.resolve("resnet", "")      # READY entry, else the right error

Meta groups: every name in the ``meta.calls`` of a loaded meta is a
sub-model of that meta. The registry recomputes the groups whenever an entry is put or
removed, and (unless ``expose_sub_models``) stamps ``hidden`` on the sub-models' entries, so
the check is re-run on every change the watcher or a repository RPC makes.

A meta's generation is a :class:`MetaModel` (its ``run``, callees and client tensors; 07). It
lives here, beside the entry that holds it, because :mod:`reactantserver.worker.meta`, which
serves it, sits above the registry::

    meta = MetaModel.from_manifest(manifest, hooks.run, generation=3)
    meta.gated          # False for a compute-only meta (empty meta.calls)
"""

from __future__ import annotations

import enum
import threading

import attrs

from reactantserver.core.errors import ModelNotFoundError, ModelUnavailableError
from reactantserver.core.manifest import Manifest
from reactantserver.core.types import TensorSpec
from reactantserver.worker.hooks import BundleHooks, MetaRun
from reactantserver.worker.runtime.loader import LoadedModel
from reactantserver.worker.scheduler.model import ScheduledModel

__all__ = [
    "NOT_RESIDENT_REASON",
    "SERVED_VERSIONS",
    "MetaModel",
    "ModelEntry",
    "ModelRegistry",
    "ModelState",
]

SERVED_VERSIONS = frozenset({"", "1"})
"""Model versions a request may name: every model has exactly one version, ``"1"``."""

NOT_RESIDENT_REASON = "not resident"
"""Why a loaded model does not serve in explicit mode (``RepositoryIndex`` reason)."""


@attrs.define(eq=False)
class MetaModel:
    """A meta generation: ``run``, the declared callees and the client tensors."""

    name: str
    generation: int
    calls: tuple[str, ...]
    run: MetaRun
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    warned_oversize: bool = False
    """Whether the "scratch larger than the pool" warning was logged (once per meta)."""

    @classmethod
    def from_manifest(cls, manifest: Manifest, run: MetaRun, *, generation: int) -> MetaModel:
        """The meta of ``manifest`` (``kind: meta``) running ``run``."""
        if not manifest.is_meta:
            raise ValueError(f"model '{manifest.name}' is not a meta model")
        return cls(
            name=manifest.name,
            generation=generation,
            calls=manifest.meta_calls,
            run=run,
            inputs=manifest.client_inputs,
            outputs=manifest.client_outputs,
        )

    @property
    def gated(self) -> bool:
        """Whether a request must hold a permit of the meta gate (it has sub-models)."""
        return bool(self.calls)

    def renamed(self, name: str) -> MetaModel:
        """The same generation served under another name (rename in place)."""
        return attrs.evolve(self, name=name)


class ModelState(enum.Enum):
    """A model's state as ``RepositoryIndex`` reports it."""

    LOADING = "LOADING"
    READY = "READY"
    UNAVAILABLE = "UNAVAILABLE"


@attrs.frozen
class ModelEntry:
    """One model name: its state and, once loaded, its manifest, hooks and generation."""

    name: str
    state: ModelState
    reason: str = ""
    manifest: Manifest | None = None
    hooks: BundleHooks = attrs.Factory(BundleHooks)
    loaded: LoadedModel | None = None
    scheduled: ScheduledModel | None = None
    hidden: bool = False
    """A meta's sub-model that is not exposed: not listed, ``NOT_FOUND`` to clients."""
    meta: MetaModel | None = None
    """The servable form of a meta model (``scheduled`` is ``None`` for one)."""

    @classmethod
    def loading(cls, name: str) -> ModelEntry:
        """A model whose first generation is still compiling."""
        return cls(name, ModelState.LOADING)

    @classmethod
    def failed(cls, name: str, reason: str) -> ModelEntry:
        """A model whose load failed (``reason`` is the error, one line)."""
        return cls(name, ModelState.UNAVAILABLE, reason=reason.splitlines()[0] if reason else "")

    @classmethod
    def ready(
        cls,
        manifest: Manifest,
        hooks: BundleHooks,
        *,
        scheduled: ScheduledModel | None = None,
        loaded: LoadedModel | None = None,
        meta: MetaModel | None = None,
    ) -> ModelEntry:
        """A servable generation."""
        return cls(
            manifest.name,
            ModelState.READY,
            manifest=manifest,
            hooks=hooks,
            loaded=loaded,
            scheduled=scheduled,
            meta=meta,
        )

    @property
    def generation(self) -> int:
        """The generation number of the installed model (0 before the first install)."""
        if self.scheduled is not None:
            return self.scheduled.generation
        return self.meta.generation if self.meta is not None else 0

    @property
    def installed(self) -> bool:
        """Whether a generation is installed (a scheduled model or a meta)."""
        return self.scheduled is not None or self.meta is not None

    @property
    def is_meta(self) -> bool:
        """Whether this is a loaded meta model."""
        return self.meta is not None


class ModelRegistry:
    """Thread-safe map of model name → :class:`ModelEntry` (entries are replaced whole).

    With ``expose_sub_models`` the meta groups are still tracked, but nothing is hidden.
    """

    def __init__(self, *, expose_sub_models: bool = False) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, ModelEntry] = {}
        self._expose = expose_sub_models
        self._owners: dict[str, tuple[str, ...]] = {}

    def put(self, entry: ModelEntry) -> None:
        """Add or replace the entry of ``entry.name``."""
        with self._lock:
            self._entries[entry.name] = entry
            self._regroup_locked()

    def remove(self, name: str) -> ModelEntry | None:
        """Forget ``name``; its old entry (``None`` when unknown)."""
        with self._lock:
            entry = self._entries.pop(name, None)
            self._regroup_locked()
            return entry

    def owners(self, name: str) -> tuple[str, ...]:
        """The loaded metas whose ``meta.calls`` name ``name``, sorted."""
        with self._lock:
            return self._owners.get(name, ())

    def metas(self) -> list[ModelEntry]:
        """Every loaded meta (``READY`` with a meta generation), sorted by name."""
        with self._lock:
            metas = [e for e in self._entries.values() if e.meta is not None]
        return sorted(metas, key=lambda e: e.name)

    def _regroup_locked(self) -> None:
        owners: dict[str, list[str]] = {}
        for entry in self._entries.values():
            if entry.meta is not None:
                for callee in entry.meta.calls:
                    owners.setdefault(callee, []).append(entry.name)
        self._owners = {name: tuple(sorted(metas)) for name, metas in owners.items()}
        for name, entry in self._entries.items():
            # A meta is never hidden: a meta that names it is the one in error (not ready).
            hidden = not self._expose and name in self._owners and entry.meta is None
            if entry.hidden is not hidden:
                self._entries[name] = attrs.evolve(entry, hidden=hidden)

    def get(self, name: str) -> ModelEntry | None:
        """The entry of ``name``, hidden ones included."""
        with self._lock:
            return self._entries.get(name)

    def visible(self) -> list[ModelEntry]:
        """Every entry a client may see, sorted by name."""
        with self._lock:
            entries = [e for e in self._entries.values() if not e.hidden]
        return sorted(entries, key=lambda e: e.name)

    def find(self, name: str, version: str = "") -> ModelEntry:
        """The visible entry of ``name`` in any state; ``ModelNotFoundError`` otherwise."""
        entry = self.get(name)
        if entry is not None and entry.hidden:
            owner = " or ".join(f"'{meta}'" for meta in self.owners(name)) or "a meta"
            raise ModelNotFoundError(f"model '{name}' is internal to meta {owner}")
        if entry is None:
            raise ModelNotFoundError(f"Request for unknown model: '{name}' is not found")
        if version not in SERVED_VERSIONS:
            raise ModelNotFoundError(
                f"Request for unknown model: '{name}' version {version} is not found"
            )
        return entry

    def resolve(self, name: str, version: str = "") -> ModelEntry:
        """The READY entry of ``name``: ``NOT_FOUND`` or ``UNAVAILABLE`` otherwise."""
        entry = self.find(name, version)
        if entry.state is ModelState.LOADING:
            raise ModelUnavailableError(f"model '{name}' is loading")
        if entry.state is not ModelState.READY:
            reason = f": {entry.reason}" if entry.reason else ""
            raise ModelUnavailableError(f"model '{name}' is unavailable{reason}")
        return entry
