"""Several workers on one GPU: their arenas must fit the device together.

Workers share a device when each names it with ``gpu:``. Each one's allocator claims its own
``runtime.mem_fraction`` of the device (at start-up with ``preallocate``, the default, so a
worker that does not fit fails at once instead of at its first large batch); the weight
budget of each is then solved from its own arena. Core's resolution splits the single
worker's default between the sharers where ``mem_fraction`` is not set; this check refuses
fractions that add up to more than the whole device::

    notes = check_device_shares([("a", "0", config_a), ("b", "0", config_b)])
"""

from __future__ import annotations

from collections.abc import Sequence

from reactantserver.core.config import Backend, WorkerConfig
from reactantserver.core.errors import ConfigError

__all__ = ["MAX_SHARED_FRACTION", "check_device_shares"]

#: The most the ``mem_fraction`` of the workers of one device may add up to.
MAX_SHARED_FRACTION = 1.0


def check_device_shares(
    workers: Sequence[tuple[str, str | None, WorkerConfig]], *, where: str = ""
) -> list[str]:
    """Notes on each shared device; :class:`ConfigError` when the fractions exceed it.

    ``workers`` are ``(name, selector, resolved configuration)``; CPU workers (no selector,
    or the CPU backend) have no arena to share.
    """
    by_device: dict[str, list[tuple[str, WorkerConfig]]] = {}
    for name, selector, config in workers:
        if selector is not None and config.runtime.backend is Backend.CUDA:
            by_device.setdefault(selector, []).append((name, config))
    notes: list[str] = []
    for selector, sharing in by_device.items():
        if len(sharing) < 2:
            continue
        shares = ", ".join(f"{name} {c.runtime.mem_fraction:g}" for name, c in sharing)
        total = sum(c.runtime.mem_fraction for _, c in sharing)
        if total > MAX_SHARED_FRACTION + 1e-9:
            raise ConfigError(
                f"workers sharing device {selector!r} claim runtime.mem_fraction {shares}, "
                f"{total:g} of the device in all; give each its share (they must add up to "
                f"at most {MAX_SHARED_FRACTION:g}), or leave mem_fraction unset to split the "
                f"default between them{where}"
            )
        preallocated = all(c.runtime.preallocate for _, c in sharing)
        notes.append(
            f"device {selector} is shared by {len(sharing)} workers, runtime.mem_fraction "
            f"{shares}" + ("" if preallocated else "; some do not preallocate their arena")
        )
    return notes
