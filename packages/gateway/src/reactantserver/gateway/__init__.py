"""One gRPC endpoint over many ReactantServer workers."""

from __future__ import annotations

from importlib.metadata import version as _version

__version__ = _version("reactantserver-gateway")

__all__ = ["__version__"]
