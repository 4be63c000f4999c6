"""What a bundle's ``model.py`` sees: ``NamedTensor`` and the ``register_*`` calls.

The loader injects these names into ``model.py``; they can
also be imported from here::

    from reactantserver.core.hooks import NamedTensor, register_model

    def preprocess(inputs: list[NamedTensor]) -> list[NamedTensor]:
        (x,) = inputs
        return [NamedTensor("x", x.data / 255.0)]

    register_model("classifier", preprocess=preprocess)

``register_*`` route to the bundle currently being loaded (:func:`collect_registrations`)
and raise ``RuntimeError`` outside a load.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal, Protocol, overload

import attrs
import numpy as np
import numpy.typing as npt

from reactantserver.core.dtypes import DType
from reactantserver.core.errors import InvalidArgumentError

__all__ = [
    "Hook",
    "InvalidArgumentError",
    "MetaCall",
    "NamedTensor",
    "Registration",
    "collect_registrations",
    "register_meta_model",
    "register_model",
]


def _as_array(value: Any) -> np.ndarray[Any, Any]:
    return np.asarray(value)


@attrs.frozen(eq=False)
class NamedTensor:
    """A named array: what hooks receive and return, and what requests carry."""

    name: str
    data: np.ndarray[Any, Any] = attrs.field(converter=_as_array)

    @property
    def dtype(self) -> DType:
        """The element type, derived from the array."""
        return DType.from_numpy(self.data.dtype)

    @property
    def shape(self) -> tuple[int, ...]:
        """The row-major shape of the array."""
        return tuple(int(d) for d in self.data.shape)


Hook = Callable[[list[NamedTensor]], list[NamedTensor]]


class MetaCall(Protocol):
    """The ``call`` argument of a meta model's ``run``.

    ``call(name, inputs)`` runs a sub-model declared in ``meta.calls`` and returns its client
    outputs (all, or ``requested_outputs`` in that order); ``call.scratch(...)`` hands out
    reusable buffers, at most once per request.
    """

    def __call__(
        self,
        name: str,
        inputs: list[NamedTensor],
        *,
        requested_outputs: Sequence[str] | None = None,
    ) -> list[NamedTensor]:
        """Run sub-model ``name`` on ``inputs`` and return its outputs."""
        ...

    @overload
    def scratch(self, shape: tuple[int, ...], dtype: npt.DTypeLike) -> np.ndarray[Any, Any]: ...

    @overload
    def scratch(
        self, shape: Sequence[tuple[tuple[int, ...], npt.DTypeLike]]
    ) -> list[np.ndarray[Any, Any]]: ...

    def scratch(
        self,
        shape: tuple[int, ...] | Sequence[tuple[tuple[int, ...], npt.DTypeLike]],
        dtype: npt.DTypeLike | None = None,
    ) -> np.ndarray[Any, Any] | list[np.ndarray[Any, Any]]:
        """One array ``(shape, dtype)``, or one per ``(shape, dtype)`` pair, from one span."""
        ...


@attrs.frozen
class Registration:
    """One ``register_model`` / ``register_meta_model`` call made by a ``model.py``."""

    kind: Literal["model", "meta"]
    name: str
    preprocess: Hook | None = None
    postprocess: Hook | None = None
    run: Callable[[list[NamedTensor], MetaCall], list[NamedTensor]] | None = None


_collector: contextvars.ContextVar[list[Registration] | None] = contextvars.ContextVar(
    "reactantserver_hook_registrations", default=None
)


@contextlib.contextmanager
def collect_registrations() -> Iterator[list[Registration]]:
    """Collect the ``register_*`` calls made while a bundle's ``model.py`` is imported."""
    registrations: list[Registration] = []
    token = _collector.set(registrations)
    try:
        yield registrations
    finally:
        _collector.reset(token)


def _record(registration: Registration) -> None:
    registrations = _collector.get()
    if registrations is None:
        raise RuntimeError(
            f"register_{registration.kind if registration.kind == 'model' else 'meta_model'}"
            "() may only be called while a bundle's model.py is being loaded"
        )
    registrations.append(registration)


def register_model(
    name: str,
    *,
    preprocess: Hook | None = None,
    postprocess: Hook | None = None,
) -> None:
    """Declare a regular model's optional pre/post hooks (``name`` is informational)."""
    _record(Registration("model", name, preprocess=preprocess, postprocess=postprocess))


def register_meta_model(
    name: str,
    *,
    run: Callable[[list[NamedTensor], MetaCall], list[NamedTensor]],
) -> None:
    """Declare a meta model's orchestration function ``run(inputs, call)``."""
    _record(Registration("meta", name, run=run))
