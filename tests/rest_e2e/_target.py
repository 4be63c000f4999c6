"""What a REST end-to-end test talks to: one process's HTTP (REST) and gRPC ports.

``tritonclient.http`` drives the REST side and ``tritonclient.grpc`` the gRPC side of the same
worker or gateway; :func:`request` sends plain HTTP (urllib) for the cases a stock client
will not build, and :func:`error_body` checks the JSON ``{"error"}`` body of a failure.
:func:`explicit_env` is the environment of the suite's workers.
"""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests._e2e_support import worker_env

__all__ = [
    "Response",
    "Target",
    "error_body",
    "explicit_env",
    "grpc_input",
    "http_input",
    "request",
]

#: ``network_timeout`` of the HTTP clients (seconds): generous, never a timing assertion.
NETWORK_TIMEOUT_S = 60.0


@attrs.frozen
class Response:
    """A plain HTTP answer."""

    status: int
    headers: Mapping[str, str]
    body: bytes


@attrs.frozen
class Target:
    """A worker or gateway: its name and its HTTP and gRPC ports on 127.0.0.1."""

    name: str
    http_port: int
    grpc_port: int

    @property
    def http_url(self) -> str:
        """``host:port`` of the HTTP listener, as ``tritonclient.http`` wants it."""
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        """``host:port`` of the gRPC listener."""
        return f"127.0.0.1:{self.grpc_port}"

    @contextlib.contextmanager
    def clients(self) -> Iterator[tuple[Any, Any]]:
        """``(tritonclient.http client, tritonclient.grpc client)``, closed on exit."""
        rest = httpclient.InferenceServerClient(
            self.http_url, network_timeout=NETWORK_TIMEOUT_S, connection_timeout=10.0
        )
        try:
            with grpcclient.InferenceServerClient(self.grpc_url) as rpc:
                yield rest, rpc
        finally:
            rest.close()


def request(
    target: Target,
    path: str,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    method: str | None = None,
) -> Response:
    """One plain HTTP request (``POST`` when there is a body, else ``GET``)."""
    http = urllib.request.Request(
        f"http://{target.http_url}{path}",
        data=body,
        headers=dict(headers or {}),
        method=method or ("GET" if body is None else "POST"),
    )
    try:
        with urllib.request.urlopen(http, timeout=NETWORK_TIMEOUT_S) as answer:
            return Response(answer.status, dict(answer.headers), answer.read())
    except urllib.error.HTTPError as error:
        with error:
            return Response(error.code, dict(error.headers), error.read())


def error_body(response: Response) -> str:
    """The message of a JSON ``{"error": ...}`` body (fails on any other shape)."""
    assert response.headers.get("Content-Type", "").startswith("application/json"), response
    decoded = json.loads(response.body)
    assert set(decoded) == {"error"}, decoded
    message: str = decoded["error"]
    assert message
    assert "\n" not in message
    return message


def http_input(name: str, array: np.ndarray[Any, Any], datatype: str, *, binary: bool) -> Any:
    """A ``tritonclient.http`` input carrying ``array`` as JSON or binary data."""
    tensor = httpclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array, binary_data=binary)
    return tensor


def grpc_input(name: str, array: np.ndarray[Any, Any], datatype: str) -> Any:
    """A ``tritonclient.grpc`` input carrying ``array``."""
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def explicit_env(cache_dir: Path, name: str) -> dict[str, str]:
    """A worker behind the gateway, in ``explicit`` model control mode, called ``name``."""
    env = worker_env(cache_dir, MODEL_CONTROL_MODE="explicit")
    env["REACTANTSERVER_WORKER_NAME"] = name
    return env
