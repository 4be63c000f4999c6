"""XLA process settings that must be in the environment before jax is first imported.

The allocator reads ``XLA_PYTHON_CLIENT_*`` and ``XLA_FLAGS`` once, when the PJRT client is
created, so start-up applies them first::

    for line in apply_xla_environment(config.runtime, os.environ):
        log.info(line)
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, MutableMapping
from pathlib import Path

import attrs

from reactantserver.core.config import Backend, Numerics, RuntimeConfig

__all__ = ["XlaEnvironment", "apply_xla_environment", "xla_environment"]

_AUTOTUNE_OFF = "--xla_gpu_autotune_level=0"
_AUTOTUNE_CACHE = "--xla_gpu_per_fusion_autotune_cache_dir"


@attrs.frozen
class XlaEnvironment:
    """The variables to set and a log line per decision."""

    variables: Mapping[str, str]
    notes: tuple[str, ...]


def xla_environment(
    runtime: RuntimeConfig, env: Mapping[str, str], *, autotune_cache_dir: Path | None = None
) -> XlaEnvironment:
    """What the environment must hold for ``runtime`` (pure: ``env`` is only read).

    Configuration wins over values already set; each override is noted. GPU allocator
    settings are left alone on the CPU backend, where they mean nothing.
    """
    wanted: dict[str, str] = {}
    notes: list[str] = []
    if runtime.backend is Backend.CUDA:
        wanted["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{runtime.mem_fraction:g}"
        wanted["XLA_PYTHON_CLIENT_PREALLOCATE"] = "true" if runtime.preallocate else "false"
        flags = env.get("XLA_FLAGS", "").split()
        if not runtime.autotune and _AUTOTUNE_OFF not in flags:
            flags = [f for f in flags if not f.startswith("--xla_gpu_autotune_level=")]
            flags.append(_AUTOTUNE_OFF)
        if runtime.autotune_cache and autotune_cache_dir is not None:
            flags = [f for f in flags if not f.startswith(_AUTOTUNE_CACHE)]
            flags.append(f"{_AUTOTUNE_CACHE}={autotune_cache_dir}")
        if flags:
            wanted["XLA_FLAGS"] = " ".join(flags)
    if runtime.numerics is Numerics.F32:
        wanted["NVIDIA_TF32_OVERRIDE"] = "0"

    variables: dict[str, str] = {}
    for name, value in wanted.items():
        before = env.get(name)
        if before == value:
            continue
        if before is not None:
            notes.append(f"{name}: configuration overrides {before!r} with {value!r}")
        else:
            notes.append(f"{name}={value}")
        variables[name] = value
    return XlaEnvironment(variables, tuple(notes))


def apply_xla_environment(
    runtime: RuntimeConfig,
    env: MutableMapping[str, str],
    *,
    autotune_cache_dir: Path | None = None,
) -> tuple[str, ...]:
    """Write the settings into ``env`` (normally ``os.environ``); returns the log lines.

    Raises ``RuntimeError`` when jax is already imported and something would change: the
    settings would silently not apply.
    """
    plan = xla_environment(runtime, env, autotune_cache_dir=autotune_cache_dir)
    if plan.variables and "jax" in sys.modules:
        raise RuntimeError(
            "XLA settings must be applied before jax is imported: " + ", ".join(plan.variables)
        )
    env.update(plan.variables)
    return plan.notes
