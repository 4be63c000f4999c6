"""Dump one side's inference-protocol descriptors as JSON on stdout.

``python _descriptor_dump.py tritonclient`` dumps the installed tritonclient's;
``python _descriptor_dump.py ours`` dumps reactantserver.core's. Each side runs in its
own process so neither descriptor pool can influence the other. Names are written
relative to the side's proto package, so ``inference.X`` and ``reactantserver.kserve.v2.X``
compare equal.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from google.protobuf import descriptor_pb2


def _relative(name: str, package: str) -> str:
    name = name.lstrip(".")
    return name[len(package) + 1 :] if name.startswith(package + ".") else name


def _message(
    msg: descriptor_pb2.DescriptorProto, prefix: str, package: str, out: dict[str, Any]
) -> None:
    full = f"{prefix}{msg.name}"
    fields = []
    for f in msg.field:
        synthetic = f.proto3_optional
        oneof = (
            msg.oneof_decl[f.oneof_index].name
            if f.HasField("oneof_index") and not synthetic
            else ""
        )
        fields.append(
            {
                "name": f.name,
                "number": f.number,
                "type": descriptor_pb2.FieldDescriptorProto.Type.Name(f.type),
                "label": descriptor_pb2.FieldDescriptorProto.Label.Name(f.label),
                "proto3_optional": f.proto3_optional,
                "type_name": _relative(f.type_name, package),
                "oneof": oneof,
            }
        )
    out["messages"][full] = {"fields": fields, "map_entry": msg.options.map_entry}
    for e in msg.enum_type:
        _enum(e, full + ".", out)
    for nested in msg.nested_type:
        _message(nested, full + ".", package, out)


def _enum(enum: descriptor_pb2.EnumDescriptorProto, prefix: str, out: dict[str, Any]) -> None:
    out["enums"][f"{prefix}{enum.name}"] = [[v.name, v.number] for v in enum.value]


def dump(modules: list[Any], paths: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {"messages": {}, "enums": {}, "methods": {}}
    for module in modules:
        fdp = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(fdp)
        package = fdp.package
        for e in fdp.enum_type:
            _enum(e, "", out)
        for m in fdp.message_type:
            _message(m, "", package, out)
        for service in fdp.service:
            for method in service.method:
                out["methods"][method.name] = {
                    "path": paths[method.name],
                    "input": _relative(method.input_type, package),
                    "output": _relative(method.output_type, package),
                    "client_streaming": method.client_streaming,
                    "server_streaming": method.server_streaming,
                }
    return out


def main(side: str) -> None:
    if side == "tritonclient":
        from tritonclient.grpc import model_config_pb2, service_pb2

        service = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
        paths = {m.name: f"/{service.full_name}/{m.name}" for m in service.methods}
        result = dump([model_config_pb2, service_pb2], paths)
    else:
        from reactantserver.core import protocol

        paths = {name: m.path for name, m in protocol.INFERENCE_METHODS.items()}
        result = dump([protocol.model_config_pb2, protocol.grpc_service_pb2], paths)
    loaded = sorted(m for m in sys.modules if m.startswith(("tritonclient", "reactantserver")))
    json.dump({"dump": result, "loaded": loaded}, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1])
