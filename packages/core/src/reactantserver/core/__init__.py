"""The jax-free substrate every ReactantServer distribution stands on.

Public modules (import them directly, e.g. ``from reactantserver.core import protocol``):
``protocol`` (generated messages, method paths, hand registration); more land with spec 02.
"""

from __future__ import annotations

from importlib.metadata import version as _version

__version__ = _version("reactantserver-core")

__all__ = ["__version__"]
