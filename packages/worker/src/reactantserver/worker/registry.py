"""The worker's model registry: every model name it knows, its state and its current generation.

Transport handlers resolve names here (05 §Status codes): unknown or hidden names are
``NOT_FOUND``, models still loading or failed are ``UNAVAILABLE``::

    registry.put(ModelEntry.loading("resnet"))
    registry.put(ModelEntry.ready(manifest, hooks, scheduled=sm, loaded=loaded))
    entry = registry.resolve("resnet", "")      # READY entry, else the right error
"""

from __future__ import annotations

import enum
import threading

import attrs

from reactantserver.core.errors import ModelNotFoundError, ModelUnavailableError
from reactantserver.core.manifest import Manifest
from reactantserver.worker.hooks import BundleHooks
from reactantserver.worker.runtime.loader import LoadedModel
from reactantserver.worker.scheduler.model import ScheduledModel

__all__ = ["SERVED_VERSIONS", "ModelEntry", "ModelRegistry", "ModelState"]

SERVED_VERSIONS = frozenset({"", "1"})
"""Model versions a request may name: every model has exactly one version, ``"1"``."""


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
    ) -> ModelEntry:
        """A servable generation."""
        return cls(
            manifest.name,
            ModelState.READY,
            manifest=manifest,
            hooks=hooks,
            loaded=loaded,
            scheduled=scheduled,
        )

    @property
    def generation(self) -> int:
        """The generation number of the scheduled model (0 before the first install)."""
        return self.scheduled.generation if self.scheduled is not None else 0


class ModelRegistry:
    """Thread-safe map of model name → :class:`ModelEntry` (entries are replaced whole)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, ModelEntry] = {}

    def put(self, entry: ModelEntry) -> None:
        """Add or replace the entry of ``entry.name``."""
        with self._lock:
            self._entries[entry.name] = entry

    def remove(self, name: str) -> ModelEntry | None:
        """Forget ``name``; its old entry (``None`` when unknown)."""
        with self._lock:
            return self._entries.pop(name, None)

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
        if entry is None or entry.hidden:
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
