"""The codec's short cuts for the common message: raw fixed-size inputs, plain outputs.

Almost every request a client sends carries its inputs in ``raw_input_contents``, asks for
outputs by name only and has no tensor parameters. For those, :func:`plain_inputs` and
:func:`plain_outputs` build exactly what the step-by-step decoder would, in a
fraction of its time; they answer ``None`` for anything else (shared memory, typed contents,
BYTES and BOOL, a size that does not add up, a repeated or missing name), and the caller
then runs the full decoder, which finds and names the problem. So a short cut never decides
an error, and never accepts what the full path would refuse.

:func:`plain_payloads` does the same for encoding: outputs without a shared-memory
destination, of a dtype with a fixed-size wire form.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from reactantserver.core.dtypes import DType
from reactantserver.core.hooks import NamedTensor
from reactantserver.core.protocol import grpc_service_pb2 as pb
from reactantserver.core.types import OutputRequest, ShmRef

__all__ = ["plain_inputs", "plain_outputs", "plain_payloads"]

# Datatype string -> NumPy dtype for the fixed-size types decoded without a check of the
# bytes; None for the rest (BYTES is parsed, BOOL bytes must be 0 or 1, unknown is an error).
_DECODE: dict[str, np.dtype[Any] | None] = {}
# NumPy dtype -> datatype string for encoding; None where the full encoder must decide.
_ENCODE: dict[np.dtype[Any], str | None] = {}


def _decode_dtype(datatype: str) -> np.dtype[Any] | None:
    try:
        return _DECODE[datatype]
    except KeyError:
        pass
    try:
        dtype = DType.from_kserve(datatype)
        found = None if dtype in (DType.BYTES, DType.BOOL) else dtype.numpy
    except ValueError:
        found = None
    if len(_DECODE) < 64:  # only the few names in use get remembered
        _DECODE[datatype] = found
    return found


def _encode_name(dtype: np.dtype[Any]) -> str | None:
    try:
        return _ENCODE[dtype]
    except KeyError:
        pass
    name: str | None = None
    if dtype.kind not in "OSU" and dtype.byteorder != ">":
        try:
            name = DType.from_numpy(dtype).kserve
        except ValueError:
            name = None
    _ENCODE[dtype] = name
    return name


def plain_inputs(msg: pb.ModelInferRequest, max_recv: int) -> list[NamedTensor] | None:
    """The inputs of ``msg`` as zero-copy arrays, if every one is plain raw data, else None.

    Plain: named once, no tensor parameters, no typed contents, one raw entry each whose
    length is exactly what the datatype and shape need, of a fixed-size type other than BOOL.
    """
    tensors = msg.inputs
    raw = msg.raw_input_contents
    if len(raw) != len(tensors):
        return None
    arrays: list[NamedTensor] = []
    names: set[str] = set()
    for tensor, data in zip(tensors, raw, strict=True):
        name = tensor.name
        if not name or name in names or tensor.parameters or tensor.HasField("contents"):
            return None
        names.add(name)
        dtype = _decode_dtype(tensor.datatype)
        if dtype is None:
            return None
        shape = tuple(tensor.shape)
        elements = 1
        for dim in shape:
            if dim < 0:
                return None
            elements *= dim
        nbytes = elements * dtype.itemsize
        if nbytes != len(data) or nbytes > max_recv:
            return None
        arrays.append(NamedTensor(name, np.frombuffer(data, dtype=dtype).reshape(shape)))
    return arrays


def plain_outputs(msg: pb.ModelInferRequest) -> list[OutputRequest] | None:
    """The requested outputs of ``msg``, if each is named once without parameters, else None."""
    outputs: list[OutputRequest] = []
    names: set[str] = set()
    for tensor in msg.outputs:
        name = tensor.name
        if not name or name in names or tensor.parameters:
            return None
        names.add(name)
        outputs.append(OutputRequest(name, None))
    return outputs


def plain_payloads(
    chosen: Sequence[tuple[NamedTensor, ShmRef | None]], msg: pb.ModelInferResponse
) -> bool:
    """Add every chosen output to ``msg`` as raw data, if all are plain; else add none.

    Plain: no shared-memory destination, a NumPy array of a fixed-size wire type in native
    little-endian order. Returns whether it did.
    """
    names: list[str] = []
    for tensor, ref in chosen:
        data = tensor.data
        if ref is not None or type(data) is not np.ndarray:
            return False
        name = _encode_name(data.dtype)
        if name is None:
            return False
        names.append(name)
    for (tensor, _), name in zip(chosen, names, strict=True):
        data = tensor.data
        msg.outputs.add(name=tensor.name, datatype=name, shape=data.shape)
        msg.raw_output_contents.append(data.tobytes())
    return True
