"""The NVML seam of the worker's metrics: device lookup, readings, failures, staleness."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from reactantserver.worker.views._nvml import GpuSample, GpuSampler, load_pynvml

from ._nvml import READINGS, FakeGpu, FakeNvml

PID = 4242


def two_gpus() -> FakeNvml:
    return FakeNvml(
        [
            FakeGpu("GPU-aaaa-1111", utilization_percent=5, processes=[(PID, 1 << 30)]),
            FakeGpu(
                "GPU-bbbb-2222",
                utilization_percent=88,
                memory_used=3 << 30,
                processes=[(1, 7), (PID, 2 << 30), (PID, None)],
            ),
        ]
    )


@contextmanager
def sampling(selector: str, fake: Any, **kwargs: Any) -> Iterator[GpuSampler]:
    """A started sampler over ``fake``, closed afterwards."""
    sampler = GpuSampler(selector, lambda: fake, pid=PID, **kwargs)
    try:
        yield sampler
    finally:
        sampler.close()


@pytest.mark.parametrize(
    ("selector", "uuid"),
    [
        ("0", "GPU-aaaa-1111"),
        ("1", "GPU-bbbb-2222"),
        ("GPU-bbbb-2222", "GPU-bbbb-2222"),
        ("GPU-bbbb", "GPU-bbbb-2222"),  # a unique prefix, as CUDA_VISIBLE_DEVICES allows
    ],
)
def test_the_selector_names_the_device(selector: str, uuid: str) -> None:
    fake = two_gpus()
    with sampling(selector, fake) as sampler:
        sample = sampler.refresh()
    assert sample is not None
    assert sample.uuid == uuid
    assert fake.initialised == 0  # shut down on close


@pytest.mark.parametrize("selector", ["2", "GPU-", "GPU-cccc", "MIG-aaaa", "a100", "-1"])
def test_a_selector_without_a_device_gives_no_samples(selector: str) -> None:
    fake = two_gpus()
    with sampling(selector, fake) as sampler:
        assert sampler.refresh() is None
        assert sampler.latest() is None
    assert fake.initialised == 0
    assert not [name for name in fake.calls if name in READINGS]


def test_readings_in_si_units_and_this_process_memory() -> None:
    with sampling("1", two_gpus()) as sampler:
        sample = sampler.refresh()
    assert sample == GpuSample(
        uuid="GPU-bbbb-2222",
        utilization=0.88,
        memory_used_bytes=3 << 30,
        memory_total_bytes=80 << 30,
        power_watts=312.5,
        power_limit_watts=700.0,
        energy_joules=9876.543,
        process_used_bytes=2 << 30,  # pid 1 is not this process; None is skipped
    )


def test_a_process_nvml_does_not_list_has_no_process_memory() -> None:
    fake = FakeNvml([FakeGpu("GPU-x", processes=[(1, 99)])])
    with sampling("0", fake) as sampler:
        sample = sampler.refresh()
    assert sample is not None
    assert sample.process_used_bytes is None
    assert sample.memory_used_bytes == 5 << 30


def test_an_nvml_error_leaves_out_that_quantity_until_it_answers() -> None:
    fake = two_gpus()
    with sampling("0", fake) as sampler:
        fake.failing = {"nvmlDeviceGetPowerUsage", "nvmlDeviceGetUtilizationRates"}
        sample = sampler.refresh()
        assert sample is not None
        assert (sample.power_watts, sample.utilization) == (None, None)
        assert sample.power_limit_watts == 700.0
        fake.failing = set(READINGS)  # the device is lost: only the cached UUID is left
        assert sampler.refresh() == GpuSample(uuid="GPU-aaaa-1111")
        fake.failing = set()
        sample = sampler.refresh()
        assert sample is not None
        assert sample.utilization == 0.05


def test_a_reading_that_raises_something_else_is_an_empty_sample() -> None:
    fake = two_gpus()

    def broken(handle: int) -> Any:
        raise RuntimeError("driver bug")

    with sampling("0", fake) as sampler:
        assert sampler.refresh() is not None
        fake.nvmlDeviceGetMemoryInfo = broken  # type: ignore[method-assign]
        assert sampler.refresh() == GpuSample()


@pytest.mark.parametrize(
    "loader",
    [
        lambda: None,  # pynvml not installed
        lambda: FakeNvml([FakeGpu("GPU-a")], init_fails=True),  # no driver
        object,  # not NVML at all
    ],
)
def test_without_nvml_or_a_driver_there_are_no_samples(loader: Any) -> None:
    sampler = GpuSampler("0", loader)
    try:
        started = time.monotonic()
        assert sampler.refresh(timeout_s=5.0) is None
        assert time.monotonic() - started < 2.0  # the thread ended; nothing waited it out
        assert sampler.latest() is None
    finally:
        sampler.close()


def test_the_newest_sample_follows_the_device_and_goes_stale_when_nvml_hangs() -> None:
    fake = two_gpus()
    with sampling("0", fake, interval_s=0.05, max_age_s=0.5) as sampler:
        assert sampler.refresh() is not None
        fake.gpus[0].utilization_percent = 60
        deadline = time.monotonic() + 5
        while (s := sampler.latest()) is None or s.utilization != 0.6:
            assert time.monotonic() < deadline, "the sampler did not pick up the change"
            time.sleep(0.01)
        fake.running.clear()  # every read now blocks, as on a hung driver
        assert sampler.refresh(timeout_s=0.2) is not None  # the last sample, still fresh
        started = time.monotonic()
        while sampler.latest() is not None:
            assert time.monotonic() - started < 5
            time.sleep(0.02)
        assert time.monotonic() - started < 2
        fake.running.set()
        assert sampler.refresh() is not None


def test_the_handle_is_opened_once() -> None:
    fake = two_gpus()
    with sampling("GPU-bbbb", fake, interval_s=0.01) as sampler:
        for _ in range(5):
            assert sampler.refresh() is not None
    assert fake.calls["nvmlInit"] == 1
    assert fake.calls["nvmlDeviceGetHandleByUUID"] == 1
    assert fake.calls["nvmlDeviceGetUUID"] == 3  # two to match the prefix, one for the sample
    assert fake.calls["nvmlDeviceGetMemoryInfo"] >= 5
    assert fake.calls["nvmlShutdown"] == 1


def test_the_real_pynvml() -> None:
    """The real module: no samples without a driver; plausible ones with one."""
    assert load_pynvml() is not None  # nvidia-ml-py is in the environment
    sampler = GpuSampler(os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0")
    try:
        sample = sampler.refresh(timeout_s=30.0)
    finally:
        sampler.close()
    if not Path("/dev/nvidiactl").exists():
        assert sample is None
    elif sample is not None:
        assert sample.uuid is not None
        assert sample.uuid.startswith(("GPU-", "MIG-"))
        assert sample.memory_total_bytes is not None
        assert sample.memory_total_bytes > 0
