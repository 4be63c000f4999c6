"""How many workers a node runs and which device each one sees.

The backend is ``runtime.backend`` of the resolved workers (environment included). A CPU node
runs a count from ``gpus`` or ``cpu_workers``; a CUDA node runs one worker per detected selector,
or falls back to CPU workers when ``runtime.allow_cpu_fallback`` allows it. Synthesized workers
come from core's ``synthesize_workers``; an explicit ``workers:`` list is bound here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import attrs

from reactantserver.core.config import (
    AUTO_GPUS,
    ENV_PREFIX,
    Backend,
    NodeConfig,
    WorkerEntry,
    key_variable,
    node_worker_configs,
    synthesize_workers,
)
from reactantserver.core.errors import ConfigError
from reactantserver.node._devices import DeviceSelection, NvmlCount, detect_devices

__all__ = ["BACKEND_VARIABLE", "WorkerLayout", "lay_out_workers"]

#: The worker variable that forces the backend of CPU-fallback workers.
BACKEND_VARIABLE: Final = key_variable(ENV_PREFIX, ("runtime", "backend"))


@attrs.frozen(kw_only=True)
class WorkerLayout:
    """The node with its workers listed, the selector of each (``None`` = CPU) and why.

    ``forced_cpu`` is set when a CUDA node found no device and falls back to CPU workers; their
    children then get ``REACTANTSERVER_WORKER_RUNTIME_BACKEND=cpu``.
    """

    node: NodeConfig
    selectors: tuple[str | None, ...]
    devices: DeviceSelection
    forced_cpu: bool = False
    notes: tuple[str, ...] = ()

    @property
    def workers(self) -> tuple[WorkerEntry, ...]:
        """The worker entries, in declaration order."""
        assert self.node.workers is not None
        return self.node.workers


def _where(node: NodeConfig) -> str:
    return f" (in {node.source})" if node.source is not None else ""


def _backend(node: NodeConfig, env: Mapping[str, str]) -> tuple[Backend, bool]:
    configs = node_worker_configs(node, env, quiet=True)
    backends = {name: config.runtime.backend for name, config in configs.items()}
    if len(set(backends.values())) > 1:
        listed = ", ".join(f"{name}={backend.value}" for name, backend in backends.items())
        raise ConfigError(
            f"runtime.backend: every worker of a node must use the same backend, got {listed}"
            + _where(node)
        )
    fallback = all(config.runtime.allow_cpu_fallback for config in configs.values())
    return next(iter(backends.values())), fallback


def _no_device_message(devices: DeviceSelection) -> str:
    found = {
        "none": "gpus is auto, CUDA_VISIBLE_DEVICES is unset and NVML found no device",
        "CUDA_VISIBLE_DEVICES": "CUDA_VISIBLE_DEVICES hides every device",
    }.get(devices.source, f"{devices.source} selects no device")
    return f"runtime.backend is cuda but no CUDA device was found ({found})"


def _cpu_layout(
    node: NodeConfig,
    count: int,
    devices: DeviceSelection,
    *,
    forced_cpu: bool,
    notes: list[str],
) -> WorkerLayout:
    node = synthesize_workers(node, count)
    assert node.workers is not None
    return WorkerLayout(
        node=node,
        selectors=(None,) * len(node.workers),
        devices=devices,
        forced_cpu=forced_cpu,
        notes=tuple(notes),
    )


_SHARE_HINT = "; workers share a device only when each of them names it with gpu:"


def _bind_listed(
    node: NodeConfig, workers: tuple[WorkerEntry, ...], selectors: tuple[str, ...]
) -> tuple[tuple[WorkerEntry, ...], list[str]]:
    where = _where(node)
    positional = [i for i, entry in enumerate(workers) if entry.gpu is None]
    if positional and positional[-1] >= len(selectors):
        raise ConfigError(
            f"workers: {len(workers)} workers but only {len(selectors)} device(s) "
            f"({', '.join(selectors)}){_SHARE_HINT}{where}"
        )
    bound: list[WorkerEntry] = []
    owners: dict[int, list[int]] = {}
    for index, entry in enumerate(workers):
        device = index if entry.gpu is None else entry.gpu
        if device >= len(selectors):
            raise ConfigError(
                f"workers[{index}].gpu: {device} is out of range; {len(selectors)} device(s) "
                f"were found ({', '.join(selectors)}){where}"
            )
        others = owners.setdefault(device, [])
        clash = next((o for o in others if entry.gpu is None or workers[o].gpu is None), None)
        if clash is not None:
            raise ConfigError(
                f"workers[{index}]: device {selectors[device]!r} (gpu {device}) is also bound "
                f"to workers[{clash}] ({workers[clash].name}){_SHARE_HINT}{where}"
            )
        others.append(index)
        bound.append(attrs.evolve(entry, gpu=device))
    unused = [selector for i, selector in enumerate(selectors) if i not in owners]
    notes = []
    if unused:
        notes.append(f"device(s) {', '.join(unused)} are not used by any worker")
    return tuple(bound), notes


def lay_out_workers(
    node: NodeConfig, env: Mapping[str, str], *, nvml_count: NvmlCount
) -> WorkerLayout:
    """The node's workers and their devices per the 09 device table.

    Raises :class:`ConfigError` for a CUDA node without devices (unless CPU fallback is on),
    explicit workers that do not fit the devices, or workers that disagree on the backend.
    """
    backend, fallback = _backend(node, env)
    if backend is Backend.CPU:
        if node.gpus == AUTO_GPUS:
            devices = DeviceSelection((), "none")
        else:
            devices = detect_devices(node.gpus, env, nvml_count=nvml_count)
        count = len(devices.selectors) or node.cpu_workers
        return _cpu_layout(node, count, devices, forced_cpu=False, notes=[])
    devices = detect_devices(node.gpus, env, nvml_count=nvml_count)
    if not devices.selectors:
        if not fallback:
            raise ConfigError(
                f"{_no_device_message(devices)}; expose the GPUs (docker --gpus, "
                "nvidia.com/gpu), set gpus or REACTANTSERVER_NODE_GPUS to their ordinals or UUIDs, "
                "set runtime.backend: cpu, or set runtime.allow_cpu_fallback: true" + _where(node)
            )
        count = node.cpu_workers if node.workers is None else len(node.workers)
        note = (
            f"{_no_device_message(devices)}; runtime.allow_cpu_fallback is on: running "
            f"{count} CPU worker(s) with runtime.backend forced to cpu"
        )
        return _cpu_layout(node, count, devices, forced_cpu=True, notes=[note])
    if node.workers is None:
        node = synthesize_workers(node, len(devices.selectors), bind_gpus=True)
        assert node.workers is not None
        return WorkerLayout(node=node, selectors=devices.selectors, devices=devices)
    workers, notes = _bind_listed(node, node.workers, devices.selectors)
    return WorkerLayout(
        node=attrs.evolve(node, workers=workers),
        selectors=tuple(devices.selectors[entry.gpu or 0] for entry in workers),
        devices=devices,
        notes=tuple(notes),
    )
