"""The two ways the GPU kit runs: on the GPU machine, and the CPU dry run that keeps it honest.

Every size, time budget and device share of the kit is here, so the dry run exercises the
same code at smoke size. Benchmark processes (not workers) get a small, non-preallocated
share of the device; each worker gets its own ``runtime.mem_fraction``, so several processes
share the one GPU the way a node's workers do::

    mode = MODES["gpu"]
    env = worker_env(mode, work, mem_fraction=0.25)
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path

import attrs

from bench.gpu._resnet import FULL, SMOKE, Arch

__all__ = ["MODES", "Mode", "bench_env", "remaining_s", "worker_env"]


@attrs.frozen(kw_only=True)
class Mode:
    """One way to run the kit: platform, model size, and how much of everything."""

    name: str
    platform: str
    arch: Arch
    served_batches: tuple[int, ...]
    """Compiled sizes of the served model; ``served`` measures each with as many clients."""
    density_batches: tuple[int, ...]
    density_models: int
    density_concurrency: int
    density_rounds: int
    window_s: float
    """Measured seconds of one window (served, density); shortened near a deadline."""
    warmup_s: float
    transfer_repeats: int
    transfer_bytes: int
    """Bytes of the contiguous raw-copy array (the model's weights are what they are)."""
    budgets_s: Mapping[str, float]
    """Each step's time budget; the kit also stops starting steps once its own is spent."""
    bench_mem_fraction: float
    """Device share of a benchmark process (not preallocated)."""
    served_mem_fraction: float
    density_mem_fraction: float


MODES: Mapping[str, Mode] = {
    "gpu": Mode(
        name="gpu",
        platform="cuda",
        arch=FULL,
        served_batches=(1, 2, 4, 8, 16, 32, 64),
        density_batches=(1, 4),
        density_models=30,
        density_concurrency=16,
        density_rounds=2,
        window_s=4.0,
        warmup_s=1.0,
        transfer_repeats=7,
        transfer_bytes=100 << 20,
        budgets_s={
            "tests": 60,
            "transfers": 40,
            "startup": 80,
            "served": 85,
            "density": 140,
            "scaling": 55,
        },
        bench_mem_fraction=0.3,
        served_mem_fraction=0.4,
        density_mem_fraction=0.2,
    ),
    "cpu-dry-run": Mode(
        name="cpu-dry-run",
        platform="cpu",
        arch=SMOKE,
        served_batches=(1, 2, 4),
        density_batches=(1, 2),
        density_models=6,
        density_concurrency=4,
        density_rounds=1,
        window_s=0.6,
        warmup_s=0.2,
        transfer_repeats=3,
        transfer_bytes=4 << 20,
        budgets_s={
            "tests": 90,
            "transfers": 40,
            "startup": 60,
            "served": 60,
            "density": 90,
            "scaling": 50,
        },
        bench_mem_fraction=0.3,
        served_mem_fraction=0.4,
        density_mem_fraction=0.2,
    ),
}


def remaining_s(deadline: float) -> float:
    """Seconds left until ``deadline`` (a ``time.time()`` instant)."""
    return deadline - time.time()


def bench_env(mode: Mode) -> dict[str, str]:
    """The environment of a benchmark process: a small device share, claimed as needed."""
    env = dict(os.environ)
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{mode.bench_mem_fraction:g}"
    if mode.platform == "cpu":
        env["JAX_PLATFORMS"] = "cpu"
    return env


def worker_env(mode: Mode, cache: Path, *, mem_fraction: float) -> dict[str, str]:
    """``REACTANTSERVER_WORKER_*`` overrides for a kit worker on ``mode``'s platform.

    Autotuning is off everywhere in the kit (a ResNet-50's convolutions autotune for minutes);
    every executable, raw or served, comes from the same executable cache, so figures compare
    like with like. The worker claims its device share at start (the product's default).
    """
    return {
        "REACTANTSERVER_WORKER_RUNTIME_BACKEND": "cuda" if mode.platform == "cuda" else "cpu",
        "REACTANTSERVER_WORKER_RUNTIME_ALLOW_CPU_FALLBACK": "false",
        "REACTANTSERVER_WORKER_RUNTIME_MEM_FRACTION": f"{mem_fraction:g}",
        "REACTANTSERVER_WORKER_RUNTIME_PREALLOCATE": "true",
        "REACTANTSERVER_WORKER_RUNTIME_AUTOTUNE": "false",
        "REACTANTSERVER_WORKER_CACHE_DIR": str(cache),
        "REACTANTSERVER_WORKER_LOGGING_LEVEL": "info",
    }
