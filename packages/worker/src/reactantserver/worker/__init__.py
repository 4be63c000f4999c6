"""Compiles StableHLO bundles with XLA and serves them over the Triton/KServe gRPC protocol."""

from __future__ import annotations

from importlib.metadata import version as _version

__version__ = _version("reactantserver-worker")

__all__ = ["__version__"]
