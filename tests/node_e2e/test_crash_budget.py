"""A worker that cannot start exhausts its crash budget and takes the node down with exit 1."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from ._node import NodeProcess

pytestmark = pytest.mark.slow


def test_a_crash_looping_worker_exhausts_the_budget(
    tmp_path: Path, node_settings: dict[str, Any]
) -> None:
    settings = {**node_settings, "supervisor": {**node_settings["supervisor"], "max_restarts": 1}}
    node = NodeProcess(tmp_path, settings, workers=1)
    # Someone else holds the public gRPC port, so the sole worker fails at every start.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", node.grpc_port))
        squatter.listen()
        node.start()
        assert node.proc is not None
        code = node.proc.wait(180)
    text = node.text()
    assert code == 1, text
    assert "restarting worker0" in text
    assert "worker0 failed 2 consecutive times" in text
    assert not node.survivors(), text
