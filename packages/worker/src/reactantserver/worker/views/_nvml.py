"""The worker's one seam towards the NVIDIA driver: its device sampled through NVML, off the loop.

``/metrics`` is rendered on the event loop, and NVML can be slow (``nvmlInit`` takes up to
seconds on a machine without persistence mode; a device that fell off the bus can block a
call). So a :class:`GpuSampler` reads the device on its own daemon thread, every
``interval_s``, and a scrape only takes the newest :class:`GpuSample` (:meth:`GpuSampler.latest`):
an attribute read, never a driver call. A sample older than ``max_age_s`` is dropped, so a
hung driver makes the series disappear instead of freezing them::

    sampler = GpuSampler("0")        # a CUDA_VISIBLE_DEVICES selector
    sampler.start()
    sample = sampler.latest()        # None until the first read, without a driver, or stale

NVML is ``pynvml`` from ``nvidia-ml-py``, loaded by :func:`load_pynvml`; tests hand in a fake
module with the same functions instead. The functions used are ``nvmlInit``,
``nvmlShutdown``, ``nvmlDeviceGetCount``, ``nvmlDeviceGetHandleByIndex``,
``nvmlDeviceGetHandleByUUID``, ``nvmlDeviceGetUUID``, ``nvmlDeviceGetUtilizationRates``,
``nvmlDeviceGetMemoryInfo``, ``nvmlDeviceGetPowerUsage``, ``nvmlDeviceGetEnforcedPowerLimit``,
``nvmlDeviceGetTotalEnergyConsumption`` and ``nvmlDeviceGetComputeRunningProcesses``, and the
exception class ``NVMLError``.

Decisions made here:

* The device is found from the selector alone: a ``GPU-``/``MIG-`` UUID (or a unique prefix of
  one, as CUDA accepts) by UUID, a number by NVML index. NVML numbers devices in PCI bus order;
  CUDA does too when ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` or when the devices are all the same
  model, which is what a node runs on. Anything else finds no device.
* No module, no driver or no device: the thread ends after one try and every sample is
  ``None``. An ``NVMLError`` while reading leaves that one quantity out of the sample
  (``NOT_SUPPORTED`` power on some boards, utilisation on MIG); a lost device leaves them all
  out until it answers again.
* The process's own device memory is found by PID; inside a container without the host's PID
  namespace NVML reports host PIDs, so it is then absent.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any, TypeAlias, TypeVar

import attrs

__all__ = ["GpuSample", "GpuSampler", "NvmlLoader", "load_pynvml"]

_log = logging.getLogger("reactantserver.worker")
_T = TypeVar("_T")

#: Returns the NVML module (``pynvml`` or a fake with its functions), or ``None`` without one.
NvmlLoader: TypeAlias = Callable[[], Any]

_UUID_PREFIXES = ("GPU-", "MIG-")


def load_pynvml() -> Any:
    """``pynvml`` (from ``nvidia-ml-py``), or ``None`` where it is not installed."""
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        return None


@attrs.frozen
class GpuSample:
    """One reading of the device; ``None`` for what NVML could not tell."""

    #: The device's UUID (``GPU-...`` or ``MIG-...``).
    uuid: str | None = None
    #: Share of the last sample period (1/6 s to 1 s, by board) a kernel ran, 0..1.
    utilization: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    power_watts: float | None = None
    #: The power limit the driver enforces.
    power_limit_watts: float | None = None
    #: Energy the device used since the driver was loaded.
    energy_joules: float | None = None
    #: Device memory this process holds on the device.
    process_used_bytes: int | None = None


class _Device:
    """An initialised NVML and the cached handle of one device."""

    def __init__(self, nvml: Any, handle: Any, pid: int) -> None:
        self._nvml = nvml
        self._handle = handle
        self._pid = pid
        self._uuid = self._ask(lambda: _text(nvml.nvmlDeviceGetUUID(handle)))

    def _ask(self, read: Callable[[], _T]) -> _T | None:
        try:
            return read()
        except self._nvml.NVMLError:
            return None

    def read(self) -> GpuSample:
        nvml, handle = self._nvml, self._handle
        memory = self._ask(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
        return GpuSample(
            uuid=self._uuid,
            utilization=self._ask(lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100),
            memory_used_bytes=None if memory is None else int(memory.used),
            memory_total_bytes=None if memory is None else int(memory.total),
            power_watts=self._ask(lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000),
            power_limit_watts=self._ask(
                lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000
            ),
            energy_joules=self._ask(
                lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000
            ),
            process_used_bytes=self._ask(self._process_bytes),
        )

    def _process_bytes(self) -> int | None:
        used = [
            int(p.usedGpuMemory)
            for p in self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle)
            if p.pid == self._pid and p.usedGpuMemory is not None
        ]
        return sum(used) if used else None

    def close(self) -> None:
        _shutdown(self._nvml)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _handle(nvml: Any, selector: str) -> Any:
    """The handle of the device ``selector`` names, or ``None``; may raise ``NVMLError``."""
    if selector.isdigit():
        return nvml.nvmlDeviceGetHandleByIndex(int(selector))
    if not selector.startswith(_UUID_PREFIXES):
        return None
    try:
        return nvml.nvmlDeviceGetHandleByUUID(selector)
    except nvml.NVMLError:
        pass
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
    matches = [h for h in handles if _text(nvml.nvmlDeviceGetUUID(h)).startswith(selector)]
    return matches[0] if len(matches) == 1 else None


def _open(nvml: Any, selector: str, pid: int) -> _Device | None:
    """NVML initialised and the selector's device found, or ``None``; no ``NVMLError`` escapes."""
    if nvml is None:
        return None
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as error:
        _log.info("NVML unavailable (%s): no GPU series", error)
        return None
    why = "none or several match"
    try:
        handle = _handle(nvml, selector)
    except nvml.NVMLError as error:
        handle, why = None, str(error)
    if handle is None:
        _log.warning("NVML finds no device for %r (%s): no GPU series", selector, why)
        _shutdown(nvml)
        return None
    return _Device(nvml, handle, pid)


def _shutdown(nvml: Any) -> None:
    with contextlib.suppress(nvml.NVMLError):
        nvml.nvmlShutdown()


class GpuSampler:
    """Reads one device through NVML on a daemon thread; scrapes take the newest reading.

    ``selector`` is the worker's ``CUDA_VISIBLE_DEVICES`` selector; ``nvml`` loads the module
    (the seam); ``pid`` is the process whose device memory is reported (this one by default).
    """

    def __init__(
        self,
        selector: str,
        nvml: NvmlLoader = load_pynvml,
        *,
        interval_s: float = 2.0,
        max_age_s: float = 10.0,
        pid: int | None = None,
    ) -> None:
        self.selector = selector
        self._nvml = nvml
        self._interval_s = interval_s
        self._max_age_s = max_age_s
        self._pid = os.getpid() if pid is None else pid
        self._cond = threading.Condition()
        self._wake = threading.Event()
        self._latest: tuple[float, GpuSample] | None = None
        self._taken = 0
        self._reading = False
        self._finished = False
        self._stopping = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the sampling thread (once; later calls do nothing)."""
        with self._cond:
            if self._thread is not None:
                return
            self._thread = threading.Thread(
                target=self._run, name="reactantserver-nvml", daemon=True
            )
        self._thread.start()

    def latest(self) -> GpuSample | None:
        """The newest sample if it is at most ``max_age_s`` old; never calls NVML."""
        latest = self._latest
        if latest is None or time.monotonic() - latest[0] > self._max_age_s:
            return None
        return latest[1]

    def refresh(self, timeout_s: float = 5.0) -> GpuSample | None:
        """Ask for a new sample now and wait up to ``timeout_s`` for it (blocks: not on a loop).

        Returns :meth:`latest` afterwards: ``None`` without a driver, or when the read did not
        finish in time.
        """
        self.start()
        with self._cond:
            target = self._taken + (2 if self._reading else 1)
            self._wake.set()
            self._cond.wait_for(lambda: self._taken >= target or self._finished, timeout_s)
        return self.latest()

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the thread and shut NVML down (waits up to ``timeout_s`` for a call in flight)."""
        with self._cond:
            self._stopping = True
            thread = self._thread
        self._wake.set()
        if thread is not None:
            thread.join(timeout_s)

    def _run(self) -> None:
        try:
            device = _open(self._nvml(), self.selector, self._pid)
        except Exception:  # a broken module or fake must not end the worker's metrics noisily
            _log.warning("NVML could not be opened: no GPU series", exc_info=True)
            device = None
        try:
            while device is not None and not self._stopping:
                with self._cond:
                    self._reading = True
                    self._wake.clear()  # a refresh from here on is served by a later read
                try:
                    sample = device.read()
                except Exception:
                    _log.warning("NVML read failed", exc_info=True)
                    sample = GpuSample()
                with self._cond:
                    self._latest = (time.monotonic(), sample)
                    self._taken += 1
                    self._reading = False
                    self._cond.notify_all()
                if not self._stopping:
                    self._wake.wait(self._interval_s)
        finally:
            if device is not None:
                device.close()
            with self._cond:
                self._finished = True
                self._cond.notify_all()
