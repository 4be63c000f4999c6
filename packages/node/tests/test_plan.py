"""The node planner: device table, worker synthesis, ports, children, gateway file, files."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from reactantserver.core.config import (
    NodeConfig,
    Role,
    load_node_config,
    node_config_from_mapping,
    resolve_worker_config,
)
from reactantserver.core.errors import ConfigError
from reactantserver.gateway.config import load_gateway_config
from reactantserver.node._devices import DeviceSelection, NvmlCount
from reactantserver.node._overrides import apply_overrides
from reactantserver.node._plan import (
    NodePlan,
    materialized_documents,
    plan_node,
    runtime_directory,
)
from reactantserver.node._spec import ChildKind, ChildSpec

from ._nvml import must_not_ask, nvml_reporting

CUDA: dict[str, Any] = {"runtime": {"backend": "cuda"}}


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {"HOME": str(tmp_path), "PATH": os.environ.get("PATH", "")}


def _node(tmp_path: Path, env: dict[str, str], **keys: Any) -> NodeConfig:
    return node_config_from_mapping({"model_repo": str(tmp_path), **keys}, env)


def _plan(
    node: NodeConfig,
    env: dict[str, str],
    tmp_path: Path,
    *,
    nvml: NvmlCount = must_not_ask,
    cores: int = 8,
    write: bool = False,
) -> NodePlan:
    return plan_node(
        node, env, nvml_count=nvml, cores=cores, directory=tmp_path / "run", write=write
    )


def _workers(plan: NodePlan) -> list[ChildSpec]:
    return [child for child in plan.children if child.kind is ChildKind.WORKER]


def _gateway(plan: NodePlan) -> ChildSpec:
    (gateway,) = [child for child in plan.children if child.kind is ChildKind.GATEWAY]
    return gateway


def _visible(plan: NodePlan) -> list[str]:
    return [child.env["CUDA_VISIBLE_DEVICES"] for child in _workers(plan)]


# --- the device table -------------------------------------------------------------------------


def test_cpu_with_a_count_runs_that_many_cpu_workers(tmp_path: Path, env: dict[str, str]) -> None:
    plan = _plan(_node(tmp_path, env, gpus=2), env, tmp_path)
    assert [child.name for child in plan.children] == ["worker0", "worker1", "gateway"]
    assert _visible(plan) == ["", ""]
    assert plan.devices == DeviceSelection(("0", "1"), "gpus")


def test_cpu_count_from_reactant_gpus(tmp_path: Path, env: dict[str, str]) -> None:
    env["REACTANTSERVER_NODE_GPUS"] = "3"
    node = apply_overrides(_node(tmp_path, env), env)
    plan = _plan(node, env, tmp_path)
    assert len(_workers(plan)) == 3
    assert plan.devices.source == "REACTANTSERVER_NODE_GPUS"


def test_cpu_auto_runs_cpu_workers_and_never_inherits_devices(
    tmp_path: Path, env: dict[str, str]
) -> None:
    env["CUDA_VISIBLE_DEVICES"] = "0,1,2,3"
    plan = _plan(_node(tmp_path, env, cpu_workers=3), env, tmp_path)
    assert [child.name for child in _workers(plan)] == ["worker0", "worker1", "worker2"]
    assert _visible(plan) == ["", "", ""]
    assert plan.devices == DeviceSelection((), "none")


@pytest.mark.parametrize("gpus", [0, "auto"])
def test_cpu_node_without_count_uses_cpu_workers(
    tmp_path: Path, env: dict[str, str], gpus: object
) -> None:
    plan = _plan(_node(tmp_path, env, gpus=gpus, cpu_workers=1), env, tmp_path)
    assert [child.name for child in plan.children] == ["worker0"]


def test_cpu_with_selectors_runs_one_cpu_worker_per_selector(
    tmp_path: Path, env: dict[str, str]
) -> None:
    plan = _plan(_node(tmp_path, env, gpus=["GPU-a", "GPU-b"]), env, tmp_path)
    assert _visible(plan) == ["", ""]
    assert [entry.gpu for entry in plan.node.workers or ()] == [None, None]


def test_cuda_runs_one_worker_per_nvml_device(tmp_path: Path, env: dict[str, str]) -> None:
    plan = _plan(_node(tmp_path, env, **{"global": CUDA}), env, tmp_path, nvml=nvml_reporting(2))
    assert _visible(plan) == ["0", "1"]
    assert plan.devices == DeviceSelection(("0", "1"), "nvml")
    assert [entry.gpu for entry in plan.node.workers or ()] == [0, 1]
    assert all("REACTANTSERVER_WORKER_RUNTIME_BACKEND" not in c.env for c in _workers(plan))


def test_cuda_selectors_pass_through_verbatim(tmp_path: Path, env: dict[str, str]) -> None:
    env["CUDA_VISIBLE_DEVICES"] = "GPU-a, GPU-b"
    plan = _plan(_node(tmp_path, env, **{"global": CUDA}), env, tmp_path)
    assert _visible(plan) == ["GPU-a", "GPU-b"]
    assert plan.devices.source == "CUDA_VISIBLE_DEVICES"


def test_backend_from_the_environment_counts(tmp_path: Path, env: dict[str, str]) -> None:
    env["REACTANTSERVER_WORKER_RUNTIME_BACKEND"] = "cuda"
    plan = _plan(_node(tmp_path, env, gpus=["3", "1"]), env, tmp_path)
    assert _visible(plan) == ["3", "1"]


def test_cuda_without_devices_falls_back_to_cpu_workers(
    tmp_path: Path, env: dict[str, str]
) -> None:
    node = _node(tmp_path, env, cpu_workers=2, **{"global": CUDA})
    plan = _plan(node, env, tmp_path, nvml=nvml_reporting(None))
    workers = _workers(plan)
    assert [child.name for child in workers] == ["worker0", "worker1"]
    assert _visible(plan) == ["", ""]
    assert [child.env["REACTANTSERVER_WORKER_RUNTIME_BACKEND"] for child in workers] == ["cpu"] * 2
    (note,) = [note for note in plan.notes if "allow_cpu_fallback" in note]
    assert "no CUDA device was found" in note
    assert "2 CPU worker(s)" in note
    config = resolve_worker_config(plan.node, "worker0", workers[0].env)
    assert config.runtime.backend.value == "cpu"


def test_cuda_visible_devices_empty_means_no_devices(tmp_path: Path, env: dict[str, str]) -> None:
    env["CUDA_VISIBLE_DEVICES"] = ""
    plan = _plan(_node(tmp_path, env, **{"global": CUDA}), env, tmp_path)
    assert _visible(plan) == [""]
    assert plan.devices == DeviceSelection((), "CUDA_VISIBLE_DEVICES")


def test_cuda_without_devices_and_without_fallback_is_an_error(
    tmp_path: Path, env: dict[str, str]
) -> None:
    settings = {"runtime": {"backend": "cuda", "allow_cpu_fallback": False}}
    node = _node(tmp_path, env, **{"global": settings})
    with pytest.raises(ConfigError) as caught:
        _plan(node, env, tmp_path, nvml=nvml_reporting(0))
    message = str(caught.value)
    assert message.startswith("runtime.backend is cuda but no CUDA device was found")
    for guidance in (
        "REACTANTSERVER_NODE_GPUS",
        "runtime.backend: cpu",
        "allow_cpu_fallback: true",
    ):
        assert guidance in message


def test_workers_must_agree_on_the_backend(tmp_path: Path, env: dict[str, str]) -> None:
    workers = [{"name": "a"}, {"name": "b", **CUDA}]
    with pytest.raises(ConfigError, match="every worker of a node must use the same backend"):
        _plan(_node(tmp_path, env, workers=workers), env, tmp_path)


# --- explicit workers -------------------------------------------------------------------------


def test_explicit_workers_take_selectors_positionally_or_by_gpu(
    tmp_path: Path, env: dict[str, str]
) -> None:
    env["CUDA_VISIBLE_DEVICES"] = "GPU-a,GPU-b,GPU-c"
    workers = [{"name": "big", "gpu": 2}, {"name": "small"}]
    plan = _plan(_node(tmp_path, env, workers=workers, **{"global": CUDA}), env, tmp_path)
    assert [child.name for child in _workers(plan)] == ["big", "small"]
    assert _visible(plan) == ["GPU-c", "GPU-b"]
    assert [entry.gpu for entry in plan.node.workers or ()] == [2, 1]
    assert "device(s) GPU-a are not used by any worker" in plan.notes


@pytest.mark.parametrize(
    ("workers", "message"),
    [
        (
            [{"name": "a"}, {"name": "b"}, {"name": "c"}],
            "workers: 3 workers but only 2 device(s) (0, 1)",
        ),
        ([{"name": "a", "gpu": 2}], "workers[0].gpu: 2 is out of range; 2 device(s)"),
        (
            [{"name": "a", "gpu": 1}, {"name": "b"}],
            "workers[1]: device '1' (gpu 1) is also bound to workers[0] (a)",
        ),
    ],
)
def test_explicit_workers_that_do_not_fit_the_devices(
    tmp_path: Path, env: dict[str, str], workers: list[dict[str, Any]], message: str
) -> None:
    node = _node(tmp_path, env, workers=workers, **{"global": CUDA})
    with pytest.raises(ConfigError) as caught:
        _plan(node, env, tmp_path, nvml=nvml_reporting(2))
    assert str(caught.value).startswith(message)


def _fractions(plan: NodePlan) -> dict[str, tuple[float, bool]]:
    out = {}
    for child in _workers(plan):
        runtime = resolve_worker_config(plan.node, child.name, child.env).runtime
        out[child.name] = (runtime.mem_fraction, runtime.preallocate)
    return out


def test_workers_naming_one_gpu_share_it_with_split_arenas(
    tmp_path: Path, env: dict[str, str]
) -> None:
    workers = [{"name": "a", "gpu": 0}, {"name": "b", "gpu": 0}, {"name": "c", "gpu": 1}]
    node = _node(tmp_path, env, workers=workers, **{"global": CUDA})
    plan = _plan(node, env, tmp_path, nvml=nvml_reporting(2))
    assert _visible(plan) == ["0", "0", "1"]
    assert _fractions(plan) == {"a": (0.45, True), "b": (0.45, True), "c": (0.9, True)}
    assert "device 0 is shared by 2 workers, runtime.mem_fraction a 0.45, b 0.45" in plan.notes
    three = [{"name": n, "gpu": 0} for n in "xyz"]
    plan = _plan(
        _node(tmp_path, env, workers=three, **{"global": CUDA}),
        env,
        tmp_path,
        nvml=nvml_reporting(1),
    )
    assert {f for f, _ in _fractions(plan).values()} == {0.3}


def test_shared_device_keeps_explicit_fractions_and_refuses_too_much(
    tmp_path: Path, env: dict[str, str]
) -> None:
    runtime = {"backend": "cuda", "preallocate": False}
    workers = [
        {"name": "big", "gpu": 0, "runtime": {"mem_fraction": 0.6}},
        {"name": "small", "gpu": 0, "runtime": {"mem_fraction": 0.3}},
    ]
    node = _node(tmp_path, env, workers=workers, **{"global": {"runtime": runtime}})
    plan = _plan(node, env, tmp_path, nvml=nvml_reporting(1))
    assert _fractions(plan) == {"big": (0.6, False), "small": (0.3, False)}
    (note,) = [n for n in plan.notes if "is shared" in n]
    assert note.endswith("some do not preallocate their arena")
    too_much = {"runtime": {"backend": "cuda", "mem_fraction": 0.9}}
    node = _node(
        tmp_path,
        env,
        workers=[{"name": "a", "gpu": 0}, {"name": "b", "gpu": 0}],
        **{"global": too_much},
    )
    with pytest.raises(ConfigError) as caught:
        _plan(node, env, tmp_path, nvml=nvml_reporting(1))
    assert str(caught.value).startswith(
        "workers sharing device '0' claim runtime.mem_fraction a 0.9, b 0.9, 1.8 of the device"
    )
    env["REACTANTSERVER_WORKER_RUNTIME_MEM_FRACTION"] = "0.7"  # one value for every worker
    node = _node(
        tmp_path,
        env,
        workers=[{"name": "a", "gpu": 0}, {"name": "b", "gpu": 0}],
        **{"global": CUDA},
    )
    with pytest.raises(ConfigError, match=r"1\.4 of the device in all"):
        _plan(node, env, tmp_path, nvml=nvml_reporting(1))


def test_cpu_workers_naming_one_gpu_share_nothing(tmp_path: Path, env: dict[str, str]) -> None:
    workers = [{"name": "a", "gpu": 0}, {"name": "b", "gpu": 0}]
    plan = _plan(_node(tmp_path, env, workers=workers, gpus=1), env, tmp_path)
    assert _visible(plan) == ["", ""]
    assert not [n for n in plan.notes if "is shared" in n]


def test_explicit_workers_on_cpu_get_no_selector(tmp_path: Path, env: dict[str, str]) -> None:
    workers = [{"name": "a", "gpu": 5}, {"name": "b"}]
    plan = _plan(_node(tmp_path, env, workers=workers, gpus=1), env, tmp_path)
    assert [child.name for child in _workers(plan)] == ["a", "b"]
    assert _visible(plan) == ["", ""]


def test_models_map_is_checked_against_the_synthesized_workers(
    tmp_path: Path, env: dict[str, str]
) -> None:
    node = _node(tmp_path, env, gpus=2, models={"resnet": ["worker1"]})
    plan = _plan(node, env, tmp_path)
    config = resolve_worker_config(plan.node, "worker1", _workers(plan)[1].env)
    assert config.scheduler.for_model("resnet").residency is not None
    with pytest.raises(ConfigError, match="unknown worker 'worker1'"):
        _plan(_node(tmp_path, env, gpus=1, models={"resnet": ["worker1"]}), env, tmp_path)


# --- ports ------------------------------------------------------------------------------------


def test_sole_worker_serves_the_public_addresses(tmp_path: Path, env: dict[str, str]) -> None:
    node = _node(
        tmp_path,
        env,
        metrics_base_port=None,  # HTTP is forced on all the same
        listen={"grpc": "0.0.0.0:7001", "metrics": "0.0.0.0:7002"},
    )
    plan = _plan(node, env, tmp_path)
    (worker,) = plan.children
    assert worker.env["REACTANTSERVER_WORKER_ENDPOINTS_HOST"] == "0.0.0.0"
    assert worker.env["REACTANTSERVER_WORKER_ENDPOINTS_PORT"] == "7001"
    assert worker.env["REACTANTSERVER_WORKER_ENDPOINTS_METRICS_PORT"] == "7002"
    assert (worker.http_host, worker.http_port) == ("127.0.0.1", 7002)
    assert (plan.public_grpc, plan.public_metrics) == ("0.0.0.0:7001", "0.0.0.0:7002")
    assert plan.gateway_file is None
    assert plan.gateway_config is None
    config = resolve_worker_config(plan.node, "worker0", worker.env)
    assert (config.endpoints.host, config.endpoints.port) == ("0.0.0.0", 7001)
    assert config.endpoints.metrics_port == 7002


def test_sole_worker_on_ipv6(tmp_path: Path, env: dict[str, str]) -> None:
    node = _node(tmp_path, env, listen={"grpc": "[::1]:7001", "metrics": "[::1]:7002"})
    (worker,) = _plan(node, env, tmp_path).children
    assert worker.env["REACTANTSERVER_WORKER_ENDPOINTS_HOST"] == "::1"
    assert worker.url("/readyz") == "http://[::1]:7002/readyz"


def test_several_workers_listen_on_loopback_behind_the_gateway(
    tmp_path: Path, env: dict[str, str]
) -> None:
    workers = [{"name": "a"}, {"name": "b", "port": 9000, "metrics_port": 9500}]
    node = _node(tmp_path, env, workers=workers, base_port=7000, metrics_base_port=7100)
    plan = _plan(node, env, tmp_path)
    a, b = _workers(plan)
    assert a.env["REACTANTSERVER_WORKER_ENDPOINTS_HOST"] == "127.0.0.1"
    assert "REACTANTSERVER_WORKER_ENDPOINTS_PORT" not in a.env
    assert (a.http_host, a.http_port, b.http_port) == ("127.0.0.1", 7100, 9500)
    assert plan.gateway_config is not None
    assert plan.gateway_config["endpoints"] == ["127.0.0.1:7000", "127.0.0.1:9000"]
    assert plan.gateway_config["metrics_endpoints"] == ["127.0.0.1:7100", "127.0.0.1:9500"]
    assert (plan.public_grpc, plan.public_metrics) == ("0.0.0.0:8001", "0.0.0.0:8002")


def test_role_workers_runs_workers_as_configured(tmp_path: Path, env: dict[str, str]) -> None:
    node = _node(
        tmp_path, env, gpus=2, role="workers", **{"global": {"endpoints": {"host": "0.0.0.0"}}}
    )
    plan = _plan(node, env, tmp_path)
    assert [child.kind for child in plan.children] == [ChildKind.WORKER] * 2
    assert all("REACTANTSERVER_WORKER_ENDPOINTS_HOST" not in c.env for c in plan.children)
    assert [c.http_port for c in plan.children] == [9100, 9101]
    assert {c.http_host for c in plan.children} == {"127.0.0.1"}
    assert (plan.public_grpc, plan.public_metrics) == (None, None)
    assert plan.gateway_file is None


def test_role_workers_with_one_worker_keeps_its_ports(tmp_path: Path, env: dict[str, str]) -> None:
    plan = _plan(_node(tmp_path, env, role="workers"), env, tmp_path)
    (worker,) = plan.children
    assert "REACTANTSERVER_WORKER_ENDPOINTS_PORT" not in worker.env
    assert worker.http_port == 9100


def test_role_gateway_runs_only_the_gateway(tmp_path: Path, env: dict[str, str]) -> None:
    node = _node(tmp_path, env, role="gateway", base_port=7000, **{"global": CUDA})
    plan = _plan(node, env, tmp_path, nvml=nvml_reporting(3))
    assert [child.kind for child in plan.children] == [ChildKind.GATEWAY]
    assert plan.node_file is None
    assert plan.gateway_config is not None
    endpoints = ["127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"]
    assert plan.gateway_config["endpoints"] == endpoints
    assert plan.gateway_config["worker_names"] == ["worker0", "worker1", "worker2"]
    assert plan.public_metrics == "0.0.0.0:8002"


def test_worker_port_on_a_public_port_is_noted(tmp_path: Path, env: dict[str, str]) -> None:
    plan = _plan(_node(tmp_path, env, gpus=2, base_port=8001), env, tmp_path)
    notes = [note for note in plan.notes if "port 8001" in note]
    assert notes == [
        "worker worker0's gRPC port 8001 is also the public gRPC port; "
        "change base_port/metrics_base_port or listen.*"
    ]


def test_environment_ports_that_collide_are_an_error(tmp_path: Path, env: dict[str, str]) -> None:
    env["REACTANTSERVER_WORKER_ENDPOINTS_PORT"] = "7000"
    with pytest.raises(ConfigError, match="port 7000 is both worker worker0's gRPC port"):
        _plan(_node(tmp_path, env, gpus=2), env, tmp_path)


# --- child processes --------------------------------------------------------------------------


def test_worker_child(tmp_path: Path, env: dict[str, str]) -> None:
    node = _node(tmp_path, env, gpus=2, supervisor={"worker_grace_seconds": 4})
    plan = _plan(node, env, tmp_path, cores=32)
    worker = _workers(plan)[1]
    node_file = str(tmp_path / "run" / "node.yaml")
    assert worker.argv == (
        sys.executable,
        "-m",
        "reactantserver.worker",
        "--node-file",
        node_file,
        "--worker",
        "worker1",
    )
    assert worker.grace_seconds == 4
    assert worker.env["REACTANTSERVER_WORKER_NAME"] == "worker1"
    assert worker.env["REACTANTSERVER_WORKER_THREADS"] == "16"
    assert worker.env["REACTANTSERVER_SUPERVISOR_PID"] == str(os.getpid())
    assert worker.env["HOME"] == env["HOME"]  # the supervisor's environment is inherited
    assert plan.threads == "16"


@pytest.mark.parametrize(("cores", "threads"), [(16, "8"), (1, "1"), (100, "16")])
def test_thread_allotment_follows_the_worker_count(
    tmp_path: Path, env: dict[str, str], cores: int, threads: str
) -> None:
    plan = _plan(_node(tmp_path, env, gpus=2), env, tmp_path, cores=cores)
    assert {c.env["REACTANTSERVER_WORKER_THREADS"] for c in _workers(plan)} == {threads}


def test_worker_threads_variable_is_passed_verbatim(tmp_path: Path, env: dict[str, str]) -> None:
    env["REACTANTSERVER_WORKER_THREADS"] = "3"
    plan = _plan(_node(tmp_path, env, gpus=2), env, tmp_path, cores=64)
    assert plan.threads == "3"
    assert {c.env["REACTANTSERVER_WORKER_THREADS"] for c in _workers(plan)} == {"3"}


def test_bad_worker_threads_variable_fails_at_plan_time(
    tmp_path: Path, env: dict[str, str]
) -> None:
    node = _node(tmp_path, env)
    env["REACTANTSERVER_WORKER_THREADS"] = "many"
    with pytest.raises(ConfigError, match="REACTANTSERVER_WORKER_THREADS"):
        _plan(node, env, tmp_path)


def test_workers_without_http_have_no_probe_port(tmp_path: Path, env: dict[str, str]) -> None:
    plan = _plan(_node(tmp_path, env, gpus=2, metrics_base_port=None), env, tmp_path)
    assert [c.http_port for c in _workers(plan)] == [None, None]
    assert plan.gateway_config is not None
    assert "metrics_endpoints" not in plan.gateway_config


def test_metrics_endpoints_are_all_or_nothing(tmp_path: Path, env: dict[str, str]) -> None:
    workers = [{"name": "a", "metrics_port": 0}, {"name": "b"}]
    plan = _plan(_node(tmp_path, env, workers=workers), env, tmp_path)
    assert [c.http_port for c in _workers(plan)] == [None, 9101]
    assert plan.gateway_config is not None
    assert "metrics_endpoints" not in plan.gateway_config


def test_gateway_child(tmp_path: Path, env: dict[str, str]) -> None:
    node = _node(
        tmp_path,
        env,
        gpus=2,
        listen={"grpc": "0.0.0.0:7001", "metrics": "10.1.2.3:7002"},
        supervisor={"gateway_grace_seconds": 2.5},
    )
    gateway = _gateway(_plan(node, env, tmp_path))
    file = str(tmp_path / "run" / "gateway.yml")
    assert gateway.argv == (sys.executable, "-m", "reactantserver.gateway", "--config", file)
    assert gateway.grace_seconds == 2.5
    assert (gateway.http_host, gateway.http_port) == ("10.1.2.3", 7002)
    assert gateway.env["REACTANTSERVER_GATEWAY_STARTUP_WAIT_SECONDS"] == "inf"
    assert gateway.env["REACTANTSERVER_SUPERVISOR_PID"] == str(os.getpid())
    assert "CUDA_VISIBLE_DEVICES" not in gateway.env


def test_gateway_startup_wait_is_kept_when_set(tmp_path: Path, env: dict[str, str]) -> None:
    env["REACTANTSERVER_GATEWAY_STARTUP_WAIT_SECONDS"] = "30"
    gateway = _gateway(_plan(_node(tmp_path, env, gpus=2), env, tmp_path))
    assert gateway.env["REACTANTSERVER_GATEWAY_STARTUP_WAIT_SECONDS"] == "30"


# --- the materialized gateway -----------------------------------------------------------------


def test_gateway_file_is_what_the_gateway_parser_reads(tmp_path: Path, env: dict[str, str]) -> None:
    node = _node(
        tmp_path,
        env,
        gpus=2,
        base_port=7000,
        metrics_base_port=7100,
        listen={"grpc": "0.0.0.0:9001", "metrics": "0.0.0.0:9002"},
        gateway={"scheduling": {"mode": "lpt_packing"}, "grpc": {"max_send_msg_bytes": 4096}},
        **{"global": {"grpc": {"max_recv_msg_bytes": 1000, "max_send_msg_bytes": 2000}}},
    )
    plan = _plan(node, env, tmp_path, write=True)
    assert plan.gateway_file == tmp_path / "run" / "gateway.yml"
    config = load_gateway_config(plan.gateway_file, _gateway(plan).env)
    assert config.endpoints == ("127.0.0.1:7000", "127.0.0.1:7001")
    assert config.metrics_endpoints == ("127.0.0.1:7100", "127.0.0.1:7101")
    assert config.worker_names == ("worker0", "worker1")
    assert (config.listen.grpc, config.listen.metrics) == ("0.0.0.0:9001", "0.0.0.0:9002")
    assert config.grpc.max_recv_msg_bytes == 1000  # mirrored from global.grpc
    assert config.grpc.max_send_msg_bytes == 4096  # the gateway block wins
    assert config.scheduling.mode.value == "lpt_packing"
    assert config.startup_wait_seconds == float("inf")
    assert node.gateway == {  # the node's block is left alone
        "scheduling": {"mode": "lpt_packing"},
        "grpc": {"max_send_msg_bytes": 4096},
    }


def test_message_limits_mirror_the_smallest_worker(tmp_path: Path, env: dict[str, str]) -> None:
    workers = [{"name": "a", "grpc": {"max_recv_msg_bytes": 500}}, {"name": "b"}]
    plan = _plan(_node(tmp_path, env, workers=workers), env, tmp_path)
    assert plan.gateway_config is not None
    assert plan.gateway_config["grpc"]["max_recv_msg_bytes"] == 500


def test_bad_gateway_block_fails_at_plan_time(tmp_path: Path, env: dict[str, str]) -> None:
    node = _node(tmp_path, env, gpus=2, gateway={"scheduling": {"mode": "best"}})
    with pytest.raises(ConfigError) as caught:
        _plan(node, env, tmp_path, write=True)
    assert str(caught.value).startswith("gateway.scheduling.mode: ")
    assert not (tmp_path / "run").exists()  # nothing is written before the plan is good


def test_gateway_file_variable_is_used_as_is(tmp_path: Path, env: dict[str, str]) -> None:
    own = tmp_path / "own-gateway.yml"
    own.write_text(
        "listen: {grpc: '0.0.0.0:6001', metrics: '0.0.0.0:6002'}\n"
        "endpoints: ['10.0.0.1:8080', '10.0.0.2:8080']\n",
        encoding="utf-8",
    )
    env["REACTANTSERVER_GATEWAY_FILE"] = str(own)
    node = _node(tmp_path, env, role="gateway", **{"global": CUDA})
    plan = _plan(node, env, tmp_path, write=True)  # no devices needed: NVML is not asked
    (gateway,) = plan.children
    assert gateway.argv[-2:] == ("--config", str(own))
    assert (plan.gateway_file, plan.gateway_config) == (own, None)
    assert (plan.public_grpc, plan.public_metrics) == ("0.0.0.0:6001", "0.0.0.0:6002")
    assert gateway.http_port == 6002
    assert plan.node_file is None
    assert not (tmp_path / "run").exists()


def test_gateway_file_variable_with_role_all(tmp_path: Path, env: dict[str, str]) -> None:
    own = tmp_path / "own-gateway.yml"
    own.write_text("endpoints: ['127.0.0.1:8080', '127.0.0.1:8081']\n", encoding="utf-8")
    env["REACTANTSERVER_GATEWAY_FILE"] = str(own)
    plan = _plan(_node(tmp_path, env, gpus=2), env, tmp_path, write=True)
    assert [child.name for child in plan.children] == ["worker0", "worker1", "gateway"]
    assert _gateway(plan).argv[-1] == str(own)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["node.yaml"]


def test_missing_gateway_file_is_a_config_error(tmp_path: Path, env: dict[str, str]) -> None:
    env["REACTANTSERVER_GATEWAY_FILE"] = str(tmp_path / "absent.yml")
    with pytest.raises(ConfigError, match="no such file"):
        _plan(_node(tmp_path, env, role="gateway"), env, tmp_path)


# --- notes ------------------------------------------------------------------------------------


def _cache_notes(plan: NodePlan) -> list[str]:
    return [note for note in plan.notes if "private host copy" in note]


def test_private_host_copies_are_noted(tmp_path: Path, env: dict[str, str]) -> None:
    plan = _plan(_node(tmp_path, env, **{"global": CUDA}), env, tmp_path, nvml=nvml_reporting(2))
    (note,) = _cache_notes(plan)
    assert note.startswith("each worker keeps a private host copy of every model (2x host RAM)")


def test_cpu_cache_with_a_byte_budget_is_noted(tmp_path: Path, env: dict[str, str]) -> None:
    settings = {"runtime": {"weight_cache_max_bytes": 1 << 20}}
    plan = _plan(_node(tmp_path, env, gpus=2, **{"global": settings}), env, tmp_path)
    assert len(_cache_notes(plan)) == 1


@pytest.mark.parametrize(
    "keys",
    [
        {"gpus": 2},  # CPU: no arena, no cache
        {"gpus": ["0", "1"], "shared_host_weights": True, "global": CUDA},
        {"gpus": 1, "global": CUDA},  # one worker
        {"gpus": 2, "global": {"runtime": {"backend": "cuda", "weight_cache_fraction": 0}}},
    ],
)
def test_no_private_copy_note(tmp_path: Path, env: dict[str, str], keys: dict[str, Any]) -> None:
    assert _cache_notes(_plan(_node(tmp_path, env, **keys), env, tmp_path)) == []


# --- files ------------------------------------------------------------------------------------


def test_files_are_written_and_load_back(tmp_path: Path, env: dict[str, str]) -> None:
    node = _node(tmp_path, env, models={"m": ["worker1"]}, **{"global": CUDA})
    plan = _plan(node, env, tmp_path, nvml=nvml_reporting(2), write=True)
    assert plan.node_file == tmp_path / "run" / "node.yaml"
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["gateway.yml", "node.yaml"]
    loaded = load_node_config(plan.node_file, env)
    assert loaded == plan.node
    assert [(entry.name, entry.gpu) for entry in loaded.workers or ()] == [
        ("worker0", 0),
        ("worker1", 1),
    ]
    assert yaml.safe_load(plan.node_file.read_text(encoding="utf-8"))["role"] == "all"


def test_writing_replaces_earlier_files(tmp_path: Path, env: dict[str, str]) -> None:
    _plan(_node(tmp_path, env, gpus=3), env, tmp_path, write=True)
    plan = _plan(_node(tmp_path, env, gpus=2), env, tmp_path, write=True)
    assert plan.node_file is not None
    assert len(load_node_config(plan.node_file, env).workers or ()) == 2
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["gateway.yml", "node.yaml"]


def test_write_false_writes_nothing(tmp_path: Path, env: dict[str, str]) -> None:
    plan = _plan(_node(tmp_path, env, gpus=2), env, tmp_path, write=False)
    assert plan.node_file == tmp_path / "run" / "node.yaml"
    assert plan.gateway_file == tmp_path / "run" / "gateway.yml"
    assert not (tmp_path / "run").exists()


def test_runtime_directory(tmp_path: Path) -> None:
    assert runtime_directory({"XDG_RUNTIME_DIR": str(tmp_path)}) == tmp_path / "reactantserver"
    fallback = runtime_directory({"XDG_RUNTIME_DIR": "relative/dir"})
    assert fallback.name.startswith("reactantserver")
    assert fallback.is_absolute()


def test_default_directory_is_the_runtime_directory(tmp_path: Path, env: dict[str, str]) -> None:
    env["XDG_RUNTIME_DIR"] = str(tmp_path / "xdg")
    plan = plan_node(_node(tmp_path, env), env, cores=4, nvml_count=must_not_ask)
    assert plan.node_file == tmp_path / "xdg" / "reactantserver" / "node.yaml"
    assert plan.node_file.is_file()


# --- materialize ------------------------------------------------------------------------------


def test_materialized_documents(tmp_path: Path, env: dict[str, str]) -> None:
    node = _node(tmp_path, env, **{"global": CUDA})
    plan = _plan(node, env, tmp_path, nvml=nvml_reporting(2), cores=6)
    documents = materialized_documents(plan)
    assert yaml.safe_load(yaml.safe_dump(documents)) == documents  # plain YAML data
    assert documents["node"]["workers"] == [
        {"name": "worker0", "gpu": 0},
        {"name": "worker1", "gpu": 1},
    ]
    assert documents["gateway"]["endpoints"] == ["127.0.0.1:8080", "127.0.0.1:8081"]
    first, _, gateway = documents["children"]
    assert first == {
        "name": "worker0",
        "kind": "worker",
        "argv": list(_workers(plan)[0].argv),
        "CUDA_VISIBLE_DEVICES": "0",
        "REACTANTSERVER_WORKER_THREADS": "3",
        "http_port": 9100,
    }
    assert (gateway["kind"], gateway["http_port"]) == ("gateway", 8002)
    assert documents["devices"] == {"selectors": ["0", "1"], "source": "nvml"}


def test_role_override_reaches_the_plan(tmp_path: Path, env: dict[str, str]) -> None:
    node = apply_overrides(_node(tmp_path, env, gpus=2), env, role="workers")
    plan = _plan(node, env, tmp_path)
    assert plan.node.role is Role.WORKERS
    assert [child.kind for child in plan.children] == [ChildKind.WORKER] * 2
