"""Re-vendor the Kubernetes JSON schemas the deployment tests validate against.

Usage (network only for the download)::

    .venv/bin/pip download --no-deps -d /tmp/kv kubernetes-validate==1.37.0
    unzip -q -o /tmp/kv/kubernetes_validate-1.37.0-py3-none-any.whl -d /tmp/kv/x
    .venv/bin/python deploy/schemas/kubernetes/vendor.py \
        /tmp/kv/x/kubernetes_validate/kubernetes-json-schema/v1.37.0-local-strict v1.37.0

The kind schemas are copied byte for byte; ``_definitions.json`` keeps only the definitions the
kinds reach through ``$ref`` (each one unchanged), so the repository holds ~0.3 MB, not 1.8 MB.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["KINDS", "main", "reachable"]

#: The kind schemas our manifests and the Helm chart need (deploy/k8s, deploy/helm).
KINDS = ("configmap-v1.json", "deployment-apps-v1.json", "service-v1.json")
_DEFS = "_definitions.json"


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


def reachable(roots: list[Any], definitions: dict[str, Any]) -> list[str]:
    """Names of the ``$defs`` entries reachable from ``roots``, in the source's order."""
    pending = [ref for root in roots for ref in _refs(root)]
    seen: set[str] = set()
    while pending:
        name = pending.pop().rpartition("/$defs/")[2]
        if name not in seen:
            seen.add(name)
            pending.extend(_refs(definitions[name]))
    return [name for name in definitions if name in seen]


def main(argv: list[str]) -> int:
    """Copy ``KINDS`` from the source folder ``argv[0]`` into ``./<argv[1]>/``."""
    source, version = Path(argv[0]), argv[1]
    target = Path(__file__).resolve().parent / version
    target.mkdir(parents=True, exist_ok=True)
    everything = json.loads((source / _DEFS).read_text())
    definitions = everything["$defs"]
    kinds = [json.loads((source / kind).read_text()) for kind in KINDS]
    for kind in KINDS:
        shutil.copyfile(source / kind, target / kind)
    pruned = {key: value for key, value in everything.items() if key != "$defs"}
    pruned["$defs"] = {name: definitions[name] for name in reachable(kinds, definitions)}
    (target / _DEFS).write_text(json.dumps(pruned, indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {len(KINDS)} kinds and {len(pruned['$defs'])} definitions to {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
