"""The device side of the worker: compiled executables and the weights on the device.

Everything here talks to the :class:`~reactantserver.worker.runtime.backend.Backend`
protocol; only :mod:`reactantserver.worker._backend` imports jax.
"""

from __future__ import annotations

__all__: list[str] = []
