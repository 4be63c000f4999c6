"""The container images, the Kubernetes / KServe / Prometheus Operator manifests and the Helm chart.

All offline: the Dockerfiles are parsed and checked instruction by instruction; every manifest
and every object the chart renders validates against the JSON schemas vendored in
deploy/schemas/; then they are cross-checked against each other, the images, the node files
baked into them and the names the code reads (tests/_deploy_support.py says how).
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from reactantserver.core.config import (
    CACHE_DIR_VARIABLE,
    NODE_FILE_VARIABLE,
    ListenConfig,
    load_node_config,
)
from tests._deploy_support import (
    CHART,
    DOCKER,
    K8S,
    MONITORING,
    ROOT,
    container_port,
    dockerignore_excludes,
    ignore_patterns,
    lint_chart,
    load_yaml,
    only,
    parse_dockerfile,
    render_chart,
    runtime,
    schema_errors,
    stages,
)

NODE_FILE = "/etc/reactantserver/node.yaml"
CACHE_DIR = "/var/cache/reactantserver"
HEALTH_OPTIONS = {"interval": "30s", "timeout": "20s", "retries": "3", "start-period": "300s"}
# image file -> (baked node file, runtime backend, extra requirement the image must install)
IMAGES = {
    "Dockerfile": ("node-cpu.yaml", "cpu", None),
    "Dockerfile.cuda": ("node-cuda.yaml", "cuda", "reactantserver-worker[cuda12]"),
}
#: Triton's convention, which the node's defaults follow: port name -> number.
PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002}
LIVE, READY = "/v2/health/live", "/v2/health/ready"
MANIFESTS = {
    "deployment": K8S / "deployment.yaml",
    "service": K8S / "service.yaml",
    "servingruntime": K8S / "servingruntime.yaml",
    "inferenceservice": K8S / "inferenceservice.yaml",
    "servicemonitor": MONITORING / "servicemonitor.yaml",
}


def manifest(name: str) -> dict[str, Any]:
    return load_yaml(MANIFESTS[name])


def listen_ports(node: Any) -> dict[str, int]:
    """The node's ``listen.*`` addresses as port numbers, by the container port names."""
    return {name: int(getattr(node.listen, name).rpartition(":")[2]) for name in PORTS}


# --- images ----------------------------------------------------------------------------------


def test_parser_joins_continuations_and_skips_comments() -> None:
    text = (
        "# syntax=docker/dockerfile:1\nFROM python:3.11-slim AS build\n"
        "RUN --mount=type=cache,target=/c echo a \\\n    # a comment inside\n    b\n\n"
        'HEALTHCHECK --interval=1s \\\n  CMD ["x", "y"]\nexpose 1 2\n'
    )
    parsed = parse_dockerfile(text)
    assert [i.keyword for i in parsed] == ["FROM", "RUN", "HEALTHCHECK", "EXPOSE"]
    assert parsed[1].flags == {"mount": "type=cache,target=/c"}
    assert parsed[1].words() == ["echo", "a", "b"]
    assert parsed[2].flags == {"interval": "1s"}
    assert parsed[2].rest == 'CMD ["x", "y"]'
    assert dockerignore_excludes(["*", "!packages/", "packages/*/tests"], "packages/a/tests/x")
    assert not dockerignore_excludes(["*", "!packages/"], "packages/a/src/b.py")
    assert dockerignore_excludes(["*", "!packages/"], "README.md")


@pytest.mark.parametrize("dockerfile", sorted(IMAGES))
def test_image_stages_and_entrypoint(dockerfile: str) -> None:
    all_stages = stages(parse_dockerfile((DOCKER / dockerfile).read_text()))
    assert len(all_stages) >= 2, "multi-stage: wheels are built apart from the runtime"
    build, final = all_stages[0], all_stages[-1]
    assert only(final, "FROM").words()[0] == "python:3.11-slim"
    wheel = " ".join(i.rest for i in build if i.keyword == "RUN" and "pip wheel" in i.rest)
    for package in ("core", "client", "gateway", "worker", "node", "export"):
        assert f"./packages/{package}" in wheel
    install = [i for i in final if i.keyword == "RUN" and "pip install" in i.rest]
    assert len(install) == 1
    assert "--no-index" in install[0].rest, "the runtime stage installs offline"
    assert '"reactantserver-node[worker]==0.1.0"' in install[0].rest
    extra = IMAGES[dockerfile][2]
    assert extra is None or f'"{extra}==0.1.0"' in install[0].rest
    entry = only(final, "ENTRYPOINT").words()
    assert Path(entry[0]).name == "tini"
    assert entry[-1] == "reactantserver-node"
    assert any("install" in i.rest and "tini" in i.words() for i in final if i.keyword == "RUN")
    assert only(final, "STOPSIGNAL").words() == ["SIGTERM"]


@pytest.mark.parametrize("dockerfile", sorted(IMAGES))
def test_image_ports_health_user_and_volume(dockerfile: str) -> None:
    final = runtime(dockerfile)
    node = load_node_config(DOCKER / IMAGES[dockerfile][0], {})
    expose = [int(port) for port in only(final, "EXPOSE").words()]
    assert expose == sorted(listen_ports(node).values()) == sorted(PORTS.values())
    text = (DOCKER / dockerfile).read_text()
    assert all(f"-p {port}:{port}" in text for port in expose), "the docker run example"
    # The healthcheck command reads the node file, so it follows listen.http wherever it is.
    health = only(final, "HEALTHCHECK")
    assert health.flags == HEALTH_OPTIONS
    assert health.rest.startswith("CMD ")
    assert json.loads(health.rest.removeprefix("CMD ")) == ["reactantserver-node", "healthcheck"]
    user = only(final, "USER").words()[0].split(":")
    assert user[0].isdigit(), "a numeric uid, so runAsNonRoot can check it"
    assert int(user[0]) != 0
    assert only(final, "VOLUME").words() == [CACHE_DIR]
    env = " ".join(i.rest for i in final if i.keyword == "ENV")
    assert f"{CACHE_DIR_VARIABLE}={CACHE_DIR}" in env.split()
    for note in ("--shm-size", "--ipc=host", "--stop-timeout", "30 s"):
        assert note in text


@pytest.mark.parametrize("dockerfile", sorted(IMAGES))
def test_image_copies_exist_and_are_in_the_context(dockerfile: str) -> None:
    patterns = ignore_patterns()
    copies = [
        i
        for i in parse_dockerfile((DOCKER / dockerfile).read_text())
        if i.keyword in {"COPY", "ADD"} and "from" not in i.flags
    ]
    assert copies
    for instruction in copies:
        *sources, _ = instruction.words()
        for source in sources:
            assert (ROOT / source).exists(), source
            assert not dockerignore_excludes(patterns, source.strip("/")), source
    baked = [i.words() for i in runtime(dockerfile) if i.keyword == "COPY"]
    assert [f"docker/{IMAGES[dockerfile][0]}", NODE_FILE] in baked
    # Everything a wheel build reads reaches the daemon.
    needed = [
        path
        for package in (ROOT / "packages").iterdir()
        for path in [
            package / "pyproject.toml",
            package / "README.md",
            *sorted((package / "src").rglob("*.py")),
        ]
    ]
    for path in needed:
        assert not dockerignore_excludes(patterns, path.relative_to(ROOT).as_posix()), path
    for unwanted in (".venv/bin/python", "build/node.yaml", ".git/HEAD", "tests/test_deploy.py"):
        assert dockerignore_excludes(patterns, unwanted)
    assert dockerignore_excludes(patterns, "deploy/helm/reactantserver/Chart.yaml")


CONSTRAINTS = ROOT / "requirements" / "constraints.txt"


def _pins() -> dict[str, str]:
    lines = CONSTRAINTS.read_text().splitlines()
    pairs = [line.split("==") for line in lines if line.strip() and not line.startswith("#")]
    return {name.strip().lower(): version.strip() for name, version in pairs}


@pytest.mark.parametrize("dockerfile", sorted(IMAGES))
def test_image_builds_with_the_constraints_ci_tests(dockerfile: str) -> None:
    build = stages(parse_dockerfile((DOCKER / dockerfile).read_text()))[0]
    copies = [i.words() for i in build if i.keyword == "COPY"]
    assert ["requirements/constraints.txt", "constraints.txt"] in copies
    wheel = [i for i in build if i.keyword == "RUN" and "pip wheel" in i.rest]
    assert len(wheel) == 1
    assert "--constraint constraints.txt" in wheel[0].rest


def test_constraints_pin_every_runtime_dependency_of_the_distributions() -> None:
    pins = _pins()
    assert all(re.fullmatch(r"[0-9][0-9A-Za-z.+-]*", v) for v in pins.values()), pins
    for pyproject in sorted((ROOT / "packages").glob("*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text())["project"]
        wanted = list(project["dependencies"])
        if pyproject.parent.name == "core":
            wanted += project["optional-dependencies"]["server"]
        for requirement in wanted:
            name = re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower()
            if not name.startswith("reactantserver-"):
                assert name in pins, (
                    f"{pyproject.parent.name} needs {name}: pin it in {CONSTRAINTS}"
                )


def test_the_helm_sdk_the_tests_use_is_pinned() -> None:
    import helm_python

    test_requirements = (ROOT / "requirements" / "test.txt").read_text()
    version = _pins()["helm-python-sdk"]
    assert f"helm-python-sdk=={version}" in test_requirements
    assert helm_python.__version__ == version


def kserve_node_text(dockerfile: str) -> tuple[str, str]:
    """The KServe node file the image derives with ``sed``: (its path, its text)."""
    for instruction in runtime(dockerfile):
        match = re.search(r"sed '(s\|[^']*)' (\S+) > (\S+)", instruction.rest)
        if instruction.keyword == "RUN" and match:
            _, pattern, replacement, _ = match.group(1).split("|")
            assert match.group(2) == NODE_FILE
            text = (DOCKER / IMAGES[dockerfile][0]).read_text()
            return match.group(3), re.sub(pattern, replacement, text, flags=re.MULTILINE)
    raise AssertionError("no sed deriving the KServe node file")


@pytest.mark.parametrize("dockerfile", sorted(IMAGES))
def test_baked_node_files_load_with_core(dockerfile: str, tmp_path: Path) -> None:
    name, backend, _ = IMAGES[dockerfile]
    kserve_path, kserve_text = kserve_node_text(dockerfile)
    (tmp_path / "kserve.yaml").write_text(kserve_text)
    for path, repo in ((DOCKER / name, "/models"), (tmp_path / "kserve.yaml", "/mnt/models")):
        node = load_node_config(path, {})
        assert node.model_repo == (repo,)
        assert node.global_settings["runtime"]["backend"] == backend
        # Spelled out in the file, and equal to the node's defaults the manifests assume.
        assert yaml.safe_load(path.read_text())["listen"] == {
            name: f"0.0.0.0:{port}" for name, port in PORTS.items()
        }
        assert node.listen == ListenConfig()
        assert listen_ports(node) == PORTS
    assert kserve_path == servingruntime_env()[NODE_FILE_VARIABLE]


@pytest.mark.parametrize("dockerfile", sorted(IMAGES))
def test_baked_node_files_materialize(dockerfile: str) -> None:
    # The real CLI on the baked file; no device is visible, so the CUDA file falls back to CPU.
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("REACTANT", "INFERENCE_SERVER_"))
    }
    env["CUDA_VISIBLE_DEVICES"] = ""
    command = [sys.executable, "-m", "reactantserver.node", "materialize", "--node-file"]
    done = subprocess.run(
        [*command, str(DOCKER / IMAGES[dockerfile][0])],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    plan = yaml.safe_load(done.stdout)
    assert [child["name"] for child in plan["children"]] == ["worker0"]
    assert plan["node"]["listen"] == {name: f"0.0.0.0:{port}" for name, port in PORTS.items()}


# --- manifests -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(MANIFESTS))
def test_manifest_validates(name: str) -> None:
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in schema_errors(manifest(name))]
    assert errors == []


_DELETE = object()
_CONTAINER = "spec.template.spec.containers.0"
# mutation -> (manifest, dotted path, new value or _DELETE)
MUTATIONS: dict[str, tuple[str, str, Any]] = {
    "port as a string": ("deployment", f"{_CONTAINER}.ports.0.containerPort", "8001"),
    "unknown container key": ("deployment", f"{_CONTAINER}.gpus", 1),
    "missing selector": ("deployment", "spec.selector", _DELETE),
    "probe as a list": ("deployment", f"{_CONTAINER}.livenessProbe", []),
    "service port as a string": ("service", "spec.ports.0.port", "8001"),
    "wrong kind": ("service", "kind", "Services"),
    "unknown protocol": ("servingruntime", "spec.protocolVersions.0", "grpc-v3"),
    "container without name": ("servingruntime", "spec.containers.0.name", _DELETE),
    "unknown spec key": ("servingruntime", "spec.modelFormats", []),
    "format without name": ("servingruntime", "spec.supportedModelFormats.0.name", _DELETE),
    "runtime port name too long": (
        "servingruntime",
        "spec.containers.0.ports.0.name",
        "http1-rest-port-8000",
    ),
    "unknown probe key": ("servingruntime", "spec.containers.0.readinessProbe.path", "/"),
    "probe period as a string": (
        "servingruntime",
        "spec.containers.0.readinessProbe.periodSeconds",
        "5",
    ),
    "storageUri as a number": ("inferenceservice", "spec.predictor.model.storageUri", 3),
    "missing modelFormat": ("inferenceservice", "spec.predictor.model.modelFormat", _DELETE),
    "bad apiVersion": ("inferenceservice", "apiVersion", "serving.kserve.io/v1"),
    "monitor without endpoints": ("servicemonitor", "spec.endpoints", _DELETE),
    "unknown endpoint key": ("servicemonitor", "spec.endpoints.0.metricsPath", "/metrics"),
    "bad scrape interval": ("servicemonitor", "spec.endpoints.0.interval", "15 seconds"),
    "monitor port as a number": ("servicemonitor", "spec.endpoints.0.port", 8002),
    "monitor kind": ("servicemonitor", "kind", "PodMonitor"),
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_mutated_manifest_fails_validation(mutation: str) -> None:
    name, dotted, value = MUTATIONS[mutation]
    original = manifest(name)
    document = copy.deepcopy(original)
    *parents, last = [int(p) if p.isdigit() else p for p in dotted.split(".")]
    node: Any = document
    for key in parents:
        node = node[key]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    paths = [list(error.absolute_path) for error in schema_errors(document, original)]
    # Rejected, and for this very change: each error sits on the changed key or its parent.
    assert paths
    assert all(path == [*parents, last][: len(path)] for path in paths), paths


def pod_spec(deployment: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


def node_container(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = pod_spec(deployment)["containers"]
    value: dict[str, Any] = container
    return value


def check_node_pod(deployment: dict[str, Any]) -> None:
    """The cross-checks every node Deployment (plain or rendered) must pass."""
    pod, container = pod_spec(deployment), node_container(deployment)
    node = load_node_config(DOCKER / "node-cuda.yaml", {})
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == listen_ports(node) == PORTS
    expose = {int(p) for p in only(runtime("Dockerfile.cuda"), "EXPOSE").words()}
    assert set(ports.values()) == expose
    probes = {
        kind: {**container[kind]["httpGet"], "port": container_port(container, port)}
        for kind in ("startupProbe", "livenessProbe", "readinessProbe")
        for port in [container[kind]["httpGet"]["port"]]
    }
    assert probes == {
        "startupProbe": {"path": LIVE, "port": PORTS["http"]},
        "livenessProbe": {"path": LIVE, "port": PORTS["http"]},
        "readinessProbe": {"path": READY, "port": PORTS["http"]},
    }
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300  # as the image's
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    mounts = {m["mountPath"]: (m, volumes[m["name"]]) for m in container["volumeMounts"]}
    _, shm = mounts["/dev/shm"]
    assert shm["emptyDir"]["medium"] == "Memory"
    assert shm["emptyDir"]["sizeLimit"]
    (models_dir,) = node.model_repo
    models_mount, models = mounts[models_dir]
    assert models_mount["readOnly"] is True
    assert models["persistentVolumeClaim"]["claimName"]
    env = {variable["name"]: variable.get("value") for variable in container["env"]}
    assert env[CACHE_DIR_VARIABLE] in mounts
    assert pod["terminationGracePeriodSeconds"] >= 30
    uid = int(only(runtime("Dockerfile.cuda"), "USER").words()[0].split(":")[0])
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == uid
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()


def check_service_routes(service: dict[str, Any], deployment: dict[str, Any]) -> None:
    names = {port["name"]: port["containerPort"] for port in node_container(deployment)["ports"]}
    routed = {port["name"]: port for port in service["spec"]["ports"]}
    assert {name: names[port["targetPort"]] for name, port in routed.items()} == PORTS
    assert routed["grpc"]["appProtocol"] == "grpc"
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()


def check_monitor_scrapes(monitor: dict[str, Any], service: dict[str, Any]) -> None:
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    (endpoint,) = monitor["spec"]["endpoints"]
    (port,) = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
    assert port["targetPort"] == "metrics"
    assert endpoint["path"] == "/metrics"


def test_deployment_matches_the_image_and_the_node() -> None:
    deployment = manifest("deployment")
    check_node_pod(deployment)
    assert node_container(deployment)["resources"]["limits"]["nvidia.com/gpu"] >= 1
    mounts = {m["mountPath"]: m["name"] for m in node_container(deployment)["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(deployment)["volumes"]}
    assert "persistentVolumeClaim" in volumes[mounts[CACHE_DIR]]


def test_service_routes_to_the_deployment() -> None:
    service = manifest("service")
    check_service_routes(service, manifest("deployment"))
    assert {port["name"]: port["port"] for port in service["spec"]["ports"]} == PORTS


def test_service_monitor_scrapes_the_metrics_port() -> None:
    monitor = manifest("servicemonitor")
    check_monitor_scrapes(monitor, manifest("service"))
    labels = manifest("deployment")["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()


def servingruntime_env() -> dict[str, str]:
    (container,) = manifest("servingruntime")["spec"]["containers"]
    return {variable["name"]: variable["value"] for variable in container["env"]}


def check_serving_runtime(spec: dict[str, Any]) -> None:
    assert spec["supportedModelFormats"] == [
        {"name": "reactantserver-bundle", "version": "3", "autoSelect": True}
    ]
    assert spec["protocolVersions"] == ["v2", "grpc-v2"]
    assert spec["annotations"] == {
        "prometheus.kserve.io/port": str(PORTS["metrics"]),
        "prometheus.kserve.io/path": "/metrics",
    }
    (container,) = spec["containers"]
    assert container["name"] == "kserve-container"
    assert "reactantserver-node" in container["command"]
    # REST first: KServe points the InferenceService's HTTP address at the first port.
    assert container["ports"] == [
        {"containerPort": PORTS["http"], "name": "http1", "protocol": "TCP"},
        {"containerPort": PORTS["grpc"], "name": "h2c", "protocol": "TCP"},
    ]
    assert container["readinessProbe"]["httpGet"] == {"path": READY, "port": PORTS["http"]}
    env = {variable["name"]: variable["value"] for variable in container["env"]}
    assert env[NODE_FILE_VARIABLE] == "/etc/reactantserver/node-kserve.yaml"
    assert env[CACHE_DIR_VARIABLE] == CACHE_DIR


def test_kserve_runtime_serves_the_inference_service() -> None:
    runtime_doc, service = manifest("servingruntime"), manifest("inferenceservice")
    spec = runtime_doc["spec"]
    check_serving_runtime(spec)
    model = service["spec"]["predictor"]["model"]
    assert model["modelFormat"]["name"] == spec["supportedModelFormats"][0]["name"]
    assert model["runtime"] == runtime_doc["metadata"]["name"] == "reactantserver"
    assert model["protocolVersion"] in spec["protocolVersions"]
    assert re.match(r"^[a-z0-9]+://\S+", model["storageUri"])
    # Two container ports: Knative Serving refuses them, KServe's Standard mode serves both.
    mode = service["metadata"]["annotations"]["serving.kserve.io/deploymentMode"]
    assert mode in {"RawDeployment", "Standard"}


def test_images_agree_and_kustomization_lists_the_core_objects() -> None:
    image = node_container(manifest("deployment"))["image"]
    (runtime_container,) = manifest("servingruntime")["spec"]["containers"]
    assert runtime_container["image"] == image
    assert f"-t {image} ." in (DOCKER / "Dockerfile.cuda").read_text()
    assert f"-t {image} ." in (ROOT / "docs" / "deployment.md").read_text()
    kustomization = load_yaml(K8S / "kustomization.yaml")
    assert kustomization["resources"] == ["deployment.yaml", "service.yaml"]
    repository, _, tag = image.partition(":")
    assert kustomization["images"] == [{"name": repository, "newTag": tag}]


# --- the Helm chart --------------------------------------------------------------------------

#: Every option away from its default at once.
ALL_OPTIONS: dict[str, Any] = {
    "gpus": 2,
    "replicaCount": 2,
    "image": {"repository": "registry.example.com/reactantserver", "tag": "0.1.0-cuda"},
    "cache": {"existingClaim": ""},
    "nodeFile": {
        "model_repo": "/models",
        "gpus": "auto",
        "listen": {name: f"0.0.0.0:{port}" for name, port in PORTS.items()},
        "global": {"runtime": {"backend": "cuda"}, "logging": {"format": "json"}},
    },
    "env": [{"name": "REACTANTSERVER_WORKER_THREADS", "value": "4"}],
    "podAnnotations": {"example.com/team": "inference"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "nodeSelector": {"nvidia.com/gpu.present": "true"},
    "imagePullSecrets": [{"name": "registry"}],
    "service": {"type": "LoadBalancer", "annotations": {"example.com/lb": "internal"}},
    "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
    "servingRuntime": {"enabled": True},
}


def by_kind(documents: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    kinds = [document["kind"] for document in documents]
    assert len(kinds) == len(set(kinds)), kinds
    return {document["kind"]: document for document in documents}


@pytest.mark.parametrize("options", ["defaults", "all options"])
def test_chart_lints_clean(options: str) -> None:
    report = lint_chart(ALL_OPTIONS if options == "all options" else None)
    assert report["errors"] == []
    # Severity 1 is information (Helm recommends an icon); warnings and errors fail.
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize("options", ["defaults", "all options"])
def test_every_rendered_object_validates(options: str) -> None:
    documents = render_chart(ALL_OPTIONS if options == "all options" else None)
    kinds = sorted(document["kind"] for document in documents)
    if options == "defaults":
        assert kinds == ["Deployment", "Service"]
    else:
        assert kinds == ["ConfigMap", "Deployment", "Service", "ServiceMonitor", "ServingRuntime"]
    for document in documents:
        errors = [f"{list(e.absolute_path)}: {e.message}" for e in schema_errors(document)]
        assert errors == [], document["kind"]


def test_chart_defaults_render_the_plain_manifests() -> None:
    rendered = by_kind(render_chart())
    deployment, service = rendered["Deployment"], rendered["Service"]
    assert pod_spec(deployment) == pod_spec(manifest("deployment"))
    for key in ("replicas", "strategy"):
        assert deployment["spec"][key] == manifest("deployment")["spec"][key]
    assert service["spec"]["ports"] == manifest("service")["spec"]["ports"]
    check_node_pod(deployment)
    check_service_routes(service, deployment)


def test_chart_options_reach_the_objects(tmp_path: Path) -> None:
    rendered = by_kind(render_chart(ALL_OPTIONS, release="edge"))
    deployment, service = rendered["Deployment"], rendered["Service"]
    check_node_pod(deployment)
    check_service_routes(service, deployment)
    check_monitor_scrapes(rendered["ServiceMonitor"], service)
    assert rendered["ServiceMonitor"]["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert (
        rendered["ServiceMonitor"]["spec"]["endpoints"]
        == (manifest("servicemonitor")["spec"]["endpoints"])
    )
    container = node_container(deployment)
    assert container["image"] == "registry.example.com/reactantserver:0.1.0-cuda"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert deployment["spec"]["replicas"] == 2
    volumes = {volume["name"]: volume for volume in pod_spec(deployment)["volumes"]}
    assert volumes["cache"] == {"name": "cache", "emptyDir": {}}
    # The node file: a ConfigMap, mounted, named by the variable the node reads, loadable.
    env = {variable["name"]: variable["value"] for variable in container["env"]}
    assert env["REACTANTSERVER_WORKER_THREADS"] == "4"
    node_path = Path(env[NODE_FILE_VARIABLE])
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == str(node_path.parent)]
    config_map = rendered["ConfigMap"]
    assert volumes[mount["name"]]["configMap"]["name"] == config_map["metadata"]["name"]
    (tmp_path / node_path.name).write_text(config_map["data"][node_path.name])
    node = load_node_config(tmp_path / node_path.name, {})
    assert node.global_settings["logging"] == {"format": "json"}
    assert listen_ports(node) == PORTS
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["example.com/team"] == "inference"
    assert re.fullmatch(r"[0-9a-f]{64}", annotations["checksum/node-file"])
    # The ServingRuntime is the plain one, with the chart's image.
    runtime_spec = rendered["ServingRuntime"]["spec"]
    check_serving_runtime(runtime_spec)
    plain = copy.deepcopy(manifest("servingruntime")["spec"])
    plain["containers"][0]["image"] = container["image"]
    plain["containers"][0]["env"] += ALL_OPTIONS["env"]
    plain["imagePullSecrets"] = ALL_OPTIONS["imagePullSecrets"]
    assert runtime_spec == plain


def test_chart_cpu_pod_and_runtime_only() -> None:
    cpu = by_kind(render_chart({"gpus": 0, "image": {"tag": "cpu"}}))
    limits = node_container(cpu["Deployment"])["resources"]["limits"]
    assert "nvidia.com/gpu" not in limits
    runtime_only = render_chart(
        {"deployment": {"enabled": False}, "servingRuntime": {"enabled": True}}
    )
    assert [document["kind"] for document in runtime_only] == ["ServingRuntime"]


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"gpus": "two"}, "/gpus"),
        ({"replicaCount": -1}, "/replicaCount"),
        ({"containerPorts": {"http": "8000"}}, "/containerPorts/http"),
        ({"service": {"ports": {"rest": 8000}}}, "/service/ports"),
        ({"serviceMonitor": {"enable": True}}, "/serviceMonitor"),
        ({"probes": {"readiness": []}}, "/probes/readiness"),
        ({"unknownOption": 1}, "'unknownOption'"),
    ],
)
def test_chart_refuses_bad_values(values: dict[str, Any], where: str) -> None:
    # values.schema.json: Helm checks the values against it before rendering anything.
    errors = lint_chart(values)["errors"]
    assert any(where in error for error in errors), errors


def test_chart_is_documented() -> None:
    text = (ROOT / "docs" / "deployment.md").read_text()
    assert f"helm install reactantserver {CHART.relative_to(ROOT)}" in text
    assert "kubectl apply -k deploy/k8s" in text
    for option in load_yaml(CHART / "values.yaml"):
        assert f"`{option}" in text, f"docs/deployment.md: the chart's {option} option"
