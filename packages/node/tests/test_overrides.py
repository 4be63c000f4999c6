"""Flags and ``REACTANTSERVER_NODE_*`` variables over the node file: precedence and validation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reactantserver.core.config import NodeConfig, Role, node_config_from_mapping
from reactantserver.core.errors import ConfigError
from reactantserver.node._overrides import (
    CPU_WORKERS_VARIABLE,
    GPUS_VARIABLE,
    LISTEN_GRPC_VARIABLE,
    LISTEN_METRICS_VARIABLE,
    MAX_RESTARTS_VARIABLE,
    ROLE_VARIABLE,
    apply_overrides,
)


def _node(tmp_path: Path, **keys: Any) -> NodeConfig:
    return node_config_from_mapping({"model_repo": str(tmp_path), **keys}, {})


def test_variable_names() -> None:
    assert ROLE_VARIABLE == "REACTANTSERVER_NODE_ROLE"
    assert GPUS_VARIABLE == "REACTANTSERVER_NODE_GPUS"
    assert CPU_WORKERS_VARIABLE == "REACTANTSERVER_NODE_CPU_WORKERS"
    assert MAX_RESTARTS_VARIABLE == "REACTANTSERVER_NODE_SUPERVISOR_MAX_RESTARTS"
    assert LISTEN_GRPC_VARIABLE == "REACTANTSERVER_GATEWAY_LISTEN_GRPC"
    assert LISTEN_METRICS_VARIABLE == "REACTANTSERVER_GATEWAY_LISTEN_METRICS"


def test_nothing_set_returns_the_file_values(tmp_path: Path) -> None:
    node = _node(tmp_path, role="workers", gpus=[0, 1], cpu_workers=3)
    assert apply_overrides(node, {"UNRELATED": "1"}) == node


def test_role_precedence(tmp_path: Path) -> None:
    node = _node(tmp_path, role="workers")
    assert apply_overrides(node, {}).role is Role.WORKERS
    assert apply_overrides(node, {ROLE_VARIABLE: "gateway"}).role is Role.GATEWAY
    flagged = apply_overrides(node, {ROLE_VARIABLE: "gateway"}, role="all")
    assert flagged.role is Role.ALL


def test_gpus_precedence(tmp_path: Path) -> None:
    node = _node(tmp_path, gpus=4)
    assert apply_overrides(node, {}).gpus == 4
    assert apply_overrides(node, {GPUS_VARIABLE: "0,GPU-x"}).gpus == ("0", "GPU-x")
    assert apply_overrides(node, {GPUS_VARIABLE: "0,GPU-x"}, gpus="2").gpus == 2
    assert apply_overrides(node, {GPUS_VARIABLE: "0"}).gpus == 0
    assert apply_overrides(node, {}, gpus="auto").gpus == "auto"


def test_other_variables(tmp_path: Path) -> None:
    node = _node(tmp_path, supervisor={"max_restarts": 2, "worker_grace_seconds": 3})
    env = {
        CPU_WORKERS_VARIABLE: " 3 ",
        MAX_RESTARTS_VARIABLE: "0",
        LISTEN_GRPC_VARIABLE: "127.0.0.1:9001",
        LISTEN_METRICS_VARIABLE: "[::]:9002",
    }
    result = apply_overrides(node, env)
    assert result.cpu_workers == 3
    assert result.supervisor.max_restarts == 0
    assert result.supervisor.worker_grace_seconds == 3  # the rest of the block is kept
    assert result.listen.grpc == "127.0.0.1:9001"
    assert result.listen.metrics == "[::]:9002"


def test_one_listen_variable_keeps_the_other_address(tmp_path: Path) -> None:
    node = _node(tmp_path, listen={"grpc": "0.0.0.0:7001", "metrics": "0.0.0.0:7002"})
    result = apply_overrides(node, {LISTEN_METRICS_VARIABLE: "0.0.0.0:7777"})
    assert (result.listen.grpc, result.listen.metrics) == ("0.0.0.0:7001", "0.0.0.0:7777")


def test_empty_variables_count_as_unset(tmp_path: Path) -> None:
    node = _node(tmp_path, role="workers", cpu_workers=2)
    env = {ROLE_VARIABLE: "", CPU_WORKERS_VARIABLE: " ", LISTEN_GRPC_VARIABLE: ""}
    assert apply_overrides(node, env) == node


@pytest.mark.parametrize(
    ("env", "flags", "message"),
    [
        (
            {ROLE_VARIABLE: "boss"},
            {},
            "REACTANTSERVER_NODE_ROLE: must be one of all, workers, gateway",
        ),
        ({}, {"role": "boss"}, "--role: must be one of all, workers, gateway"),
        ({GPUS_VARIABLE: ""}, {}, "REACTANTSERVER_NODE_GPUS: must be a device count"),
        ({GPUS_VARIABLE: " "}, {}, "REACTANTSERVER_NODE_GPUS: must be a device count"),
        ({}, {"gpus": "1,1"}, "--gpus: duplicate selector '1'"),
        (
            {CPU_WORKERS_VARIABLE: "0"},
            {},
            "REACTANTSERVER_NODE_CPU_WORKERS: must be an integer >= 1",
        ),
        (
            {CPU_WORKERS_VARIABLE: "two"},
            {},
            "REACTANTSERVER_NODE_CPU_WORKERS: must be an integer >= 1",
        ),
        (
            {MAX_RESTARTS_VARIABLE: "-1"},
            {},
            "REACTANTSERVER_NODE_SUPERVISOR_MAX_RESTARTS: must be an integer >= 0",
        ),
        (
            {LISTEN_GRPC_VARIABLE: "8001"},
            {},
            'REACTANTSERVER_GATEWAY_LISTEN_GRPC: must be "host:port"',
        ),
        (
            {LISTEN_METRICS_VARIABLE: "0.0.0.0:0"},
            {},
            'REACTANTSERVER_GATEWAY_LISTEN_METRICS: must be "host:port"',
        ),
    ],
)
def test_bad_values_name_the_variable_or_flag(
    tmp_path: Path, env: dict[str, str], flags: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        apply_overrides(_node(tmp_path), env, **flags)
    assert str(caught.value).startswith(message)
