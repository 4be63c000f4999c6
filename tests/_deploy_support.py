"""How tests/test_deploy.py reads its subjects: Dockerfiles, manifests, the Helm chart, schemas.

Docker is not available here, so a Dockerfile is parsed by a small instruction parser. Every
Kubernetes object (a manifest in deploy/, or a document the Helm chart renders) is validated
against the JSON schema vendored for its ``apiVersion`` and ``kind`` in deploy/schemas/, with
``$ref`` resolved through a local registry: nothing is fetched. The chart is linted and rendered
by Helm's own Go code (the ``helm-python-sdk`` wheel, which bundles the Helm v4 SDK as a shared
library), offline.
"""

from __future__ import annotations

import functools
import json
import re
import shlex
from pathlib import Path
from typing import Any

import attrs
import helm_python as helm
import jsonschema  # type: ignore[import-untyped]
import yaml
from referencing import Registry, Resource

__all__ = [
    "CHART",
    "DOCKER",
    "K8S",
    "MONITORING",
    "ROOT",
    "SCHEMAS",
    "SCHEMA_FILES",
    "Instruction",
    "container_port",
    "dockerignore_excludes",
    "ignore_patterns",
    "lint_chart",
    "load_yaml",
    "only",
    "parse_dockerfile",
    "render_chart",
    "runtime",
    "schema_errors",
    "stages",
]

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"
K8S = ROOT / "deploy" / "k8s"
MONITORING = ROOT / "deploy" / "monitoring"
CHART = ROOT / "deploy" / "helm" / "reactantserver"
SCHEMAS = ROOT / "deploy" / "schemas"
#: (apiVersion, kind) -> its schema under deploy/schemas/ (README.md there says where from).
SCHEMA_FILES = {
    ("apps/v1", "Deployment"): "kubernetes/v1.37.0/deployment-apps-v1.json",
    ("v1", "Service"): "kubernetes/v1.37.0/service-v1.json",
    ("v1", "ConfigMap"): "kubernetes/v1.37.0/configmap-v1.json",
    ("serving.kserve.io/v1alpha1", "ServingRuntime"): "kserve/servingruntime-v1alpha1.json",
    ("serving.kserve.io/v1beta1", "InferenceService"): "kserve/inferenceservice-v1beta1.json",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): (
        "prometheus-operator/v0.93.0/servicemonitor-monitoring-v1.json"
    ),
}


# --- Dockerfiles -----------------------------------------------------------------------------


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
    """The one instruction ``keyword`` of ``stage`` (fails on none or several)."""
    found = [i for i in stage if i.keyword == keyword]
    assert len(found) == 1, f"expected one {keyword}, found {len(found)}"
    return found[0]


def runtime(dockerfile: str) -> list[Instruction]:
    """The final (runtime) stage of ``docker/<dockerfile>``."""
    return stages(parse_dockerfile((DOCKER / dockerfile).read_text()))[-1]


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
    """The patterns of the repository's ``.dockerignore``."""
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


# --- Kubernetes objects ----------------------------------------------------------------------


def load_yaml(path: Path) -> dict[str, Any]:
    """The one YAML document of ``path``."""
    document: dict[str, Any] = yaml.safe_load(path.read_text())
    return document


@functools.cache
def _registry() -> Registry[Any]:
    resources = []
    for path in sorted(SCHEMAS.rglob("*.json")):
        contents = json.loads(path.read_text())
        resources.append((contents["$id"], Resource.from_contents(contents)))
    empty: Registry[Any] = Registry()
    return empty.with_resources(resources)


@functools.cache
def _validator(api_version: str, kind: str) -> Any:
    schema = json.loads((SCHEMAS / SCHEMA_FILES[api_version, kind]).read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, registry=_registry())


def schema_errors(document: dict[str, Any], schema_of: dict[str, Any] | None = None) -> list[Any]:
    """Every schema error of ``document``, checked against the schema of ``schema_of``'s kind.

    ``schema_of`` defaults to ``document``: a mutated document is still judged by the schema of
    the kind it was written as.
    """
    chosen = document if schema_of is None else schema_of
    validator = _validator(chosen["apiVersion"], chosen["kind"])
    return list(validator.iter_errors(document))


def container_port(container: dict[str, Any], port: int | str) -> int:
    """The number of ``port``, a number or the name of one of ``container``'s ports."""
    if isinstance(port, int):
        return port
    (number,) = [p["containerPort"] for p in container["ports"] if p.get("name") == port]
    value: int = number
    return value


# --- the Helm chart --------------------------------------------------------------------------


def lint_chart(values: dict[str, Any] | None = None) -> dict[str, Any]:
    """``helm lint --strict`` of the chart with ``values``: Helm's report as data."""
    return helm.lint(CHART, values, strict=True)


def render_chart(
    values: dict[str, Any] | None = None, release: str = "reactantserver"
) -> list[dict[str, Any]]:
    """``helm template`` of the chart: every rendered Kubernetes object, in template order."""
    with helm.Chart.load(CHART) as chart:
        rendered = chart.render(values, name=release, namespace="inference")
    documents: list[dict[str, Any]] = []
    for path in sorted(rendered):
        if path.endswith(".yaml"):
            documents.extend(d for d in yaml.safe_load_all(rendered[path]) if d is not None)
    return documents
