"""Triton's command-line flags: parsing, the keys they set, and their place above the env."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from reactantserver.core.config import (
    STANDALONE_HTTP_PORT,
    FlagValue,
    ModelControlMode,
    Residency,
    add_triton_arguments,
    load_worker_config,
    port_flags,
    worker_key_flags,
)
from reactantserver.core.errors import ConfigError

ENV = {"HOME": "/home/tester"}


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_triton_arguments(parser)
    return parser.parse_args(argv)


def test_model_repository_repeats_and_keeps_the_old_spelling() -> None:
    args = parse("--model-repository", "/a", "--model-repo", "/b")
    assert args.model_repository == [Path("/a"), Path("/b")]


@pytest.mark.parametrize(
    ("spelling", "mode"),
    [
        ("none", "static"),
        ("poll", "dynamic"),
        ("explicit", "explicit"),
        ("static", "static"),
        ("dynamic", "dynamic"),
    ],
)
def test_control_modes_take_tritons_names(spelling: str, mode: str) -> None:
    flags = worker_key_flags(parse("--model-control-mode", spelling))
    assert flags == [FlagValue("--model-control-mode", ("model_control_mode",), mode)]


def test_load_model_pins_each_model_in_explicit_mode() -> None:
    args = parse("--model-control-mode", "explicit", "--load-model", "a", "--load-model", "b")
    flags = worker_key_flags(args)
    paths = [flag.path for flag in flags if flag.flag == "--load-model"]
    assert paths == [("scheduler", "models", m, "residency") for m in ("a", "b")]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--load-model", "a"], "needs --model-control-mode explicit"),
        (["--model-control-mode", "poll", "--load-model", "a"], "needs --model-control-mode"),
        (["--model-control-mode", "explicit", "--load-model", "*"], "name a model"),
    ],
)
def test_load_model_follows_tritons_rule(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        worker_key_flags(parse(*argv))


@pytest.mark.parametrize("port", ["-1", "65536", "http"])
def test_ports_are_checked_by_the_parser(port: str) -> None:
    with pytest.raises(SystemExit):
        parse("--grpc-port", port)


def test_port_flags_by_role() -> None:
    assert port_flags(parse()) == {}
    assert port_flags(parse("--http-port", "1", "--metrics-port", "3")) == {
        "http": 1,
        "metrics": 3,
    }


def test_standalone_flags_win_over_the_environment(tmp_path: Path) -> None:
    env = {
        **ENV,
        "REACTANTSERVER_WORKER_ENDPOINTS_PORT": "7001",
        "REACTANTSERVER_WORKER_LOGGING_FORMAT": "text",
    }
    second = tmp_path / "second"
    argv = f"--model-repository {tmp_path} --model-repository {second} --grpc-port 9001"
    argv += " --metrics-port 9002 --model-control-mode explicit --load-model mlp --log-format json"
    args = parse(*argv.split())
    config = load_worker_config(
        model_repo=args.model_repository,
        ports=port_flags(args),
        flags=worker_key_flags(args),
        env=env,
    )
    assert config.model_dirs == (str(tmp_path), str(tmp_path / "second"))
    endpoints = config.endpoints
    assert (endpoints.http_port, endpoints.port, endpoints.metrics_port) == (
        STANDALONE_HTTP_PORT,
        9001,
        9002,
    )
    assert config.model_control_mode is ModelControlMode.EXPLICIT
    assert config.scheduler.for_model("mlp").residency is Residency.DEVICE
    assert config.logging.format.value == "json"


def test_an_error_from_a_flag_names_the_flag(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"endpoints\.metrics_port: must differ.*--metrics-port"):
        load_worker_config(model_repo=tmp_path, ports={"metrics": 8001}, env=ENV)


def test_flags_apply_to_a_node_file_worker(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text("model_repo: /models\n")
    config = load_worker_config(node_file=path, ports={"grpc": 7100}, env=ENV)
    assert config.endpoints.port == 7100
