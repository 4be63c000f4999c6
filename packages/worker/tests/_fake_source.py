"""A WeightSource for tests: in-memory uint8 arrays, counting file reads.

Shared by the weight cache's own tests and the server tests that need resident weights::

    cache.add_model("m", FakeSource(size=300), Residency.UNPINNED)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

__all__ = ["SIZE", "FakeSource"]

SIZE = 1000  # bytes of one test model's weights
Array = np.ndarray[Any, Any]


@attrs.define(eq=False)
class FakeSource:
    """A WeightSource over one uint8 array, counting file reads and floor changes."""

    fill_value: int = 0
    size: int = SIZE
    parts: int = 1
    reads: int = 0
    floor: list[Array] | None = None
    fail_reads: bool = False

    @property
    def nbytes(self) -> int:
        return self.size

    @property
    def host_resident(self) -> bool:
        return self.floor is not None

    def _read(self) -> list[Array]:
        if self.fail_reads:
            raise OSError("weights file vanished")
        self.reads += 1
        return [
            np.full(self.size // self.parts, self.fill_value, dtype=np.uint8)
            for _ in range(self.parts)
        ]

    def load(self) -> Sequence[Array]:
        return self.floor if self.floor is not None else self._read()

    def keep_host(self) -> None:
        if self.floor is None:
            self.floor = self._read()

    def drop_host(self) -> None:
        self.floor = None
