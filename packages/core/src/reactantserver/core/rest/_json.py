"""JSON <-> protobuf for REST: messages as Triton prints them, parameters both ways.

Messages print with their ``.proto`` field names, 64-bit integers as JSON numbers (not the
strings ``json_format`` writes), enums by name and bytes as base64; unset fields that have
presence are left out, and fields at their default only with ``defaults=True``.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Mapping, MutableMapping
from typing import Any

import grpc
import numpy as np
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from reactantserver.core.codec._params import set_param
from reactantserver.core.protocol import grpc_service_pb2 as pb
from reactantserver.core.rest._types import RestCallError

__all__ = [
    "bad_request",
    "infer_parameter",
    "json_type",
    "message_to_json",
    "parse_json_object",
    "require_int",
]


def bad_request(message: str) -> RestCallError:
    """The error for a malformed HTTP request (``INVALID_ARGUMENT`` → 400)."""
    return RestCallError(grpc.StatusCode.INVALID_ARGUMENT, message)


def message_to_json(message: Message, *, defaults: bool = False) -> dict[str, Any]:
    """``message`` as a JSON-ready dict (see the module docstring for the conventions)."""
    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            if value or defaults:
                value_field = field.message_type.fields_by_name["value"]
                out[field.name] = {
                    str(key): _field_value(value_field, value[key], defaults)
                    for key in sorted(value)
                }
        elif field.is_repeated:
            if value or defaults:
                out[field.name] = [_field_value(field, item, defaults) for item in value]
        elif field.has_presence:
            if message.HasField(field.name):
                out[field.name] = _field_value(field, value, defaults)
        elif defaults or value != field.default_value:
            out[field.name] = _field_value(field, value, defaults)
    return out


def _field_value(field: Any, value: Any, defaults: bool) -> Any:
    kind = field.type
    if kind == FieldDescriptor.TYPE_MESSAGE:
        return message_to_json(value, defaults=defaults)
    if kind == FieldDescriptor.TYPE_ENUM:
        number = field.enum_type.values_by_number.get(value)
        return value if number is None else number.name
    if kind == FieldDescriptor.TYPE_BYTES:
        return base64.b64encode(value).decode("ascii")
    if kind in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE):
        return _float(value, single=kind == FieldDescriptor.TYPE_FLOAT)
    return value


def _float(value: float, *, single: bool) -> float | str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    # float32 fields print at float32 precision (0.1, not 0.10000000149011612).
    return float(str(np.float32(value))) if single else value


def infer_parameter(
    params: MutableMapping[str, pb.InferParameter], key: str, value: object, what: str
) -> None:
    """Store a JSON parameter value as the ``InferParameter`` a gRPC client would send.

    bool → ``bool_param``, int → ``int64_param`` (``uint64_param`` past int64), float →
    ``double_param``, str → ``string_param`` (``set_param``); anything else is a 400 naming
    ``what``.
    """
    try:
        set_param(params, key, value)
    except ValueError:
        raise bad_request(
            f"{what}: parameter {key!r} ({value}) fits neither int64 nor uint64"
        ) from None
    except TypeError:
        raise bad_request(
            f"{what}: parameter {key!r} must be a bool, number or string, got {json_type(value)}"
        ) from None


def parse_json_object(body: bytes, what: str, *, empty_ok: bool = True) -> dict[str, Any]:
    """``body`` as a JSON object (an empty body is ``{}`` when ``empty_ok``); else a 400."""
    if not body.strip() and empty_ok:
        return {}
    try:
        value = json.loads(body)
    except (UnicodeDecodeError, ValueError) as exc:
        raise bad_request(f"{what}: malformed JSON: {exc}") from None
    if not isinstance(value, dict):
        raise bad_request(f"{what}: expected a JSON object, got {json_type(value)}")
    return value


def require_int(
    obj: Mapping[str, Any], key: str, what: str, *, default: int | None = None, limit: int = 64
) -> int:
    """A non-negative integer member that fits an unsigned ``limit``-bit field; else a 400."""
    value = obj.get(key, default)
    if value is None:
        raise bad_request(f"{what}: missing {key!r}")
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"{what}: {key!r} must be an integer, got {json_type(value)}")
    if not 0 <= value < 1 << limit:
        raise bad_request(f"{what}: {key!r} ({value}) is out of range")
    return value


def json_type(value: object) -> str:
    """How a JSON value is named in error messages (``"an array"``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"
