"""A started worker for the server tests, built by the start-up code's own functions.

The configuration is written as a node file's worker block would write it and structured by
``worker_config_from_mapping``; the runtime comes from ``server.build_runtime`` and every bundle
from ``boot.load_model``, so the tests see the caches, floors and scheduler the server builds.
Only the probe and warm-up of ``boot.boot`` are skipped (tests count weight loads)::

    config = world_config(tmp_path / "cache", budget=1 << 20, residency={"m": "device"})
    world = start_world(config, [bundle_dir])
    try:
        ...  # world.state serves; world.runtime.scheduler is running
    finally:
        world.close()
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from reactantserver.core.config import (
    ModelControlMode,
    SchedulingDiscipline,
    WorkerConfig,
    worker_config_from_mapping,
)
from reactantserver.worker.repository.boot import LoadedBundle, load_model
from reactantserver.worker.server import build_runtime
from reactantserver.worker.state import Runtime, WorkerState

__all__ = ["World", "start_world", "world_config"]

WORKER_THREADS = "REACTANTSERVER_WORKER_THREADS"


def world_config(
    cache_dir: Path,
    *,
    mode: ModelControlMode = ModelControlMode.DYNAMIC,
    discipline: SchedulingDiscipline = SchedulingDiscipline.FAIR,
    budget: int = 0,
    residency: Mapping[str, str] | None = None,
    worker_name: str | None = None,
    hook_threads: int = 2,
) -> WorkerConfig:
    """A worker configuration as the loader would build it.

    ``budget > 0`` turns the on-demand weight cache on (``runtime.weight_cache_max_bytes``; on
    CPU there is no arena, so 0 leaves it off). ``residency`` maps model names to configured
    floors (``unpinned``, ``system``, ``device``); unnamed models get the floor boot chooses.
    """
    data: dict[str, Any] = {
        "cache_dir": str(cache_dir),
        "model_control_mode": mode.value,
        "runtime": {"weight_cache_max_bytes": budget},
        "scheduler": {
            "discipline": discipline.value,
            "models": {name: {"residency": floor} for name, floor in (residency or {}).items()},
        },
    }
    env = {WORKER_THREADS: str(hook_threads)}
    return worker_config_from_mapping(data, env, worker_name=worker_name)


@attrs.define(eq=False)
class World:
    """One worker's state with a started runtime (scheduler running, every bundle READY)."""

    state: WorkerState
    runtime: Runtime
    bundles: list[LoadedBundle] = attrs.Factory(list)

    def close(self) -> None:
        """Stop the scheduler, shut the hook pool and close every loaded model."""
        self.runtime.scheduler.stop(grace_s=1.0)
        self.runtime.pool.shutdown()
        for bundle in self.bundles:
            if bundle.entry.loaded is not None:
                bundle.entry.loaded.close()


def start_world(
    config: WorkerConfig, bundles: Sequence[Path], *, version: str = "0.0.test"
) -> World:
    """Build the runtime, load and register ``bundles`` in order (metas too), start the scheduler.

    The caller owns the result and must :meth:`World.close` it; on failure everything built
    so far is closed before the error propagates.
    """
    state = WorkerState(config, version=version)
    runtime = build_runtime(state)
    state.runtime = runtime
    world = World(state, runtime)
    try:
        for path in bundles:
            bundle = load_model(state, runtime, path)
            world.bundles.append(bundle)
            if bundle.entry.scheduled is not None:  # a meta has nothing scheduled
                runtime.scheduler.add_model(bundle.entry.scheduled)
            state.registry.put(bundle.entry)
        runtime.scheduler.start()
    except BaseException:
        world.close()
        raise
    state.started = True
    return world
