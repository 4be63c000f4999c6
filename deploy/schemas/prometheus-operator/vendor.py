"""Convert the prometheus-operator ServiceMonitor CRD into the JSON schema the tests use.

Usage (network only for the clone)::

    git clone --depth 1 --branch v0.93.0 \\
        https://github.com/prometheus-operator/prometheus-operator /tmp/po
    .venv/bin/python deploy/schemas/prometheus-operator/vendor.py \\
        /tmp/po/example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml v0.93.0

The CRD's ``openAPIV3Schema`` (OpenAPI 3.0 with Kubernetes extensions) becomes JSON Schema draft
2020-12, validating the way ``kubectl apply`` does with its default strict field validation:

- every object that lists ``properties`` and says nothing about other keys gets
  ``additionalProperties: false`` (the API server rejects unknown fields);
- ``x-kubernetes-int-or-string`` becomes ``anyOf: [integer, string]`` where the CRD has no
  ``anyOf`` already, and ``x-kubernetes-list-type: set`` becomes ``uniqueItems: true``;
- the other ``x-kubernetes-*`` keys (list-map keys, map types) have no JSON Schema counterpart
  and are dropped; the CRD has no CEL rules (``x-kubernetes-validations``), and one would fail
  the conversion rather than be dropped;
- the root pins ``apiVersion`` and ``kind`` and requires them, and ``metadata`` refers to the
  vendored Kubernetes ``ObjectMeta`` (the CRD leaves it a bare object).
Descriptions, defaults, patterns, enums and formats are kept as they are.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

__all__ = ["convert", "main"]

_GROUP_VERSION = "monitoring.coreos.com/v1"
_KIND = "ServiceMonitor"
_OBJECT_META = (
    "https://kubernetes.io/api/_definitions.json"
    "#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
)
_INT_OR_STRING = [{"type": "integer"}, {"type": "string"}]


def _refuse(value: Any, schema: dict[str, Any]) -> dict[str, Any]:
    raise ValueError(f"{sorted(schema)}: a marker with no conversion here; extend vendor.py")


#: Kubernetes markers -> what each becomes (given its value and the node that holds it).
_MARKERS: dict[str, Callable[[Any, dict[str, Any]], dict[str, Any]]] = {
    "x-kubernetes-int-or-string": lambda v, s: {} if "anyOf" in s else {"anyOf": _INT_OR_STRING},
    "x-kubernetes-list-type": lambda v, s: {"uniqueItems": True} if v == "set" else {},
    "x-kubernetes-list-map-keys": lambda v, s: {},
    "x-kubernetes-map-type": lambda v, s: {},
    "x-kubernetes-validations": _refuse,
    "x-kubernetes-preserve-unknown-fields": _refuse,
    "nullable": lambda v, s: _refuse(v, s) if v else {},
}


def _child(key: str, value: Any) -> Any:
    """The value of the ordinary key ``key``, its sub-schemas converted."""
    if key == "properties":
        return {name: _node(child) for name, child in value.items()}
    if key in {"items", "additionalProperties"} and isinstance(value, dict):
        return _node(value)
    if key in {"anyOf", "oneOf", "allOf"}:
        return [_node(child) for child in value]
    return value


def _node(schema: dict[str, Any]) -> dict[str, Any]:
    """One schema node converted, its children first."""
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _MARKERS:
            out.update(_MARKERS[key](value, schema))
        else:
            out[key] = _child(key, value)
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def convert(crd: dict[str, Any], version: str) -> dict[str, Any]:
    """The JSON schema of the CRD's ``v1`` version, tagged with the operator ``version``."""
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    body = _node(served["schema"]["openAPIV3Schema"])
    body["properties"]["apiVersion"] = {"const": _GROUP_VERSION}
    body["properties"]["kind"] = {"const": _KIND}
    body["properties"]["metadata"] = {"$ref": _OBJECT_META}
    body["required"] = ["apiVersion", "kind", "metadata", *body.get("required", [])]
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://reactantserver.invalid/schemas/prometheus-operator/{version}/"
        "servicemonitor-monitoring-v1.json",
        "title": f"ServiceMonitor ({_GROUP_VERSION}), prometheus-operator {version} CRD",
        **body,
    }


def main(argv: list[str]) -> int:
    """Convert the CRD file ``argv[0]`` into ``./<argv[1]>/servicemonitor-monitoring-v1.json``."""
    source, version = Path(argv[0]), argv[1]
    crd = yaml.safe_load(source.read_text())
    target = Path(__file__).resolve().parent / version / "servicemonitor-monitoring-v1.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(convert(crd, version), indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
