"""Loading from files: the worker's three command-line forms, the node file, YAML pitfalls."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from reactantserver.core import config
from reactantserver.core.config import (
    DEFAULT_NODE_FILE,
    STANDALONE_GRPC_PORT,
    STANDALONE_METRICS_PORT,
    load_node_config,
    load_worker_config,
)
from reactantserver.core.errors import ConfigError

ENV = {"HOME": "/home/tester"}

TWO_WORKERS = """
model_repo: /models
global:
  runtime: {backend: cuda}
workers:
  - name: w0
  - name: w1
    scheduler: {discipline: edf}
"""


def write(tmp_path: Path, text: str, name: str = "node.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


# ---- reactantserver-worker --node-file F --worker NAME -----------------------------------------


def test_node_file_and_worker_name(tmp_path: Path) -> None:
    path = write(tmp_path, TWO_WORKERS)
    loaded = load_worker_config(node_file=path, worker="w1", env=ENV)
    assert loaded.worker_name == "w1"
    assert loaded.endpoints.port == 8081
    assert loaded.scheduler.discipline == "edf"
    assert loaded.runtime.backend == "cuda"
    assert loaded.model_dirs == ("/models",)


def test_worker_name_from_environment(tmp_path: Path) -> None:
    path = write(tmp_path, TWO_WORKERS)
    loaded = load_worker_config(node_file=path, env={**ENV, "REACTANTSERVER_WORKER_NAME": "w0"})
    assert (loaded.worker_name, loaded.endpoints.port) == ("w0", 8080)
    flag_wins = load_worker_config(
        node_file=path, worker="w1", env={**ENV, "REACTANTSERVER_WORKER_NAME": "w0"}
    )
    assert flag_wins.worker_name == "w1"


def test_multi_worker_file_needs_a_name(tmp_path: Path) -> None:
    path = write(tmp_path, TWO_WORKERS)
    for env in (ENV, {**ENV, "REACTANTSERVER_WORKER_NAME": ""}):
        with pytest.raises(ConfigError) as info:
            load_worker_config(node_file=path, env=env)
        message = str(info.value)
        assert "2 workers (w0, w1)" in message
        assert "REACTANTSERVER_WORKER_NAME" in message


def test_single_worker_file_needs_no_name(tmp_path: Path) -> None:
    listed = write(tmp_path, "model_repo: /m\nworkers: [{name: only}]\n", "one.yaml")
    assert load_worker_config(node_file=listed, env=ENV).worker_name == "only"
    synthesized = write(tmp_path, "model_repo: /m\n", "none.yaml")
    loaded = load_worker_config(node_file=synthesized, env=ENV)
    assert (loaded.worker_name, loaded.endpoints.port, loaded.endpoints.metrics_port) == (
        "worker0",
        8080,
        9100,
    )


def test_unknown_worker_name(tmp_path: Path) -> None:
    path = write(tmp_path, TWO_WORKERS)
    with pytest.raises(
        ConfigError, match=r"no worker named 'w7' in .*node.yaml \(workers: w0, w1\)"
    ):
        load_worker_config(node_file=path, worker="w7", env=ENV)


def test_node_file_from_environment(tmp_path: Path) -> None:
    path = write(tmp_path, TWO_WORKERS)
    env = {**ENV, "REACTANTSERVER_NODE_FILE": str(path), "REACTANTSERVER_WORKER_NAME": "w1"}
    assert load_worker_config(env=env).endpoints.port == 8081


def test_default_node_file(tmp_path: Path) -> None:
    assert Path("/etc/reactantserver/node.yaml") == DEFAULT_NODE_FILE
    if DEFAULT_NODE_FILE.exists():
        pytest.skip("this machine has a real node file")
    with pytest.raises(ConfigError, match=r"/etc/reactantserver/node\.yaml: no such file"):
        load_worker_config(env=ENV)


def test_env_overrides_apply_to_the_node_worker(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tmp_path, TWO_WORKERS)
    env = {
        **ENV,
        "REACTANTSERVER_WORKER_SCHEDULER_DISCIPLINE": "fifo",
        "REACTANTSERVER_WORKER_THREADS": "3",
    }
    with caplog.at_level(logging.INFO, logger="reactantserver.core.config"):
        loaded = load_worker_config(node_file=path, worker="w1", env=env)
    assert loaded.scheduler.discipline == "fifo"
    assert loaded.hook_threads == 3
    assert "REACTANTSERVER_WORKER_SCHEDULER_DISCIPLINE" in caplog.text


# ---- reactantserver-worker --model-repository DIR -----------------------------------------------


def test_standalone_model_repo(tmp_path: Path) -> None:
    loaded = load_worker_config(model_repo=tmp_path, env=ENV)
    assert loaded.model_dirs == (str(tmp_path),)
    endpoints = loaded.endpoints
    assert (endpoints.http_port, endpoints.port, endpoints.metrics_port) == (8000, 8001, 8002)
    assert (STANDALONE_GRPC_PORT, STANDALONE_METRICS_PORT) == (8001, 8002)
    assert loaded.endpoints.host == "127.0.0.1"
    assert loaded.worker_name is None
    assert loaded.runtime.mem_fraction == 0.9


def test_standalone_takes_env_overrides(tmp_path: Path) -> None:
    env = {
        **ENV,
        "REACTANTSERVER_WORKER_ENDPOINTS_HOST": "0.0.0.0",
        "REACTANTSERVER_WORKER_NAME": "solo",
    }
    loaded = load_worker_config(model_repo=tmp_path, env=env)
    assert (loaded.endpoints.host, loaded.worker_name) == ("0.0.0.0", "solo")
    with pytest.raises(ConfigError, match=r"endpoints\.metrics_port: must differ"):
        load_worker_config(
            model_repo=tmp_path, env={**ENV, "REACTANTSERVER_WORKER_ENDPOINTS_PORT": "8002"}
        )


def test_model_repo_and_node_file_exclude_each_other(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="mutually exclusive"):
        load_worker_config(node_file=write(tmp_path, TWO_WORKERS), model_repo=tmp_path, env=ENV)


# ---- load_node_config ----------------------------------------------------------------------------


def test_load_node_config_validates_every_worker(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        model_repo: /m
        workers:
          - name: w0
          - name: w1
            runtime: {mem_fraction: 0}
        """,
    )
    with pytest.raises(ConfigError) as info:
        load_node_config(path, ENV)
    assert str(info.value).startswith("workers[1].runtime.mem_fraction: must be in (0, 1]")
    assert str(info.value).endswith(f"(in {path})")
    # A worker only resolves its own entry.
    assert load_worker_config(node_file=path, worker="w0", env=ENV).worker_name == "w0"


def test_load_node_config_checks_env_quietly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tmp_path, TWO_WORKERS)
    with caplog.at_level(logging.INFO, logger="reactantserver.core.config"):
        parsed = load_node_config(path, {**ENV, "REACTANTSERVER_WORKER_META_CONCURRENCY": "4"})
    assert [w.name for w in parsed.workers or ()] == ["w0", "w1"]
    assert parsed.source == path
    assert caplog.records == []
    with pytest.raises(ConfigError, match="REACTANTSERVER_WORKER_META_CONCURRENCY"):
        load_node_config(path, {**ENV, "REACTANTSERVER_WORKER_META_CONCURRENCY": "0"})


def test_empty_and_non_mapping_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^model_repo: required key missing"):
        load_node_config(write(tmp_path, ""), ENV)
    with pytest.raises(ConfigError, match="node file must be a mapping, got a list"):
        load_node_config(write(tmp_path, "- model_repo: /m\n"), ENV)


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_node_config(tmp_path / "missing.yaml", ENV)
    with pytest.raises(ConfigError, match="cannot read"):
        load_node_config(tmp_path, ENV)


def test_yaml_syntax_error_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "model_repo: /m\nglobal: {runtime: [\n")
    with pytest.raises(ConfigError) as info:
        load_node_config(path, ENV)
    assert str(info.value) == (
        f"{path}:3:1: invalid YAML: while parsing a flow node; did not find expected node content"
    )


def test_duplicate_keys_are_rejected(tmp_path: Path) -> None:
    path = write(tmp_path, "model_repo: /m\nbase_port: 8000\nbase_port: 9000\n")
    with pytest.raises(ConfigError) as info:
        load_node_config(path, ENV)
    assert str(info.value) == (
        f"{path}:3:1: invalid YAML: while constructing a mapping; found duplicate key 'base_port'"
    )
    nested = write(tmp_path, "model_repo: /m\nglobal:\n  runtime: {warmup: true, warmup: false}\n")
    with pytest.raises(ConfigError, match="duplicate key 'warmup'"):
        load_node_config(nested, ENV)


def test_yaml_merge_keys_still_work(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        model_repo: /m
        global:
          meta: &meta {concurrency: 3}
        workers:
          - name: w0
            meta:
              <<: *meta
              scratch_slots: 4
        """,
    )
    loaded = load_worker_config(node_file=path, worker="w0", env=ENV)
    assert (loaded.meta.concurrency, loaded.meta.scratch_slots) == (3, 4)


# ---- YAML 1.1 pitfalls, as written in files ----------------------------------------------------


def pitfall(tmp_path: Path, global_block: str) -> str:
    path = write(tmp_path, "model_repo: /m\nglobal:\n" + textwrap.indent(global_block, "  "))
    with pytest.raises(ConfigError) as info:
        load_node_config(path, ENV)
    return str(info.value)


def test_unquoted_octal_mode(tmp_path: Path) -> None:
    for written in ("660", "0660"):
        message = pitfall(tmp_path, f"runtime: {{shared_host_weights_mode: {written}}}\n")
        assert message.startswith("global.runtime.shared_host_weights_mode: must be a quoted")
        assert "quote" in message


def test_quoted_octal_mode(tmp_path: Path) -> None:
    path = write(
        tmp_path, "model_repo: /m\nglobal: {runtime: {shared_host_weights_mode: '0640'}}\n"
    )
    loaded = load_worker_config(node_file=path, env=ENV)
    assert loaded.runtime.shared_host_weights_mode_bits == 0o640


def test_yaml_booleans_are_booleans_and_quoted_words_are_not(tmp_path: Path) -> None:
    path = write(tmp_path, "model_repo: /m\nglobal: {runtime: {preallocate: no, warmup: On}}\n")
    loaded = load_worker_config(node_file=path, env=ENV)
    assert (loaded.runtime.preallocate, loaded.runtime.warmup) == (False, True)
    message = pitfall(tmp_path, 'runtime: {preallocate: "no"}\n')
    assert message.startswith("global.runtime.preallocate: expected a boolean")
    assert "unquoted" in message


def test_norway_problem_in_names(tmp_path: Path) -> None:
    message = pitfall(tmp_path, "models_include: [resnet, no]\n")
    assert message.startswith("global.models_include[1]: expected a string, got boolean false")
    assert "quote it" in message
    message = pitfall(tmp_path, "scheduler: {models: {off: {weight: 2.0}}}\n")
    assert "quote it" in message


def test_exponent_without_dot(tmp_path: Path) -> None:
    message = pitfall(tmp_path, "runtime: {mem_fraction: 5e-1}\n")
    assert message.startswith("global.runtime.mem_fraction: expected a number, got string '5e-1'")
    assert "1.0e-3" in message


def test_public_surface_is_sorted() -> None:
    assert config.__all__ == sorted(
        config.__all__, key=lambda n: (0 if n.isupper() else 1 if n[:1].isupper() else 2, n)
    )
    for name in config.__all__:
        assert hasattr(config, name)


def test_config_import_leaves_jax_out() -> None:
    code = (
        "import sys, reactantserver.core.config;"
        "assert not [m for m in sys.modules if m.split('.')[0] in ('jax', 'jaxlib')]"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
