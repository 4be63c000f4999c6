"""Tensor declarations with axis letters, and the ``NAME=DTYPE[AXES]`` syntax of ``--input``.

A manifest names every axis with a letter; :class:`TensorDecl` carries
the letters next to the sizes, so the exporter writes exactly what the user asked for::

    TensorDecl.parse("image=f32[n,c=3,h=224,w=224]").letters   # "nchw"
    TensorDecl.parse("x=f32[n,16]").letters                    # "na" (auto letter for 16)
    TensorDecl.parse("tokens=i32[n,l=-1]").variable_letters    # ("l",)
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from reactantserver.core.dtypes import DType
from reactantserver.core.types import Batch, Dim, Fixed, TensorSpec, Variable
from reactantserver.export._errors import ExportError

__all__ = ["AUTO_LETTERS", "BATCH_LETTER", "TensorDecl", "as_decl", "as_decls", "parse_tensor_spec"]

BATCH_LETTER = "n"
"""The letter of the batch axis."""

AUTO_LETTERS = "abcdefghijklmopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
"""Letters handed to axes given without one, in this order (never ``n``, the batch letter)."""

_SPEC = re.compile(r"\s*([^=\s\[\]]+)\s*=\s*([A-Za-z0-9_]+)\s*\[(.*)\]\s*")
_NAMED = re.compile(r"([A-Za-z])\s*=\s*([+-]?\d+)")
_BARE_SIZE = re.compile(r"\d+")
_LETTER = re.compile(r"[A-Za-z]")


def _render_dim(letter: str, dim: Dim) -> str:
    if isinstance(dim, Batch):
        return letter
    if isinstance(dim, Variable):
        return f"{letter}=-1"
    return f"{letter}={dim.size}"


@attrs.frozen
class TensorDecl:
    """A tensor as a manifest declares it: name, dtype and one letter + extent per axis.

    ``letters`` are row-major; ``n`` marks the batch axis (:class:`Batch`), every other letter
    a :class:`Fixed` or :class:`Variable` extent. Build one with :meth:`parse`,
    :meth:`from_spec` or directly.
    """

    name: str
    dtype: DType
    letters: str
    dims: tuple[Dim, ...]

    def __attrs_post_init__(self) -> None:
        where = f"tensor {self.name!r}"
        if not self.name:
            raise ExportError("a tensor needs a non-empty name")
        if len(self.letters) != len(self.dims):
            raise ExportError(
                f"{where}: {len(self.letters)} axis letters for {len(self.dims)} axes"
            )
        if len(set(self.letters)) != len(self.letters):
            raise ExportError(f"{where}: axis letters {self.letters!r} repeat a letter")
        for letter, dim in zip(self.letters, self.dims, strict=True):
            if not _LETTER.fullmatch(letter):
                raise ExportError(f"{where}: axis letter {letter!r} is not an ASCII letter")
            if (letter == BATCH_LETTER) != isinstance(dim, Batch):
                raise ExportError(
                    f"{where}: the batch axis must use the letter {BATCH_LETTER!r} "
                    f"and only it (axis {letter!r} is {dim})"
                )
            if isinstance(dim, Fixed) and dim.size <= 0:
                raise ExportError(f"{where}: axis {letter!r} has size {dim.size}, must be > 0")

    # -- construction ------------------------------------------------------------------------

    @classmethod
    def parse(cls, text: str) -> TensorDecl:
        """Parse ``NAME=DTYPE[AXES]``.

        AXES is a comma-separated list of ``n`` (the batch axis), ``letter=size`` (a fixed
        axis), ``letter=-1`` (a variable axis, sized per variant) or a bare ``size`` (a fixed
        axis that gets the next free letter of :data:`AUTO_LETTERS`); ``[]`` is a scalar.
        """
        match = _SPEC.fullmatch(text)
        if match is None:
            raise ExportError(
                f"tensor spec {text!r}: expected NAME=DTYPE[AXES], e.g. x=f32[n,16] "
                "or image=f32[n,c=3,h=224,w=224]"
            )
        name, token, body = match.groups()
        try:
            dtype = DType.from_token(token)
        except ValueError as exc:
            raise ExportError(f"tensor spec {text!r}: {exc}") from None
        items = [item.strip() for item in body.split(",")] if body.strip() else []
        letters: list[str | None] = []
        dims: list[Dim] = []
        for item in items:
            letter, dim = _parse_axis(text, item)
            letters.append(letter)
            dims.append(dim)
        try:
            return cls(name, dtype, _fill_letters(letters), tuple(dims))
        except ExportError as exc:
            raise ExportError(f"tensor spec {text!r}: {exc}") from None

    @classmethod
    def from_spec(cls, spec: TensorSpec) -> TensorDecl:
        """A declaration for a core :class:`TensorSpec`: ``n`` for the batch axis, auto letters
        for the others."""
        letters = [BATCH_LETTER if isinstance(d, Batch) else None for d in spec.shape]
        return cls(spec.name, spec.dtype, _fill_letters(letters), tuple(spec.shape))

    @classmethod
    def from_extents(
        cls,
        name: str,
        dtype: DType,
        extents: Sequence[int],
        *,
        batch_axis: int | None = None,
        variable_axes: Iterable[int] = (),
    ) -> TensorDecl:
        """A declaration for observed extents (auto letters): the batch axis becomes ``n``,
        ``variable_axes`` become ``-1``, every other axis keeps its size."""
        variable = set(variable_axes)
        dims: list[Dim] = []
        for axis, size in enumerate(extents):
            if axis == batch_axis:
                dims.append(Batch())
            elif axis in variable:
                dims.append(Variable())
            else:
                dims.append(Fixed(int(size)))
        return cls.from_spec(TensorSpec(name, dtype, tuple(dims)))

    # -- facts -------------------------------------------------------------------------------

    @property
    def spec(self) -> TensorSpec:
        """The core :class:`TensorSpec` (letters dropped)."""
        return TensorSpec(self.name, self.dtype, self.dims)

    @property
    def rank(self) -> int:
        """The number of axes."""
        return len(self.dims)

    @property
    def batch_axis(self) -> int | None:
        """The row-major position of the batch axis, or ``None``."""
        return self.spec.batch_axis

    @property
    def variable_letters(self) -> tuple[str, ...]:
        """The letters of the VARIABLE axes, row-major."""
        return tuple(
            letter
            for letter, dim in zip(self.letters, self.dims, strict=True)
            if isinstance(dim, Variable)
        )

    def concrete_shape(self, batch_size: int, sizes: Mapping[str, int]) -> tuple[int, ...]:
        """The extents for one compiled module: ``batch_size`` on the batch axis and
        ``sizes[letter]`` on each variable axis."""
        shape: list[int] = []
        for letter, dim in zip(self.letters, self.dims, strict=True):
            if isinstance(dim, Batch):
                shape.append(batch_size)
            elif isinstance(dim, Variable):
                if letter not in sizes:
                    raise ExportError(
                        f"tensor {self.name!r}: no size for variable axis {letter!r} "
                        "(give it in every --variant)"
                    )
                shape.append(int(sizes[letter]))
            else:
                shape.append(dim.size)
        return tuple(shape)

    def manifest_entry(self) -> dict[str, Any]:
        """The tensor entry of ``manifest.yaml`` (``dims`` left out when empty)."""
        entry: dict[str, Any] = {
            "name": self.name,
            "dtype": self.dtype.token,
            "shape": self.letters,
        }
        dims = {
            letter: (-1 if isinstance(dim, Variable) else dim.size)
            for letter, dim in zip(self.letters, self.dims, strict=True)
            if not isinstance(dim, Batch)
        }
        if dims:
            entry["dims"] = dims
        return entry

    def __str__(self) -> str:
        axes = ",".join(_render_dim(c, d) for c, d in zip(self.letters, self.dims, strict=True))
        return f"{self.name}={self.dtype.token}[{axes}]"


def _parse_axis(text: str, item: str) -> tuple[str | None, Dim]:
    where = f"tensor spec {text!r}: axis {item!r}"
    if item == BATCH_LETTER:
        return BATCH_LETTER, Batch()
    if _BARE_SIZE.fullmatch(item):
        size = int(item)
        if size <= 0:
            raise ExportError(f"{where}: a size must be > 0")
        return None, Fixed(size)
    named = _NAMED.fullmatch(item)
    if named is not None:
        letter, raw = named[1], int(named[2])
        if letter == BATCH_LETTER:
            raise ExportError(f"{where}: {BATCH_LETTER!r} is the batch axis and takes no size")
        if raw == -1:
            return letter, Variable()
        if raw <= 0:
            raise ExportError(f"{where}: a size must be > 0, or -1 for a variable axis")
        return letter, Fixed(raw)
    if _LETTER.fullmatch(item):
        raise ExportError(
            f"{where}: a lettered axis needs a size ({item}=SIZE, or {item}=-1 for a variable "
            f"axis); only {BATCH_LETTER!r} (the batch axis) stands alone"
        )
    if item == "-1":
        raise ExportError(f"{where}: a variable axis needs a letter (e.g. l=-1)")
    raise ExportError(f"{where}: expected n, LETTER=SIZE, LETTER=-1 or SIZE")


def _fill_letters(letters: Sequence[str | None]) -> str:
    used = {letter for letter in letters if letter is not None}
    free = iter(c for c in AUTO_LETTERS if c not in used)
    out = []
    for letter in letters:
        try:
            out.append(letter if letter is not None else next(free))
        except StopIteration:
            raise ExportError("a tensor has more axes than there are axis letters") from None
    return "".join(out)


def parse_tensor_spec(text: str) -> TensorDecl:
    """Parse ``NAME=DTYPE[AXES]`` (the ``--input`` syntax); see :meth:`TensorDecl.parse`."""
    return TensorDecl.parse(text)


def as_decl(value: TensorDecl | TensorSpec | str) -> TensorDecl:
    """A :class:`TensorDecl` from a declaration, a core ``TensorSpec`` or spec text."""
    if isinstance(value, TensorDecl):
        return value
    if isinstance(value, TensorSpec):
        return TensorDecl.from_spec(value)
    if isinstance(value, str):
        return TensorDecl.parse(value)
    raise ExportError(f"expected a tensor declaration or NAME=DTYPE[AXES], got {value!r}")


def as_decls(values: Iterable[TensorDecl | TensorSpec | str], what: str) -> tuple[TensorDecl, ...]:
    """Declarations for a list of tensors; names must be unique within the list."""
    decls = tuple(as_decl(v) for v in values)
    seen: set[str] = set()
    for decl in decls:
        if decl.name in seen:
            raise ExportError(f"{what}: tensor name {decl.name!r} is used twice")
        seen.add(decl.name)
    return decls
