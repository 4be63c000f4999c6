"""The ASGI messages ``GrpcApp`` sends for each way a unary call ends, without a socket.

A call that fails before its response started is answered the way gRPC's HTTP/2 protocol
calls Trailers-Only: the status rides in the one header block that ends the stream (the
front test checks a real client reads it; here, that no separate trailers are sent).
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from reactantserver.core.front import GrpcApp, MethodTable, RpcContext

SERVICE = "test.Echo"


def _app() -> GrpcApp:
    methods = MethodTable()

    async def echo(request: bytes, context: RpcContext) -> bytes:
        return request

    async def refuse(request: bytes, context: RpcContext) -> bytes:
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "not now")
        raise AssertionError("unreachable")

    methods.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler(
                SERVICE,
                {
                    "Echo": grpc.unary_unary_rpc_method_handler(echo),
                    "Refuse": grpc.unary_unary_rpc_method_handler(refuse),
                    "Gated": grpc.unary_unary_rpc_method_handler(echo),
                },
            )
        ]
    )
    methods.set_gate(f"/{SERVICE}/Gated", lambda: "the worker is full")
    return GrpcApp(methods, max_recv_msg_bytes=1 << 20, max_send_msg_bytes=1 << 20)


def _call(method: str, payload: bytes = b"hi") -> list[dict[str, Any]]:
    """Run one unary call through the app; the messages it sent."""
    sent: list[dict[str, Any]] = []
    body = b"\0" + len(payload).to_bytes(4, "big") + payload

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "path": f"/{SERVICE}/{method}",
        "headers": [(b"content-type", b"application/grpc"), (b"te", b"trailers")],
        "client": ("127.0.0.1", 1),
    }
    asyncio.run(_app()(scope, receive, send))
    return sent


def _status_of(headers: list[tuple[bytes, bytes]]) -> tuple[bytes, bytes]:
    found = dict(headers)
    return found.get(b"grpc-status", b""), found.get(b"grpc-message", b"")


def _assert_trailers_only(sent: list[dict[str, Any]], status: bytes, message: bytes) -> None:
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    start, end = sent
    assert start["trailers"] is False
    assert (b"content-type", b"application/grpc") in start["headers"]
    assert _status_of(start["headers"]) == (status, message)
    assert (end["body"], end["more_body"]) == (b"", False)


def test_an_answer_is_start_message_and_status_trailers() -> None:
    sent = _call("Echo")
    kinds = [m["type"] for m in sent]
    assert kinds == ["http.response.start", "http.response.body", "http.response.trailers"]
    assert sent[0]["trailers"] is True
    assert sent[1]["body"] == b"\0\0\0\0\x02hi"
    assert _status_of(sent[2]["headers"]) == (b"0", b"")


def test_a_refusal_at_the_gate_is_trailers_only() -> None:
    _assert_trailers_only(_call("Gated"), b"8", b"the worker is full")


def test_an_unknown_method_is_trailers_only() -> None:
    _assert_trailers_only(_call("Missing"), b"12", b"Method not found!")


def test_a_handler_that_aborts_before_answering_is_trailers_only() -> None:
    _assert_trailers_only(_call("Refuse"), b"9", b"not now")
