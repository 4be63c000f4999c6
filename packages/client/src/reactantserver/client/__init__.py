"""Thin Pythonic client for ReactantServer and any KServe V2 / Triton gRPC server."""

from __future__ import annotations

from importlib.metadata import version as _version

__version__ = _version("reactantserver-client")

__all__ = ["__version__"]
