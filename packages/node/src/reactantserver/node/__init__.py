"""Node supervisor: one worker per device plus an embedded gateway."""

from __future__ import annotations

from importlib.metadata import version as _version

__version__ = _version("reactantserver-node")

__all__ = ["__version__"]
