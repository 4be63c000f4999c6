"""Element types: manifest tokens, NumPy dtypes, KServe datatypes, safetensors dtypes.

One :class:`DType` member per manifest token::

    DType.from_kserve("FP32").numpy   # dtype('float32')
    DType.from_token("bf16").itemsize  # 2
"""

from __future__ import annotations

import enum
import functools
from typing import Any

import numpy as np

__all__ = ["DType"]


class DType(enum.Enum):
    """An element type, named by its manifest token."""

    BOOL = "bool"
    U8 = "u8"
    U16 = "u16"
    U32 = "u32"
    U64 = "u64"
    I8 = "i8"
    I16 = "i16"
    I32 = "i32"
    I64 = "i64"
    F16 = "f16"
    F32 = "f32"
    F64 = "f64"
    BF16 = "bf16"
    F8_E5M2 = "f8_e5m2"
    F8_E4M3 = "f8_e4m3"
    BYTES = "bytes"

    @property
    def token(self) -> str:
        """The manifest token (``"f32"``)."""
        return self.value

    @classmethod
    def from_token(cls, token: str) -> DType:
        """The member for a manifest token; ``ValueError`` for anything else."""
        try:
            return cls(token)
        except ValueError:
            known = ", ".join(m.value for m in cls)
            raise ValueError(f"unknown dtype token {token!r} (expected one of: {known})") from None

    @property
    def kserve(self) -> str:
        """The KServe V2 datatype string; ``ValueError`` for the FP8 types (not on the wire)."""
        name = _KSERVE.get(self)
        if name is None:
            raise ValueError(f"{self.token} has no KServe datatype (executable-internal only)")
        return name

    @classmethod
    def from_kserve(cls, datatype: str) -> DType:
        """The member for a KServe datatype string (``"FP32"``); ``ValueError`` if unknown."""
        member = _FROM_KSERVE.get(datatype)
        if member is None:
            raise ValueError(f"unknown datatype {datatype!r}")
        return member

    @property
    def safetensors(self) -> str:
        """The safetensors dtype string; ``ValueError`` for ``bytes``."""
        if self is DType.BYTES:
            raise ValueError("bytes tensors cannot be stored in safetensors")
        return _SAFETENSORS[self]

    @classmethod
    def from_safetensors(cls, dtype: str) -> DType:
        """The member for a safetensors dtype string (``"F32"``); ``ValueError`` if unknown."""
        for member, name in _SAFETENSORS.items():
            if name == dtype:
                return member
        raise ValueError(f"unsupported safetensors dtype {dtype!r}")

    @property
    def mlir(self) -> str:
        """The MLIR/StableHLO element type (``"f32"``, ``"i1"``); ``ValueError`` for ``bytes``."""
        if self is DType.BYTES:
            raise ValueError("bytes tensors have no MLIR element type")
        return _MLIR[self]

    @classmethod
    def from_mlir(cls, element_type: str) -> DType:
        """The member for an MLIR element type string; ``ValueError`` if unsupported."""
        for member, name in _MLIR.items():
            if name == element_type:
                return member
        raise ValueError(f"unsupported MLIR element type {element_type!r}")

    @property
    def itemsize(self) -> int:
        """Bytes per element; 0 for ``bytes`` (variable length)."""
        return _ITEMSIZE[self]

    @property
    def numpy(self) -> np.dtype[Any]:
        """The NumPy dtype.

        ``bf16`` and the FP8 types come from ``ml_dtypes`` when it is installed (it always
        is next to jax); without it ``bf16`` is carried as ``uint16`` bit patterns and the
        FP8 types raise ``ValueError``.
        """
        return _numpy_dtype(self)

    @classmethod
    def from_numpy(cls, dtype: Any) -> DType:
        """The member for a NumPy dtype (or anything ``np.dtype`` accepts)."""
        dt = dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)
        member = _numpy_index().get(dt)
        if member is not None:
            return member
        if dt.kind in "OSU":
            return DType.BYTES
        raise ValueError(f"no dtype token for NumPy dtype {dt}")


_KSERVE: dict[DType, str] = {
    DType.BOOL: "BOOL",
    DType.U8: "UINT8",
    DType.U16: "UINT16",
    DType.U32: "UINT32",
    DType.U64: "UINT64",
    DType.I8: "INT8",
    DType.I16: "INT16",
    DType.I32: "INT32",
    DType.I64: "INT64",
    DType.F16: "FP16",
    DType.F32: "FP32",
    DType.F64: "FP64",
    DType.BF16: "BF16",
    DType.BYTES: "BYTES",
}
_FROM_KSERVE = {name: member for member, name in _KSERVE.items()}

_SAFETENSORS: dict[DType, str] = {
    DType.BOOL: "BOOL",
    DType.U8: "U8",
    DType.U16: "U16",
    DType.U32: "U32",
    DType.U64: "U64",
    DType.I8: "I8",
    DType.I16: "I16",
    DType.I32: "I32",
    DType.I64: "I64",
    DType.F16: "F16",
    DType.F32: "F32",
    DType.F64: "F64",
    DType.BF16: "BF16",
    DType.F8_E5M2: "F8_E5M2",
    DType.F8_E4M3: "F8_E4M3",
}

_MLIR: dict[DType, str] = {
    DType.BOOL: "i1",
    DType.U8: "ui8",
    DType.U16: "ui16",
    DType.U32: "ui32",
    DType.U64: "ui64",
    DType.I8: "i8",
    DType.I16: "i16",
    DType.I32: "i32",
    DType.I64: "i64",
    DType.F16: "f16",
    DType.F32: "f32",
    DType.F64: "f64",
    DType.BF16: "bf16",
    DType.F8_E5M2: "f8E5M2",
    DType.F8_E4M3: "f8E4M3FN",
}

_ITEMSIZE: dict[DType, int] = {
    DType.BOOL: 1,
    DType.U8: 1,
    DType.U16: 2,
    DType.U32: 4,
    DType.U64: 8,
    DType.I8: 1,
    DType.I16: 2,
    DType.I32: 4,
    DType.I64: 8,
    DType.F16: 2,
    DType.F32: 4,
    DType.F64: 8,
    DType.BF16: 2,
    DType.F8_E5M2: 1,
    DType.F8_E4M3: 1,
    DType.BYTES: 0,
}

_PLAIN: dict[DType, str] = {
    DType.BOOL: "bool",
    DType.U8: "uint8",
    DType.U16: "uint16",
    DType.U32: "uint32",
    DType.U64: "uint64",
    DType.I8: "int8",
    DType.I16: "int16",
    DType.I32: "int32",
    DType.I64: "int64",
    DType.F16: "float16",
    DType.F32: "float32",
    DType.F64: "float64",
    DType.BYTES: "object",
}

_ML_DTYPES_NAMES = {
    DType.BF16: "bfloat16",
    DType.F8_E5M2: "float8_e5m2",
    DType.F8_E4M3: "float8_e4m3fn",
}


@functools.cache
def _numpy_dtype(member: DType) -> np.dtype[Any]:
    plain = _PLAIN.get(member)
    if plain is not None:
        return np.dtype(plain).newbyteorder("<") if member.itemsize > 1 else np.dtype(plain)
    try:
        import ml_dtypes
    except ImportError:
        if member is DType.BF16:
            return np.dtype("<u2")
        raise ValueError(f"{member.token} needs the ml_dtypes package") from None
    scalar_type: type[Any] = getattr(ml_dtypes, _ML_DTYPES_NAMES[member])
    return np.dtype(scalar_type)


@functools.cache
def _numpy_index() -> dict[np.dtype[Any], DType]:
    """NumPy dtype → member, built once (first member wins, as the manifest order says)."""
    index: dict[np.dtype[Any], DType] = {}
    for member in DType:
        if member is DType.BYTES:
            continue
        try:
            index.setdefault(_numpy_dtype(member), member)
        except ValueError:
            continue
    return index
