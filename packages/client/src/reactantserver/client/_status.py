"""The status of a failed call, whichever gRPC flavour raised it."""

from __future__ import annotations

import grpc

__all__ = ["status_code", "status_details"]


def status_code(error: BaseException) -> grpc.StatusCode | None:
    """The gRPC status of ``error``; ``None`` for anything that is not a gRPC error.

    Blocking calls raise ``grpc.RpcError`` objects that are also ``grpc.Call``; ``grpc.aio``
    raises ``AioRpcError``, which is not, so both are read through their ``code()`` method.
    """
    if not isinstance(error, grpc.RpcError):
        return None
    code = getattr(error, "code", None)
    value = code() if callable(code) else None
    return value if isinstance(value, grpc.StatusCode) else None


def status_details(error: BaseException) -> str:
    """The status message of a gRPC ``error`` ("" for anything else)."""
    if not isinstance(error, grpc.RpcError):
        return ""
    details = getattr(error, "details", None)
    value = details() if callable(details) else None
    return value if isinstance(value, str) else ""
