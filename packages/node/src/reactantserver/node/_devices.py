"""Which devices a node runs on and how many threads each worker gets.

Nothing here reads ``os.environ``: callers hand in the environment. The one place that talks to
the NVIDIA driver is :func:`nvml_device_count`, passed around as an :data:`NvmlCount` so tests
(and machines without a driver) can substitute a count.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final, TypeAlias

import attrs

from reactantserver.core.config import NODE_PREFIX, GpuSpec, key_variable
from reactantserver.core.errors import ConfigError

__all__ = [
    "CUDA_VISIBLE_DEVICES",
    "GPUS_VARIABLE",
    "MAX_WORKER_THREADS",
    "DeviceSelection",
    "NvmlCount",
    "available_cores",
    "cgroup_cpu_limit",
    "detect_devices",
    "nvml_device_count",
    "parse_gpu_spec",
    "thread_allotment",
]

#: The variable every child is given exactly one device through (``""`` for CPU workers).
CUDA_VISIBLE_DEVICES: Final = "CUDA_VISIBLE_DEVICES"
#: Overrides the node file's ``gpus``.
GPUS_VARIABLE: Final = key_variable(NODE_PREFIX, ("gpus",))
#: Upper bound of the per-worker thread allotment.
MAX_WORKER_THREADS: Final = 16
_AUTO: Final = "auto"

#: How the supervisor asks the driver for the number of devices (``None`` = no driver).
NvmlCount: TypeAlias = Callable[[], "int | None"]


def nvml_device_count() -> int | None:
    """The number of NVIDIA devices NVML reports, or ``None`` without a usable driver.

    This is the node's one seam towards the NVIDIA driver (``pynvml`` from ``nvidia-ml-py``):
    ``nvmlInit``, ``nvmlDeviceGetCount``, ``nvmlShutdown``. A missing module, a missing shared
    library or driver, or any ``NVMLError`` yields ``None``; it never raises.
    """
    try:
        pynvml: Any = importlib.import_module("pynvml")
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        return int(pynvml.nvmlDeviceGetCount())
    except pynvml.NVMLError:
        return None
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def parse_gpu_spec(value: str, *, variable: str) -> GpuSpec:
    """``REACTANTSERVER_NODE_GPUS`` / ``--gpus`` text as a ``gpus`` value.

    A bare integer ``N`` is a device count (``0`` = a CPU node); ``auto`` restores detection;
    anything else is a comma list of ordinals or UUIDs (trimmed). Empty text, empty items,
    negative numbers and duplicates raise :class:`ConfigError` naming ``variable``.
    """
    text = value.strip()
    if not text:
        raise ConfigError(
            f"{variable}: must be a device count, auto, or a comma list of ordinals or UUIDs, "
            "got an empty value"
        )
    if text.isdigit():
        return int(text)
    if text.lower() == _AUTO:
        return _AUTO
    selectors: list[str] = []
    for index, part in enumerate(text.split(",")):
        selector = part.strip()
        if not selector:
            raise ConfigError(f"{variable}: item {index} is empty, got {value!r}")
        if selector.startswith("-"):
            raise ConfigError(
                f"{variable}: {selector!r} is not a device ordinal (int >= 0) or UUID"
            )
        if selector in selectors:
            raise ConfigError(f"{variable}: duplicate selector {selector!r}")
        selectors.append(selector)
    return tuple(selectors)


@attrs.frozen
class DeviceSelection:
    """The devices found and where they came from.

    ``selectors`` are ordinal strings or UUIDs passed verbatim as ``CUDA_VISIBLE_DEVICES``;
    ``source`` is ``REACTANTSERVER_NODE_GPUS``, ``gpus``, ``CUDA_VISIBLE_DEVICES``, ``nvml`` or
    ``none``.
    """

    selectors: tuple[str, ...]
    source: str


def _spec_selectors(gpus: int | tuple[str, ...]) -> tuple[str, ...]:
    return tuple(str(i) for i in range(gpus)) if isinstance(gpus, int) else gpus


def _gpus_source(gpus: GpuSpec, env: Mapping[str, str]) -> str:
    # The caller has already folded REACTANTSERVER_NODE_GPUS (or --gpus) into ``gpus``; name the
    # variable when the value is the one it holds.
    raw = env.get(GPUS_VARIABLE, "")
    if raw.strip():
        try:
            if parse_gpu_spec(raw, variable=GPUS_VARIABLE) == gpus:
                return GPUS_VARIABLE
        except ConfigError:
            pass
    return "gpus"


def _visible_devices(value: str) -> tuple[str, ...]:
    selectors: list[str] = []
    for part in value.split(","):
        selector = part.strip()
        if selector.startswith("-"):
            break  # CUDA stops enumerating at an invalid entry ("-1" hides every device)
        if selector and selector not in selectors:
            selectors.append(selector)
    return tuple(selectors)


def detect_devices(
    gpus: GpuSpec, env: Mapping[str, str], *, nvml_count: NvmlCount = nvml_device_count
) -> DeviceSelection:
    """The node's device selectors: the first source that says anything wins.

    ``gpus`` (already overridden by ``--gpus`` / ``REACTANTSERVER_NODE_GPUS``; a count ``N`` means
    ``"0"``…``"N-1"``, ``0`` a CPU node) unless ``auto``; then ``CUDA_VISIBLE_DEVICES`` (a set
    but empty value means no devices, and detection stops there); then the NVML device count;
    else none.
    """
    if gpus != _AUTO:
        assert not isinstance(gpus, str)
        return DeviceSelection(_spec_selectors(gpus), _gpus_source(gpus, env))
    visible = env.get(CUDA_VISIBLE_DEVICES)
    if visible is not None:
        return DeviceSelection(_visible_devices(visible), CUDA_VISIBLE_DEVICES)
    count = nvml_count()
    if count:
        return DeviceSelection(tuple(str(i) for i in range(count)), "nvml")
    return DeviceSelection((), "none")


def _affinity() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1  # pragma: no cover - Linux has sched_getaffinity


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None


def _quota_cpus(quota: str, period: str) -> int | None:
    try:
        quota_us, period_us = int(quota), int(period)
    except ValueError:
        return None
    if quota_us <= 0 or period_us <= 0:
        return None  # -1 = no limit
    return math.ceil(quota_us / period_us)


def cgroup_cpu_limit(cgroup_root: Path) -> int | None:
    """The cgroup CPU quota in whole CPUs (rounded up), or ``None`` when none is set.

    cgroup v2: ``cpu.max`` holds ``"<quota> <period>"`` or ``"max <period>"``; cgroup v1:
    ``cpu/cpu.cfs_quota_us`` (``-1`` = none) over ``cpu/cpu.cfs_period_us``.
    """
    text = _read(cgroup_root / "cpu.max")
    if text is not None:
        parts = text.split()
        if len(parts) == 2 and parts[0] != "max":
            return _quota_cpus(parts[0], parts[1])
        return None
    for controller in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        quota = _read(cgroup_root / controller / "cpu.cfs_quota_us")
        period = _read(cgroup_root / controller / "cpu.cfs_period_us")
        if quota is not None and period is not None:
            return _quota_cpus(quota, period)
    return None


def available_cores(
    *, affinity: Callable[[], int] | None = None, cgroup_root: Path = Path("/sys/fs/cgroup")
) -> int:
    """CPUs this process may use: its affinity mask, capped by the cgroup CPU quota (>= 1)."""
    cores = (affinity or _affinity)()
    limit = cgroup_cpu_limit(cgroup_root)
    if limit is not None:
        cores = min(cores, limit)
    return max(1, cores)


def thread_allotment(cores: int, workers: int) -> int:
    """Hook-pool threads per worker: ``clamp(cores // workers, 1, 16)``."""
    return max(1, min(cores // max(1, workers), MAX_WORKER_THREADS))
