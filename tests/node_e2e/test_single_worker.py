"""A one-worker node: the worker itself serves the public ports; there is no gateway."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as grpcclient
import yaml

from ._node import NodeProcess, running_node

pytestmark = pytest.mark.slow


def test_a_single_worker_node_has_no_gateway(tmp_path: Path, node_settings: dict[str, Any]) -> None:
    with running_node(tmp_path, node_settings, workers=1) as node:
        names = [" ".join(child.cmdline()) for child in node.children()]
        assert not any("reactantserver.gateway" in name for name in names), names
        worker = node.child("reactantserver.worker", "worker0")
        assert worker.environ().get("CUDA_VISIBLE_DEVICES") == ""
        with grpcclient.InferenceServerClient(node.url) as client:
            assert client.is_model_ready("mlp")
        assert node.run("healthcheck").returncode == 0

        shown = node.run("materialize")
        assert shown.returncode == 0, shown.stderr
        document = yaml.safe_load(shown.stdout)
        assert [child["name"] for child in document["children"]] == ["worker0"]
        assert document["gateway"] is None
    assert node.proc is not None
    assert node.proc.returncode == 0, node.tail()
    # The node is gone, so it is no longer healthy.
    unhealthy = node.run("healthcheck")
    assert unhealthy.returncode == 1
    assert "not healthy" in unhealthy.stderr


def test_a_configuration_error_exits_1_with_the_key_path(tmp_path: Path) -> None:
    node = NodeProcess(tmp_path, {"model_repo": str(tmp_path), "gpus": -1}, workers=1)
    done = node.run()
    assert done.returncode == 1
    assert "gpus" in done.stderr
    assert "configuration error" in done.stderr
