"""Node and worker configuration, parsed once at the edge into frozen typed objects.

A worker process calls :func:`load_worker_config` with its command-line values and
``os.environ``; nothing below it reads the environment::

    config = load_worker_config(node_file=args.node_file, worker=args.worker,
                                model_repo=args.model_repo, env=os.environ)
    config.scheduler.for_model("resnet").weight

The supervisor calls :func:`load_node_config`, then :func:`synthesize_workers` once it knows
the device count. Every error is a :class:`~reactantserver.core.errors.ConfigError` whose lines
read ``<key path>: <message>``.

The engine is shared: another distribution's file (the gateway's) declares its schema with
:func:`setting`, reads YAML with :func:`load_yaml_file`, finds its variables' keys with
:func:`iter_leaf_fields` and :func:`parse_env_setting`, and checks and structures the lot with
:func:`structure_file` and :func:`config_error`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs

from reactantserver.core.config._env import (
    CACHE_DIR_VARIABLE,
    DEFAULT_NODE_FILE,
    ENV_OVERRIDES,
    ENV_PREFIX,
    NODE_FILE_VARIABLE,
    WORKER_NAME_VARIABLE,
    WORKER_THREADS_VARIABLE,
    parse_env_setting,
    resolve_cache_dir,
)
from reactantserver.core.config._env import PendingOverride as Override
from reactantserver.core.config._fields import ENV_ONLY_KEY, setting
from reactantserver.core.config._file import structure_file
from reactantserver.core.config._flags import (
    FlagValue,
    add_triton_arguments,
    port_flags,
    worker_key_flags,
)
from reactantserver.core.config._keys import REMOVED_KEYS, KeyRules, iter_leaf_fields
from reactantserver.core.config._node import (
    AUTO_GPUS,
    GpuSpec,
    ListenConfig,
    NodeConfig,
    Role,
    SupervisorConfig,
    WorkerEntry,
    check_address,
)
from reactantserver.core.config._node import node_config_from_mapping as _parse_node
from reactantserver.core.config._resolve import (
    node_config_to_dict,
    node_worker_configs,
    resolve_worker_config,
    synthesize_workers,
    worker_entries,
)
from reactantserver.core.config._schema import (
    Backend,
    EndpointsConfig,
    EnvOverride,
    GrpcConfig,
    LogFormat,
    LoggingConfig,
    LogLevel,
    MetaConfig,
    ModelControlMode,
    ModelSchedulingConfig,
    Numerics,
    Residency,
    RuntimeConfig,
    SchedulerConfig,
    SchedulingDiscipline,
    TlsConfig,
    WorkerConfig,
)
from reactantserver.core.config._structure import Origin, Problem, config_error, raise_problems
from reactantserver.core.config._tracing import (
    TraceExporter,
    TraceLevel,
    TraceMode,
    TracingConfig,
)
from reactantserver.core.config._variables import (
    CLIENT_MAX_RECV_VARIABLE,
    CLIENT_MAX_SEND_VARIABLE,
    GATEWAY_FILE_VARIABLE,
    GATEWAY_PREFIX,
    NODE_KEY_VARIABLES,
    NODE_PREFIX,
    PROCESS_VARIABLES,
    RENAMED_PREFIXES,
    RENAMED_VARIABLES,
    SUPERVISOR_PID_VARIABLE,
    EnvUpgrade,
    check_not_process_variable,
    key_variable,
    lookup,
    renamed_to,
    unknown_variables,
    upgrade_env,
)
from reactantserver.core.config._worker import (
    Layer,
    finish_worker_config,
    merge_layers,
    resolve_env,
    set_path,
    top_level_mapping,
)
from reactantserver.core.config._yaml import load_yaml_file
from reactantserver.core.errors import ConfigError

__all__ = [
    "AUTO_GPUS",
    "CACHE_DIR_VARIABLE",
    "CLIENT_MAX_RECV_VARIABLE",
    "CLIENT_MAX_SEND_VARIABLE",
    "DEFAULT_NODE_FILE",
    "ENV_PREFIX",
    "GATEWAY_FILE_VARIABLE",
    "GATEWAY_PREFIX",
    "NODE_FILE_VARIABLE",
    "NODE_KEY_VARIABLES",
    "NODE_PREFIX",
    "PROCESS_VARIABLES",
    "REMOVED_KEYS",
    "RENAMED_PREFIXES",
    "RENAMED_VARIABLES",
    "STANDALONE_GRPC_PORT",
    "STANDALONE_HTTP_PORT",
    "STANDALONE_METRICS_PORT",
    "SUPERVISOR_PID_VARIABLE",
    "WORKER_NAME_VARIABLE",
    "WORKER_THREADS_VARIABLE",
    "Backend",
    "EndpointsConfig",
    "EnvOverride",
    "EnvUpgrade",
    "FlagValue",
    "GpuSpec",
    "GrpcConfig",
    "KeyRules",
    "ListenConfig",
    "LogFormat",
    "LogLevel",
    "LoggingConfig",
    "MetaConfig",
    "ModelControlMode",
    "ModelSchedulingConfig",
    "NodeConfig",
    "Numerics",
    "Origin",
    "Override",
    "Problem",
    "Residency",
    "Role",
    "RuntimeConfig",
    "SchedulerConfig",
    "SchedulingDiscipline",
    "SupervisorConfig",
    "TlsConfig",
    "TraceExporter",
    "TraceLevel",
    "TraceMode",
    "TracingConfig",
    "WorkerConfig",
    "WorkerEntry",
    "add_triton_arguments",
    "check_address",
    "check_not_process_variable",
    "config_error",
    "env_override_variables",
    "iter_leaf_fields",
    "key_variable",
    "load_node_config",
    "load_worker_config",
    "load_yaml_file",
    "lookup",
    "node_config_from_mapping",
    "node_config_to_dict",
    "node_worker_configs",
    "parse_env_setting",
    "port_flags",
    "renamed_to",
    "renamed_variables",
    "resolve_cache_dir",
    "resolve_env",
    "resolve_worker_config",
    "set_path",
    "setting",
    "structure_file",
    "synthesize_workers",
    "unknown_variables",
    "upgrade_env",
    "worker_config_from_mapping",
    "worker_config_to_dict",
    "worker_entries",
    "worker_key_flags",
]

#: Ports of a standalone worker (``--model-repository DIR``): Triton's, the node's public ports.
STANDALONE_HTTP_PORT: Final = 8000
STANDALONE_GRPC_PORT: Final = 8001
STANDALONE_METRICS_PORT: Final = 8002


def env_override_variables() -> dict[str, str]:
    """Every ``REACTANTSERVER_WORKER_*`` override variable and the dotted key it sets."""
    return {variable: ".".join(path) for variable, (path, _type) in ENV_OVERRIDES.items()}


def renamed_variables() -> dict[str, str]:
    """Every older name still accepted, one by one, and its new name (the prefix families
    ``INFERENCE_SERVER_*`` and ``REACTANT_GATEWAY_*`` are in :data:`RENAMED_PREFIXES`)."""
    return dict(RENAMED_VARIABLES)


def worker_config_from_mapping(
    data: Mapping[str, Any] | None,
    env: Mapping[str, str],
    *,
    worker_name: str | None = None,
) -> WorkerConfig:
    """A worker configuration from a mapping of worker keys (tests, embedding).

    ``data`` is checked and structured exactly like a node file's worker block; ``env``
    overrides are applied and logged; no node-derived value is added.
    """
    layer = Layer(top_level_mapping(data, "worker configuration"), Origin())
    raw, origins, problems = merge_layers([layer])
    raise_problems(problems)
    return finish_worker_config(raw, origins, env, worker_name=worker_name)


def node_config_from_mapping(
    data: Mapping[str, Any] | None, env: Mapping[str, str], *, source: Path | None = None
) -> NodeConfig:
    """A node configuration from a node file's top-level mapping.

    Besides the node keys, every worker the file implies (one synthesized worker when it lists
    none) is resolved once against ``env``, silently, so that a bad value fails here, at the
    supervisor, with its key path.
    """
    return _validated_node(data, env, source)


def _validated_node(data: object, env: Mapping[str, str], source: Path | None) -> NodeConfig:
    node = _parse_node(top_level_mapping(data, "node file"), source=source)
    node_worker_configs(node, env, quiet=True)
    return node


def load_node_config(path: Path, env: Mapping[str, str]) -> NodeConfig:
    """Read and validate a node file (see :func:`node_config_from_mapping`)."""
    return _validated_node(load_yaml_file(path), env, path)


def _env_value(env: Mapping[str, str], variable: str) -> str | None:
    value = env.get(variable, "").strip()
    return value or None


def load_worker_config(
    *,
    node_file: Path | None = None,
    worker: str | None = None,
    model_repo: Path | Sequence[Path] | None = None,
    ports: Mapping[str, int] | None = None,
    flags: Sequence[FlagValue] = (),
    env: Mapping[str, str],
) -> WorkerConfig:
    """The configuration of this worker process, from its command line and environment.

    - ``model_repo`` (``--model-repository DIR``, one or several): standalone; defaults,
      ``model_dirs`` = the directories and Triton's ports: REST 8000, gRPC 8001, metrics 8002.
      Exclusive with ``node_file``.
    - otherwise a node file (``node_file``, else ``$REACTANTSERVER_NODE_FILE``, else
      ``/etc/reactantserver/node.yaml``) and the entry named ``worker``, else
      ``$REACTANTSERVER_WORKER_NAME``; without a name the file must imply exactly one worker.

    ``ports`` (``--http-port``, ``--grpc-port``, ``--metrics-port`` by role, see
    :func:`port_flags`) and ``flags`` apply last: a command-line value wins over the file and
    the environment. Older variable names work too, each reported once as deprecated (see
    :func:`upgrade_env`).
    """
    env = resolve_env(env)
    name = worker or _env_value(env, WORKER_NAME_VARIABLE)
    flags = [*flags, *_port_values(ports or {})]
    if model_repo is not None:
        if node_file is not None:
            raise ConfigError("--model-repository and --node-file are mutually exclusive")
        directories = [model_repo] if isinstance(model_repo, Path) else list(model_repo)
        raw: dict[str, Any] = {}
        set_path(raw, ("model_dirs",), [str(directory) for directory in directories])
        set_path(raw, ("endpoints", "http_port"), STANDALONE_HTTP_PORT)
        set_path(raw, ("endpoints", "port"), STANDALONE_GRPC_PORT)
        set_path(raw, ("endpoints", "metrics_port"), STANDALONE_METRICS_PORT)
        return finish_worker_config(raw, {}, env, worker_name=name, flags=flags)
    path = node_file or Path(_env_value(env, NODE_FILE_VARIABLE) or DEFAULT_NODE_FILE)
    node = _parse_node(top_level_mapping(load_yaml_file(path), "node file"), source=path)
    if name is None:
        entries = worker_entries(node)
        if len(entries) != 1:
            names = ", ".join(entry.name for entry in entries)
            raise ConfigError(
                f"{path} lists {len(entries)} workers ({names}); choose one with --worker or "
                f"{WORKER_NAME_VARIABLE}"
            )
        name = entries[0].name
    return resolve_worker_config(node, name, env, flags=flags)


_PORT_KEYS: Final = {"http": "http_port", "grpc": "port", "metrics": "metrics_port"}


def _port_values(ports: Mapping[str, int]) -> list[FlagValue]:
    return [
        FlagValue(f"--{role}-port", ("endpoints", _PORT_KEYS[role]), port)
        for role, port in ports.items()
    ]


def _serialize(_instance: Any, _field: Any, value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    return list(value) if isinstance(value, tuple) else value


def _file_key(field: attrs.Attribute[Any], value: Any) -> bool:
    # Env-only fields are not keys; unset optional keys are left out.
    return not field.metadata.get(ENV_ONLY_KEY) and not (value is None and field.default is None)


def worker_config_to_dict(config: WorkerConfig) -> dict[str, Any]:
    """``config`` as a mapping of worker keys (plain YAML types) that loads back to it."""
    return attrs.asdict(config, filter=_file_key, value_serializer=_serialize)
