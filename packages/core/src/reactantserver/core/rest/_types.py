"""The types every REST piece shares: the backend seam, the error, the response, the statuses."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from typing import Any, NoReturn, Protocol

import attrs
import grpc
from google.protobuf.message import Message

__all__ = [
    "CONTENT_TYPE",
    "JSON",
    "OCTET_STREAM",
    "RestBackend",
    "RestCallError",
    "RestContext",
    "RestResponse",
    "empty_response",
    "error_response",
    "http_status",
    "json_response",
]

CONTENT_TYPE = "Content-Type"
JSON = "application/json"
OCTET_STREAM = "application/octet-stream"

# Everything not listed is a client-side problem: 400.
_HTTP_STATUS = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.DATA_LOSS: 500,
}
_BAD_REQUEST = 400


def http_status(code: grpc.StatusCode) -> int:
    """The HTTP status a gRPC status maps to (``OK`` → 200; unlisted non-OK codes → 400)."""
    return _HTTP_STATUS.get(code, _BAD_REQUEST)


class RestCallError(Exception):
    """A call that ended with a non-OK gRPC status; REST answers :func:`http_status` of it.

    Backends raise it for the status the gRPC handler aborted with; the translation raises it
    (``INVALID_ARGUMENT``) for a malformed HTTP request::

        raise RestCallError(grpc.StatusCode.NOT_FOUND, "unknown model 'm'")
    """

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"RestCallError({self.code!r}, {self.message!r})"


class RestContext:
    """The servicer-context adapter a REST call hands to a gRPC handler.

    An adapter, not a mock: the handlers only ever ``await context.abort(code, details)``,
    read ``context.time_remaining()`` and ``context.invocation_metadata()`` (the HTTP headers,
    for ``traceparent``) and may send initial metadata; over REST an abort is a
    :class:`RestCallError` (which ``handle_rest`` turns into the HTTP status), the budget is
    the request's own, and gRPC metadata has no REST form (it is dropped).
    """

    def __init__(
        self, time_remaining: float | None, headers: Iterable[tuple[str, str]] = ()
    ) -> None:
        self._deadline = None if time_remaining is None else time.monotonic() + time_remaining
        self._headers = headers

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        """The request's HTTP headers as metadata pairs (names lower-cased), read on demand."""
        return tuple((key.lower(), value) for key, value in self._headers)

    def time_remaining(self) -> float | None:
        """Seconds left of the call's budget (``None``: no transport deadline)."""
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - time.monotonic())

    async def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn:
        """End the call with ``code``: raises :class:`RestCallError`."""
        raise RestCallError(code, details)

    async def send_initial_metadata(self, metadata: object) -> None:
        """Nothing to send: gRPC metadata (the forwarding lane's advert) is not part of REST."""
        del metadata


class RestBackend(Protocol):
    """What a REST front calls: one unary method of the inference service by its gRPC name."""

    async def call(
        self,
        method: str,
        request: Message,
        time_remaining: float | None,
        headers: Iterable[tuple[str, str]] = (),
    ) -> Message:  # pragma: no cover - protocol
        """Run ``method`` (``"ModelInfer"``, ``"ServerLive"``, ...) on ``request``.

        Returns the response message; raises :class:`RestCallError` for a non-OK status.
        ``time_remaining`` is the caller's budget in seconds (``None``: none); ``headers`` are
        the HTTP request's, handed to the handler as its metadata (``RestContext``).
        """
        ...


@attrs.frozen
class RestResponse:
    """An HTTP answer: status, body and the headers the body needs (``Content-Type``, ...)."""

    status: int
    body: bytes
    headers: Mapping[str, str] = attrs.field(factory=dict)

    def json(self) -> Any:
        """The body parsed as JSON (for JSON answers and errors)."""
        return json.loads(self.body)


def json_response(value: Any, status: int = 200) -> RestResponse:
    """``value`` as a JSON body with its content type."""
    body = json.dumps(value, separators=(",", ":")).encode()
    return RestResponse(status, body, {CONTENT_TYPE: JSON})


def empty_response(status: int = 200) -> RestResponse:
    """An answer without a body (health, ready, register, load...)."""
    return RestResponse(status, b"", {})


def error_response(
    status: int, message: str, headers: Mapping[str, str] | None = None
) -> RestResponse:
    """The KServe V2 error answer: ``{"error": message}`` with ``status``."""
    response = json_response({"error": message}, status)
    return attrs.evolve(response, headers={**response.headers, **(headers or {})})
