"""Node file: parsing, worker resolution, models map, ports."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from reactantserver.core.config import (
    ListenConfig,
    NodeConfig,
    Residency,
    Role,
    SupervisorConfig,
    WorkerConfig,
    WorkerEntry,
    node_config_from_mapping,
    node_config_to_dict,
    node_worker_configs,
    resolve_worker_config,
    synthesize_workers,
    worker_entries,
)
from reactantserver.core.config._resolve import shared_mem_fraction
from reactantserver.core.errors import ConfigError

ENV = {"HOME": "/home/tester"}
LOGGER = "reactantserver.core.config"


def node(**data: Any) -> NodeConfig:
    return node_config_from_mapping({"model_repo": "/models", **data}, ENV)


def reject(**data: Any) -> str:
    with pytest.raises(ConfigError) as info:
        node(**data)
    return str(info.value)


def worker(parsed: NodeConfig, name: str, **env: str) -> WorkerConfig:
    return resolve_worker_config(parsed, name, {**ENV, **env})


TWO = [{"name": "w0"}, {"name": "w1"}]


# ---- node keys --------------------------------------------------------------------------------


def test_node_defaults() -> None:
    parsed = node()
    assert parsed == NodeConfig(model_repo=("/models",))
    assert (parsed.base_port, parsed.metrics_base_port) == (8080, 9100)
    assert parsed.workers is None
    assert (parsed.global_settings, parsed.models, parsed.gateway) == ({}, {}, {})
    assert parsed.shared_host_weights is None
    assert (parsed.gpus, parsed.cpu_workers, parsed.role) == ("auto", 1, Role.ALL)
    assert parsed.listen == ListenConfig(
        http="0.0.0.0:8000", grpc="0.0.0.0:8001", metrics="0.0.0.0:8002"
    )
    assert parsed.model_repo == ("/models",)
    assert parsed.supervisor == SupervisorConfig(
        max_restarts=0,
        stable_uptime_seconds=60.0,
        max_backoff_seconds=30.0,
        worker_grace_seconds=15.0,
        gateway_grace_seconds=10.0,
        liveness_interval_seconds=10.0,
        liveness_failures=3,
    )


def test_model_repo_is_required_and_non_empty() -> None:
    with pytest.raises(ConfigError, match=r"^model_repo: required key missing"):
        node_config_from_mapping({}, ENV)
    with pytest.raises(ConfigError, match=r"^model_repo: must not be empty"):
        node_config_from_mapping({"model_repo": ""}, ENV)
    with pytest.raises(ConfigError, match=r"^model_repo: required key missing"):
        node_config_from_mapping(None, ENV)


@pytest.mark.parametrize(
    ("data", "path"),
    [
        ({"base_port": 0}, "base_port"),
        ({"base_port": "8080"}, "base_port"),
        ({"metrics_base_port": 70000}, "metrics_base_port"),
        ({"metrics_base_port": 0}, "metrics_base_port"),
        ({"shared_host_weights": "yes"}, "shared_host_weights"),
        ({"cpu_workers": 0}, "cpu_workers"),
        ({"role": "everything"}, "role"),
        ({"listen": {"grpc": "8001"}}, "listen.grpc"),
        ({"listen": {"metrics": "0.0.0.0:0"}}, "listen.metrics"),
        ({"listen": {"http": "8000"}}, "listen.http"),
        ({"listen": {"rest": "0.0.0.0:8000"}}, "listen.rest"),
        ({"model_repo": ["/models", ""]}, "model_repo[1]"),
        ({"supervisor": {"restarts": 1}}, "supervisor.restarts"),
        ({"supervisor": {"max_restarts": -1}}, "supervisor.max_restarts"),
        ({"supervisor": {"stable_uptime_seconds": 0}}, "supervisor.stable_uptime_seconds"),
        ({"supervisor": {"max_backoff_seconds": 0}}, "supervisor.max_backoff_seconds"),
        ({"supervisor": {"worker_grace_seconds": -1}}, "supervisor.worker_grace_seconds"),
        ({"supervisor": {"gateway_grace_seconds": -1}}, "supervisor.gateway_grace_seconds"),
        ({"supervisor": {"liveness_interval_seconds": -1}}, "supervisor.liveness_interval_seconds"),
        ({"supervisor": {"liveness_failures": 0}}, "supervisor.liveness_failures"),
        ({"gpus": -1}, "gpus"),
        ({"gpus": []}, "gpus"),
        ({"gpus": "two"}, "gpus"),
        ({"gpus": {"count": 2}}, "gpus"),
        ({"gpus": True}, "gpus"),
        ({"gpus": [0, True]}, "gpus[1]"),
        ({"gpus": [0, -1]}, "gpus[1]"),
        ({"gpus": ["0", 0]}, "gpus[1]"),
        ({"gateway": {"endpoints": ["127.0.0.1:8080"]}}, "gateway.endpoints"),
        ({"gateway": {"worker_names": ["a"]}}, "gateway.worker_names"),
        ({"gateway": "round_robin"}, "gateway"),
        ({"global": ["runtime"]}, "global"),
        ({"models": ["resnet"]}, "models"),
        ({"modles": {}}, "modles"),
    ],
)
def test_node_key_rules(data: dict[str, Any], path: str) -> None:
    message = reject(**data)
    assert message.startswith(f"{path}: "), message


def test_unknown_node_key_suggests() -> None:
    assert reject(base_prot=8000) == "base_prot: unknown key (did you mean base_port?)"


@pytest.mark.parametrize("key", ["runtime", "scheduler", "model_dirs"])
def test_worker_key_at_top_level_points_at_global(key: str) -> None:
    assert reject(**{key: {}}) == (
        f"{key}: worker key at the top level; put it under global: or a worker entry"
    )


def test_removed_key_at_top_level() -> None:
    assert reject(batch_policy={}) == (
        "batch_policy: removed key; use scheduler.models.<m>.max_batch_size"
    )


@pytest.mark.parametrize(
    ("gpus", "expected"),
    [
        ("auto", "auto"),
        (None, "auto"),
        (0, 0),
        (2, 2),
        ("2", 2),
        ([0, 1], ("0", "1")),
        (["GPU-5f3c", " 1 "], ("GPU-5f3c", "1")),
    ],
)
def test_gpus_forms(gpus: object, expected: object) -> None:
    assert node(gpus=gpus).gpus == expected


def test_supervisor_keys_parse() -> None:
    parsed = node(
        role="workers",
        cpu_workers=3,
        listen={"grpc": "[::]:9001"},
        supervisor={"max_restarts": 5, "max_backoff_seconds": 4},
        gateway={"policy": "model_aware", "anything": {"is": "kept"}},
    )
    assert parsed.role is Role.WORKERS
    assert parsed.cpu_workers == 3
    assert parsed.listen == ListenConfig(grpc="[::]:9001")
    assert (parsed.supervisor.max_restarts, parsed.supervisor.max_backoff_seconds) == (5, 4.0)
    assert parsed.gateway == {"policy": "model_aware", "anything": {"is": "kept"}}


# ---- workers list -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("workers", "path", "words"),
    [
        ([], "workers", "non-empty list"),
        ({"w0": {}}, "workers", "non-empty list"),
        (["w0"], "workers[0]", "expected a mapping"),
        ([{"gpu": 0}], "workers[0].name", "required key missing"),
        ([{"name": "gpu 0"}], "workers[0].name", "[A-Za-z0-9_-]+"),
        ([{"name": True}], "workers[0].name", "expected a string"),
        ([{"name": "a"}, {"name": "a"}], "workers[1].name", "duplicate name (also workers[0])"),
        ([{"name": "a", "gpu": -1}], "workers[0].gpu", "must be >= 0"),
        ([{"name": "a", "port": 0}], "workers[0].port", "must be in [1, 65535]"),
        ([{"name": "a", "metrics_port": 65536}], "workers[0].metrics_port", "must be in"),
        ([{"name": "a", "runtime": {"mem_frac": 1}}], "workers[0].runtime.mem_frac", "unknown key"),
        ([{"name": "a", "batch_policy": {}}], "workers[0].batch_policy", "removed key"),
    ],
)
def test_worker_entry_rules(workers: object, path: str, words: str) -> None:
    message = reject(workers=workers)
    assert message.startswith(f"{path}: "), message
    assert words in message


def test_worker_names_and_gpu_kept() -> None:
    parsed = node(workers=[{"name": "a-1", "gpu": 1}, {"name": "B_2"}])
    assert parsed.workers == (WorkerEntry("a-1", gpu=1), WorkerEntry("B_2"))
    assert worker_entries(parsed) == parsed.workers


def test_derived_values() -> None:
    parsed = node(workers=TWO)
    configs = node_worker_configs(parsed, ENV)
    assert list(configs) == ["w0", "w1"]
    for index, name in enumerate(["w0", "w1"]):
        resolved = configs[name]
        assert resolved.worker_name == name
        assert resolved.model_dirs == ("/models",)
        assert resolved.endpoints.port == 8080 + index
        assert resolved.endpoints.metrics_port == 9100 + index
        assert resolved.runtime.device_ordinal == 0


def test_explicit_entry_ports_and_disabled_metrics() -> None:
    parsed = node(
        base_port=7000,
        metrics_base_port=None,
        workers=[{"name": "a", "port": 6000}, {"name": "b"}, {"name": "c", "metrics_port": 6100}],
    )
    ports = [
        (c.endpoints.port, c.endpoints.metrics_port)
        for c in node_worker_configs(parsed, ENV).values()
    ]
    assert ports == [(6000, 0), (7001, 0), (7002, 6100)]


def test_workers_sharing_a_gpu_split_the_default_mem_fraction() -> None:
    parsed = node(
        workers=[
            {"name": "a", "gpu": 0},
            {"name": "b", "gpu": 0},
            {"name": "c", "gpu": 0, "runtime": {"mem_fraction": 0.2}},
            {"name": "d", "gpu": 1},
            {"name": "e"},
        ]
    )
    fractions = {n: c.runtime.mem_fraction for n, c in node_worker_configs(parsed, ENV).items()}
    assert fractions == {"a": 0.3, "b": 0.3, "c": 0.2, "d": 0.9, "e": 0.9}
    assert [shared_mem_fraction(k) for k in (1, 2, 3, 4, 7)] == [0.9, 0.45, 0.3, 0.225, 0.128]
    # The global block, like the worker's own, is a choice: it is kept (the node checks sums).
    parsed = node(
        **{"global": {"runtime": {"mem_fraction": 0.4}}},
        workers=[{"name": "a", "gpu": 0}, {"name": "b", "gpu": 0}],
    )
    assert {c.runtime.mem_fraction for c in node_worker_configs(parsed, ENV).values()} == {0.4}


def test_resolution_order_and_deep_merge() -> None:
    parsed = node(
        **{
            "global": {
                "runtime": {"mem_fraction": 0.5, "preallocate": False},
                "models_include": ["a", "b"],
                "scheduler": {"models": {"resnet": {"weight": 2.0, "max_batch_size": 8}}},
            },
            "workers": [
                {"name": "w0"},
                {
                    "name": "w1",
                    "runtime": {"mem_fraction": 0.7},
                    "models_include": ["c"],
                    "scheduler": {"models": {"resnet": {"weight": 3.0}}},
                },
            ],
        }
    )
    w0, w1 = worker(parsed, "w0"), worker(parsed, "w1")
    assert (w0.runtime.mem_fraction, w0.runtime.preallocate) == (0.5, False)
    assert (w1.runtime.mem_fraction, w1.runtime.preallocate) == (0.7, False)
    assert w0.models_include == ("a", "b")
    assert w1.models_include == ("c",)  # lists replace, they do not merge
    assert w0.scheduler.models["resnet"].weight == 2.0
    assert (w1.scheduler.models["resnet"].weight, w1.scheduler.models["resnet"].max_batch_size) == (
        3.0,
        8,
    )
    # Environment overrides come last.
    assert (
        worker(parsed, "w1", REACTANTSERVER_WORKER_RUNTIME_MEM_FRACTION="0.2").runtime.mem_fraction
        == 0.2
    )


def test_node_derived_values_win_over_blocks(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        parsed = node(
            **{
                "global": {"endpoints": {"port": 9999}, "model_dirs": ["/elsewhere"]},
                "workers": [{"name": "w0", "runtime": {"device_ordinal": 3}}],
            }
        )
    resolved = worker(parsed, "w0")
    assert resolved.endpoints.port == 8080
    assert resolved.model_dirs == ("/models",)
    assert resolved.runtime.device_ordinal == 0
    assert "global.endpoints.port is ignored" in caplog.text
    assert "global.model_dirs is ignored" in caplog.text
    assert "workers[0].runtime.device_ordinal is ignored" in caplog.text


def test_env_overrides_node_derived_port() -> None:
    resolved = worker(node(workers=TWO), "w1", REACTANTSERVER_WORKER_ENDPOINTS_PORT="8001")
    assert resolved.endpoints.port == 8001


def test_errors_name_the_block_they_come_from() -> None:
    message = reject(**{"global": {"runtime": {"mem_fraction": 2}}})
    assert message.startswith("global.runtime.mem_fraction: must be in (0, 1]")
    message = reject(workers=[{"name": "w0"}, {"name": "w1", "meta": {"concurrency": 0}}])
    assert message.startswith("workers[1].meta.concurrency: must be >= 1")
    message = reject(**{"global": {"runtime": {"numerics": "tf32"}}})
    assert message.startswith("global.runtime.numerics: tf32 needs backend cuda")


def test_unknown_and_removed_keys_in_global() -> None:
    assert reject(**{"global": {"runtime": {"memfraction": 1}}}).startswith(
        "global.runtime.memfraction: unknown key"
    )
    assert reject(**{"global": {"runtime": {"residency_mode": "x"}}}) == (
        "global.runtime.residency_mode: removed key; use model_control_mode"
    )


def test_derived_port_out_of_range_says_where_it_came_from() -> None:
    message = reject(base_port=65535, workers=TWO)
    assert (
        message == "endpoints.port: must be in [1, 65535], got integer 65536 (from base_port + 1)"
    )


def test_node_file_path_ends_the_message(tmp_path: Any) -> None:
    source = tmp_path / "node.yaml"
    with pytest.raises(ConfigError) as info:
        node_config_from_mapping({"model_repo": "/m", "cpu_workers": 0}, ENV, source=source)
    assert str(info.value) == f"cpu_workers: must be >= 1, got integer 0 (in {source})"


# ---- models map and shared_host_weights -------------------------------------------------------


def test_models_map_sets_device_residency_on_listed_workers_only() -> None:
    parsed = node(workers=TWO, models={"resnet": ["w1"], "bert": ["w0", "w1"]})
    w0, w1 = worker(parsed, "w0"), worker(parsed, "w1")
    assert "resnet" not in w0.scheduler.models
    assert w1.scheduler.models["resnet"].residency is Residency.DEVICE
    assert w0.scheduler.models["bert"].residency is Residency.DEVICE
    assert w1.scheduler.models["bert"].residency is Residency.DEVICE


def test_models_map_does_not_override_a_set_residency() -> None:
    parsed = node(
        workers=[
            {"name": "w0", "scheduler": {"models": {"resnet": {"residency": "pinned_system"}}}},
            {"name": "w1", "scheduler": {"models": {"resnet": {"weight": 4.0}}}},
        ],
        models={"resnet": ["w0", "w1"]},
    )
    assert worker(parsed, "w0").scheduler.models["resnet"].residency is Residency.SYSTEM
    w1 = worker(parsed, "w1").scheduler.models["resnet"]
    assert (w1.residency, w1.weight) == (Residency.DEVICE, 4.0)


def test_models_map_residency_beats_global_default_only_where_unset() -> None:
    parsed = node(
        **{"global": {"scheduler": {"models": {"m": {"residency": "unpinned"}}}}},
        workers=TWO,
        models={"m": ["w0"]},
    )
    assert worker(parsed, "w0").scheduler.models["m"].residency is Residency.UNPINNED


@pytest.mark.parametrize(
    ("models", "path", "words"),
    [
        ({"resnet": ["w2"]}, "models.resnet[0]", "unknown worker 'w2' (workers: w0, w1)"),
        ({"resnet": ["w0", "nope"]}, "models.resnet[1]", "unknown worker 'nope'"),
        ({"resnet": []}, "models.resnet", "non-empty list"),
        ({"resnet": "w0"}, "models.resnet", "non-empty list"),
        ({"resnet": [0]}, "models.resnet[0]", "expected a worker name"),
        ({False: ["w0"]}, "models.False", "quote it"),
    ],
)
def test_models_map_rules(models: dict[Any, Any], path: str, words: str) -> None:
    message = reject(workers=TWO, models=models)
    assert message.startswith(f"{path}: "), message
    assert words in message


def test_shared_host_weights_is_copied_where_unset() -> None:
    parsed = node(
        shared_host_weights=True,
        workers=[{"name": "w0"}, {"name": "w1", "runtime": {"shared_host_weights": False}}],
    )
    assert worker(parsed, "w0").runtime.shared_host_weights is True
    assert worker(parsed, "w1").runtime.shared_host_weights is False
    assert worker(node(), "worker0").runtime.shared_host_weights is False


# ---- ports --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "path"),
    [
        ({"workers": [{"name": "a"}, {"name": "b", "port": 8080}]}, "workers[1].port"),
        ({"base_port": 9000, "metrics_base_port": 9001, "workers": TWO}, "base_port"),
        ({"workers": [{"name": "a", "metrics_port": 8081}, {"name": "b"}]}, "base_port"),
        (
            {"workers": [{"name": "a", "port": 9000, "metrics_port": 9000}]},
            "workers[0].metrics_port",
        ),
        ({"base_port": 9100}, "metrics_base_port"),
    ],
)
def test_port_collisions(data: dict[str, Any], path: str) -> None:
    message = reject(**data)
    assert message.startswith(f"{path}: port "), message
    assert "is both" in message


def test_disabled_metrics_ports_never_collide() -> None:
    parsed = node(metrics_base_port=None, workers=[{"name": "a"}, {"name": "b"}, {"name": "c"}])
    assert [c.endpoints.metrics_port for c in node_worker_configs(parsed, ENV).values()] == [
        0,
        0,
        0,
    ]


# ---- synthesis ----------------------------------------------------------------------------------


def test_absent_workers_resolve_as_one_synthesized_worker() -> None:
    parsed = node()
    assert worker_entries(parsed) == (WorkerEntry("worker0"),)
    assert list(node_worker_configs(parsed, ENV)) == ["worker0"]
    with pytest.raises(ConfigError, match=r"no worker named 'worker1' .*\(workers: worker0\)"):
        worker(parsed, "worker1")


def test_synthesize_workers() -> None:
    parsed = node(models={"resnet": ["worker2"]})  # valid until the count is known
    synthesized = synthesize_workers(parsed, 3, bind_gpus=True)
    assert synthesized.workers == tuple(WorkerEntry(f"worker{i}", gpu=i) for i in range(3))
    resolved = resolve_worker_config(synthesized, "worker2", ENV)
    assert resolved.endpoints.port == 8082
    assert resolved.scheduler.models["resnet"].residency is Residency.DEVICE
    assert synthesize_workers(node(), 2).workers == (WorkerEntry("worker0"), WorkerEntry("worker1"))
    with pytest.raises(ConfigError, match=r"models.resnet\[0\]: unknown worker 'worker2'"):
        synthesize_workers(parsed, 2)
    with pytest.raises(ValueError, match="count"):
        synthesize_workers(parsed, 0)


def test_synthesize_keeps_listed_workers() -> None:
    parsed = node(workers=TWO)
    assert synthesize_workers(parsed, 4) is parsed


def test_models_map_names_that_synthesis_cannot_produce_are_rejected_early() -> None:
    assert reject(models={"resnet": ["gpu0"]}).startswith("models.resnet[0]: unknown worker 'gpu0'")


def test_synthesized_port_collision() -> None:
    parsed = node(base_port=9000, metrics_base_port=9002)
    with pytest.raises(ConfigError, match="port 9002 is both"):
        synthesize_workers(parsed, 3)


# ---- materialize --------------------------------------------------------------------------------


def test_node_config_to_dict_round_trips() -> None:
    parsed = node(
        **{
            "global": {"runtime": {"backend": "cuda"}},
            "workers": [{"name": "w0", "gpu": 1, "port": 7000, "meta": {"concurrency": 4}}],
            "models": {"resnet": ["w0"]},
            "shared_host_weights": True,
            "gpus": [1, "GPU-x"],
            "gateway": {"policy": "round_robin"},
        }
    )
    plain = node_config_to_dict(parsed)
    assert plain["workers"] == [{"name": "w0", "gpu": 1, "port": 7000, "meta": {"concurrency": 4}}]
    assert plain["gpus"] == ["1", "GPU-x"]
    assert plain["role"] == "all"
    assert node_config_from_mapping(plain, ENV) == parsed
    synthesized = synthesize_workers(node(), 2)
    assert node_config_from_mapping(node_config_to_dict(synthesized), ENV) == synthesized
