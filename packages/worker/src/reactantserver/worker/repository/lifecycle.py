"""Changing the model set while the worker serves: load, atomic reload, unload, rename.

Every change runs on the calling thread (the watcher thread, or an RPC's worker thread) and
hands the steps that touch the device or the scheduler to the dispatch thread as control
commands, so the other models keep being served between them:

1. compile (calling thread): manifest, ``model.py``, every module; nothing visible yet;
2. *prepare* (dispatch thread): admit the weights under a staging key, warm every size;
3. *swap* (dispatch thread): the old generation stops admitting and drains with its own
   executables and weights; the new one is installed under the name in the same step;
4. the retired generation's weights and file handles are freed after its last request.

A failed reload leaves the old generation serving; the error is logged, counted
(``reactantserver_worker_model_load_failures_total``) and shown as the ``RepositoryIndex`` reason::

    lifecycle = ModelLifecycle(state, runtime)
    lifecycle.install("mlp", seen)          # first load or reload; raises on failure
    lifecycle.rename("mlp", "mlp-v2", seen)
    lifecycle.unload("mlp-v2")
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

import attrs

from reactantserver.core.errors import FailedPreconditionError, ModelNotFoundError, status_message
from reactantserver.worker.registry import ModelEntry
from reactantserver.worker.repository.boot import (
    CompiledBundle,
    LoadedBundle,
    admit_model,
    compile_model,
    warn_missing_callees,
)
from reactantserver.worker.repository.digest import BundleDigester
from reactantserver.worker.repository.reconcile import Known, Seen
from reactantserver.worker.repository.scan import observe, scan_model_dirs
from reactantserver.worker.runtime.probe import ModelRuns, RunKey, model_runs, warm_up
from reactantserver.worker.runtime.residency import Residency, resolve_residency
from reactantserver.worker.scheduler import ScheduledModel
from reactantserver.worker.state import Runtime, WorkerState

__all__ = ["ModelLifecycle", "apply_residency"]

_log = logging.getLogger("reactantserver.worker.lifecycle")
_T = TypeVar("_T")


def apply_residency(
    runtime: Runtime, name: str, target: Residency, runs: ModelRuns | None
) -> Residency | None:
    """Dispatch thread: set the floor of ``name``, warming it when pinned the first time.

    Returns the floor now (``None``: the model has no weights, so it is always resident).
    """
    weights = runtime.weights
    if name not in weights:
        return None
    try:
        weights.set_residency(name, target)
    except KeyError:  # unloaded since the caller resolved it
        raise ModelNotFoundError(f"Request for unknown model: '{name}' is not found") from None
    if target is Residency.PINNED_DEVICE and runs is not None and runs.runs:
        costs = runtime.scheduler.costs
        if any(costs.measured(name, run.batch) is None for run in runs.runs):
            # Never warmed (explicit mode warms only device-pinned models at start-up).
            result = warm_up(runtime.backend, weights, [runs])
            runtime.scheduler.seed_costs(result.costs)
            _log.info("warmed %r after pinning it: %d size(s)", name, len(result.costs))
    return weights.residency(name)


class ModelLifecycle:
    """Installs, replaces, removes and renames generations; one change at a time.

    :attr:`known` is what the repository watcher compares its polls with: per model name,
    the bundle directory, its identity and the digest last installed (or last failed).
    """

    def __init__(self, state: WorkerState, runtime: Runtime) -> None:
        self._state = state
        self._runtime = runtime
        self.lock = threading.RLock()
        """Held for a whole change, so the watcher and the repository RPCs never interleave."""
        self.known: dict[str, Known] = {}
        self.digester = BundleDigester()
        """Shared with the watcher; used under :attr:`lock` only."""
        self._generation = 0

    # -- start-up --------------------------------------------------------------------------

    def adopt(self, entry: ModelEntry, seen: Seen) -> None:
        """Take over a generation installed at start-up (so it can be retired later)."""
        with self.lock:
            if entry.scheduled is not None:
                self._arm(entry)
            self._generation = max(self._generation, entry.generation)
            self.known[entry.name] = Known(seen.path, seen.identity, seen.digest)

    def note_failed(self, name: str, seen: Seen) -> None:
        """Remember a start-up load that failed (retried when its digest changes)."""
        with self.lock:
            self.known[name] = Known(
                seen.path, seen.identity, seen.digest, failed=True, serving=False
            )

    # -- install: first load or reload -----------------------------------------------------

    def install(self, name: str, seen: Seen, *, pin: bool = False) -> ModelEntry:
        """Compile ``seen.path`` and install it as ``name``'s new generation; its entry.

        ``pin`` makes the new generation ``PINNED_DEVICE`` (explicit-mode load). Raises on
        failure, after recording it: a reload leaves the old generation serving.
        """
        with self.lock:
            state, runtime = self._state, self._runtime
            old = state.registry.get(name)
            reload = old is not None and old.installed
            if not reload:
                state.registry.put(ModelEntry.loading(name))
            self._generation += 1
            generation = self._generation
            staging = f"{name}#g{generation}"
            started = time.perf_counter()
            try:
                compiled = compile_model(state, runtime, seen.path, generation=generation)
                if compiled.manifest.name != name:
                    raise ValueError(f"bundle {seen.path} is named {compiled.manifest.name!r}")
                bundle = self._on_dispatch(lambda: self._prepare(compiled, staging, pin=pin))
            except Exception as exc:
                self._failed(name, seen, old if reload else None, exc, started)
                raise
            entry = self._on_dispatch(lambda: self._swap(name, bundle))
            warn_missing_callees(state, name)
            state.record_load(name, bundle.seconds, ok=True)
            self.known[name] = Known(seen.path, seen.identity, seen.digest)
            _log.info(
                "model %s model=%s generation=%d seconds=%.3f",
                "reloaded" if reload else "loaded",
                name,
                generation,
                bundle.seconds,
            )
            return entry

    def _prepare(self, compiled: CompiledBundle, staging: str, *, pin: bool) -> LoadedBundle:
        """Dispatch thread: admit the weights under ``staging`` and warm every size."""
        runtime = self._runtime
        residency = None
        if pin and runtime.weights.enabled:
            residency = Residency.PINNED_DEVICE
        bundle = admit_model(self._state, runtime, compiled, key=staging, residency=residency)
        if self._state.config.runtime.warmup and bundle.runs.runs:
            try:
                result = warm_up(runtime.backend, runtime.weights, [bundle.runs])
            except BaseException:
                self._discard(bundle)
                raise
            if result.failed:
                self._discard(bundle)
                raise RuntimeError(
                    f"warm-up of model '{compiled.manifest.name}' failed for "
                    f"{len(result.failed)} compiled size(s)"
                )
            name = compiled.manifest.name
            runtime.scheduler.seed_costs(
                {RunKey(name, k.variant, k.batch): v for k, v in result.costs.items()}
            )
        return bundle

    def _swap(self, name: str, bundle: LoadedBundle) -> ModelEntry:
        """Dispatch thread: retire the current generation and install the new one at once.

        A meta has nothing scheduled: its entry replaces the old one (a regular model that
        became a meta retires like an unloaded one).
        """
        runtime = self._runtime
        current = runtime.scheduler.model(name)
        if current is not None:
            self._retire_weights(current)
        scheduled = bundle.entry.scheduled
        if scheduled is None:
            if current is not None:
                runtime.scheduler.remove_model(name)
            self._state.registry.put(bundle.entry)
            return bundle.entry
        if scheduled.weights is not None and scheduled.weights != name:
            runtime.weights.rename_model(scheduled.weights, name)
            scheduled.weights = name
        self._arm(bundle.entry)
        runtime.scheduler.add_model(scheduled)  # the old generation stops admitting here
        self._state.registry.put(bundle.entry)
        return bundle.entry

    def _failed(
        self,
        name: str,
        seen: Seen,
        old: ModelEntry | None,
        exc: BaseException,
        started: float,
    ) -> None:
        reason = status_message(exc)
        self._state.record_load(name, time.perf_counter() - started, ok=False)
        if old is not None:
            _log.error(
                "model reload failed model=%s error=%s; the old generation serves", name, reason
            )
            self._state.registry.put(attrs.evolve(old, reason=f"reload failed: {reason}"))
            self.known[name] = Known(seen.path, seen.identity, seen.digest, failed=True)
        else:
            _log.error("model load failed model=%s error=%s", name, reason)
            self._state.registry.put(ModelEntry.failed(name, reason))
            self.known[name] = Known(
                seen.path, seen.identity, seen.digest, failed=True, serving=False
            )

    def load_explicit(self, name: str) -> None:
        """``RepositoryModelLoad`` in explicit mode: (re)load from ``model_dirs``, then pin.

        An unchanged, loaded bundle is only pinned (``PINNED_DEVICE``) and warmed. A meta
        loads its sub-models that are not loaded yet and pins every one of them (what a
        Triton user expects of an ensemble).
        """
        with self.lock:
            config = self._state.config
            found = scan_model_dirs(
                [Path(d) for d in config.model_dirs], include=config.models_include
            )
            seen = observe(found, self.digester)
            entry = self._load_pinned(name, found.conflicts, seen)
            if entry.meta is not None:
                for callee in entry.meta.calls:
                    self._load_pinned(callee, found.conflicts, seen)
                self._state.meta_floors[name] = Residency.PINNED_DEVICE

    def _load_pinned(
        self, name: str, conflicts: Mapping[str, str], found: Mapping[str, Seen]
    ) -> ModelEntry:
        if name in conflicts:
            raise FailedPreconditionError(conflicts[name])
        seen = found.get(name)
        if seen is None:
            raise ModelNotFoundError(f"no bundle named '{name}' in the model directories")
        known = self.known.get(name)
        entry = self._state.registry.get(name)
        if (
            entry is None
            or not entry.installed
            or known is None
            or known.failed
            or (known.digest != seen.digest)
        ):
            return self.install(name, seen, pin=True)
        runtime = self._runtime
        if name in runtime.weights and runtime.weights.enabled:
            runs = model_runs(entry.loaded) if entry.loaded is not None else None
            self._on_dispatch(lambda: apply_residency(runtime, name, Residency.PINNED_DEVICE, runs))
        return entry

    def refresh(self, seen: Mapping[str, Seen]) -> None:
        """Follow a directory replaced by the same content (a republication): new path/identity."""
        with self.lock:
            for name, now in seen.items():
                known = self.known.get(name)
                if known is None or known.failed or known.digest != now.digest:
                    continue
                if (known.path, known.identity) != (now.path, now.identity):
                    self.known[name] = attrs.evolve(known, path=now.path, identity=now.identity)

    # -- unload ----------------------------------------------------------------------------

    def unload(self, name: str, *, keep_groups: bool = False) -> None:
        """Remove ``name``: new requests get ``NOT_FOUND``; queued ones drain, then it is freed.

        With ``keep_groups`` (``RepositoryModelUnload``) a sub-model of a loaded meta is
        refused with ``FAILED_PRECONDITION``; the watcher unloads it anyway when its bundle
        is gone (the meta is then not ready until it comes back).
        """
        with self.lock:
            state = self._state
            entry = state.registry.get(name)
            owners = state.registry.owners(name)
            if keep_groups and owners and entry is not None:
                metas = ", ".join(f"'{meta}'" for meta in owners)
                raise FailedPreconditionError(
                    f"cannot unload model '{name}': it is a sub-model of loaded meta {metas}; "
                    "unload the meta first"
                )
            if entry is None:
                raise ModelNotFoundError(f"Request for unknown model: '{name}' is not found")
            if entry.scheduled is not None:
                scheduler = self._runtime.scheduler

                def retire() -> None:
                    state.registry.remove(name)
                    current = scheduler.model(name)
                    if current is not None:
                        self._retire_weights(current)
                    scheduler.remove_model(name)

                self._on_dispatch(retire)
            else:
                state.registry.remove(name)
            state.meta_floors.pop(name, None)
            if (gone := self.known.pop(name, None)) is not None:
                self.digester.forget(gone.path)
            state.forget_load(name)
            state.requests.forget(name)
            _log.info("model unloaded model=%s", name)

    # -- rename in place -------------------------------------------------------------------

    def rename(self, old: str, new: str, seen: Seen) -> None:
        """Serve ``old``'s generation as ``new``: no recompile, no memory movement."""
        with self.lock:
            state = self._state
            entry = state.registry.get(old)
            if entry is None or entry.manifest is None or not entry.installed:
                raise ModelNotFoundError(f"cannot rename '{old}': it is not loaded")
            if state.registry.get(new) is not None:
                raise ValueError(f"cannot rename '{old}' to '{new}': the name is taken")
            for caller in state.registry.owners(old):
                _log.warning(
                    "model %r renamed to %r but meta %r still calls %r; it is not ready until "
                    "a model of that name is loaded",
                    old,
                    new,
                    caller,
                    old,
                )
            manifest = attrs.evolve(entry.manifest, name=new)
            meta = entry.meta.renamed(new) if entry.meta is not None else None
            renamed = attrs.evolve(entry, name=new, manifest=manifest, reason="", meta=meta)
            self._on_dispatch(lambda: self._rename(old, new, renamed))
            if (gone := self.known.pop(old, None)) is not None and gone.path != seen.path:
                self.digester.forget(gone.path)
            self.known[new] = Known(seen.path, seen.identity, seen.digest)
            state.rename_load(old, new)
            state.requests.forget(old)
            _log.info("model renamed in place model=%s new_name=%s", old, new)

    def _rename(self, old: str, new: str, renamed: ModelEntry) -> None:
        """Dispatch thread: re-key scheduler, weight cache and registry in one step."""
        runtime, registry = self._runtime, self._state.registry
        if renamed.meta is not None:
            runtime.scheduler.rename_counters(old, new)
            registry.remove(old)
            registry.put(renamed)
            if (floor := self._state.meta_floors.pop(old, None)) is not None:
                self._state.meta_floors[new] = floor
            return
        scheduled = runtime.scheduler.rename_model(old, new)
        weights = runtime.weights
        if scheduled.weights == old:
            weights.rename_model(old, new)
            scheduled.weights = new
        settings = self._state.config.scheduler.for_model(new)
        scheduled.weight = settings.weight
        registry.remove(old)
        registry.put(renamed)
        if new in weights and weights.enabled and not weights.explicit:
            floor = (
                None if settings.residency is None else Residency.parse(settings.residency.value)
            )
            wanted = resolve_residency(floor, cache_enabled=True)
            if weights.residency(new) is not wanted:
                weights.set_residency(new, wanted)

    # -- helpers ---------------------------------------------------------------------------

    def _on_dispatch(self, fn: Callable[[], _T]) -> _T:
        return self._runtime.scheduler.control(fn).result()

    def _arm(self, entry: ModelEntry) -> None:
        """Free ``entry``'s generation after its last request once it stops admitting."""
        scheduled, loaded = entry.scheduled, entry.loaded
        assert scheduled is not None
        weights = self._runtime.weights

        def drained() -> None:
            key = scheduled.weights
            if key is not None and key in weights:
                weights.remove_model(key)
            if loaded is not None:
                loaded.close()
            _log.info(
                "generation retired model=%s generation=%d", scheduled.name, scheduled.generation
            )

        scheduled.on_drained = drained

    def _retire_weights(self, model: ScheduledModel) -> None:
        """Move a leaving generation's weights off the model name (it drains under its own key)."""
        key = model.weights
        if key is None or key not in self._runtime.weights:
            return
        retiring = f"{model.name}#retiring-g{model.generation}"
        self._runtime.weights.rename_model(key, retiring)
        model.weights = retiring

    def _discard(self, bundle: LoadedBundle) -> None:
        scheduled, loaded = bundle.entry.scheduled, bundle.entry.loaded
        key = scheduled.weights if scheduled is not None else None
        if key is not None and key in self._runtime.weights:
            self._runtime.weights.remove_model(key)
        if loaded is not None:
            loaded.close()
