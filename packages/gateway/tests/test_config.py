"""Gateway configuration: defaults, bounds, env overrides, file resolution, round trip."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from reactantserver.core.config import LogFormat, LogLevel
from reactantserver.core.errors import ConfigError
from reactantserver.gateway import config as gateway_config
from reactantserver.gateway.config import (
    CompactionMode,
    FillMode,
    GatewayConfig,
    ModelFillMode,
    ModelPlacementConfig,
    RoutingPolicy,
    SchedulingMode,
    WorkBasis,
    gateway_config_from_mapping,
    gateway_config_to_dict,
    load_gateway_config,
)

LOGGER = "reactantserver.gateway.config"
WORKERS = ["w0:8001", "w1:8001"]


def _nested(dotted: str, value: object) -> dict[str, Any]:
    data: dict[str, Any] = {}
    node = data
    *parents, leaf = dotted.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value
    return data


def _get(config: object, dotted: str) -> object:
    for key in dotted.split("."):
        config = getattr(config, key)
    return config


def _load(data: dict[str, Any] | None = None, env: dict[str, str] | None = None) -> GatewayConfig:
    return gateway_config_from_mapping({"endpoints": WORKERS, **(data or {})}, env or {})


def _error(data: dict[str, Any], env: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        gateway_config_from_mapping({"endpoints": WORKERS, **data}, env or {})
    return str(caught.value).splitlines()


DEFAULTS = [
    ("listen.grpc", "0.0.0.0:8001"),
    ("listen.metrics", "0.0.0.0:8002"),
    ("metrics_endpoints", ()),
    ("worker_names", ()),
    ("worker_client.request_timeout_seconds", 60.0),
    ("worker_client.max_concurrent_streams", 32),
    ("worker_client.tls.ca_file", ""),
    ("worker_client.tls.cert_file", ""),
    ("worker_client.tls.key_file", ""),
    ("grpc.max_recv_msg_bytes", 512 << 20),
    ("grpc.max_send_msg_bytes", 512 << 20),
    ("grpc.max_concurrent_requests_per_worker", 64),
    ("grpc.keepalive_time_seconds", 60.0),
    ("grpc.keepalive_timeout_seconds", 20.0),
    ("grpc.min_client_ping_interval_seconds", 10.0),
    ("grpc.max_connection_age_seconds", 0.0),
    ("tls.cert_file", ""),
    ("tls.key_file", ""),
    ("tls.client_ca_file", ""),
    ("logging.level", LogLevel.INFO),
    ("logging.format", LogFormat.TEXT),
    ("health.interval_seconds", 10.0),
    ("health.wedge_exit_rounds", 3),
    ("startup_wait_seconds", 0.0),
    ("control_service", True),
    ("scheduling.mode", SchedulingMode.ROUND_ROBIN),
    ("scheduling.work_basis", WorkBasis.COMPUTE),
    ("scheduling.rebalance_compute_seconds", 300.0),
    ("scheduling.first_rebalance_compute_seconds", 60.0),
    ("scheduling.ema_halflife_compute_seconds", 0.0),
    ("scheduling.hysteresis", 0.0),
    ("scheduling.default_replicas", 1),
    ("scheduling.routing_policy", RoutingPolicy.FILL_LEAST),
    ("scheduling.routing_fill_mode", FillMode.RUN),
    ("scheduling.routing_fill_factor", 1.0),
    ("scheduling.forbid_memory_oversubscription", True),
    ("scheduling.compaction_mode", CompactionMode.EAGER),
    ("scheduling.compaction_interval", 1),
    ("scheduling.models", {}),
    ("scheduling.model_aware.cold_load_penalty", 1.0),
    ("scheduling.model_aware.default_load_bandwidth_bytes_per_second", 8e9),
    ("scheduling.model_aware.load_overhead_seconds", 0.005),
    ("scheduling.model_aware.network_seconds", {}),
]


@pytest.mark.parametrize(("dotted", "expected"), DEFAULTS)
def test_default(dotted: str, expected: object) -> None:
    value = _get(_load(), dotted)
    assert value == expected
    assert type(value) is type(expected) or isinstance(expected, dict)


def test_defaults_equal_direct_construction() -> None:
    assert _load() == GatewayConfig(endpoints=tuple(WORKERS))
    assert ModelPlacementConfig() == ModelPlacementConfig(None, ModelFillMode.INHERIT, None)


BOUNDS = [
    ("listen.grpc", "8001", "must be"),
    ("listen.metrics", "::1:8002", "IPv6"),
    ("listen.grpc", "h:65536", "port in [0, 65535]"),
    ("worker_client.request_timeout_seconds", 0, "must be > 0"),
    ("worker_client.max_concurrent_streams", 0, "must be > 0"),
    ("worker_client.tls.ca_file", 5, "expected a string"),
    ("grpc.max_recv_msg_bytes", 0, "must be in (0, 2147483647]"),
    ("grpc.max_send_msg_bytes", 1 << 31, "must be in (0, 2147483647]"),
    ("grpc.max_concurrent_requests_per_worker", -1, "must be >= 0"),
    ("grpc.keepalive_time_seconds", -1, "must be >= 0"),
    ("grpc.keepalive_timeout_seconds", 0, "must be > 0"),
    ("grpc.min_client_ping_interval_seconds", -0.5, "must be >= 0"),
    ("grpc.max_connection_age_seconds", -1, "must be >= 0"),
    ("tls.cert_file", True, "quote it"),
    ("logging.level", "verbose", "must be one of debug, info, warning, error"),
    ("logging.format", "xml", "must be one of text, json"),
    ("health.interval_seconds", 0, "must be > 0"),
    ("health.wedge_exit_rounds", -1, "must be >= 0"),
    ("health.wedge_exit_rounds", 1.5, "expected an integer"),
    ("startup_wait_seconds", -2, "inf, forever or -1"),
    ("startup_wait_seconds", "soon", "inf, forever or -1"),
    ("control_service", "yes", "write it unquoted"),
    ("scheduling.mode", "random", "round_robin, lpt_packing, model_aware"),
    ("scheduling.work_basis", "bytes", "compute, items, requests"),
    ("scheduling.rebalance_compute_seconds", 0, "must be > 0"),
    ("scheduling.first_rebalance_compute_seconds", -1, "must be >= 0"),
    ("scheduling.ema_halflife_compute_seconds", -1, "must be >= 0"),
    ("scheduling.hysteresis", 1.0, "must be in [0, 1)"),
    ("scheduling.hysteresis", -0.1, "must be in [0, 1)"),
    ("scheduling.default_replicas", 0, "integer >= 1 or all"),
    ("scheduling.default_replicas", "every", "integer >= 1 or all"),
    ("scheduling.routing_policy", "fill_most", "fill_least, fill_rr"),
    ("scheduling.routing_fill_mode", "inherit", "run, spread, inflight"),
    ("scheduling.routing_fill_factor", 0, "must be > 0"),
    ("scheduling.forbid_memory_oversubscription", 1, "expected a boolean"),
    ("scheduling.compaction_mode", "lazy", "off, eager, scheduled"),
    ("scheduling.compaction_interval", -1, "must be >= 0"),
    ("scheduling.models.m.replicas", 0, "integer >= 1 or all"),
    ("scheduling.models.m.fill_mode", "fill", "run, spread, inflight, inherit"),
    ("scheduling.models.m.fill_factor", 0, "must be > 0"),
    ("scheduling.models", ["m"], "expected a mapping"),
    ("scheduling.model_aware.cold_load_penalty", 0.5, "must be >= 1"),
    ("scheduling.model_aware.default_load_bandwidth_bytes_per_second", 0, "must be > 0"),
    ("scheduling.model_aware.load_overhead_seconds", -0.001, "must be >= 0"),
    ("scheduling.model_aware.network_seconds.w0:8001", -1, "must be >= 0"),
    ("scheduling.model_aware.load_overhead_seconds", "1e-3", "write it unquoted with a dot"),
]


@pytest.mark.parametrize(("dotted", "value", "expected"), BOUNDS)
def test_bound(dotted: str, value: object, expected: str) -> None:
    (line,) = _error(_nested(dotted, value))
    assert line.startswith(f"{dotted}: ")
    assert expected in line


@pytest.mark.parametrize(
    ("dotted", "value", "expected"),
    [
        ("listen.grpc", "127.0.0.1:0", "127.0.0.1:0"),
        ("listen.metrics", "[::1]:9000", "[::1]:9000"),
        ("scheduling.hysteresis", 0.99, 0.99),
        ("scheduling.work_basis", "ITEMS", WorkBasis.ITEMS),
        ("scheduling.default_replicas", "all", "all"),
        ("scheduling.compaction_interval", 0, 0),
        ("startup_wait_seconds", math.inf, math.inf),
        ("startup_wait_seconds", "forever", math.inf),
        ("startup_wait_seconds", -1, math.inf),
        ("startup_wait_seconds", 30, 30.0),
        ("grpc.max_concurrent_requests_per_worker", 0, 0),
        ("health.wedge_exit_rounds", 0, 0),
        ("scheduling.model_aware.cold_load_penalty", 1, 1.0),
    ],
)
def test_accepted_edge_value(dotted: str, value: object, expected: object) -> None:
    assert _get(_load(_nested(dotted, value)), dotted) == expected


def test_endpoint_rules_dedupe_and_labels() -> None:
    config = _load({"endpoints": ["a:1", "[::1]:2", "a:1"], "worker_names": ["x", "y"]})
    assert config.endpoints == ("a:1", "[::1]:2")
    assert config.worker_labels == ("x", "y")
    assert config.inbound_cap == 128
    assert _load().worker_labels == tuple(WORKERS)
    assert _load({"grpc": {"max_concurrent_requests_per_worker": 0}}).inbound_cap == 0
    assert _error({"endpoints": []}) == ["endpoints: must not be empty, got a list"]
    assert _error({"endpoints": ["a:1", "b", "c:0"]}) == [
        'endpoints[1]: must be "host:port" (IPv6 as "[::1]:port") with a port in [1, 65535], '
        "got string 'b'",
        'endpoints[2]: must be "host:port" (IPv6 as "[::1]:port") with a port in [1, 65535], '
        "got string 'c:0'",
    ]
    assert _error({"worker_names": ["x"]}) == [
        "worker_names: must name every endpoint (2 after de-duplication), got 1 names"
    ]
    assert _error({"worker_names": ["x", "x"]})[0].startswith("worker_names: must not repeat")
    assert _error({"metrics_endpoints": ["m:0"]})[0].startswith("metrics_endpoints[0]: ")
    with pytest.raises(ConfigError, match="required key missing; list the workers"):
        gateway_config_from_mapping({}, {})


def test_direct_construction_runs_the_rules() -> None:
    with pytest.raises(ConfigError, match=r"endpoints\[0\]: must be"):
        GatewayConfig(endpoints=("nope",))
    with pytest.raises(ConfigError, match="hysteresis: must be in"):
        gateway_config.SchedulingConfig(hysteresis=1.0)
    assert GatewayConfig(endpoints=("a:1",), startup_wait_seconds=-1).startup_wait_seconds == (
        math.inf
    )


def test_model_overrides_and_helpers() -> None:
    models = {"a": {"replicas": "all", "fill_mode": "spread", "fill_factor": 2.0}, "b": None}
    scheduling = _load({"scheduling": {"models": models}}).scheduling
    assert scheduling.for_model("a") == ModelPlacementConfig("all", ModelFillMode.SPREAD, 2.0)
    assert scheduling.for_model("b") == ModelPlacementConfig()
    assert scheduling.for_model("missing").replicas is None
    assert ModelFillMode.INHERIT.resolve(FillMode.SPREAD) is FillMode.SPREAD
    assert ModelFillMode.INFLIGHT.resolve(FillMode.RUN) is FillMode.INFLIGHT
    assert scheduling.effective_ema_halflife_compute_seconds == 300.0
    with pytest.raises(TypeError):
        scheduling.models["c"] = ModelPlacementConfig()  # type: ignore[index]


def test_every_problem_is_one_line_with_its_key_path() -> None:
    data = {
        "listen": {"grpc": "x", "rest": "y"},
        "scheduling": {"mode": "lpt", "model_aware": {"cold_load_penalty": 0, "network_secs": {}}},
        "helth": {},
    }
    assert _error(data) == [
        "helth: unknown key (did you mean health?)",
        "listen.rest: unknown key",
        'listen.grpc: must be "host:port" (IPv6 as "[::1]:port") with a port in [0, 65535], '
        "got string 'x'",
        "scheduling.mode: must be one of round_robin, lpt_packing, model_aware, got string 'lpt'",
        "scheduling.model_aware.network_secs: unknown key (did you mean network_seconds?)",
        "scheduling.model_aware.cold_load_penalty: must be >= 1, got integer 0",
    ]


def _write(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def test_file_resolution_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    explicit = _write(tmp_path / "explicit.yml", {"endpoints": ["e:1"]})
    named = _write(tmp_path / "named.yml", {"endpoints": ["n:1"]})
    default = _write(tmp_path / "default.yml", {"endpoints": ["d:1"]})
    monkeypatch.setattr(gateway_config, "DEFAULT_GATEWAY_FILE", default)
    env = {"REACTANTSERVER_GATEWAY_FILE": str(named)}
    assert load_gateway_config(explicit, env).endpoints == ("e:1",)
    assert load_gateway_config(None, env).endpoints == ("n:1",)
    assert load_gateway_config(None, {}).endpoints == ("d:1",)
    monkeypatch.setattr(gateway_config, "DEFAULT_GATEWAY_FILE", tmp_path / "absent.yml")
    assert load_gateway_config(None, {"REACTANTSERVER_GATEWAY_WORKERS": "v:1"}).endpoints == (
        "v:1",
    )
    with pytest.raises(ConfigError, match="no such file"):
        load_gateway_config(None, {"REACTANTSERVER_GATEWAY_FILE": str(tmp_path / "missing.yml")})
    with pytest.raises(ConfigError, match="no such file"):
        load_gateway_config(tmp_path / "missing.yml", {})


def test_file_errors_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "gateway.yml"
    path.write_text("endpoints: [a:1]\nscheduling:\n  compaction_mode: off\n  mode: x\n")
    with pytest.raises(ConfigError) as caught:
        load_gateway_config(path, {})
    assert str(caught.value) == (
        "scheduling.mode: must be one of round_robin, lpt_packing, model_aware, "
        f"got string 'x' (in {path})"
    )
    path.write_text("endpoints: [a:1]\nscheduling:\n  compaction_mode: off\n")
    assert load_gateway_config(path, {}).scheduling.compaction_mode is CompactionMode.OFF
    path.write_text("endpoints: [a:1]\nendpoints: [b:1]\n")
    with pytest.raises(ConfigError, match=r"gateway.yml:2:1: invalid YAML: .*duplicate key"):
        load_gateway_config(path, {})
    path.write_text("- a:1\n")
    with pytest.raises(ConfigError, match="<top level>: expected a mapping of gateway keys"):
        load_gateway_config(path, {})
    path.write_text("")
    with pytest.raises(ConfigError, match="endpoints: required key missing"):
        load_gateway_config(path, {})


def test_round_trip_through_yaml() -> None:
    data = {
        "listen": {"grpc": "127.0.0.1:0", "metrics": "[::1]:0"},
        "endpoints": ["a:1", "b:2"],
        "metrics_endpoints": ["a:9"],
        "worker_names": ["a", "b"],
        "worker_client": {"max_concurrent_streams": 8, "tls": {"ca_file": "/ca"}},
        "grpc": {"max_concurrent_requests_per_worker": 0, "keepalive_time_seconds": 5},
        "tls": {"cert_file": "/c", "key_file": "/k"},
        "logging": {"level": "debug", "format": "json"},
        "health": {"interval_seconds": 0.5, "wedge_exit_rounds": 0},
        "startup_wait_seconds": "forever",
        "control_service": False,
        "scheduling": {
            "mode": "lpt_packing",
            "work_basis": "ITEMS",
            "default_replicas": "all",
            "compaction_mode": "off",
            "models": {"m": {"replicas": 2, "fill_factor": 0.5}, "n": {"fill_mode": "spread"}},
            "model_aware": {"network_seconds": {"a:1": 0.01}},
        },
    }
    config = gateway_config_from_mapping(data, {})
    plain = gateway_config_to_dict(config)
    assert plain["startup_wait_seconds"] == "forever"
    assert plain["scheduling"]["models"]["m"] == {
        "replicas": 2,
        "fill_mode": "inherit",
        "fill_factor": 0.5,
    }
    text = yaml.safe_dump(plain)
    assert gateway_config_from_mapping(yaml.safe_load(text), {}) == config
    assert gateway_config_from_mapping(gateway_config_to_dict(_load()), {}) == _load()


def test_warnings(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _load()
        _load({"grpc": {"max_concurrent_requests_per_worker": 0}})
    assert caplog.records == []
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _load({"grpc": {"max_concurrent_requests_per_worker": 32}})
    (record,) = caplog.records
    assert "max_concurrent_requests_per_worker (32)" in record.getMessage()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _load({"scheduling": {"model_aware": {"network_seconds": {"elsewhere:1": 0.1}}}})
    (record,) = caplog.records
    assert "'elsewhere:1'" in record.getMessage()


def test_the_grpc_settings_shared_with_the_worker_take_its_defaults() -> None:
    from reactantserver.core.config import GrpcConfig
    from reactantserver.gateway.config import GatewayGrpcConfig

    worker, gateway = GrpcConfig(), GatewayGrpcConfig()
    for name in (
        "max_recv_msg_bytes",
        "max_send_msg_bytes",
        "keepalive_time_seconds",
        "keepalive_timeout_seconds",
        "min_client_ping_interval_seconds",
        "max_connection_age_seconds",
    ):
        assert getattr(gateway, name) == getattr(worker, name), name
