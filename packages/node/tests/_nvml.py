"""Stand-ins for the NVML device-count seam of ``reactantserver.node._devices``."""

from __future__ import annotations

from reactantserver.node._devices import NvmlCount


def nvml_reporting(count: int | None) -> NvmlCount:
    """An NVML seam that reports ``count`` devices (``None``: no driver)."""

    def nvml() -> int | None:
        return count

    return nvml


def must_not_ask() -> int | None:
    """An NVML seam for plans that must not consult NVML: fails the test if called."""
    raise AssertionError("NVML must not be consulted")
