"""Gateway configuration: ``REACTANTSERVER_GATEWAY_*`` overrides, their precedence and errors."""

from __future__ import annotations

import logging
import math
from typing import Any

import pytest

from reactantserver.core.config import PROCESS_VARIABLES, LogFormat, renamed_variables
from reactantserver.core.errors import ConfigError
from reactantserver.gateway.config import (
    CompactionMode,
    FillMode,
    GatewayConfig,
    SchedulingMode,
    WorkBasis,
    gateway_config_from_mapping,
    gateway_env_variables,
)

LOGGER = "reactantserver.gateway.config"
BASE = {"endpoints": ["w0:8001", "w1:8001"]}


def _get(config: object, dotted: str) -> object:
    for key in dotted.split("."):
        config = getattr(config, key)
    return config


def _load(env: dict[str, str], data: dict[str, Any] | None = None) -> GatewayConfig:
    return gateway_config_from_mapping({**BASE, **(data or {})}, env)


def _error(env: dict[str, str]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        _load(env)
    return str(caught.value).splitlines()


ENV_CASES = [
    ("REACTANTSERVER_GATEWAY_LISTEN_GRPC", "127.0.0.1:0", "listen.grpc", "127.0.0.1:0"),
    ("REACTANTSERVER_GATEWAY_LISTEN_METRICS", "[::]:9", "listen.metrics", "[::]:9"),
    ("REACTANTSERVER_GATEWAY_WORKERS", " a:1, b:2 ,,a:1", "endpoints", ("a:1", "b:2")),
    ("REACTANTSERVER_GATEWAY_WORKER_METRICS", "a:9,b:9", "metrics_endpoints", ("a:9", "b:9")),
    ("REACTANTSERVER_GATEWAY_WORKER_NAMES", "x,y", "worker_names", ("x", "y")),
    (
        "REACTANTSERVER_GATEWAY_WORKER_CLIENT_REQUEST_TIMEOUT_SECONDS",
        "2.5",
        "worker_client.request_timeout_seconds",
        2.5,
    ),
    ("REACTANTSERVER_GATEWAY_WORKER_CLIENT_TLS_CA_FILE", "/ca", "worker_client.tls.ca_file", "/ca"),
    ("REACTANTSERVER_GATEWAY_GRPC_MAX_RECV_MSG_BYTES", "1024", "grpc.max_recv_msg_bytes", 1024),
    ("REACTANTSERVER_GATEWAY_TLS_CLIENT_CA_FILE", "/c", "tls.client_ca_file", "/c"),
    ("REACTANTSERVER_GATEWAY_LOGGING_FORMAT", "json", "logging.format", LogFormat.JSON),
    ("REACTANTSERVER_GATEWAY_HEALTH_INTERVAL_SECONDS", "0.5", "health.interval_seconds", 0.5),
    ("REACTANT_GATEWAY_WEDGE_EXIT_ROUNDS", "0", "health.wedge_exit_rounds", 0),  # older name
    ("REACTANTSERVER_GATEWAY_HEALTH_WEDGE_EXIT_ROUNDS", "7", "health.wedge_exit_rounds", 7),
    ("REACTANTSERVER_GATEWAY_STARTUP_WAIT_SECONDS", "inf", "startup_wait_seconds", math.inf),
    ("REACTANTSERVER_GATEWAY_STARTUP_WAIT_SECONDS", "-1", "startup_wait_seconds", math.inf),
    ("REACTANTSERVER_GATEWAY_STARTUP_WAIT_SECONDS", "12", "startup_wait_seconds", 12.0),
    ("REACTANTSERVER_GATEWAY_CONTROL_SERVICE", "no", "control_service", False),
    ("REACTANTSERVER_GATEWAY_CONTROL_SERVICE", "1", "control_service", True),
    (
        "REACTANTSERVER_GATEWAY_SCHEDULING_MODE",
        "lpt_packing",
        "scheduling.mode",
        SchedulingMode.LPT_PACKING,
    ),
    (
        "REACTANTSERVER_GATEWAY_SCHEDULING_WORK_BASIS",
        "Requests",
        "scheduling.work_basis",
        WorkBasis.REQUESTS,
    ),
    (
        "REACTANTSERVER_GATEWAY_SCHEDULING_DEFAULT_REPLICAS",
        "all",
        "scheduling.default_replicas",
        "all",
    ),
    ("REACTANTSERVER_GATEWAY_SCHEDULING_DEFAULT_REPLICAS", "3", "scheduling.default_replicas", 3),
    (
        "REACTANTSERVER_GATEWAY_SCHEDULING_ROUTING_FILL_MODE",
        "spread",
        "scheduling.routing_fill_mode",
        FillMode.SPREAD,
    ),
    (
        "REACTANTSERVER_GATEWAY_SCHEDULING_COMPACTION_MODE",
        "off",
        "scheduling.compaction_mode",
        CompactionMode.OFF,
    ),
    (
        "REACTANTSERVER_GATEWAY_SCHEDULING_FORBID_MEMORY_OVERSUBSCRIPTION",
        "false",
        "scheduling.forbid_memory_oversubscription",
        False,
    ),
    (
        "REACTANTSERVER_GATEWAY_SCHEDULING_MODEL_AWARE_COLD_LOAD_PENALTY",
        "2",
        "scheduling.model_aware.cold_load_penalty",
        2.0,
    ),
]


@pytest.mark.parametrize(("variable", "raw", "dotted", "expected"), ENV_CASES)
def test_env_override(variable: str, raw: str, dotted: str, expected: object) -> None:
    config = gateway_config_from_mapping(
        None, {"REACTANTSERVER_GATEWAY_WORKERS": "w:1,v:1", variable: raw}
    )
    assert _get(config, dotted) == expected


def test_env_wins_over_file_and_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    data = {"scheduling": {"hysteresis": 0.5, "mode": "model_aware"}}
    env = {
        "REACTANTSERVER_GATEWAY_SCHEDULING_HYSTERESIS": "0.25",
        "REACTANTSERVER_GATEWAY_WORKERS": "z:1",
    }
    with caplog.at_level(logging.INFO, logger=LOGGER):
        config = _load(env, data)
    assert config.scheduling.hysteresis == 0.25
    assert config.scheduling.mode is SchedulingMode.MODEL_AWARE
    assert config.endpoints == ("z:1",)
    assert "REACTANTSERVER_GATEWAY_SCHEDULING_HYSTERESIS" in caplog.text


def test_an_older_name_works_and_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    env = {"REACTANT_GATEWAY_SCHEDULING_HYSTERESIS": "0.25", "REACTANT_GATEWAY_WORKERS": "z:1"}
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        config = _load(env)
    assert config.scheduling.hysteresis == 0.25
    assert config.endpoints == ("z:1",)
    assert [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()] == [
        "config: REACTANT_GATEWAY_SCHEDULING_HYSTERESIS is deprecated; "
        "use REACTANTSERVER_GATEWAY_SCHEDULING_HYSTERESIS",
        "config: REACTANT_GATEWAY_WORKERS is deprecated; use REACTANTSERVER_GATEWAY_WORKERS",
    ]


def test_the_new_name_wins_over_the_older_ones(caplog: pytest.LogCaptureFixture) -> None:
    env = {
        "REACTANT_GATEWAY_WEDGE_EXIT_ROUNDS": "1",
        "REACTANT_GATEWAY_HEALTH_WEDGE_EXIT_ROUNDS": "3",
        "REACTANTSERVER_GATEWAY_HEALTH_WEDGE_EXIT_ROUNDS": "5",
    }
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert _load(env).health.wedge_exit_rounds == 5
    assert sorted(r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()) == [
        f"config: {old} is deprecated and ignored: "
        "REACTANTSERVER_GATEWAY_HEALTH_WEDGE_EXIT_ROUNDS is set too and wins"
        for old in (
            "REACTANT_GATEWAY_HEALTH_WEDGE_EXIT_ROUNDS",
            "REACTANT_GATEWAY_WEDGE_EXIT_ROUNDS",
        )
    ]
    older = {k: v for k, v in env.items() if k.startswith("REACTANT_")}
    assert _load(older).health.wedge_exit_rounds == 3  # the dotted-path name beats the short one


def test_an_unknown_variable_warns_with_the_closest_name(
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = {
        "REACTANTSERVER_GATEWAY_SCHEDULING_HYSTERESYS": "0.1",
        "REACTANTSERVER_GATEWAY_FILE": "",
        "REACTANTSERVER_GATEWAY_WORKERS": "a:1",
        "REACTANTSERVER_GATEWAY_WORKER_NAMES": "a",
        "REACTANTSERVER_WORKER_NAME": "w",
        "REACTANTSERVER_NODE_ROLE": "all",
    }
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _load(env)
    assert [r.getMessage() for r in caplog.records if "unknown" in r.getMessage()] == [
        "config: ignoring unknown variable REACTANTSERVER_GATEWAY_SCHEDULING_HYSTERESYS "
        "(did you mean REACTANTSERVER_GATEWAY_SCHEDULING_HYSTERESIS?)"
    ]


def test_no_gateway_key_has_a_process_variable_name() -> None:
    assert not set(gateway_env_variables()) & set(PROCESS_VARIABLES)
    assert all(name.startswith("REACTANTSERVER_GATEWAY_") for name in gateway_env_variables())
    for new in renamed_variables().values():
        if new.startswith("REACTANTSERVER_GATEWAY_"):
            assert new in gateway_env_variables() or new in PROCESS_VARIABLES


def test_env_ignores_unknown_and_empty_variables_and_has_no_map_keys() -> None:
    env = {
        "REACTANTSERVER_GATEWAY_BOGUS": "x",
        "REACTANTSERVER_GATEWAY_FILE": "",
        "REACTANTSERVER_GATEWAY_SCHEDULING_MODELS": "x",
        "REACTANTSERVER_GATEWAY_LISTEN_GRPC": "  ",
    }
    assert _load(env) == _load({})
    variables = gateway_env_variables()
    assert variables["REACTANTSERVER_GATEWAY_WORKERS"] == "endpoints"
    assert (
        variables["REACTANTSERVER_GATEWAY_HEALTH_WEDGE_EXIT_ROUNDS"] == "health.wedge_exit_rounds"
    )
    assert "REACTANTSERVER_GATEWAY_FILE" not in variables
    assert not [v for v in variables.values() if "models" in v or "network_seconds" in v]
    assert len(variables) == 51


def test_env_errors_name_the_variable() -> None:
    env = {
        "REACTANTSERVER_GATEWAY_HEALTH_INTERVAL_SECONDS": "soon",
        "REACTANTSERVER_GATEWAY_CONTROL_SERVICE": "maybe",
        "REACTANTSERVER_GATEWAY_SCHEDULING_HYSTERESIS": "2",
        "REACTANTSERVER_GATEWAY_WORKERS": "a:1,bad",
    }
    assert _error(env) == [
        "control_service: cannot parse 'maybe' as a boolean (1/true/yes/on or 0/false/no/off) "
        "(from REACTANTSERVER_GATEWAY_CONTROL_SERVICE)",
        "health.interval_seconds: cannot parse 'soon' as a number "
        "(from REACTANTSERVER_GATEWAY_HEALTH_INTERVAL_SECONDS)",
        'endpoints[1]: must be "host:port" (IPv6 as "[::1]:port") with a port in [1, 65535], '
        "got string 'bad' (from REACTANTSERVER_GATEWAY_WORKERS)",
        "scheduling.hysteresis: must be in [0, 1), got number 2.0 "
        "(from REACTANTSERVER_GATEWAY_SCHEDULING_HYSTERESIS)",
    ]
