"""Hypothesis strategies for everything around the tensors: outputs, parameters, SHM, model.

Statuses per 05 and 02: a bad parameter
type is ``INVALID_ARGUMENT``, unknown keys are ignored, non-positive timeouts mean "no
deadline"; an unregistered region is ``FAILED_PRECONDITION``, a range outside a registered one
``INVALID_ARGUMENT``; an unknown model or version is ``NOT_FOUND``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
from hypothesis import strategies as st

from ._requests import (
    DEADLINE,
    FEATURES,
    INVALID,
    LOGITS,
    NOT_FOUND,
    OK,
    PRECONDITION,
    SERVED,
    Mutation,
    first_input,
)

MAX_BUDGET_NS = 10 * 365 * 24 * 3600 * 10**9
"""Budgets longer than 10 years mean "no deadline"."""
SAFE_BUDGET_NS = 5 * 10**9
"""A budget this long never expires on a request to an idle worker."""

SHM_IN = ("fz_in", 4096)
SHM_OUT = ("fz_out", 4096)
SHM_SMALL = ("fz_small", 64)
"""The registered regions (name, byte size) the fixture creates in ``/dev/shm``."""
REGISTERED = dict([SHM_IN, SHM_OUT, SHM_SMALL])

_SHM_KEYS = ("shared_memory_region", "shared_memory_offset", "shared_memory_byte_size")
_INVALID = frozenset({INVALID})


@attrs.frozen
class Param:
    """One ``InferParameter``: which member of the oneof is set (``None``: none) and its value."""

    kind: str | None
    value: Any

    def store(self, params: Any, key: str) -> None:
        """Write this parameter under ``key`` of a protobuf parameter map."""
        if self.kind is None:
            params[key].Clear()  # present, with no member set
        else:
            setattr(params[key], self.kind, self.value)


PARAMS = st.one_of(
    st.builds(Param, st.just("int64_param"), st.integers(-(1 << 63), (1 << 63) - 1)),
    st.builds(Param, st.just("int64_param"), st.integers(-10, 10**7)),
    st.builds(Param, st.just("uint64_param"), st.integers(0, (1 << 64) - 1)),
    st.builds(Param, st.just("bool_param"), st.booleans()),
    st.builds(Param, st.just("string_param"), st.text(max_size=6)),
    st.builds(Param, st.just("double_param"), st.floats(allow_nan=True)),
    st.builds(Param, st.none(), st.none()),
)
_INTS = ("int64_param", "uint64_param")


def _budget(param: Param, unit_ns: int) -> frozenset[str]:
    if param.kind not in _INTS:
        return _INVALID
    budget = param.value * unit_ns
    if budget <= 0 or budget > MAX_BUDGET_NS or budget >= SAFE_BUDGET_NS:
        return frozenset({OK})
    return frozenset({OK, DEADLINE})


def parameter_statuses(key: str, param: Param) -> frozenset[str]:
    """What the protocol says a request-level parameter ``key`` with this value leads to."""
    if key == "timeout":
        return _budget(param, 1000)
    if key == "reactant_timeout_ns":
        return _budget(param, 1)
    if key == "priority":
        if param.kind == "uint64_param" or (param.kind == "int64_param" and param.value >= 0):
            return frozenset({OK})
        return _INVALID
    if key == "sequence_id":
        return frozenset({OK if param.value in (None, 0, "") else INVALID})
    return frozenset({OK})  # sequence_start/_end, binary_data_output and unknown keys


_REQUEST_KEYS = st.one_of(
    st.sampled_from(
        [
            "timeout",
            "reactant_timeout_ns",
            "priority",
            "sequence_id",
            "sequence_start",
            "sequence_end",
            "binary_data_output",
        ]
    ),
    st.text(max_size=12),
)
_TENSOR_KEYS = st.one_of(st.just("binary_data"), st.text(max_size=12)).filter(
    lambda key: key not in (*_SHM_KEYS, "classification")
)


@st.composite
def parameters(draw: st.DrawFn) -> Mutation:
    """Request parameters of any type under known and unknown keys, plus ignored tensor ones."""
    chosen = draw(st.dictionaries(_REQUEST_KEYS, PARAMS, min_size=1, max_size=3))
    on_input = draw(st.dictionaries(_TENSOR_KEYS, PARAMS, max_size=2))
    statuses = [parameter_statuses(key, param) for key, param in chosen.items()]
    # A rejected parameter rejects the request; otherwise any of the allowed outcomes.
    rejected = any(OK not in s for s in statuses)
    expected = _INVALID if rejected else frozenset().union(*statuses)

    def apply(request: Any) -> None:
        for key, param in chosen.items():
            param.store(request.parameters, key)
        x = first_input(request)
        for key, param in on_input.items():
            param.store(x.parameters, key)

    return Mutation(f"parameters {chosen} input {on_input}", apply, expected)


@st.composite
def outputs(draw: st.DrawFn) -> Mutation:
    """Requested outputs: known, unknown, unnamed or repeated names, with tensor parameters."""
    names = draw(st.lists(st.one_of(st.just("logits"), st.text(max_size=6)), max_size=4))
    extra = draw(st.sampled_from(["none", "binary_data", "unknown", "classification", "stray"]))
    good = all(n == "logits" for n in names) and len(names) <= 1
    expected = frozenset({OK if good and extra in ("none", "binary_data", "unknown") else INVALID})
    if extra in ("classification", "stray") and not names:
        expected = frozenset({OK})  # no requested output carries the parameter

    def apply(request: Any) -> None:
        for name in names:
            wanted = request.outputs.add(name=name)
            if extra == "binary_data":
                wanted.parameters["binary_data"].bool_param = True
            elif extra == "unknown":
                wanted.parameters["fuzz_unknown"].string_param = "ignored"
            elif extra == "classification":
                wanted.parameters["classification"].int64_param = 2
            elif extra == "stray":
                wanted.parameters["shared_memory_offset"].int64_param = 0

    return Mutation(f"outputs {names} ({extra})", apply, expected)


@attrs.frozen
class ShmPlacement:
    """Where a tensor claims to live in shared memory, and how the claim is spelled."""

    region: str
    offset: int | None
    byte_size: int | None
    typo: str | None  # one of the three parameters written with a wrong type

    def store(self, params: Any) -> None:
        """Write the three parameters (a ``None`` one is left out)."""
        params["shared_memory_region"].string_param = self.region
        if self.offset is not None:
            params["shared_memory_offset"].int64_param = self.offset
        if self.byte_size is not None:
            params["shared_memory_byte_size"].int64_param = self.byte_size
        if self.typo == "shared_memory_region":
            params[self.typo].int64_param = 1
        elif self.typo is not None:
            params[self.typo].string_param = "1"

    def statuses(self, needed: int, exact: bool) -> frozenset[str]:
        """The documented statuses of this placement for a tensor of ``needed`` bytes.

        ``exact``: an input (its byte size must be the tensor's); else an output (at least).
        """
        found: set[str] = set()
        offset = self.offset or 0
        if self.typo is not None or not self.region or self.byte_size is None:
            return _INVALID
        if offset < 0 or self.byte_size < 0:
            return _INVALID
        if self.byte_size != needed if exact else self.byte_size < needed:
            found.add(INVALID)
        size = REGISTERED.get(self.region)
        if size is None:
            found.add(PRECONDITION)
        elif offset + self.byte_size > size:
            found.add(INVALID)
        return frozenset(found or {OK})


_REGIONS = st.one_of(
    st.sampled_from([SHM_IN[0], SHM_OUT[0], SHM_SMALL[0]]),
    st.text(max_size=8).filter(lambda name: name not in REGISTERED),
)
_TYPO = st.one_of(st.none(), st.none(), st.none(), st.sampled_from(_SHM_KEYS))


def _placement(draw: st.DrawFn, needed: int) -> ShmPlacement:
    size = st.one_of(st.just(needed), st.integers(-8, 4200), st.integers(0, 1 << 62))
    return ShmPlacement(
        region=draw(_REGIONS),
        offset=draw(st.one_of(st.none(), st.integers(-8, 4200), st.integers(0, (1 << 63) - 1))),
        byte_size=draw(st.one_of(st.none(), size, size)),
        typo=draw(_TYPO),
    )


@st.composite
def shm(draw: st.DrawFn, rows: int) -> Mutation:
    """``x`` and/or ``logits`` placed in registered, unregistered or too small regions."""
    on_input = draw(st.booleans())
    on_output = not on_input or draw(st.booleans())
    x = _placement(draw, rows * FEATURES * 4) if on_input else None
    y = _placement(draw, rows * LOGITS * 4) if on_output else None
    parts = []
    if x is not None:
        parts.append(x.statuses(rows * FEATURES * 4, exact=True))
    if y is not None:
        parts.append(y.statuses(rows * LOGITS * 4, exact=False))
    expected = frozenset().union(*parts)
    if expected != {OK}:
        expected -= {OK}

    def apply(request: Any) -> None:
        if x is not None:
            tensor = first_input(request)
            if request.raw_input_contents:
                del request.raw_input_contents[0]
            x.store(tensor.parameters)
        if y is not None:
            y.store(request.outputs.add(name="logits").parameters)

    return Mutation(f"shm input {x} output {y}", apply, expected)


def model_names() -> st.SearchStrategy[Mutation]:
    """Unknown model names and versions (``NOT_FOUND``), the empty name, version ``"1"``."""
    unknown = st.text(min_size=1, max_size=12).filter(lambda name: name not in SERVED)
    version = st.text(max_size=4).filter(lambda v: v not in ("", "1"))

    def rename(name: str) -> Callable[[Any], None]:
        return lambda request: setattr(request, "model_name", name)

    def reversion(v: str) -> Callable[[Any], None]:
        return lambda request: setattr(request, "model_version", v)

    return st.one_of(
        unknown.map(lambda n: Mutation(f"model {n!r}", rename(n), frozenset({NOT_FOUND}))),
        st.just(Mutation("model ''", rename(""), _INVALID)),
        version.map(lambda v: Mutation(f"version {v!r}", reversion(v), frozenset({NOT_FOUND}))),
        st.just(Mutation("version '1'", reversion("1"), frozenset({OK}))),
    )
