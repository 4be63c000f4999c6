"""TLS and mTLS end to end, with certificates the test makes (``openssl``).

One CA signs every certificate. ``tls_worker`` serves TLS (``endpoints.tls.cert_file`` and
``key_file``); ``mtls_worker`` also requires client certificates (``client_ca_file``). A
gateway serves TLS on its public port and reaches ``mtls_worker`` over mTLS
(``worker_client.tls.*``), so stock ``tritonclient.grpc`` with ``ssl=True`` infers through
two TLS hops. The harnesses poll readiness in plaintext, so these servers are started and
polled over TLS here.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import attrs
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.gateway_e2e._gateway import GatewayProcess
from tests.worker_e2e._harness import (
    STARTUP_TIMEOUT_S,
    WorkerProcess,
    infer_input,
    status_of,
    wait_for,
)

from ._certs import certificate, needs_openssl
from .conftest import base_env

pytestmark = [needs_openssl, pytest.mark.slow]


@attrs.frozen
class Pki:
    """The CA, one server certificate (``localhost``, ``127.0.0.1``) and one client's."""

    ca: Path
    server_key: Path
    server_cert: Path
    client_key: Path
    client_cert: Path


class Server(Protocol):
    """What :func:`tls_running` needs of a worker or gateway harness process."""

    proc: subprocess.Popen[bytes] | None

    @property
    def url(self) -> str: ...
    def start(self) -> None: ...
    def stop(self) -> int | None: ...
    def log_tail(self, nchars: int = ...) -> str: ...


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """Fresh certificates for this module."""
    directory = tmp_path_factory.mktemp("pki")
    ca = certificate(directory, "ca")
    server_key, server_cert = certificate(directory, "server", ca=ca)
    client_key, client_cert = certificate(directory, "client", ca=ca)
    return Pki(ca[1], server_key, server_cert, client_key, client_cert)


def client(url: str, pki: Pki | None = None, *, with_cert: bool = False) -> Any:
    """A tritonclient: plaintext without ``pki``, else TLS trusting the CA (+ client cert)."""
    if pki is None:
        return grpcclient.InferenceServerClient(url)
    if not with_cert:
        return grpcclient.InferenceServerClient(url, ssl=True, root_certificates=str(pki.ca))
    return grpcclient.InferenceServerClient(
        url,
        ssl=True,
        root_certificates=str(pki.ca),
        private_key=str(pki.client_key),
        certificate_chain=str(pki.client_cert),
    )


@contextlib.contextmanager
def tls_running(server: Server, pki: Pki, *, with_cert: bool) -> Iterator[None]:
    """Start ``server``, wait until it is ready over TLS; stop it on exit (must exit 0)."""
    server.start()

    def ready() -> bool:
        proc = server.proc
        assert proc is not None
        assert proc.poll() is None, f"exited during start-up:\n{server.log_tail()}"
        with (
            contextlib.suppress(InferenceServerException),
            client(server.url, pki, with_cert=with_cert) as triton,
        ):
            return bool(triton.is_server_ready(client_timeout=2))
        return False

    try:
        wait_for(ready, "ready over TLS", STARTUP_TIMEOUT_S)
        yield
    finally:
        code = server.stop()
    assert code == 0, f"exited with {code}:\n{server.log_tail()}"


def _tls_env(cache_dir: Path, pki: Pki, *, mutual: bool) -> dict[str, str]:
    extra = {
        "ENDPOINTS_TLS_CERT_FILE": str(pki.server_cert),
        "ENDPOINTS_TLS_KEY_FILE": str(pki.server_key),
    }
    if mutual:
        extra["ENDPOINTS_TLS_CLIENT_CA_FILE"] = str(pki.ca)
    return base_env(cache_dir, **extra)


@pytest.fixture(scope="module")
def tls_worker(
    repo: Path, cache_dir: Path, pki: Pki, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    """A worker serving TLS without client authentication."""
    log = tmp_path_factory.mktemp("tls") / "tls_worker.log"
    worker = WorkerProcess(repo, log, _tls_env(cache_dir, pki, mutual=False))
    with tls_running(worker, pki, with_cert=False):
        yield worker


@pytest.fixture(scope="module")
def mtls_worker(
    repo: Path, cache_dir: Path, pki: Pki, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    """A worker that requires a client certificate signed by the CA."""
    log = tmp_path_factory.mktemp("mtls") / "mtls_worker.log"
    worker = WorkerProcess(repo, log, _tls_env(cache_dir, pki, mutual=True))
    with tls_running(worker, pki, with_cert=True):
        yield worker


@pytest.fixture(scope="module")
def tls_gateway(
    mtls_worker: WorkerProcess, pki: Pki, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    """TLS on the public port, mTLS (CA + client certificate) towards :func:`mtls_worker`."""
    settings: dict[str, Any] = {
        "tls": {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key)},
        "worker_client": {
            "tls": {
                "ca_file": str(pki.ca),
                "cert_file": str(pki.client_cert),
                "key_file": str(pki.client_key),
            }
        },
    }
    directory = tmp_path_factory.mktemp("tls_gateway")
    gateway = GatewayProcess([mtls_worker], directory, settings=settings)
    with tls_running(gateway, pki, with_cert=False):
        yield gateway


def infer(triton: Any) -> np.ndarray[Any, Any]:
    """``mlp`` on three fixed rows; the logits."""
    x = np.arange(48, dtype=np.float32).reshape(3, 16) / 100
    result = triton.infer("mlp", [infer_input("x", x, "FP32")], client_timeout=30)
    return np.asarray(result.as_numpy("logits"))


def refused(triton: Any) -> str:
    """The status of ``ServerLive`` from a client the server must turn away."""
    with triton, pytest.raises(InferenceServerException) as caught:
        triton.is_server_live(client_timeout=5)
    return status_of(caught.value)


def test_tls_worker_serves_a_client_that_trusts_the_ca(tls_worker: WorkerProcess, pki: Pki) -> None:
    with client(tls_worker.url, pki) as triton:
        assert triton.is_server_live()
        assert infer(triton).shape[0] == 3
    log = tls_worker.log_tail(100000)
    assert "tls=True" in log
    assert "forwarding lane" not in log  # the lane carries no TLS: never opened with it


def test_tls_worker_refuses_plaintext(tls_worker: WorkerProcess) -> None:
    assert refused(client(tls_worker.url)) == "UNAVAILABLE"


def test_mtls_worker_refuses_a_client_without_a_certificate(
    mtls_worker: WorkerProcess, pki: Pki
) -> None:
    assert refused(client(mtls_worker.url, pki)) == "UNAVAILABLE"
    assert refused(client(mtls_worker.url)) == "UNAVAILABLE"


def test_mtls_worker_accepts_a_client_with_a_certificate(
    mtls_worker: WorkerProcess, pki: Pki
) -> None:
    with client(mtls_worker.url, pki, with_cert=True) as triton:
        assert triton.is_server_ready()
        assert infer(triton).shape[0] == 3


def test_tritonclient_infers_through_a_tls_gateway_over_mtls_to_the_worker(
    tls_gateway: GatewayProcess, mtls_worker: WorkerProcess, pki: Pki
) -> None:
    with client(mtls_worker.url, pki, with_cert=True) as direct:
        expected = infer(direct)
        before = direct.get_inference_statistics("mlp", as_json=True)
    with client(tls_gateway.url, pki) as triton:
        for _ in range(3):
            np.testing.assert_allclose(infer(triton), expected, rtol=1e-5, atol=1e-5)
    with client(mtls_worker.url, pki, with_cert=True) as direct:
        after = direct.get_inference_statistics("mlp", as_json=True)

    def count(stats: Any) -> int:
        return sum(int(m.get("inference_count", 0)) for m in stats["model_stats"])

    assert count(after) - count(before) >= 3 * 3  # the worker ran the gateway's requests
    assert (
        tls_gateway.metric("reactantserver_gateway_worker_lane") == 0
    )  # TLS towards workers: gRPC only
    assert refused(client(tls_gateway.url)) == "UNAVAILABLE"
