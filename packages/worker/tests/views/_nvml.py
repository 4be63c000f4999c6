"""A stand-in for ``pynvml`` behind the worker's NVML seam (``views._nvml``).

:class:`FakeNvml` has the functions the seam calls, over a list of :class:`FakeGpu`; a test
changes a device's readings, makes named functions raise :class:`NVMLError`, or makes them
block, between scrapes. Units are NVML's: percent, bytes, milliwatts, millijoules.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import attrs


class NVMLError(Exception):
    """The fake's ``pynvml.NVMLError``."""


@attrs.define
class FakeGpu:
    """One device's readings, in NVML's units."""

    uuid: str
    utilization_percent: int = 37
    memory_used: int = 5 << 30
    memory_total: int = 80 << 30
    power_mw: int = 312_500
    power_limit_mw: int = 700_000
    energy_mj: int = 9_876_543
    #: (pid, used bytes or None) of the compute processes on the device.
    processes: list[tuple[int, int | None]] = attrs.field(factory=list)


class FakeNvml:
    """The subset of ``pynvml`` the seam uses, over ``gpus`` (index order)."""

    NVMLError = NVMLError

    def __init__(self, gpus: list[FakeGpu], *, init_fails: bool = False) -> None:
        self.gpus = gpus
        self.init_fails = init_fails
        #: Names of functions that raise NVMLError while listed.
        self.failing: set[str] = set()
        #: Cleared to make every device read block until it is set again.
        self.running = threading.Event()
        self.running.set()
        self.calls: dict[str, int] = {}
        self.initialised = 0

    def _call(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        if name in self.failing:
            raise NVMLError(name)

    def _read(self, name: str, handle: int) -> FakeGpu:
        self._call(name)
        self.running.wait()
        return self.gpus[handle]

    def nvmlInit(self) -> None:
        self._call("nvmlInit")
        if self.init_fails:
            raise NVMLError("NVML Shared Library Not Found")
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self._call("nvmlShutdown")
        self.initialised -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._call("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self._call("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise NVMLError("Invalid Argument")
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        self._call("nvmlDeviceGetHandleByUUID")
        for index, gpu in enumerate(self.gpus):
            if gpu.uuid == uuid:
                return index
        raise NVMLError("Not Found")

    def nvmlDeviceGetUUID(self, handle: int) -> bytes:
        return self._read("nvmlDeviceGetUUID", handle).uuid.encode()  # older pynvml: bytes

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        gpu = self._read("nvmlDeviceGetUtilizationRates", handle)
        return SimpleNamespace(gpu=gpu.utilization_percent, memory=0)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        gpu = self._read("nvmlDeviceGetMemoryInfo", handle)
        free = gpu.memory_total - gpu.memory_used
        return SimpleNamespace(total=gpu.memory_total, used=gpu.memory_used, free=free)

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        return self._read("nvmlDeviceGetPowerUsage", handle).power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: int) -> int:
        return self._read("nvmlDeviceGetEnforcedPowerLimit", handle).power_limit_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> int:
        return self._read("nvmlDeviceGetTotalEnergyConsumption", handle).energy_mj

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Any]:
        gpu = self._read("nvmlDeviceGetComputeRunningProcesses", handle)
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in gpu.processes]


#: Every device-reading function of the fake (the ones a lost device fails).
READINGS = (
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetComputeRunningProcesses",
)
