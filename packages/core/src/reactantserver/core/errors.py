"""Exception hierarchy: each request-level error carries the gRPC status it maps to.

Errors are raised where the problem is found and translated once, at the transport edge::

    try:
        ...
    except ReactantError as exc:
        await context.abort(exc.status, str(exc))

Anything that is not a :class:`ReactantError` maps to ``INTERNAL`` (:func:`status_of`).
Load-time errors (:class:`ManifestError`, :class:`BundleError`, :class:`ConfigError`) never
reach a request; their messages name the file and the key path.
"""

from __future__ import annotations

from typing import ClassVar

import grpc

__all__ = [
    "BundleError",
    "ConfigError",
    "DeadlineExceededError",
    "FailedPreconditionError",
    "InvalidArgumentError",
    "ManifestError",
    "ModelNotFoundError",
    "ModelUnavailableError",
    "OverloadedError",
    "PoolAcquireTimeout",
    "ReactantError",
    "RegionNotRegisteredError",
    "ShuttingDownError",
    "status_message",
    "status_of",
]


class ReactantError(Exception):
    """Base of every request-level failure; ``status`` is its gRPC status code."""

    status: ClassVar[grpc.StatusCode] = grpc.StatusCode.INTERNAL


class InvalidArgumentError(ReactantError):
    """The client sent something invalid (also raised by ``model.py`` hooks)."""

    status = grpc.StatusCode.INVALID_ARGUMENT


class ModelNotFoundError(ReactantError):
    """No visible model of that name (or version)."""

    status = grpc.StatusCode.NOT_FOUND


class ModelUnavailableError(ReactantError):
    """The model exists but cannot serve now: loading, failed load, or not resident."""

    status = grpc.StatusCode.UNAVAILABLE


class FailedPreconditionError(ReactantError):
    """The server is not in a state that allows the operation."""

    status = grpc.StatusCode.FAILED_PRECONDITION


class RegionNotRegisteredError(FailedPreconditionError):
    """A request names a shared-memory region that is not registered."""


class DeadlineExceededError(ReactantError):
    """The request's deadline passed before it could complete."""

    status = grpc.StatusCode.DEADLINE_EXCEEDED


class PoolAcquireTimeout(DeadlineExceededError):
    """A :class:`~reactantserver.core.buffer_pool.BufferPool` acquire ran past its deadline."""


class OverloadedError(ReactantError):
    """A bounded queue or the in-flight cap is full."""

    status = grpc.StatusCode.RESOURCE_EXHAUSTED


class ShuttingDownError(ReactantError):
    """The server is draining and takes no new work."""

    status = grpc.StatusCode.UNAVAILABLE


class ManifestError(ValueError):
    """A ``manifest.yaml`` breaks a rule of the manifest grammar (docs/reference/manifest.md); the
    message names file, key path, rule."""


class BundleError(ValueError):
    """A bundle's files are inconsistent (missing module, bad weights, bad ``model.py``)."""


class ConfigError(ValueError):
    """Invalid node or worker configuration; the message names the key path."""


def status_message(exc: BaseException) -> str:
    """An error as one line: its text with runs of whitespace collapsed, else its type's name.

    The one helper for every status message, log line and recorded reason built from an
    exception.
    """
    return " ".join(str(exc).split()) or type(exc).__name__


def status_of(exc: BaseException) -> grpc.StatusCode:
    """The gRPC status an exception maps to at the transport edge (``INTERNAL`` by default)."""
    if isinstance(exc, ReactantError):
        return exc.status
    return grpc.StatusCode.INTERNAL
