"""The jax-free substrate every ReactantServer distribution stands on.

Public modules (import them directly, e.g. ``from reactantserver.core import codec``):
``dtypes`` (element types), ``protocol`` (generated messages, method paths, hand
registration), ``errors`` (exceptions with their gRPC status), ``types`` (boundary types),
``codec`` (wire messages <-> boundary types), ``manifest`` (bundle manifests and layout),
``config`` (node/worker configuration), ``shm`` (system shared-memory registry),
``weights`` (safetensors reader, weight stores), ``buffer_pool`` (staging allocator),
``hooks`` (what a bundle's ``model.py`` sees), ``logs`` and ``log_settings`` (process
logging, Triton's ``LogSettings``).

Server-side modules, used by the worker and the gateway (their third-party parts come with
the ``server`` extra, so the thin client installs none of them): ``front`` (the native gRPC
front door over h2corn), ``rest`` (KServe V2 REST over gRPC handlers; ``rest.http_app``, the
aiohttp route and listener), ``serving`` (TLS material, health, reflection), ``lane`` (the
gateway-to-worker forwarding lane), ``status`` (the status page).
"""

from __future__ import annotations

from importlib.metadata import version as _version

__version__ = _version("reactantserver-core")

__all__ = ["__version__"]
