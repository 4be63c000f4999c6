"""The one scheme of environment variables: older names, deprecation warnings, collisions."""

from __future__ import annotations

import logging
from pathlib import Path

import attrs
import pytest

from reactantserver.core.config import (
    CACHE_DIR_VARIABLE,
    GATEWAY_PREFIX,
    NODE_FILE_VARIABLE,
    NODE_KEY_VARIABLES,
    NODE_PREFIX,
    PROCESS_VARIABLES,
    RENAMED_PREFIXES,
    RENAMED_VARIABLES,
    SUPERVISOR_PID_VARIABLE,
    WORKER_NAME_VARIABLE,
    WORKER_THREADS_VARIABLE,
    NodeConfig,
    SchedulingDiscipline,
    env_override_variables,
    key_variable,
    load_worker_config,
    lookup,
    renamed_to,
    upgrade_env,
    worker_config_from_mapping,
)

LOGGER = "reactantserver.core.config"


def _messages(caplog: pytest.LogCaptureFixture, word: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if word in r.getMessage()]


def test_an_older_worker_variable_works_and_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        config = worker_config_from_mapping({}, {"INFERENCE_SERVER_SCHEDULER_DISCIPLINE": "fifo"})
    assert config.scheduler.discipline is SchedulingDiscipline.FIFO
    assert [o.variable for o in config.env_overrides] == [
        "REACTANTSERVER_WORKER_SCHEDULER_DISCIPLINE"
    ]
    assert _messages(caplog, "deprecated") == [
        "config: INFERENCE_SERVER_SCHEDULER_DISCIPLINE is deprecated; "
        "use REACTANTSERVER_WORKER_SCHEDULER_DISCIPLINE"
    ]


def test_the_worker_entry_point_warns_once_per_older_name(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    node_file = tmp_path / "node.yaml"
    node_file.write_text(f"model_repo: {tmp_path}\nworkers:\n  - name: a\n  - name: b\n")
    env = {
        "REACTANT_NODE_FILE": str(node_file),
        "REACTANT_WORKER_NAME": "b",
        "REACTANT_WORKER_THREADS": "3",
        "REACTANT_CACHE_DIR": "/var/cache/rs",
        "INFERENCE_SERVER_RUNTIME_MEM_FRACTION": "0.5",
    }
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        config = load_worker_config(env=env)
    assert config.worker_name == "b"
    assert config.hook_threads == 3
    assert config.cache_dir == "/var/cache/rs"
    assert config.runtime.mem_fraction == 0.5
    assert sorted(_messages(caplog, "deprecated")) == sorted(
        f"config: {old} is deprecated; use {renamed_to(old)}" for old in env
    )


def test_the_new_name_wins_and_the_older_one_is_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = {
        "INFERENCE_SERVER_RUNTIME_MEM_FRACTION": "0.3",
        "REACTANTSERVER_WORKER_RUNTIME_MEM_FRACTION": "0.6",
    }
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        config = worker_config_from_mapping({}, env)
    assert config.runtime.mem_fraction == 0.6
    assert _messages(caplog, "deprecated") == [
        "config: INFERENCE_SERVER_RUNTIME_MEM_FRACTION is deprecated and ignored: "
        "REACTANTSERVER_WORKER_RUNTIME_MEM_FRACTION is set too and wins"
    ]


def test_upgrade_leaves_out_the_older_names_and_a_second_pass_finds_nothing() -> None:
    env = {
        "REACTANT_ROLE": "gateway",
        "INFERENCE_SERVER_RUNTIME_BACKEND": "cpu",
        "REACTANT_GATEWAY_WEDGE_EXIT_ROUNDS": "3",
        "REACTANT_SUPERVISOR_PID": "42",
        "INFERENCE_SERVER_RUNTIME_RESIDENCY_MODE": "x",  # removed: kept, to be refused
        "PATH": "/bin",
    }
    upgrade = upgrade_env(env)
    assert dict(upgrade.env) == {
        "REACTANTSERVER_NODE_ROLE": "gateway",
        "REACTANTSERVER_WORKER_RUNTIME_BACKEND": "cpu",
        "REACTANTSERVER_GATEWAY_HEALTH_WEDGE_EXIT_ROUNDS": "3",
        SUPERVISOR_PID_VARIABLE: "42",
        "INFERENCE_SERVER_RUNTIME_RESIDENCY_MODE": "x",
        "PATH": "/bin",
    }
    assert len(upgrade.messages) == 4
    again = upgrade_env(upgrade.env)
    assert again.messages == ()
    assert dict(again.env) == dict(upgrade.env)


def test_an_environment_without_older_names_is_returned_unchanged() -> None:
    env = {"PATH": "/bin", "REACTANTSERVER_NODE_ROLE": "all"}
    assert upgrade_env(env).env is env


def test_unknown_variables_of_the_new_prefix_get_a_suggestion(
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = {
        "REACTANTSERVER_WORKER_SCHEDULER_DISCIPLIN": "fifo",
        WORKER_NAME_VARIABLE: "w",
        WORKER_THREADS_VARIABLE: "2",
        CACHE_DIR_VARIABLE: "/c",
        NODE_FILE_VARIABLE: "/etc/node.yaml",
        SUPERVISOR_PID_VARIABLE: "1",
        "REACTANTSERVER_NODE_ROLE": "all",
        "REACTANTSERVER_GATEWAY_LISTEN_GRPC": "0.0.0.0:8001",
    }
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        worker_config_from_mapping({}, env)
    assert _messages(caplog, "unknown") == [
        "config: ignoring unknown variable REACTANTSERVER_WORKER_SCHEDULER_DISCIPLIN "
        "(did you mean REACTANTSERVER_WORKER_SCHEDULER_DISCIPLINE?)"
    ]


def test_no_worker_or_node_key_has_a_process_variable_name() -> None:
    keys = set(env_override_variables()) | set(NODE_KEY_VARIABLES)
    assert not keys & set(PROCESS_VARIABLES)
    assert all(name.startswith("REACTANTSERVER_") for name in [*keys, *PROCESS_VARIABLES])


def test_the_node_key_variables_name_node_keys() -> None:
    for variable, path in NODE_KEY_VARIABLES.items():
        cls: object = NodeConfig
        for part in path:
            assert isinstance(cls, type)
            cls = attrs.fields_dict(attrs.resolve_types(cls))[part].type
        assert variable == key_variable(NODE_PREFIX, path)


def test_every_older_name_has_a_new_name_that_is_read() -> None:
    read = set(env_override_variables()) | set(NODE_KEY_VARIABLES) | set(PROCESS_VARIABLES)
    for old, new in RENAMED_VARIABLES.items():
        assert renamed_to(old) == new
        # The gateway's keys are checked against its own table in the gateway's tests.
        assert new in read or new.startswith(GATEWAY_PREFIX), old
    for old, new in RENAMED_PREFIXES.items():
        assert renamed_to(old + "X") == new + "X"


def test_lookup_falls_back_to_the_older_name() -> None:
    old = "REACTANT_SUPERVISOR_PID"
    assert lookup({old: "7"}, SUPERVISOR_PID_VARIABLE) == ("7", old)
    assert lookup({old: "7", SUPERVISOR_PID_VARIABLE: "8"}, SUPERVISOR_PID_VARIABLE) == (
        "8",
        SUPERVISOR_PID_VARIABLE,
    )
    prefixed = "INFERENCE_SERVER_LOGGING_FORMAT"
    assert lookup({prefixed: "json"}, "REACTANTSERVER_WORKER_LOGGING_FORMAT") == (
        "json",
        prefixed,
    )
    assert lookup({}, CACHE_DIR_VARIABLE) == (None, CACHE_DIR_VARIABLE)
