"""Executions and rows counted inside a peer's model function, read by the harness.

Each (server, model) pair owns a two-slot int64 file (``executions``, ``rows``), mapped
shared: the model function adds to it in whatever process runs it, and the harness reads it
at the window's edges. Two adds to a mapped array per execution cost nothing measurable next
to the execution. numpy only: the peers' server scripts import this module in their venvs::

    count = Counter.create(folder / "pytriton-tiny_mlp.counts")   # the harness, before start
    Counter.open(path).add(rows)                                  # the model function
    executions, rows = Counter.open(path).read()                  # the harness, at the edges
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Counter", "counter_path"]


def counter_path(folder: Path, server: str, model: str) -> Path:
    """Where ``server`` counts ``model``'s executions."""
    return folder / f"{server}-{model}.counts"


class Counter:
    """A mapped ``[executions, rows]`` pair of int64."""

    def __init__(self, path: Path, slots: np.memmap[Any, np.dtype[np.int64]]) -> None:
        self.path = path
        self._slots = slots

    @classmethod
    def create(cls, path: Path) -> Counter:
        """A fresh zeroed counter at ``path`` (replacing one there)."""
        path.write_bytes(bytes(16))
        return cls.open(path)

    @classmethod
    def open(cls, path: Path) -> Counter:
        """The counter at ``path``, mapped shared."""
        return cls(path, np.memmap(path, dtype=np.int64, mode="r+", shape=(2,)))

    def add(self, rows: int) -> None:
        """Count one execution of ``rows`` rows (one writer per counter: no lock)."""
        self._slots[0] += 1
        self._slots[1] += rows

    def read(self) -> tuple[int, int]:
        """(executions, rows) so far."""
        return int(self._slots[0]), int(self._slots[1])
