"""Retry an execution once after a device out-of-memory, with other weights evicted."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol, TypeVar

__all__ = ["DEVICE_OOM_MARKERS", "Evictor", "is_device_oom", "run_with_oom_retry"]

#: Substrings (case-insensitive) of an execution error that mean the device ran out of memory.
DEVICE_OOM_MARKERS = ("RESOURCE_EXHAUSTED", "out of memory")

_log = logging.getLogger(__name__)
_T = TypeVar("_T")


class Evictor(Protocol):
    """What the retry needs from the weight cache."""

    def evict_unpinned(self, keep: str | None = None) -> int:
        """Evict every resident on-demand model except ``keep``; returns how many."""
        ...


def is_device_oom(exc: BaseException) -> bool:
    """Whether an execution error says the device ran out of memory."""
    text = str(exc).lower()
    return any(marker.lower() in text for marker in DEVICE_OOM_MARKERS)


def run_with_oom_retry(cache: Evictor, model: str, run: Callable[[], _T]) -> _T:
    """Run ``run``; on a device OOM with other on-demand weights resident, evict them, retry once.

    ``model``'s own weights stay resident, so ``run`` may keep using the buffers it was given.
    Any other error, an OOM with nothing to evict, or a second failure propagates (the
    dispatcher reports it to the requests as ``INTERNAL``).
    """
    try:
        return run()
    except Exception as exc:
        if not is_device_oom(exc):
            raise
        freed = cache.evict_unpinned(keep=model)
        if freed == 0:
            raise
        _log.warning(
            "device out of memory running %r; evicted %d other model(s) and retrying once",
            model,
            freed,
        )
    return run()
