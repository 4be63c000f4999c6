"""Residency floors: where a model's weights are kept between executions.

| State | Host copy | Device copy | Evictable |
|---|---|---|---|
| ``UNPINNED`` | none (read from the file on each load) | on demand | yes |
| ``PINNED_SYSTEM`` | kept for the generation's life | on demand (host->device copy) | yes |
| ``PINNED_DEVICE`` | not kept | loaded at admission, kept | no, outside the budget |

::

    residency = resolve_residency(Residency.parse(entry.residency), cache_enabled=True)
"""

from __future__ import annotations

import enum

__all__ = ["Residency", "resolve_residency"]

# Spellings accepted by Residency.parse: the enum's own (proto) names and the config values.
_ALIASES = {
    "unpinned": "unpinned",
    "pinned_system": "pinned_system",
    "system": "pinned_system",
    "pinned_device": "pinned_device",
    "device": "pinned_device",
}


class Residency(enum.Enum):
    """A model's residency floor; names match ``reactantserver.control.v1.Residency``."""

    UNPINNED = "unpinned"
    PINNED_SYSTEM = "pinned_system"
    PINNED_DEVICE = "pinned_device"

    @property
    def keeps_host_copy(self) -> bool:
        """Whether the host floor (materialised weights in RAM) is kept."""
        return self is Residency.PINNED_SYSTEM

    @property
    def evictable(self) -> bool:
        """Whether the device copy counts against the budget and may be evicted."""
        return self is not Residency.PINNED_DEVICE

    @classmethod
    def parse(cls, value: str) -> Residency:
        """A residency from its name or config value (``unpinned``, ``system``, ``device``...)."""
        key = _ALIASES.get(value.strip().lower())
        if key is None:
            raise ValueError(
                f"unknown residency {value!r}; expected one of {', '.join(sorted(_ALIASES))}"
            )
        return cls(key)


def resolve_residency(explicit: Residency | None, *, cache_enabled: bool) -> Residency:
    """The floor a model gets: the configured one wins; else ``PINNED_SYSTEM`` with the cache on.

    Applied at start-up, on loads and on renames. Without the on-demand cache every weight stays
    on the device, so the floor is ``UNPINNED`` (a host copy would only waste RAM).
    """
    if explicit is not None:
        return explicit
    return Residency.PINNED_SYSTEM if cache_enabled else Residency.UNPINNED
