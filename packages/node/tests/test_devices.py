"""Device detection, ``REACTANTSERVER_NODE_GPUS`` syntax, the cgroup CPU quota and the thread
allotment."""

from __future__ import annotations

from pathlib import Path

import pytest

from reactantserver.core.errors import ConfigError
from reactantserver.node._devices import (
    DeviceSelection,
    available_cores,
    cgroup_cpu_limit,
    detect_devices,
    nvml_device_count,
    parse_gpu_spec,
    thread_allotment,
)

from ._nvml import must_not_ask, nvml_reporting


def test_nvml_seam_returns_none_without_a_driver() -> None:
    # No NVIDIA driver on the test machines: the seam says so instead of raising.
    assert nvml_device_count() is None


# --- REACTANTSERVER_NODE_GPUS / --gpus syntax -----------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2", 2),
        (" 0 ", 0),
        ("auto", "auto"),
        ("AUTO", "auto"),
        ("1", 1),
        ("0,1", ("0", "1")),
        (" 3 , 1 ", ("3", "1")),
        ("GPU-abc", ("GPU-abc",)),
        ("GPU-abc, GPU-def", ("GPU-abc", "GPU-def")),
    ],
)
def test_parse_gpu_spec(text: str, expected: object) -> None:
    assert parse_gpu_spec(text, variable="REACTANTSERVER_NODE_GPUS") == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "REACTANTSERVER_NODE_GPUS: must be a device count"),
        ("   ", "REACTANTSERVER_NODE_GPUS: must be a device count"),
        ("0,0", "REACTANTSERVER_NODE_GPUS: duplicate selector '0'"),
        ("0,,1", "REACTANTSERVER_NODE_GPUS: item 1 is empty"),
        ("-1", "REACTANTSERVER_NODE_GPUS: '-1' is not a device ordinal"),
    ],
)
def test_parse_gpu_spec_errors_name_the_variable(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_gpu_spec(text, variable="REACTANTSERVER_NODE_GPUS")


def test_parse_gpu_spec_names_the_flag() -> None:
    with pytest.raises(ConfigError, match=r"^--gpus: "):
        parse_gpu_spec("", variable="--gpus")


# --- detection order --------------------------------------------------------------------------


def test_node_count_wins_over_everything() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "5,6,7"}
    assert detect_devices(2, env, nvml_count=must_not_ask) == DeviceSelection(("0", "1"), "gpus")


def test_node_selectors_pass_through_verbatim() -> None:
    selection = detect_devices(("GPU-a", "3"), {}, nvml_count=must_not_ask)
    assert selection == DeviceSelection(("GPU-a", "3"), "gpus")


def test_count_zero_is_a_cpu_node_and_stops_detection() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "0"}
    assert detect_devices(0, env, nvml_count=must_not_ask) == DeviceSelection((), "gpus")


def test_source_is_the_variable_when_it_set_the_value() -> None:
    env = {"REACTANTSERVER_NODE_GPUS": "0, 1"}
    selection = detect_devices(("0", "1"), env, nvml_count=must_not_ask)
    assert selection == DeviceSelection(("0", "1"), "REACTANTSERVER_NODE_GPUS")
    # A flag that overrode the variable is not reported as the variable.
    assert detect_devices(3, env, nvml_count=must_not_ask).source == "gpus"


def test_cuda_visible_devices_when_auto() -> None:
    env = {"CUDA_VISIBLE_DEVICES": " 2, GPU-x ,2"}
    selection = detect_devices("auto", env, nvml_count=must_not_ask)
    assert selection == DeviceSelection(("2", "GPU-x"), "CUDA_VISIBLE_DEVICES")


def test_empty_cuda_visible_devices_means_no_devices() -> None:
    selection = detect_devices("auto", {"CUDA_VISIBLE_DEVICES": ""}, nvml_count=must_not_ask)
    assert selection == DeviceSelection((), "CUDA_VISIBLE_DEVICES")


def test_cuda_visible_devices_stops_at_an_invalid_entry() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "1,-1,2"}
    assert detect_devices("auto", env, nvml_count=must_not_ask).selectors == ("1",)


def test_nvml_count_when_nothing_else_says() -> None:
    selection = detect_devices("auto", {}, nvml_count=nvml_reporting(3))
    assert selection == DeviceSelection(("0", "1", "2"), "nvml")


@pytest.mark.parametrize("count", [None, 0])
def test_no_devices(count: int | None) -> None:
    selection = detect_devices("auto", {}, nvml_count=nvml_reporting(count))
    assert selection == DeviceSelection((), "none")


# --- cores ------------------------------------------------------------------------------------


def _write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n", encoding="ascii")


def test_no_cgroup_files_means_no_limit(tmp_path: Path) -> None:
    assert cgroup_cpu_limit(tmp_path) is None
    assert available_cores(affinity=lambda: 12, cgroup_root=tmp_path) == 12


@pytest.mark.parametrize(
    ("cpu_max", "expected"),
    [("max 100000", 12), ("200000 100000", 2), ("150000 100000", 2), ("50000 100000", 1)],
)
def test_cgroup_v2_quota(tmp_path: Path, cpu_max: str, expected: int) -> None:
    _write(tmp_path, "cpu.max", cpu_max)
    assert available_cores(affinity=lambda: 12, cgroup_root=tmp_path) == expected


def test_cgroup_quota_above_affinity_keeps_affinity(tmp_path: Path) -> None:
    _write(tmp_path, "cpu.max", "6400000 100000")
    assert available_cores(affinity=lambda: 4, cgroup_root=tmp_path) == 4


@pytest.mark.parametrize(("quota", "expected"), [("-1", 12), ("250000", 3), ("100000", 1)])
@pytest.mark.parametrize("controller", ["cpu", "cpu,cpuacct"])
def test_cgroup_v1_quota(tmp_path: Path, controller: str, quota: str, expected: int) -> None:
    _write(tmp_path, f"{controller}/cpu.cfs_quota_us", quota)
    _write(tmp_path, f"{controller}/cpu.cfs_period_us", "100000")
    assert available_cores(affinity=lambda: 12, cgroup_root=tmp_path) == expected


def test_garbled_cgroup_file_is_ignored(tmp_path: Path) -> None:
    _write(tmp_path, "cpu.max", "lots 100000")
    assert available_cores(affinity=lambda: 5, cgroup_root=tmp_path) == 5


def test_available_cores_of_this_process() -> None:
    assert available_cores() >= 1


# --- thread allotment -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cores", "workers", "threads"),
    [(32, 2, 16), (16, 2, 8), (8, 1, 8), (100, 1, 16), (1, 4, 1), (7, 2, 3)],
)
def test_thread_allotment_examples(cores: int, workers: int, threads: int) -> None:
    assert thread_allotment(cores, workers) == threads
