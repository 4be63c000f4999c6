"""Bind addresses: workers behind a gateway listen on loopback only.

A ``gpus: 2`` node runs two workers behind its gateway; the listening sockets of every worker
process are on ``127.0.0.1``, while the gateway's public ports are wherever ``listen.*`` puts
them (here the gRPC port on loopback and the HTTP port on every interface). A standalone
worker started without ``endpoints.host`` listens on ``127.0.0.1`` too.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.node_e2e._node import NodeProcess, running_node
from tests.worker_e2e._harness import WorkerProcess

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def node(
    tmp_path_factory: pytest.TempPathFactory, repo: Path, cache_dir: Path
) -> Iterator[NodeProcess]:
    """``gpus: 2`` on the CPU backend; the public HTTP port on ``0.0.0.0`` through ``listen.*``."""
    settings: dict[str, Any] = {
        "model_repo": str(repo),
        "gpus": 2,
        "global": {"cache_dir": str(cache_dir), "model_control_mode": "static"},
        "gateway": {"health": {"interval_seconds": 0.5}},
    }
    directory = tmp_path_factory.mktemp("bind")
    probe = NodeProcess(directory, settings, name="probe")  # only to pick a free HTTP port
    public_http = f"0.0.0.0:{probe.http_port}"
    env = {
        "REACTANTSERVER_GATEWAY_LISTEN_METRICS": public_http,
        "REACTANTSERVER_GATEWAY_LISTEN_HTTP": public_http,
    }
    with running_node(directory, settings, env=env) as process:
        yield process


def _plain(address: str) -> str:
    # gRPC listens on an IPv6 socket bound to ``::ffff:127.0.0.1``: IPv4 loopback all the same.
    parsed = ipaddress.ip_address(address)
    mapped = parsed.ipv4_mapped if isinstance(parsed, ipaddress.IPv6Address) else None
    return str(mapped or parsed)


def listening(process: psutil.Process) -> set[tuple[str, int]]:
    """``(address, port)`` of every TCP socket ``process`` listens on (IPv4-mapped unwrapped)."""
    return {
        (_plain(conn.laddr.ip), conn.laddr.port)
        for conn in process.net_connections(kind="tcp")
        if conn.status == psutil.CONN_LISTEN
    }


def test_workers_behind_the_gateway_listen_on_loopback_only(node: NodeProcess) -> None:
    for index, name in enumerate(("worker0", "worker1")):
        sockets = listening(node.child("reactantserver.worker", name))
        ports = {port for _, port in sockets}
        assert {node.base_port + index, node.metrics_base_port + index} <= ports, sockets
        assert {address for address, _ in sockets} == {"127.0.0.1"}, (name, sockets)


def test_the_public_ports_follow_listen(node: NodeProcess) -> None:
    sockets = listening(node.child("reactantserver.gateway"))
    metrics = {address for address, port in sockets if port != node.grpc_port}
    assert ("127.0.0.1", node.grpc_port) in sockets, sockets
    assert metrics == {"0.0.0.0"}, sockets
    assert not any(address == "0.0.0.0" for address, port in sockets if port == node.grpc_port)


def test_a_standalone_worker_listens_on_loopback_by_default(capped: WorkerProcess) -> None:
    assert capped.proc is not None
    assert "REACTANTSERVER_WORKER_ENDPOINTS_HOST" not in capped.env
    sockets = listening(psutil.Process(capped.proc.pid))
    assert {port for _, port in sockets} >= {capped.grpc_port, capped.http_port}, sockets
    assert {address for address, _ in sockets} == {"127.0.0.1"}, sockets
