"""From a node file to the children a supervisor runs.

:func:`plan_node` takes a node with its flags and environment applied, lays out the workers
(``_layout``), gives each its ports, device and thread allotment, adds the embedded gateway when
the node needs one, and writes the resolved ``node.yaml`` (and ``gateway.yml``) that the children
read::

    node = apply_overrides(load_node_config(path, os.environ), os.environ, role=args.role)
    plan = plan_node(node, os.environ)
    plan.children  # workers in declaration order, then the gateway
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import attrs

from reactantserver.core.config import (
    ENV_PREFIX,
    GATEWAY_PREFIX,
    SUPERVISOR_PID_VARIABLE,
    WORKER_NAME_VARIABLE,
    WORKER_THREADS_VARIABLE,
    Backend,
    ListenConfig,
    NodeConfig,
    Role,
    WorkerConfig,
    key_variable,
    node_config_to_dict,
    resolve_worker_config,
    upgrade_env,
)
from reactantserver.core.errors import ConfigError
from reactantserver.gateway.config import FILE_VARIABLE as GATEWAY_FILE_VARIABLE
from reactantserver.gateway.config import GatewayConfig, load_gateway_config
from reactantserver.node._devices import (
    CUDA_VISIBLE_DEVICES,
    DeviceSelection,
    NvmlCount,
    available_cores,
    nvml_device_count,
    thread_allotment,
)
from reactantserver.node._gateway_file import (
    WorkerAddress,
    materialize_gateway,
    split_address,
    validate_gateway,
    write_yaml_atomically,
)
from reactantserver.node._layout import BACKEND_VARIABLE, WorkerLayout, lay_out_workers
from reactantserver.node._sharing import check_device_shares
from reactantserver.node._spec import LOOPBACK, ChildKind, ChildSpec, probe_host

__all__ = [
    "GATEWAY_FILE_NAME",
    "NODE_FILE_NAME",
    "STARTUP_WAIT_VARIABLE",
    "NodePlan",
    "materialized_documents",
    "plan_node",
    "runtime_directory",
]

NODE_FILE_NAME: Final = "node.yaml"
GATEWAY_FILE_NAME: Final = "gateway.yml"
#: Injected into the gateway's environment (``inf``) unless already set.
STARTUP_WAIT_VARIABLE: Final = key_variable(GATEWAY_PREFIX, ("startup_wait_seconds",))
_RUNTIME_SUBDIR: Final = "reactantserver"
_SYSTEM_RUNTIME_DIR: Final = Path("/run")
_HOST_VARIABLE: Final = key_variable(ENV_PREFIX, ("endpoints", "host"))
_PORT_VARIABLE: Final = key_variable(ENV_PREFIX, ("endpoints", "port"))
_HTTP_PORT_VARIABLE: Final = key_variable(ENV_PREFIX, ("endpoints", "http_port"))
_METRICS_PORT_VARIABLE: Final = key_variable(ENV_PREFIX, ("endpoints", "metrics_port"))


@attrs.frozen(kw_only=True)
class NodePlan:
    """Everything a supervisor needs to run a node, decided before any child starts.

    ``node`` has its workers synthesized and bound (it is what ``node.yaml`` holds);
    ``children`` are the workers in declaration order, then the gateway if any; ``node_file``
    and ``gateway_file`` are the files they read (``None`` when unused); ``gateway_config`` is
    the materialized gateway mapping (``None`` with ``REACTANTSERVER_GATEWAY_FILE``); ``threads``
    is each worker's ``REACTANTSERVER_WORKER_THREADS``; ``notes`` are warnings for the supervisor
    to log;
    ``public_http``/``public_grpc``/``public_metrics`` are the public addresses (``None`` for
    role workers).
    """

    node: NodeConfig
    children: tuple[ChildSpec, ...]
    node_file: Path | None
    gateway_file: Path | None
    gateway_config: dict[str, Any] | None
    devices: DeviceSelection
    threads: str
    notes: tuple[str, ...] = ()
    public_http: str | None = None
    public_grpc: str | None = None
    public_metrics: str | None = None


def _writable(path: Path) -> bool:
    if path.is_dir():
        return os.access(path, os.W_OK | os.X_OK)
    return path.parent.is_dir() and os.access(path.parent, os.W_OK | os.X_OK)


def runtime_directory(env: Mapping[str, str]) -> Path:
    """Where the resolved files go: ``$XDG_RUNTIME_DIR/reactantserver``, else
    ``/run/reactantserver`` when writable, else ``<tmp>/reactantserver-<uid>``."""
    xdg = env.get("XDG_RUNTIME_DIR", "").strip()
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / _RUNTIME_SUBDIR
    system = _SYSTEM_RUNTIME_DIR / _RUNTIME_SUBDIR
    if _writable(system):
        return system
    return Path(tempfile.gettempdir()) / f"{_RUNTIME_SUBDIR}-{os.getuid()}"


@attrs.frozen
class _Worker:
    """One planned worker: its entry name, selector, environment and resolved configuration."""

    name: str
    selector: str | None
    env: dict[str, str]
    config: WorkerConfig

    @property
    def address(self) -> WorkerAddress:
        ports = self.config.endpoints
        return WorkerAddress(self.name, probe_host(ports.host), ports.port, ports.metrics_port)


def _threads(env: Mapping[str, str], cores: int | None, workers: int) -> str:
    explicit = env.get(WORKER_THREADS_VARIABLE, "")
    if explicit.strip():
        return explicit  # verbatim; the worker validates it (and so does resolution below)
    return str(thread_allotment(available_cores() if cores is None else cores, workers))


def _plan_workers(
    layout: WorkerLayout, env: Mapping[str, str], threads: str, *, role: Role
) -> list[_Worker]:
    node = layout.node
    sole = role is Role.ALL and len(layout.workers) == 1
    grpc_host, grpc_port = split_address(node.listen.grpc)
    _, metrics_port = split_address(node.listen.metrics)
    _, http_port = split_address(node.listen.http)
    planned = []
    for entry, selector in zip(layout.workers, layout.selectors, strict=True):
        child = dict(env)
        child[WORKER_NAME_VARIABLE] = entry.name
        child[CUDA_VISIBLE_DEVICES] = selector or ""
        child[WORKER_THREADS_VARIABLE] = threads
        child[SUPERVISOR_PID_VARIABLE] = str(os.getpid())
        if layout.forced_cpu:
            child[BACKEND_VARIABLE] = Backend.CPU.value
        if sole:
            child[_HOST_VARIABLE] = grpc_host
            child[_PORT_VARIABLE] = str(grpc_port)
            child[_METRICS_PORT_VARIABLE] = str(metrics_port)
            child[_HTTP_PORT_VARIABLE] = str(http_port)
        elif role is Role.ALL:
            child[_HOST_VARIABLE] = LOOPBACK
        config = resolve_worker_config(node, entry.name, child, quiet=True)
        planned.append(_Worker(entry.name, selector, child, config))
    _check_resolved_ports(planned, node)
    return planned


def _share_notes(workers: list[_Worker], node: NodeConfig, forced_cpu: bool) -> list[str]:
    if forced_cpu:
        return []
    where = f" (in {node.source})" if node.source is not None else ""
    return check_device_shares([(w.name, w.selector, w.config) for w in workers], where=where)


def _check_resolved_ports(workers: list[_Worker], node: NodeConfig) -> None:
    # The node file's ports are checked by core; REACTANTSERVER_WORKER_ENDPOINTS_* in the
    # environment apply to every worker alike and can still make two of them collide.
    seen: dict[int, str] = {}
    for worker in workers:
        endpoints = worker.config.endpoints
        for kind, port in (("gRPC", endpoints.port), ("HTTP", endpoints.metrics_port)):
            if not port:
                continue
            label = f"worker {worker.name}'s {kind} port"
            if port in seen:
                raise ConfigError(
                    f"port {port} is both {seen[port]} and {label} (check listen.* and "
                    f"{ENV_PREFIX}ENDPOINTS_* in the environment)"
                    + (f" (in {node.source})" if node.source is not None else "")
                )
            seen[port] = label


def _public_collisions(workers: list[_Worker], http: str, grpc: str, metrics: str) -> list[str]:
    public = {
        split_address(http)[1]: "REST",
        split_address(grpc)[1]: "gRPC",
        split_address(metrics)[1]: "metrics",
    }
    notes = []
    for worker in workers:
        endpoints = worker.config.endpoints
        for kind, port in (("gRPC", endpoints.port), ("HTTP", endpoints.metrics_port)):
            if port and port in public:
                notes.append(
                    f"worker {worker.name}'s {kind} port {port} is also the public "
                    f"{public[port]} port; change base_port/metrics_base_port or listen.*"
                )
    return notes


def _sole_worker_host_notes(listen: ListenConfig) -> list[str]:
    grpc_host = split_address(listen.grpc)[0]
    notes = []
    for key, other in (("http", listen.http), ("metrics", listen.metrics)):
        other_host = split_address(other)[0]
        if other_host != grpc_host:
            notes.append(
                f"the sole worker binds one host for all its ports: {grpc_host} from "
                f"listen.grpc; the host of listen.{key} ({other_host}) is not used"
            )
    return notes


def _cache_note(workers: list[_Worker], backend_forced: bool) -> list[str]:
    def private_copy(config: WorkerConfig) -> bool:
        runtime = config.runtime
        on_device = runtime.backend is Backend.CUDA and not backend_forced
        cache = runtime.weight_cache_max_bytes > 0 or (
            on_device and runtime.weight_cache_fraction > 0
        )
        return cache and not runtime.shared_host_weights

    if len(workers) > 1 and any(private_copy(worker.config) for worker in workers):
        return [
            f"each worker keeps a private host copy of every model ({len(workers)}x host RAM) "
            "with the on-demand weight cache on and shared_host_weights off; set "
            "shared_host_weights: true to share one copy"
        ]
    return []


def _worker_child(worker: _Worker, node: NodeConfig, node_file: Path) -> ChildSpec:
    argv = (sys.executable, "-m", "reactantserver.worker", "--node-file", str(node_file))
    endpoints = worker.config.endpoints
    return ChildSpec(
        name=worker.name,
        kind=ChildKind.WORKER,
        argv=(*argv, "--worker", worker.name),
        env=worker.env,
        grace_seconds=node.supervisor.worker_grace_seconds,
        http_host=probe_host(endpoints.host),
        http_port=endpoints.metrics_port or None,
    )


def _gateway_env(env: Mapping[str, str]) -> dict[str, str]:
    child = dict(env)
    if not child.get(STARTUP_WAIT_VARIABLE, "").strip():
        child[STARTUP_WAIT_VARIABLE] = "inf"
    child[SUPERVISOR_PID_VARIABLE] = str(os.getpid())
    return child


def _gateway_child(
    node: NodeConfig, env: dict[str, str], file: Path, config: GatewayConfig
) -> ChildSpec:
    host, port = split_address(config.listen.metrics)
    return ChildSpec(
        name="gateway",
        kind=ChildKind.GATEWAY,
        argv=(sys.executable, "-m", "reactantserver.gateway", "--config", str(file)),
        env=env,
        grace_seconds=node.supervisor.gateway_grace_seconds,
        http_host=probe_host(host),
        http_port=port or None,
    )


def plan_node(
    node: NodeConfig,
    env: Mapping[str, str],
    *,
    nvml_count: NvmlCount = nvml_device_count,
    cores: int | None = None,
    directory: Path | None = None,
    write: bool = True,
) -> NodePlan:
    """Plan ``node`` (flags and variables already applied with ``apply_overrides``).

    ``cores`` defaults to :func:`available_cores`; files go to ``directory``, else
    :func:`runtime_directory`. With ``write=False`` nothing is written (``materialize``) and the
    plan names the files it would write. Raises :class:`ConfigError` for anything that would
    stop the node from starting, before a file is written.
    """
    env = upgrade_env(env).env  # the children get the new names only
    role = node.role
    directory = directory if directory is not None else runtime_directory(env)
    gateway_file_env = env.get(GATEWAY_FILE_VARIABLE, "").strip()
    notes: list[str] = []
    workers: list[_Worker] = []
    threads = _threads(env, cores, 1)
    devices = DeviceSelection((), "none")
    forced_cpu = False
    if not (role is Role.GATEWAY and gateway_file_env):
        layout = lay_out_workers(node, env, nvml_count=nvml_count)
        node, devices, forced_cpu = layout.node, layout.devices, layout.forced_cpu
        notes += layout.notes
        threads = _threads(env, cores, len(layout.workers))
        workers = _plan_workers(layout, env, threads, role=role)
        notes += _share_notes(workers, node, forced_cpu)
    runs_workers = role is not Role.GATEWAY
    node_file = directory / NODE_FILE_NAME if runs_workers else None
    children = [_worker_child(w, node, node_file) for w in workers if node_file is not None]
    public_http: str | None = None
    public_grpc: str | None = None
    public_metrics: str | None = None
    gateway_file: Path | None = None
    gateway_data: dict[str, Any] | None = None
    if role is Role.ALL and len(workers) == 1:
        listen = node.listen
        public_http, public_grpc, public_metrics = listen.http, listen.grpc, listen.metrics
        notes += _sole_worker_host_notes(listen)
    elif role is Role.GATEWAY or (role is Role.ALL and len(workers) >= 2):
        gateway_env = _gateway_env(env)
        if gateway_file_env:
            gateway_file = Path(gateway_file_env)
            config = load_gateway_config(gateway_file, gateway_env)
        else:
            gateway_file = directory / GATEWAY_FILE_NAME
            gateway_data = materialize_gateway(
                node, [w.address for w in workers], [w.config for w in workers]
            )
            config = validate_gateway(gateway_data, gateway_env, source=node.source)
        public_grpc, public_metrics = config.listen.grpc, config.listen.metrics
        public_http = config.listen.http or public_metrics
        notes += _public_collisions(workers, public_http, public_grpc, public_metrics)
        children.append(_gateway_child(node, gateway_env, gateway_file, config))
    if runs_workers:
        notes += _cache_note(workers, forced_cpu)
    if write:
        if node_file is not None:
            write_yaml_atomically(node_file, node_config_to_dict(node))
        if gateway_file is not None and gateway_data is not None:
            write_yaml_atomically(gateway_file, gateway_data)
    return NodePlan(
        node=node,
        children=tuple(children),
        node_file=node_file,
        gateway_file=gateway_file,
        gateway_config=gateway_data,
        devices=devices,
        threads=threads,
        notes=tuple(notes),
        public_http=public_http,
        public_grpc=public_grpc,
        public_metrics=public_metrics,
    )


def materialized_documents(plan: NodePlan) -> dict[str, Any]:
    """What ``reactantserver-node materialize`` prints: the node, the gateway, the children."""
    children = []
    for child in plan.children:
        children.append(
            {
                "name": child.name,
                "kind": child.kind.value,
                "argv": list(child.argv),
                CUDA_VISIBLE_DEVICES: child.env.get(CUDA_VISIBLE_DEVICES)
                if child.kind is ChildKind.WORKER
                else None,
                WORKER_THREADS_VARIABLE: child.env.get(WORKER_THREADS_VARIABLE)
                if child.kind is ChildKind.WORKER
                else None,
                "http_port": child.http_port,
            }
        )
    return {
        "node": node_config_to_dict(plan.node),
        "gateway": plan.gateway_config,
        "gateway_file": None if plan.gateway_file is None else str(plan.gateway_file),
        "devices": {"selectors": list(plan.devices.selectors), "source": plan.devices.source},
        "children": children,
        "notes": list(plan.notes),
    }
