"""WorkerServer in process: listener options, TLS and mutual TLS, start-up and shutdown order.

The end-to-end behaviour of a real ``reactantserver-worker`` subprocess is in
``tests/worker_e2e``; here the parts a subprocess makes awkward to observe.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from reactantserver.core.config import WorkerConfig, worker_config_from_mapping
from reactantserver.core.protocol import SERVER_LIVE, SERVER_READY, grpc_service_pb2
from reactantserver.worker.server import WorkerServer

_T = TypeVar("_T")

NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _config(tmp_path: Path, **endpoints: Any) -> WorkerConfig:
    data = {
        "model_dirs": [str(tmp_path)],
        "cache_dir": str(tmp_path / "cache"),
        "endpoints": {"port": _free_port(), **endpoints},
    }
    return worker_config_from_mapping(data, {})


def _run(config: WorkerConfig, body: Callable[[WorkerServer], Awaitable[_T]]) -> _T:
    async def main() -> _T:
        server = WorkerServer(config, version="9.9.9")
        await server.start()
        try:
            return await body(server)
        finally:
            await server.shut_down()

    return asyncio.run(main())


async def _live(channel: grpc.aio.Channel) -> bool:
    call = channel.unary_unary(
        SERVER_LIVE,
        request_serializer=grpc_service_pb2.ServerLiveRequest.SerializeToString,
        response_deserializer=grpc_service_pb2.ServerLiveResponse.FromString,
    )
    response = await call(grpc_service_pb2.ServerLiveRequest(), timeout=10)
    return bool(response.live)


def test_an_empty_repository_is_live_but_never_ready(tmp_path: Path) -> None:
    config = _config(tmp_path)

    async def body(server: WorkerServer) -> tuple[bool, bool, int]:
        await server.wait_booted()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            ready = channel.unary_unary(
                SERVER_READY,
                request_serializer=grpc_service_pb2.ServerReadyRequest.SerializeToString,
                response_deserializer=grpc_service_pb2.ServerReadyResponse.FromString,
            )
            answer = await ready(grpc_service_pb2.ServerReadyRequest(), timeout=10)
            health = health_pb2_grpc.HealthStub(channel)
            status = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
            return await _live(channel), answer.ready, status.status

    live, ready, status = _run(config, body)
    assert live
    assert not ready  # no model registered
    assert status == NOT_SERVING


def test_a_taken_port_fails_the_start(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        config = worker_config_from_mapping(
            {"model_dirs": [str(tmp_path)], "endpoints": {"port": taken.getsockname()[1]}}, {}
        )

        async def main() -> None:
            server = WorkerServer(config, version="0")
            try:
                await server.start()
            finally:
                await server.shut_down()

        with pytest.raises(RuntimeError, match="Failed to bind"):
            asyncio.run(main())


# -- TLS -------------------------------------------------------------------------------------


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _certificate(
    directory: Path, name: str, *, ca: tuple[Path, Path] | None = None
) -> tuple[Path, Path]:
    key, cert = directory / f"{name}.key", directory / f"{name}.pem"
    subject = f"/CN={name}"
    if ca is None:
        _openssl(
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-keyout", str(key), "-out", str(cert), "-subj", subject,
            "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
            "-addext", "basicConstraints=critical,CA:TRUE",
        )  # fmt: skip
        return key, cert
    request = directory / f"{name}.csr"
    extensions = directory / f"{name}.ext"
    extensions.write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(request),
        "-subj", subject,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", str(request), "-CA", str(ca[1]), "-CAkey", str(ca[0]),
        "-CAcreateserial", "-days", "2", "-out", str(cert), "-extfile", str(extensions),
    )  # fmt: skip
    return key, cert


needs_openssl = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


@needs_openssl
def test_tls_serves_clients_that_trust_the_certificate(tmp_path: Path) -> None:
    key, cert = _certificate(tmp_path, "server")
    config = _config(tmp_path, tls={"cert_file": str(cert), "key_file": str(key)})

    async def body(server: WorkerServer) -> tuple[bool, grpc.StatusCode]:
        trusted = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
        target = f"127.0.0.1:{server.grpc_port}"
        async with grpc.aio.secure_channel(target, trusted) as channel:
            live = await _live(channel)
        async with grpc.aio.insecure_channel(target) as plain:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await _live(plain)
        return live, refused.value.code()

    live, plain_status = _run(config, body)
    assert live
    assert plain_status is grpc.StatusCode.UNAVAILABLE


@needs_openssl
def test_mutual_tls_requires_a_client_certificate(tmp_path: Path) -> None:
    ca = _certificate(tmp_path, "ca")
    server_key, server_cert = _certificate(tmp_path, "server", ca=ca)
    client_key, client_cert = _certificate(tmp_path, "client", ca=ca)
    config = _config(
        tmp_path,
        tls={
            "cert_file": str(server_cert),
            "key_file": str(server_key),
            "client_ca_file": str(ca[1]),
        },
    )

    async def body(server: WorkerServer) -> tuple[bool, grpc.StatusCode]:
        target = f"127.0.0.1:{server.grpc_port}"
        with_cert = grpc.ssl_channel_credentials(
            root_certificates=ca[1].read_bytes(),
            private_key=client_key.read_bytes(),
            certificate_chain=client_cert.read_bytes(),
        )
        async with grpc.aio.secure_channel(target, with_cert) as channel:
            live = await _live(channel)
        without = grpc.ssl_channel_credentials(root_certificates=ca[1].read_bytes())
        async with grpc.aio.secure_channel(target, without) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await _live(channel)
        return live, refused.value.code()

    live, anonymous = _run(config, body)
    assert live
    assert anonymous is grpc.StatusCode.UNAVAILABLE
