"""The worker's start-up load of every model, run on the loader thread.

The event loop keeps answering health and metadata while this runs: every scanned model is
listed ``LOADING`` first, then each bundle is parsed, its ``model.py`` imported and its
modules compiled; the weight cache admits the weights, the probe sizes the on-demand budget
and warms every compiled size, and only then do the models turn ``READY``::

    booted = boot(state, runtime)    # blocking; runtime: the worker server's build_runtime
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import attrs

from reactantserver.core.config import ModelControlMode, WorkerConfig
from reactantserver.core.errors import BundleError, status_message
from reactantserver.core.manifest import Manifest, load_manifest
from reactantserver.worker.hooks import BundleHooks, load_hooks
from reactantserver.worker.meta import MetaModel
from reactantserver.worker.registry import ModelEntry
from reactantserver.worker.repository.digest import BundleDigester
from reactantserver.worker.repository.reconcile import Seen
from reactantserver.worker.repository.scan import observe, scan_model_dirs
from reactantserver.worker.runtime.backend import CompileSpec
from reactantserver.worker.runtime.device_setup import (
    BackendStartError,
    budget_policy,
    create_backend,
)
from reactantserver.worker.runtime.loader import LoadedModel, load_bundle
from reactantserver.worker.runtime.page_locked import floor_source
from reactantserver.worker.runtime.probe import ModelRuns, model_runs, start_up
from reactantserver.worker.runtime.residency import Residency, resolve_residency
from reactantserver.worker.scheduler import ScheduledModel
from reactantserver.worker.state import Runtime, WorkerState

__all__ = [
    "BackendStartError",
    "Booted",
    "CompiledBundle",
    "LoadedBundle",
    "admit_model",
    "boot",
    "budget_policy",
    "check_meta_calls",
    "compile_model",
    "create_backend",
    "load_model",
    "warn_missing_callees",
]

_log = logging.getLogger("reactantserver.worker.boot")


@attrs.frozen
class LoadedBundle:
    """A compiled generation not yet serving: its registry entry and its warm-up runs."""

    entry: ModelEntry
    runs: ModelRuns
    seconds: float


@attrs.frozen
class CompiledBundle:
    """A bundle parsed, imported and compiled, its weights not yet admitted (loader thread)."""

    manifest: Manifest
    hooks: BundleHooks
    loaded: LoadedModel | None
    """``None`` for a meta model (no modules, no weights)."""
    generation: int
    started: float
    """``time.perf_counter()`` when the load began."""


def _compile_spec(config: WorkerConfig) -> CompileSpec:
    return CompileSpec(numerics=config.runtime.numerics.value, autotune=config.runtime.autotune)


def compile_model(
    state: WorkerState, runtime: Runtime, bundle: Path, *, generation: int = 1
) -> CompiledBundle:
    """Parse the manifest, import ``model.py`` and compile every module (no device memory).

    Raises ``BundleError``/``ManifestError`` (or anything the compile raises) on failure.
    """
    started = time.perf_counter()
    manifest = load_manifest(bundle)
    if manifest.is_meta:
        check_meta_calls(state, manifest, bundle)
    hooks = load_hooks(bundle, manifest, generation=generation)
    if manifest.is_meta:
        return CompiledBundle(manifest, hooks, None, generation, started)
    loaded = load_bundle(
        bundle, runtime.backend, runtime.executables, opts=_compile_spec(state.config)
    )
    return CompiledBundle(manifest, hooks, loaded, generation, started)


def check_meta_calls(state: WorkerState, manifest: Manifest, bundle: Path) -> None:
    """Load-time group check of a meta: no callee may be a loaded meta."""
    for callee in manifest.meta_calls:
        entry = state.registry.get(callee)
        if entry is not None and entry.is_meta:
            raise BundleError(
                f"{bundle}: meta '{manifest.name}' calls '{callee}', which is a meta model; "
                "a meta may call regular models only (one level)"
            )


def warn_missing_callees(state: WorkerState, name: str) -> None:
    """Log each callee of meta ``name`` that is not loaded: the meta is not ready until it is."""
    entry = state.registry.get(name)
    if entry is None or entry.meta is None:
        return
    for callee in entry.meta.calls:
        sub = state.registry.get(callee)
        if sub is None or not sub.installed:
            _log.warning(
                "meta %r calls %r, which is not loaded; the meta is not ready until it is",
                name,
                callee,
            )


def _admit_meta(state: WorkerState, compiled: CompiledBundle, key: str) -> LoadedBundle:
    manifest = compiled.manifest
    run = compiled.hooks.run
    if run is None:  # load_hooks refuses a meta without run; keep the type checker honest
        raise BundleError(f"meta '{manifest.name}' registered no run function")
    meta = MetaModel.from_manifest(manifest, run, generation=compiled.generation)
    entry = ModelEntry.ready(manifest, compiled.hooks, meta=meta)
    return LoadedBundle(entry, ModelRuns(key, ()), time.perf_counter() - compiled.started)


def admit_model(
    state: WorkerState,
    runtime: Runtime,
    compiled: CompiledBundle,
    *,
    key: str | None = None,
    residency: Residency | None = None,
) -> LoadedBundle:
    """Admit a compiled generation's weights to the weight cache under ``key``.

    ``key`` defaults to the model name (a reload stages under another key until its swap);
    ``residency`` overrides the configured floor. Runs where the weight cache may be touched:
    before the dispatch thread starts, or on it. The weights file is closed on failure.
    """
    manifest, loaded = compiled.manifest, compiled.loaded
    key = key or manifest.name
    if loaded is None:
        return _admit_meta(state, compiled, key)
    try:
        settings = state.config.scheduler.for_model(manifest.name)
        if loaded.weight_specs:
            if residency is None:
                floor = settings.residency
                parsed = None if floor is None else Residency.parse(floor.value)
                residency = resolve_residency(parsed, cache_enabled=runtime.weights.enabled)
            source = floor_source(
                loaded.weight_source(runtime.store),
                runtime.backend,
                page_locked=state.config.runtime.page_locked_weights,
                shared=state.config.runtime.shared_host_weights,
                name=key,
            )
            runtime.weights.add_model(key, source, residency)
        scheduled = ScheduledModel.from_loaded(
            loaded,
            generation=compiled.generation,
            weight=settings.weight,
            max_batch_size=settings.max_batch_size,
            queue_delay_ns=_queue_delay_ns(state.config.scheduler.queue_delay_us(manifest.name)),
        )
        if scheduled.weights is not None:
            scheduled.weights = key
    except BaseException:
        loaded.close()
        raise
    entry = ModelEntry.ready(manifest, compiled.hooks, scheduled=scheduled, loaded=loaded)
    runs = model_runs(loaded)
    return LoadedBundle(entry, ModelRuns(key, runs.runs), time.perf_counter() - compiled.started)


def load_model(
    state: WorkerState, runtime: Runtime, bundle: Path, *, generation: int = 1
) -> LoadedBundle:
    """Compile one bundle and admit its weights by residency floor (before dispatch starts).

    Raises ``BundleError``/``ManifestError`` (or anything the compile raises) on failure;
    nothing is left in the weight cache then.
    """
    compiled = compile_model(state, runtime, bundle, generation=generation)
    return admit_model(state, runtime, compiled)


def _describe(bundle: LoadedBundle, runtime: Runtime) -> str:
    manifest = bundle.entry.manifest
    assert manifest is not None
    tensors = ", ".join(f"{t.name}: {t.dtype.value}{t.wire_shape}" for t in manifest.client_inputs)
    if manifest.is_meta:
        return (
            f"model={manifest.name} kind=meta generation={bundle.entry.generation} "
            f"inputs=[{tensors}] calls=[{', '.join(manifest.meta_calls)}] "
            f"seconds={bundle.seconds:.3f}"
        )
    sizes = sorted({run.batch for run in bundle.runs.runs})
    name = manifest.name
    residency = runtime.weights.residency(name).name if name in runtime.weights else "none"
    return (
        f"model={name} generation={bundle.entry.generation} inputs=[{tensors}] "
        f"compiled_sizes={sizes if sizes != [0] else 'unbatched'} "
        f"weight_bytes={bundle.entry.loaded.weight_nbytes if bundle.entry.loaded else 0} "
        f"residency={residency} seconds={bundle.seconds:.3f}"
    )


def _load_all(state: WorkerState, runtime: Runtime, bundles: dict[str, Path]) -> list[LoadedBundle]:
    loaded: list[LoadedBundle] = []
    for name, path in bundles.items():
        started = time.perf_counter()
        try:
            bundle = load_model(state, runtime, path)
        except Exception as exc:
            reason = status_message(exc)
            _log.error("model load failed model=%s error=%s", name, reason)
            state.registry.put(ModelEntry.failed(name, reason))
            state.record_load(name, time.perf_counter() - started, ok=False)
            continue
        state.record_load(name, bundle.seconds, ok=True)
        loaded.append(bundle)
    return loaded


def _refuse_nested_metas(state: WorkerState, bundles: list[LoadedBundle]) -> list[LoadedBundle]:
    """Start-up's half of :func:`check_meta_calls`: a meta calling a meta loaded beside it fails.

    (During start-up every registry entry is still a placeholder, so the load-time check
    cannot see the other bundles.)
    """
    metas = {b.entry.name for b in bundles if b.entry.meta is not None}
    kept: list[LoadedBundle] = []
    for bundle in bundles:
        meta = bundle.entry.meta
        nested = [c for c in meta.calls if c in metas] if meta is not None else []
        if not nested:
            kept.append(bundle)
            continue
        reason = (
            f"meta '{bundle.entry.name}' calls '{nested[0]}', which is a meta model; "
            "a meta may call regular models only (one level)"
        )
        _log.error("model load failed model=%s error=%s", bundle.entry.name, reason)
        state.registry.put(ModelEntry.failed(bundle.entry.name, reason))
        state.record_load(bundle.entry.name, bundle.seconds, ok=False)
    return kept


@attrs.frozen
class Booted:
    """What start-up saw: every scanned bundle's digest (none in static mode), for the lifecycle."""

    seen: dict[str, Seen]
    digester: BundleDigester


def boot(state: WorkerState, runtime: Runtime) -> Booted:
    """Start-up on ``runtime`` (built by the worker server's ``build_runtime``): scan, compile,
    probe/warm-up, dispatch thread, then ready.

    A bundle that fails is ``UNAVAILABLE`` with the reason and does not stop the others.
    Each bundle is digested before it compiles, so a change made while it compiles is seen
    by the watcher's first poll.
    """
    config = state.config
    found = scan_model_dirs([Path(d) for d in config.model_dirs], include=config.models_include)
    for name, reason in found.conflicts.items():
        state.registry.put(ModelEntry.failed(name, reason))
    for name in found.bundles:
        state.registry.put(ModelEntry.loading(name))
    digester = BundleDigester()
    # Static mode never compares digests: do not read every weights file at start-up for it.
    static = config.model_control_mode is ModelControlMode.STATIC
    seen = {} if static else observe(found, digester)
    bundles = _refuse_nested_metas(state, _load_all(state, runtime, found.bundles))
    result = start_up(
        runtime.backend,
        runtime.weights,
        [b.runs for b in bundles],
        runtime.policy,
        warmup=config.runtime.warmup,
    )
    if result.budget is not None:
        _log.info("weight cache budget %s", result.budget.summary())
    runtime.scheduler.seed_costs(result.costs)
    for bundle in bundles:
        if bundle.entry.scheduled is not None:
            runtime.scheduler.add_model(bundle.entry.scheduled)
    runtime.scheduler.start()
    for bundle in bundles:
        state.registry.put(bundle.entry)
        _log.info("model loaded %s", _describe(bundle, runtime))
    for bundle in bundles:
        warn_missing_callees(state, bundle.entry.name)
    state.started = True
    _log.info(
        "worker ready: %d model(s) serving, %d failed",
        len(bundles),
        len(found.bundles) + len(found.conflicts) - len(bundles),
    )
    return Booted(seen, digester)


def _queue_delay_ns(microseconds: int | None) -> int | None:
    """A configured queue delay in nanoseconds (None stays None: the adaptive wait)."""
    return None if microseconds is None else microseconds * 1000
