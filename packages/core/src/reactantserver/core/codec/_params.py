"""``InferParameter`` values: reading them with type rules, writing Python values back."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping

from reactantserver.core.errors import InvalidArgumentError
from reactantserver.core.protocol import grpc_service_pb2 as pb
from reactantserver.core.types import ParameterValue

_UINT64_LIMIT = 1 << 64
_INT64_MIN = -(1 << 63)


def param_value(param: pb.InferParameter) -> ParameterValue | None:
    """The Python value a parameter carries, or ``None`` when no member of the oneof is set."""
    kind = param.WhichOneof("parameter_choice")
    if kind is None:
        return None
    value: ParameterValue = getattr(param, kind)
    return value


def int_param(params: Mapping[str, pb.InferParameter], key: str, what: str) -> int | None:
    """An integer parameter (``int64_param`` or ``uint64_param``), ``None`` when absent.

    Any other member of the oneof is an ``InvalidArgumentError`` naming ``what`` and ``key``.
    """
    if key not in params:
        return None
    param = params[key]
    kind = param.WhichOneof("parameter_choice")
    if kind == "int64_param":
        return param.int64_param
    if kind == "uint64_param":
        return param.uint64_param
    raise InvalidArgumentError(
        f"{what}: parameter {key!r} must be an int64 or uint64 parameter, got {kind or 'nothing'}"
    )


def string_param(params: Mapping[str, pb.InferParameter], key: str, what: str) -> str | None:
    """A string parameter, ``None`` when absent; another type is an ``InvalidArgumentError``."""
    if key not in params:
        return None
    param = params[key]
    kind = param.WhichOneof("parameter_choice")
    if kind != "string_param":
        raise InvalidArgumentError(
            f"{what}: parameter {key!r} must be a string parameter, got {kind or 'nothing'}"
        )
    return param.string_param


def set_param(params: MutableMapping[str, pb.InferParameter], key: str, value: object) -> None:
    """Store a Python value in the member of the oneof that fits it."""
    # bool first: it is an int subclass but has its own member.
    if isinstance(value, bool):
        params[key].bool_param = value
    elif isinstance(value, int):
        if not _INT64_MIN <= value < _UINT64_LIMIT:
            raise ValueError(f"parameter {key!r}: {value} fits neither int64 nor uint64")
        if value >= 1 << 63:
            params[key].uint64_param = value
        else:
            params[key].int64_param = value
    elif isinstance(value, float):
        params[key].double_param = value
    elif isinstance(value, str):
        params[key].string_param = value
    else:
        raise TypeError(f"parameter {key!r}: unsupported value type {type(value).__name__}")
