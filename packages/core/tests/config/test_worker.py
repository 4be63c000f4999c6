"""Worker keys: defaults, every validation rule, aliases, removed keys."""

from __future__ import annotations

import copy
import logging
import pickle
from typing import Any

import attrs
import pytest

from reactantserver.core import config
from reactantserver.core.config import (
    Backend,
    LogFormat,
    LogLevel,
    ModelControlMode,
    ModelSchedulingConfig,
    Numerics,
    Residency,
    RuntimeConfig,
    SchedulerConfig,
    SchedulingDiscipline,
    TraceExporter,
    TraceLevel,
    TraceMode,
    WorkerConfig,
    worker_config_from_mapping,
    worker_config_to_dict,
)
from reactantserver.core.errors import ConfigError

ENV = {"HOME": "/home/tester"}
GIB = 1 << 30


def nested(path: str, value: object) -> dict[str, Any]:
    """``"runtime.mem_fraction", 0.5`` → ``{"runtime": {"mem_fraction": 0.5}}``."""
    data: dict[str, Any] = {}
    node = data
    *parents, leaf = path.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value
    return data


def lookup(obj: object, path: str) -> object:
    for key in path.split("."):
        obj = obj[key] if isinstance(obj, dict) else getattr(obj, key)
    return obj


def reject(data: dict[str, Any], env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        worker_config_from_mapping(data, env or ENV)
    return str(info.value)


# The worker keys (docs/reference/configuration.md), one row per key.
SPEC_DEFAULTS: list[tuple[str, object]] = [
    ("cache_dir", ""),
    ("model_dirs", ()),
    ("models_include", ()),
    ("model_control_mode", ModelControlMode.DYNAMIC),
    ("model_poll_seconds", 15.0),
    ("shutdown_grace_seconds", 10.0),
    ("runtime.backend", Backend.CPU),
    ("runtime.device_ordinal", 0),
    ("runtime.mem_fraction", 0.9),
    ("runtime.preallocate", True),
    ("runtime.allow_cpu_fallback", True),
    ("runtime.numerics", Numerics.AUTO),
    ("runtime.weight_cache_fraction", 1.0),
    ("runtime.weight_cache_wiggle_fraction", 0.1),
    ("runtime.weight_cache_max_bytes", 0),
    ("runtime.autotune", True),
    ("runtime.autotune_cache", True),
    ("runtime.autotune_cache_dir", ""),
    ("runtime.executable_cache", True),
    ("runtime.executable_cache_max_bytes", 10 * GIB),
    ("runtime.warmup", True),
    ("runtime.shared_host_weights", False),
    ("runtime.shared_host_weights_mode", "660"),
    ("runtime.page_locked_weights", True),
    ("runtime.cpu_arena_bytes", 0),
    ("runtime.cpu_arena_bandwidth_bytes_per_s", 0.0),
    ("scheduler.discipline", SchedulingDiscipline.FAIR),
    ("scheduler.ema_halflife_seconds", 30.0),
    ("scheduler.recency_penalty_cap", 0.25),
    ("scheduler.coalescing_discount", 0.1),
    ("scheduler.cost_ema_alpha", 0.2),
    ("scheduler.max_queue_depth", 1024),
    ("scheduler.compaction_interval", 0),
    ("scheduler.default_priority", 1),
    # On: a batch pads up to a larger compiled size when the learned costs say it serves
    # more rows per second (issue 32: coalescing without tuning).
    ("scheduler.pad_up_when_cheaper", True),
    # Unset: the adaptive wait (issue 32: coalescing without tuning); a number fixes the delay.
    ("scheduler.max_queue_delay_microseconds", None),
    ("scheduler.prefetch_weights", True),
    ("scheduler.models", {}),
    ("meta.concurrency", 2),
    ("meta.scratch_bytes", GIB),
    ("meta.scratch_slots", 16),
    ("meta.expose_sub_models", False),
    ("endpoints.host", "127.0.0.1"),
    ("endpoints.port", 8080),
    ("endpoints.http_port", 0),
    ("endpoints.metrics_port", 0),
    ("endpoints.max_concurrent_requests", 64),
    ("endpoints.control_service", True),
    ("endpoints.reflection", True),
    ("endpoints.lane", True),
    ("endpoints.front_threads", 1),
    ("endpoints.tls.cert_file", ""),
    ("endpoints.tls.key_file", ""),
    ("endpoints.tls.client_ca_file", ""),
    ("grpc.max_recv_msg_bytes", 536870912),
    ("grpc.max_send_msg_bytes", 536870912),
    ("grpc.keepalive_time_seconds", 60.0),
    ("grpc.keepalive_timeout_seconds", 20.0),
    ("grpc.min_client_ping_interval_seconds", 10.0),
    ("grpc.max_connection_age_seconds", 0.0),
    ("logging.level", LogLevel.INFO),
    ("logging.format", LogFormat.TEXT),
    ("tracing.mode", TraceMode.OFF),
    ("tracing.level", TraceLevel.TIMESTAMPS),
    ("tracing.rate", 1.0),
    ("tracing.count", -1),
    ("tracing.exporter", TraceExporter.OTLP),
    ("tracing.endpoint", ""),
    ("tracing.service_name", ""),
]


@pytest.mark.parametrize(("path", "expected"), SPEC_DEFAULTS)
def test_default_matches_spec(path: str, expected: object) -> None:
    value = lookup(WorkerConfig(), path)
    assert value == expected
    assert type(value) is type(expected)


def test_defaults_cover_every_key() -> None:
    assert {path for path, _ in SPEC_DEFAULTS} - {"scheduler.models"} == set(
        config.env_override_variables().values()
    )


def test_model_scheduling_defaults() -> None:
    entry = ModelSchedulingConfig()
    assert (entry.weight, entry.residency, entry.max_batch_size) == (1.0, None, None)
    assert SchedulerConfig().for_model("anything") == entry


def test_empty_mapping_gives_defaults_with_resolved_cache_dirs() -> None:
    loaded = worker_config_from_mapping({}, ENV)
    expected = attrs.evolve(
        WorkerConfig(),
        cache_dir="/home/tester/.cache/reactantserver",
        runtime=RuntimeConfig(autotune_cache_dir="/home/tester/.cache/reactantserver/xla-autotune"),
    )
    assert loaded == expected
    assert worker_config_from_mapping(None, ENV) == expected


# (key path, bad value): every range and enum rule of the worker keys.
REJECTED: list[tuple[str, object]] = [
    ("model_control_mode", "manual"),
    ("model_poll_seconds", -1),
    ("shutdown_grace_seconds", -0.5),
    ("runtime.backend", "tpu"),
    ("runtime.device_ordinal", -1),
    ("runtime.mem_fraction", 0),
    ("runtime.mem_fraction", 1.01),
    ("runtime.numerics", "bf16"),
    ("runtime.weight_cache_fraction", -0.1),
    ("runtime.weight_cache_fraction", 1.5),
    ("runtime.weight_cache_wiggle_fraction", 1.0),
    ("runtime.weight_cache_wiggle_fraction", -0.1),
    ("runtime.weight_cache_max_bytes", -1),
    ("runtime.executable_cache_max_bytes", 0),
    ("runtime.shared_host_weights_mode", "1777"),
    ("runtime.shared_host_weights_mode", "rw-rw----"),
    ("runtime.shared_host_weights_mode", "689"),
    ("runtime.shared_host_weights_mode", ""),
    ("scheduler.discipline", "lifo"),
    ("scheduler.ema_halflife_seconds", 0),
    ("scheduler.recency_penalty_cap", 0),
    ("scheduler.recency_penalty_cap", 1.5),
    ("scheduler.coalescing_discount", 1),
    ("scheduler.coalescing_discount", -0.1),
    ("scheduler.cost_ema_alpha", 0),
    ("scheduler.cost_ema_alpha", 1.1),
    ("scheduler.max_queue_depth", 0),
    ("scheduler.compaction_interval", -1),
    ("scheduler.default_priority", 0),
    ("scheduler.models.resnet.weight", 0),
    ("scheduler.models.resnet.weight", -1.0),
    ("scheduler.models.resnet.residency", "gpu"),
    ("scheduler.models.resnet.max_batch_size", 0),
    ("scheduler.max_queue_delay_microseconds", -1),
    ("scheduler.max_queue_delay_microseconds", 1_000_001),
    ("scheduler.models.resnet.max_queue_delay_microseconds", -1),
    ("meta.concurrency", 0),
    ("meta.scratch_slots", 0),
    ("endpoints.host", ""),
    ("endpoints.port", 0),
    ("endpoints.port", 65536),
    ("endpoints.metrics_port", -1),
    ("endpoints.http_port", 65536),
    ("endpoints.metrics_port", 65536),
    ("endpoints.max_concurrent_requests", -1),
    ("grpc.max_recv_msg_bytes", 0),
    ("grpc.max_send_msg_bytes", 0),
    ("grpc.max_send_msg_bytes", 1 << 31),
    ("grpc.keepalive_time_seconds", -1),
    ("grpc.keepalive_timeout_seconds", 0),
    ("grpc.min_client_ping_interval_seconds", -1),
    ("grpc.max_connection_age_seconds", -1),
    ("logging.level", "verbose"),
    ("logging.level", "INFO"),
    ("logging.format", "xml"),
    ("tracing.mode", "jaeger"),
    ("tracing.rate", 1.5),
    ("tracing.count", -2),
]


@pytest.mark.parametrize(("path", "value"), REJECTED)
def test_rule_rejects_and_names_the_key_path(path: str, value: object) -> None:
    message = reject(nested(path, value))
    assert message.startswith(f"{path}: "), message
    assert "\n" not in message


# Values on the edge of each range that are allowed.
ACCEPTED: list[tuple[str, object]] = [
    ("runtime.mem_fraction", 1),
    ("runtime.weight_cache_fraction", 0),
    ("runtime.weight_cache_fraction", 1),
    ("runtime.weight_cache_wiggle_fraction", 0),
    ("runtime.weight_cache_max_bytes", 1),
    ("scheduler.recency_penalty_cap", 1),
    ("scheduler.coalescing_discount", 0),
    ("scheduler.cost_ema_alpha", 1),
    ("scheduler.compaction_interval", 0),
    ("scheduler.models.resnet.max_batch_size", 1),
    ("scheduler.max_queue_delay_microseconds", 1_000_000),
    ("scheduler.models.resnet.max_queue_delay_microseconds", 0),
    ("meta.scratch_bytes", 0),
    ("meta.scratch_bytes", -1),
    ("endpoints.port", 65535),
    ("endpoints.metrics_port", 65535),
    ("endpoints.max_concurrent_requests", 0),
    ("grpc.keepalive_time_seconds", 0),
    ("grpc.min_client_ping_interval_seconds", 0),
    ("grpc.max_recv_msg_bytes", (1 << 31) - 1),
    ("shutdown_grace_seconds", 0),
    ("runtime.shared_host_weights_mode", "0600"),
    ("runtime.shared_host_weights_mode", "777"),
]


@pytest.mark.parametrize(("path", "value"), ACCEPTED)
def test_edge_values_are_accepted(path: str, value: object) -> None:
    loaded = worker_config_from_mapping(nested(path, value), ENV)
    assert lookup(loaded, path) == value


def test_every_error_is_reported_at_once() -> None:
    message = reject(
        {"runtime": {"mem_fraction": 2.0, "device_ordinal": -1}, "meta": {"concurrency": 0}}
    )
    lines = message.splitlines()
    assert {line.split(":")[0] for line in lines} == {
        "runtime.mem_fraction",
        "runtime.device_ordinal",
        "meta.concurrency",
    }


def test_message_says_what_the_value_must_be_and_was() -> None:
    assert reject(nested("runtime.mem_fraction", 1.5)) == (
        "runtime.mem_fraction: must be in (0, 1], got number 1.5"
    )


# ---- types: no coercion across YAML types --------------------------------------------------

WRONG_TYPES: list[tuple[str, object, str]] = [
    ("runtime.preallocate", "yes", "unquoted"),
    ("runtime.preallocate", "false", "unquoted"),
    ("runtime.preallocate", 1, "expected a boolean"),
    ("runtime.device_ordinal", 1.5, "expected an integer"),
    ("runtime.device_ordinal", True, "expected an integer"),
    ("scheduler.max_queue_depth", "64", "unquoted"),
    ("runtime.mem_fraction", "0.5", "expected a number"),
    ("runtime.mem_fraction", True, "expected a number"),
    ("runtime.mem_fraction", float("nan"), "finite"),
    ("grpc.max_connection_age_seconds", float("inf"), "finite"),
    ("endpoints.host", 127, "quote it"),
    ("cache_dir", True, "quote it"),
    ("model_dirs", "/models", "expected a list"),
    ("runtime.backend", 1, "must be one of"),
    ("runtime", "cpu", "expected a mapping"),
    ("scheduler.models", ["resnet"], "expected a mapping"),
    ("scheduler.models.resnet", None, "expected a mapping"),
]


@pytest.mark.parametrize(("path", "value", "words"), WRONG_TYPES)
def test_wrong_yaml_type_is_rejected(path: str, value: object, words: str) -> None:
    message = reject(nested(path, value))
    assert message.startswith(f"{path}: ")
    assert words in message


def test_list_items_are_checked_with_their_index() -> None:
    message = reject({"models_include": ["resnet", False]})
    assert message.startswith("models_include[1]: expected a string, got boolean false")
    assert "quote it" in message


def test_model_name_key_must_be_a_string() -> None:
    message = reject({"scheduler": {"models": {False: {"weight": 2.0}}}})
    assert message.startswith("scheduler.models.False: model names must be non-empty strings")
    assert "quote it" in message


def test_octal_mode_as_int_asks_for_quotes() -> None:
    for value in (660, 0o660):
        message = reject(nested("runtime.shared_host_weights_mode", value))
        assert message.startswith("runtime.shared_host_weights_mode: must be a quoted octal string")
        assert "quote" in message


def test_octal_mode_bits() -> None:
    loaded = worker_config_from_mapping(nested("runtime.shared_host_weights_mode", "0640"), ENV)
    assert loaded.runtime.shared_host_weights_mode_bits == 0o640


@pytest.mark.parametrize(
    ("mode", "warns"), [("660", False), ("664", False), ("666", True), ("777", True)]
)
def test_world_writable_mode_warns(
    mode: str, warns: bool, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="reactantserver.core.config"):
        worker_config_from_mapping(nested("runtime.shared_host_weights_mode", mode), ENV)
    warned = [r for r in caplog.records if "shared_host_weights_mode" in r.getMessage()]
    assert bool(warned) is warns
    if warns:
        assert warned[0].levelno == logging.WARNING


# ---- aliases and enums ------------------------------------------------------------------------


def test_backend_alias_gpu_is_cuda() -> None:
    loaded = worker_config_from_mapping(nested("runtime.backend", "gpu"), ENV)
    assert loaded.runtime.backend is Backend.CUDA
    assert worker_config_to_dict(loaded)["runtime"]["backend"] == "cuda"


@pytest.mark.parametrize(
    ("spelling", "expected"),
    [
        ("unpinned", Residency.UNPINNED),
        ("system", Residency.SYSTEM),
        ("pinned_system", Residency.SYSTEM),
        ("device", Residency.DEVICE),
        ("pinned_device", Residency.DEVICE),
        (None, None),
    ],
)
def test_residency_spellings(spelling: str | None, expected: Residency | None) -> None:
    loaded = worker_config_from_mapping(nested("scheduler.models.resnet.residency", spelling), ENV)
    assert loaded.scheduler.for_model("resnet").residency is expected


def test_enum_error_lists_spellings_and_aliases() -> None:
    message = reject(nested("scheduler.models.resnet.residency", "pinned"))
    assert "unpinned, system (alias pinned_system), device (alias pinned_device)" in message


def test_per_model_settings() -> None:
    data = {"scheduler": {"models": {"resnet": {"weight": 2, "max_batch_size": 8}, "bert": {}}}}
    loaded = worker_config_from_mapping(data, ENV)
    assert loaded.scheduler.models["resnet"] == ModelSchedulingConfig(weight=2.0, max_batch_size=8)
    assert loaded.scheduler.models["bert"] == ModelSchedulingConfig()
    assert isinstance(loaded.scheduler.models["resnet"].weight, float)


def test_queue_delay_per_model_overrides_the_global_one() -> None:
    models = {"resnet": {"max_queue_delay_microseconds": 0}, "bert": {"weight": 2}}
    data = {"scheduler": {"max_queue_delay_microseconds": 500, "models": models}}
    scheduler = worker_config_from_mapping(data, ENV).scheduler
    assert scheduler.queue_delay_us("resnet") == 0
    assert scheduler.queue_delay_us("bert") == 500
    assert scheduler.queue_delay_us("unlisted") == 500
    env = {**ENV, "REACTANTSERVER_WORKER_SCHEDULER_MAX_QUEUE_DELAY_MICROSECONDS": "250"}
    assert worker_config_from_mapping({}, env).scheduler.queue_delay_us("any") == 250


# ---- cross-field rules ----------------------------------------------------------------------


def test_tf32_needs_cuda() -> None:
    message = reject({"runtime": {"numerics": "tf32"}})
    assert message.startswith("runtime.numerics: tf32 needs backend cuda")
    loaded = worker_config_from_mapping({"runtime": {"numerics": "tf32", "backend": "gpu"}}, ENV)
    assert loaded.runtime.numerics is Numerics.TF32


def test_poll_interval_must_be_positive_when_dynamic() -> None:
    message = reject({"model_poll_seconds": 0})
    assert message.startswith("model_poll_seconds: must be > 0 when model_control_mode is dynamic")
    for mode in ("static", "explicit"):
        loaded = worker_config_from_mapping(
            {"model_control_mode": mode, "model_poll_seconds": 0}, ENV
        )
        assert loaded.model_poll_seconds == 0.0


def test_http_port_must_differ_from_port_and_may_share_the_metrics_port() -> None:
    message = reject({"endpoints": {"port": 9000, "http_port": 9000}})
    assert message.startswith("endpoints.http_port: must differ from endpoints.port")
    shared = {"port": 9000, "http_port": 9001, "metrics_port": 9001}
    loaded = worker_config_from_mapping({"endpoints": shared}, ENV)
    assert (loaded.endpoints.http_port, loaded.endpoints.metrics_port) == (9001, 9001)


def test_metrics_port_must_differ_from_port() -> None:
    message = reject({"endpoints": {"port": 9000, "metrics_port": 9000}})
    assert message.startswith("endpoints.metrics_port: must differ from endpoints.port")
    loaded = worker_config_from_mapping({"endpoints": {"port": 9000, "metrics_port": 9001}}, ENV)
    assert loaded.endpoints.metrics_port == 9001


@pytest.mark.parametrize(
    ("tls", "path"),
    [
        ({"cert_file": "c.pem"}, "endpoints.tls.key_file"),
        ({"key_file": "k.pem"}, "endpoints.tls.cert_file"),
        ({"client_ca_file": "ca.pem"}, "endpoints.tls.client_ca_file"),
    ],
)
def test_tls_files_come_in_pairs(tls: dict[str, str], path: str) -> None:
    assert reject({"endpoints": {"tls": tls}}).startswith(f"{path}: ")


def test_tls_and_mtls() -> None:
    tls = {"cert_file": "c.pem", "key_file": "k.pem"}
    plain = worker_config_from_mapping({"endpoints": {"tls": tls}}, ENV).endpoints.tls
    assert (plain.enabled, plain.mutual) == (True, False)
    mutual = worker_config_from_mapping(
        {"endpoints": {"tls": {**tls, "client_ca_file": "ca.pem"}}}, ENV
    ).endpoints.tls
    assert (mutual.enabled, mutual.mutual) == (True, True)
    assert not WorkerConfig().endpoints.tls.enabled


# ---- unknown and removed keys ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "path"),
    [
        ({"runtime": {"mem_frac": 0.5}}, "runtime.mem_frac"),
        ({"schedular": {}}, "schedular"),
        ({"endpoints": {"tls": {"ca_file": "x"}}}, "endpoints.tls.ca_file"),
        (
            {"scheduler": {"models": {"resnet": {"priority": 2}}}},
            "scheduler.models.resnet.priority",
        ),
        ({"worker_name": "w0"}, "worker_name"),
        ({"hook_threads": 4}, "hook_threads"),
    ],
)
def test_unknown_key_is_named(data: dict[str, Any], path: str) -> None:
    assert reject(data).startswith(f"{path}: unknown key")


def test_unknown_key_suggests_the_close_one() -> None:
    assert "did you mean mem_fraction?" in reject({"runtime": {"mem_frac": 0.5}})


@pytest.mark.parametrize(
    ("data", "path", "hint"),
    [
        (
            {"batch_policy": {"max_batch_size": 8}},
            "batch_policy",
            "use scheduler.models.<m>.max_batch_size",
        ),
        (
            {"runtime": {"residency_mode": "explicit"}},
            "runtime.residency_mode",
            "use model_control_mode",
        ),
        (
            {"scheduler": {"dispatch_timeout_seconds": 5}},
            "scheduler.dispatch_timeout_seconds",
            "no execution watchdog exists",
        ),
        (
            {"scheduler": {"models": {"resnet": {"pin_to_gpu": True}}}},
            "scheduler.models.resnet.pin_to_gpu",
            "use residency: device",
        ),
    ],
)
def test_removed_key_gives_its_hint(data: dict[str, Any], path: str, hint: str) -> None:
    assert reject(data) == f"{path}: removed key; {hint}"


def test_top_level_must_be_a_mapping() -> None:
    with pytest.raises(ConfigError, match="must be a mapping"):
        worker_config_from_mapping(["runtime"], ENV)  # type: ignore[arg-type]


# ---- direct construction, round trip, hook pool ----------------------------------------------


def test_direct_construction_validates() -> None:
    with pytest.raises(ConfigError, match=r"mem_fraction: must be in \(0, 1\]"):
        RuntimeConfig(mem_fraction=2.0)
    with pytest.raises(ConfigError, match="weight: must be > 0"):
        ModelSchedulingConfig(weight=0.0)


def test_config_is_frozen_and_hashable() -> None:
    loaded = worker_config_from_mapping({"scheduler": {"models": {"m": {"weight": 2.0}}}}, ENV)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        loaded.runtime = RuntimeConfig()  # type: ignore[misc]
    assert hash(loaded) == hash(attrs.evolve(loaded))


def test_to_dict_round_trips() -> None:
    data = {
        "model_dirs": ["/a", "/b"],
        "model_control_mode": "explicit",
        "runtime": {"backend": "gpu", "numerics": "tf32", "shared_host_weights_mode": "640"},
        "scheduler": {"models": {"resnet": {"residency": "pinned_device", "weight": 3}}},
        "endpoints": {"tls": {"cert_file": "c", "key_file": "k"}},
    }
    loaded = worker_config_from_mapping(data, ENV)
    plain = worker_config_to_dict(loaded)
    assert plain["model_dirs"] == ["/a", "/b"]
    assert plain["scheduler"]["models"] == {"resnet": {"weight": 3.0, "residency": "device"}}
    assert "worker_name" not in plain
    assert worker_config_from_mapping(plain, ENV) == loaded


def test_config_pickles_and_copies() -> None:
    loaded = worker_config_from_mapping({"scheduler": {"models": {"m": {"weight": 2.0}}}}, ENV)
    assert pickle.loads(pickle.dumps(loaded)) == loaded
    assert copy.deepcopy(loaded) == loaded


def test_odd_model_names_keep_their_path() -> None:
    message = reject({"scheduler": {"models": {"a]b'c": {"weight": 0}}}})
    assert message.startswith("scheduler.models.a]b'c.weight: must be > 0")


def test_huge_number_is_not_finite() -> None:
    assert "finite" in reject(nested("runtime.mem_fraction", 10**400))


def test_hook_pool_size() -> None:
    assert WorkerConfig().hook_pool_size(64) == 16
    assert WorkerConfig().hook_pool_size(4) == 4
    assert WorkerConfig(hook_threads=40).hook_pool_size(4) == 40
