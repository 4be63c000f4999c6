"""Turns JAX (and PyTorch) models into ReactantServer bundles."""

from __future__ import annotations

from importlib.metadata import version as _version

__version__ = _version("reactantserver-export")

__all__ = ["__version__"]
