"""Environment overrides and the other worker variables."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from reactantserver.core.config import (
    Backend,
    EnvOverride,
    ModelControlMode,
    WorkerConfig,
    env_override_variables,
    resolve_cache_dir,
    worker_config_from_mapping,
)
from reactantserver.core.errors import ConfigError

ENV = {"HOME": "/home/tester"}
LOGGER = "reactantserver.core.config"


def load(data: dict[str, Any] | None = None, /, **env: str) -> WorkerConfig:
    return worker_config_from_mapping(data or {}, {**ENV, **env})


def reject(data: dict[str, Any] | None = None, /, **env: str) -> str:
    with pytest.raises(ConfigError) as info:
        load(data, **env)
    return str(info.value)


def leaves(cls: type, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every scalar/list leaf of the attrs classes, found independently of the code under test."""
    for field in attrs.fields(cls):
        if field.name in {"worker_name", "hook_threads", "env_overrides", "models"}:
            continue  # not file keys, or per-model keys (which have no variable)
        if isinstance(field.type, type) and attrs.has(field.type):
            yield from leaves(field.type, (*prefix, field.name))
        else:
            yield (*prefix, field.name)


def test_every_leaf_has_one_unique_variable() -> None:
    attrs.resolve_types(WorkerConfig)
    paths = list(leaves(WorkerConfig))
    names = ["REACTANTSERVER_WORKER_" + "_".join(path).upper() for path in paths]
    assert len(names) == len(set(names)), "two keys share an override variable"
    assert env_override_variables() == {
        name: ".".join(path) for name, path in zip(names, paths, strict=True)
    }
    assert len(names) == 68


def test_spec_example_name() -> None:
    variables = env_override_variables()
    assert variables["REACTANTSERVER_WORKER_SCHEDULER_EMA_HALFLIFE_SECONDS"] == (
        "scheduler.ema_halflife_seconds"
    )
    assert variables["REACTANTSERVER_WORKER_ENDPOINTS_TLS_CERT_FILE"] == "endpoints.tls.cert_file"
    assert not [name for name in variables if "MODELS_" in name and "SCHEDULER" in name]


def test_override_wins_over_file_and_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger=LOGGER):
        loaded = load(
            {"scheduler": {"ema_halflife_seconds": 5.0}},
            REACTANTSERVER_WORKER_SCHEDULER_EMA_HALFLIFE_SECONDS="12.5",
        )
    assert loaded.scheduler.ema_halflife_seconds == 12.5
    assert loaded.env_overrides == (
        EnvOverride(
            "REACTANTSERVER_WORKER_SCHEDULER_EMA_HALFLIFE_SECONDS",
            "scheduler.ema_halflife_seconds",
            12.5,
        ),
    )
    (record,) = [r for r in caplog.records if "REACTANTSERVER_WORKER_" in r.getMessage()]
    assert record.levelno == logging.INFO
    assert "scheduler.ema_halflife_seconds" in record.getMessage()
    assert "12.5" in record.getMessage()


def test_every_applied_override_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    env = {
        "REACTANTSERVER_WORKER_RUNTIME_BACKEND": "gpu",
        "REACTANTSERVER_WORKER_ENDPOINTS_PORT": "9000",
        "REACTANTSERVER_WORKER_MODEL_DIRS": "/a:/b",
        "REACTANTSERVER_WORKER_META_CONCURRENCY": "4",
    }
    with caplog.at_level(logging.INFO, logger=LOGGER):
        loaded = load(**env)
    logged = " ".join(r.getMessage() for r in caplog.records)
    for name in env:
        assert name in logged
    assert {o.variable for o in loaded.env_overrides} == set(env)
    assert loaded.runtime.backend is Backend.CUDA
    assert loaded.endpoints.port == 9000
    assert loaded.model_dirs == ("/a", "/b")
    assert loaded.meta.concurrency == 4


def test_overrides_do_not_change_equality() -> None:
    assert load(REACTANTSERVER_WORKER_RUNTIME_WARMUP="true") == load()


@pytest.mark.parametrize("word", ["1", "true", "TRUE", "Yes", "on", " On "])
def test_true_words(word: str) -> None:
    assert load(
        {"runtime": {"warmup": False}}, REACTANTSERVER_WORKER_RUNTIME_WARMUP=word
    ).runtime.warmup


@pytest.mark.parametrize("word", ["0", "false", "False", "NO", "off"])
def test_false_words(word: str) -> None:
    assert not load(REACTANTSERVER_WORKER_RUNTIME_WARMUP=word).runtime.warmup


@pytest.mark.parametrize("word", ["", "2", "y", "enabled", "truee"])
def test_other_boolean_words_are_errors_naming_the_variable(word: str) -> None:
    message = reject(REACTANTSERVER_WORKER_RUNTIME_WARMUP=word)
    assert message.startswith("REACTANTSERVER_WORKER_RUNTIME_WARMUP: cannot parse")
    assert "boolean" in message


@pytest.mark.parametrize(
    ("variable", "raw", "what"),
    [
        ("REACTANTSERVER_WORKER_SCHEDULER_MAX_QUEUE_DEPTH", "lots", "an integer"),
        ("REACTANTSERVER_WORKER_SCHEDULER_MAX_QUEUE_DEPTH", "1.5", "an integer"),
        ("REACTANTSERVER_WORKER_RUNTIME_MEM_FRACTION", "most", "a number"),
        ("REACTANTSERVER_WORKER_RUNTIME_MEM_FRACTION", "nan", "a finite number"),
        ("REACTANTSERVER_WORKER_META_SCRATCH_SLOTS", "many", "an integer"),
    ],
)
def test_parse_failures_name_the_variable(variable: str, raw: str, what: str) -> None:
    assert reject(**{variable: raw}) == f"{variable}: cannot parse {raw!r} as {what}"


def test_rule_failures_name_the_key_and_the_variable() -> None:
    message = reject(REACTANTSERVER_WORKER_RUNTIME_MEM_FRACTION="1.5")
    assert message == (
        "runtime.mem_fraction: must be in (0, 1], got number 1.5 "
        "(from REACTANTSERVER_WORKER_RUNTIME_MEM_FRACTION)"
    )
    message = reject(REACTANTSERVER_WORKER_RUNTIME_BACKEND="tpu")
    assert message.startswith("runtime.backend: must be one of cpu, cuda")
    assert message.endswith("(from REACTANTSERVER_WORKER_RUNTIME_BACKEND)")


def test_cross_field_failure_names_the_variable() -> None:
    message = reject(REACTANTSERVER_WORKER_RUNTIME_NUMERICS="tf32")
    assert message.startswith("runtime.numerics: tf32 needs backend cuda")
    assert "REACTANTSERVER_WORKER_RUNTIME_NUMERICS" in message


def test_scalar_types() -> None:
    loaded = load(
        REACTANTSERVER_WORKER_MODEL_CONTROL_MODE="explicit",
        REACTANTSERVER_WORKER_MODEL_POLL_SECONDS="2",
        REACTANTSERVER_WORKER_RUNTIME_SHARED_HOST_WEIGHTS_MODE="640",
        REACTANTSERVER_WORKER_ENDPOINTS_HOST="0.0.0.0",
        REACTANTSERVER_WORKER_META_SCRATCH_BYTES="-1",
    )
    assert loaded.model_control_mode is ModelControlMode.EXPLICIT
    assert loaded.model_poll_seconds == 2.0
    assert loaded.runtime.shared_host_weights_mode == "640"
    assert loaded.endpoints.host == "0.0.0.0"
    assert loaded.meta.scratch_bytes == -1


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("/a:/b", ("/a", "/b")), ("/a", ("/a",)), ("", ()), ("/a::/b:", ("/a", "/b"))],
)
def test_lists_are_colon_separated(raw: str, expected: tuple[str, ...]) -> None:
    assert load(
        {"models_include": ["x"]}, REACTANTSERVER_WORKER_MODELS_INCLUDE=raw
    ).models_include == (expected)


def test_unknown_variable_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        loaded = load(REACTANTSERVER_WORKER_RUNTIME_MEM_FRACTON="0.5")
    assert loaded.runtime.mem_fraction == 0.9
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert "REACTANTSERVER_WORKER_RUNTIME_MEM_FRACTON" in record.getMessage()
    assert "did you mean REACTANTSERVER_WORKER_RUNTIME_MEM_FRACTION" in record.getMessage()


def test_per_model_keys_have_no_variable(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        load(REACTANTSERVER_WORKER_SCHEDULER_MODELS_RESNET_WEIGHT="2")
    assert "ignoring unknown variable" in caplog.text


_BATCH_HINT = "use scheduler.models.<m>.max_batch_size"


@pytest.mark.parametrize(
    ("variable", "hint"),
    [
        ("REACTANTSERVER_WORKER_BATCH_POLICY_MAX_BATCH_SIZE", _BATCH_HINT),
        ("REACTANTSERVER_WORKER_BATCH_POLICY_TIMEOUT_MS", _BATCH_HINT),
        ("REACTANTSERVER_WORKER_RUNTIME_RESIDENCY_MODE", "use model_control_mode"),
        (
            "REACTANTSERVER_WORKER_SCHEDULER_DISPATCH_TIMEOUT_SECONDS",
            "no execution watchdog exists",
        ),
        # The older spellings keep their hints, under the name the user set.
        ("INFERENCE_SERVER_BATCH_POLICY_MAX_BATCH_SIZE", _BATCH_HINT),
        ("INFERENCE_SERVER_RUNTIME_RESIDENCY_MODE", "use model_control_mode"),
        ("INFERENCE_SERVER_SCHEDULER_DISPATCH_TIMEOUT_SECONDS", "no execution watchdog exists"),
    ],
)
def test_removed_variables_are_errors_with_hints(variable: str, hint: str) -> None:
    assert reject(**{variable: "1"}) == f"{variable}: removed variable; {hint}"


@pytest.mark.parametrize(
    ("variable", "path"),
    [
        ("REACTANT_META_CONCURRENCY", "concurrency"),
        ("REACTANT_FANOUT_BYTES", "scratch_bytes"),
        ("REACTANT_FANOUT_SLOTS", "scratch_slots"),
    ],
)
def test_reactant_meta_variables_still_work(variable: str, path: str) -> None:
    loaded = load({"meta": {path: 3}}, **{variable: "7"})
    assert getattr(loaded.meta, path) == 7


def test_older_key_name_wins_over_the_reactant_alias(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        loaded = load(REACTANT_META_CONCURRENCY="3", INFERENCE_SERVER_META_CONCURRENCY="5")
    assert loaded.meta.concurrency == 5
    assert (
        "REACTANT_META_CONCURRENCY is deprecated and ignored: INFERENCE_SERVER_META_CONCURRENCY "
        "is set too and wins; use REACTANTSERVER_WORKER_META_CONCURRENCY"
    ) in caplog.text


def test_worker_threads() -> None:
    loaded = load(REACTANTSERVER_WORKER_THREADS="6")
    assert loaded.hook_threads == 6
    assert loaded.hook_pool_size(64) == 6
    assert load(REACTANTSERVER_WORKER_THREADS="").hook_threads is None
    assert load().hook_threads is None


@pytest.mark.parametrize("raw", ["0", "-2", "four", "1.5"])
def test_bad_worker_threads(raw: str) -> None:
    assert reject(REACTANTSERVER_WORKER_THREADS=raw).startswith("REACTANTSERVER_WORKER_THREADS: ")


def test_all_env_errors_are_reported_together() -> None:
    message = reject(
        REACTANTSERVER_WORKER_RUNTIME_WARMUP="maybe",
        REACTANTSERVER_WORKER_RUNTIME_RESIDENCY_MODE="x",
        REACTANTSERVER_WORKER_THREADS="x",
    )
    assert len(message.splitlines()) == 3


# ---- cache directories ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cache_dir", "env", "expected"),
    [
        (
            "/var/cache/rs",
            {"REACTANTSERVER_CACHE_DIR": "/x", "XDG_CACHE_HOME": "/xdg"},
            "/var/cache/rs",
        ),
        ("", {"REACTANTSERVER_CACHE_DIR": "/x", "XDG_CACHE_HOME": "/xdg"}, "/x"),
        ("", {"REACTANTSERVER_CACHE_DIR": "", "XDG_CACHE_HOME": "/xdg"}, "/xdg/reactantserver"),
        ("", {"XDG_CACHE_HOME": "relative/ignored"}, "/home/tester/.cache/reactantserver"),
        ("", {}, "/home/tester/.cache/reactantserver"),
        ("~/caches", {}, "/home/tester/caches"),
        ("", {"REACTANTSERVER_CACHE_DIR": "~/rc"}, "/home/tester/rc"),
    ],
)
def test_cache_dir_resolution(cache_dir: str, env: dict[str, str], expected: str) -> None:
    assert resolve_cache_dir(cache_dir, {**ENV, **env}) == Path(expected)


def test_cache_dir_without_home_uses_the_password_database() -> None:
    assert resolve_cache_dir("", {}).name == "reactantserver"


def test_loader_resolves_cache_dirs() -> None:
    loaded = load(REACTANTSERVER_CACHE_DIR="/var/cache/reactantserver")
    assert loaded.cache_dir == "/var/cache/reactantserver"
    assert loaded.runtime.autotune_cache_dir == "/var/cache/reactantserver/xla-autotune"
    explicit = load(
        {"runtime": {"autotune_cache_dir": "/tune"}}, REACTANTSERVER_WORKER_CACHE_DIR="/c"
    )
    assert (explicit.cache_dir, explicit.runtime.autotune_cache_dir) == ("/c", "/tune")


def test_nothing_reads_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REACTANTSERVER_WORKER_RUNTIME_MEM_FRACTION", "0.1")
    monkeypatch.setenv("REACTANTSERVER_CACHE_DIR", "/from/os/environ")
    loaded = load()
    assert loaded.runtime.mem_fraction == 0.9
    assert loaded.cache_dir == "/home/tester/.cache/reactantserver"


@pytest.mark.parametrize(
    ("raw", "expected"), [("auto", None), ("", None), ("none", None), ("0", 0), ("1500", 1500)]
)
def test_the_queue_delay_variable_sets_a_delay_or_the_adaptive_wait(
    raw: str, expected: int | None
) -> None:
    variable = "REACTANTSERVER_WORKER_SCHEDULER_MAX_QUEUE_DELAY_MICROSECONDS"
    data = {"scheduler": {"max_queue_delay_microseconds": 700}}
    assert load(data, **{variable: raw}).scheduler.max_queue_delay_microseconds == expected
