"""The container images and Kubernetes / KServe manifests, checked offline.

Docker is not available here, so the Dockerfiles are parsed (a small instruction parser) and
checked instruction by instruction; the manifests validate against the JSON schemas vendored in
deploy/schemas/ through a local registry (no network), then cross-checked against each other, the
images and the node files baked into them.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import attrs
import jsonschema  # type: ignore[import-untyped]
import pytest
import yaml
from referencing import Registry, Resource

from reactantserver.core.config import ListenConfig, load_node_config

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"
K8S = ROOT / "deploy" / "k8s"
SCHEMAS = ROOT / "deploy" / "schemas"
NODE_FILE = "/etc/reactantserver/node.yaml"
CACHE_DIR = "/var/cache/reactantserver"
HEALTH_OPTIONS = {"interval": "30s", "timeout": "20s", "retries": "3", "start-period": "300s"}
# image file -> (baked node file, runtime backend, extra requirement the image must install)
IMAGES = {
    "Dockerfile": ("node-cpu.yaml", "cpu", None),
    "Dockerfile.cuda": ("node-cuda.yaml", "cuda", "reactantserver-worker[cuda12]"),
}
SCHEMA_FILES = {
    ("apps/v1", "Deployment"): "kubernetes/v1.37.0/deployment-apps-v1.json",
    ("v1", "Service"): "kubernetes/v1.37.0/service-v1.json",
    ("serving.kserve.io/v1alpha1", "ServingRuntime"): "kserve/servingruntime-v1alpha1.json",
    ("serving.kserve.io/v1beta1", "InferenceService"): "kserve/inferenceservice-v1beta1.json",
}
MANIFESTS = ("deployment", "service", "servingruntime", "inferenceservice")


# --- Dockerfile parsing ----------------------------------------------------------------------


@attrs.frozen
class Instruction:
    """One Dockerfile instruction: upper-cased keyword, leading ``--flags`` and the rest."""

    keyword: str
    flags: dict[str, str]
    rest: str

    def words(self) -> list[str]:
        """The arguments: the JSON (exec) form when written so, else shell words."""
        if self.rest.startswith("["):
            value: list[str] = json.loads(self.rest)
            return value
        return shlex.split(self.rest)


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions of ``text``: ``\\`` continuations joined, comment lines dropped."""
    instructions: list[Instruction] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and not pending):
            continue  # comments (and parser directives) may sit inside a continuation too
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        logical, pending = pending + line, ""
        if not logical.strip():
            continue
        keyword, _, rest = logical.strip().partition(" ")
        flags: dict[str, str] = {}
        rest = rest.strip()
        while rest.startswith("--"):
            flag, _, rest = rest.partition(" ")
            name, _, value = flag[2:].partition("=")
            flags[name] = value
            rest = rest.strip()
        instructions.append(Instruction(keyword.upper(), flags, rest))
    assert not pending, "dangling line continuation at end of file"
    return instructions


def stages(instructions: list[Instruction]) -> list[list[Instruction]]:
    """The build stages, each starting with its ``FROM``."""
    result: list[list[Instruction]] = []
    for instruction in instructions:
        if instruction.keyword == "FROM":
            result.append([])
        assert result, "instruction before the first FROM"
        result[-1].append(instruction)
    return result


def only(stage: list[Instruction], keyword: str) -> Instruction:
    found = [i for i in stage if i.keyword == keyword]
    assert len(found) == 1, f"expected one {keyword}, found {len(found)}"
    return found[0]


_GLOB = {"**": ".*", "*": "[^/]*", "?": "[^/]"}


def dockerignore_excludes(patterns: list[str], path: str) -> bool:
    """Docker's rule: the last pattern matching ``path`` or one of its parents decides."""
    parts = path.split("/")
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    excluded = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        body = pattern.removeprefix("!").strip("/")
        regex = "".join(
            _GLOB.get(token) or re.escape(token)
            for token in re.split(r"(\*\*|\*|\?)", body)
            if token
        )
        if any(re.fullmatch(regex, candidate) for candidate in candidates):
            excluded = not negated
    return excluded


def ignore_patterns() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def runtime(dockerfile: str) -> list[Instruction]:
    return stages(parse_dockerfile((DOCKER / dockerfile).read_text()))[-1]


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


# --- images ----------------------------------------------------------------------------------


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
    assert only(final, "EXPOSE").words() == ["8001", "8002"]
    health = only(final, "HEALTHCHECK")
    assert health.flags == HEALTH_OPTIONS
    assert health.rest.startswith("CMD ")
    assert json.loads(health.rest.removeprefix("CMD ")) == ["reactantserver-node", "healthcheck"]
    user = only(final, "USER").words()[0].split(":")
    assert user[0].isdigit(), "a numeric uid, so runAsNonRoot can check it"
    assert int(user[0]) != 0
    assert only(final, "VOLUME").words() == [CACHE_DIR]
    env = " ".join(i.rest for i in final if i.keyword == "ENV")
    assert f"REACTANT_CACHE_DIR={CACHE_DIR}" in env.split()
    comments = (DOCKER / dockerfile).read_text()
    for note in ("--shm-size", "--ipc=host", "--stop-timeout", "30 s"):
        assert note in comments


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
        assert (
            node.listen
            == ListenConfig()
            == ListenConfig(http="0.0.0.0:8000", grpc="0.0.0.0:8001", metrics="0.0.0.0:8002")
        )
    assert kserve_path == servingruntime_node_file()


@pytest.mark.parametrize("dockerfile", sorted(IMAGES))
def test_baked_node_files_materialize(dockerfile: str) -> None:
    # The real CLI on the baked file; no device is visible, so the CUDA file falls back to CPU.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REACTANT_", "INFERENCE_"))}
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
    assert plan["node"]["listen"] == {
        "http": "0.0.0.0:8000",
        "grpc": "0.0.0.0:8001",
        "metrics": "0.0.0.0:8002",
    }


# --- manifests -------------------------------------------------------------------------------


def manifest(name: str) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((K8S / f"{name}.yaml").read_text())
    return document


def registry() -> Registry[Any]:
    resources = []
    for path in sorted(SCHEMAS.rglob("*.json")):
        contents = json.loads(path.read_text())
        resources.append((contents["$id"], Resource.from_contents(contents)))
    empty: Registry[Any] = Registry()
    return empty.with_resources(resources)


def validator(name: str) -> Any:
    """A validator for the manifest ``name`` (chosen from the file as written, not as mutated)."""
    document = manifest(name)
    schema = json.loads(
        (SCHEMAS / SCHEMA_FILES[document["apiVersion"], document["kind"]]).read_text()
    )
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, registry=registry())


@pytest.mark.parametrize("name", MANIFESTS)
def test_manifest_validates(name: str) -> None:
    document = manifest(name)
    errors = [
        f"{list(e.absolute_path)}: {e.message}" for e in validator(name).iter_errors(document)
    ]
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
    "storageUri as a number": ("inferenceservice", "spec.predictor.model.storageUri", 3),
    "missing modelFormat": ("inferenceservice", "spec.predictor.model.modelFormat", _DELETE),
    "bad apiVersion": ("inferenceservice", "apiVersion", "serving.kserve.io/v1"),
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_mutated_manifest_fails_validation(mutation: str) -> None:
    name, dotted, value = MUTATIONS[mutation]
    document = copy.deepcopy(manifest(name))
    *parents, last = [int(p) if p.isdigit() else p for p in dotted.split(".")]
    node: Any = document
    for key in parents:
        node = node[key]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    paths = [list(error.absolute_path) for error in validator(name).iter_errors(document)]
    # Rejected, and for this very change: each error sits on the changed key or its parent.
    assert paths
    assert all(path == [*parents, last][: len(path)] for path in paths), paths


def deployment_container() -> dict[str, Any]:
    pod = manifest("deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    value: dict[str, Any] = container
    return value


def test_deployment_matches_the_image_and_the_node() -> None:
    deployment = manifest("deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = deployment_container()
    node = load_node_config(DOCKER / "node-cuda.yaml", {})
    http_port = int(node.listen.metrics.rpartition(":")[2])
    assert http_port == 8002
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"grpc": 8001, "http": 8002}
    expose = {int(p) for p in only(runtime("Dockerfile.cuda"), "EXPOSE").words()}
    assert set(ports.values()) == expose
    probes = {kind: container[kind]["httpGet"] for kind in ("readinessProbe", "livenessProbe")}
    assert probes["readinessProbe"] == {"path": "/readyz", "port": http_port}
    assert probes["livenessProbe"] == {"path": "/healthz", "port": http_port}
    assert container["startupProbe"]["httpGet"]["port"] == http_port
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300  # as the image's
    assert container["resources"]["limits"]["nvidia.com/gpu"] >= 1
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    mounts = {m["mountPath"]: (m, volumes[m["name"]]) for m in container["volumeMounts"]}
    _, shm = mounts["/dev/shm"]
    assert shm["emptyDir"]["medium"] == "Memory"
    assert shm["emptyDir"]["sizeLimit"]
    models_mount, models = mounts["/models"]
    assert models_mount["readOnly"] is True
    assert models["persistentVolumeClaim"]["claimName"]
    assert "persistentVolumeClaim" in mounts[CACHE_DIR][1]
    assert pod["terminationGracePeriodSeconds"] >= 30
    uid = int(only(runtime("Dockerfile.cuda"), "USER").words()[0].split(":")[0])
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == uid
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()


def test_service_routes_to_the_deployment() -> None:
    service, deployment = manifest("service"), manifest("deployment")
    names = {port["name"]: port["containerPort"] for port in deployment_container()["ports"]}
    routed = {port["port"]: port for port in service["spec"]["ports"]}
    assert set(routed) == {8001, 8002}
    assert routed[8001]["appProtocol"] == "grpc"
    for number, port in routed.items():
        assert names[port["targetPort"]] == number
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()


def servingruntime_node_file() -> str:
    (container,) = manifest("servingruntime")["spec"]["containers"]
    env = {variable["name"]: variable["value"] for variable in container["env"]}
    path: str = env["REACTANT_NODE_FILE"]
    return path


def test_kserve_runtime_serves_the_inference_service() -> None:
    runtime_doc, service = manifest("servingruntime"), manifest("inferenceservice")
    spec = runtime_doc["spec"]
    assert spec["supportedModelFormats"] == [
        {"name": "reactantserver-bundle", "version": "3", "autoSelect": True}
    ]
    assert spec["protocolVersions"] == ["grpc-v2"]
    (container,) = spec["containers"]
    assert container["name"] == "kserve-container"
    assert "reactantserver-node" in container["command"]
    assert container["ports"] == [{"containerPort": 8001, "name": "h2c", "protocol": "TCP"}]
    model = service["spec"]["predictor"]["model"]
    assert model["modelFormat"]["name"] == spec["supportedModelFormats"][0]["name"]
    assert model["runtime"] == runtime_doc["metadata"]["name"] == "reactantserver"
    assert model["protocolVersion"] in spec["protocolVersions"]
    assert re.match(r"^[a-z0-9]+://\S+", model["storageUri"])


def test_images_agree_and_kustomization_lists_the_core_objects() -> None:
    image = deployment_container()["image"]
    (runtime_container,) = manifest("servingruntime")["spec"]["containers"]
    assert runtime_container["image"] == image
    assert f"-t {image} ." in (DOCKER / "Dockerfile.cuda").read_text()
    assert f"-t {image} ." in (ROOT / "docs" / "deployment.md").read_text()
    kustomization = manifest("kustomization")
    assert kustomization["resources"] == ["deployment.yaml", "service.yaml"]
    repository, _, tag = image.partition(":")
    assert kustomization["images"] == [{"name": repository, "newTag": tag}]
