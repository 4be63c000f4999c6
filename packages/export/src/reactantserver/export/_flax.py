"""``export_flax``: a Flax NNX module -> bundle (extra ``flax``).

An NNX module is split into its graph definition and its state. The parameters and batch
statistics become the bundle's weights (names = ``/``-joined state paths, e.g.
``conv1/kernel``); everything else in the state (RNG keys and counters, which an eval-mode
model never reads) stays a constant of the traced function. The module is put in eval mode
(``BatchNorm`` uses its running averages, ``Dropout`` is off) and exported by the JAX
procedure, so the arity gate and weight checks are the same as for ``export_jax``.

A Linen model needs no helper: ``export_jax(lambda v, x: model.apply(v, x), variables, …)``.
"""

from __future__ import annotations

import importlib
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from reactantserver.export._errors import ExportError

__all__ = ["FLAX_EXTRA_HINT", "export_flax", "flax_function", "nnx_module"]

FLAX_EXTRA_HINT = "pip install 'reactantserver-export[flax]' (flax==0.12.8)"
"""How to install what the Flax path needs."""


def nnx_module() -> Any:
    """``flax.nnx``, or an :class:`ExportError` saying how to install it."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return importlib.import_module("flax.nnx")
    except Exception as exc:
        raise ExportError(
            f"the Flax path needs flax: {type(exc).__name__}: {exc}; {FLAX_EXTRA_HINT}"
        ) from exc


def flax_function(model: Any) -> tuple[Callable[..., Any], dict[str, Any]]:
    """``(fn, params)`` with ``fn(params, *inputs) == model(*inputs)`` for an NNX module.

    ``params`` is a plain nested dict of arrays (the parameters and batch statistics);
    ``model`` is put in eval mode first.
    """
    import jax

    nnx = nnx_module()
    if not isinstance(model, nnx.Module):
        raise ExportError(f"{model!r} is not a flax.nnx.Module")
    model.eval()
    graphdef, weights, rest = nnx.split(model, (nnx.Param, nnx.BatchStat), ...)
    params: dict[str, Any] = nnx.to_pure_dict(weights)

    def fn(values: Mapping[str, Any], *inputs: Any) -> Any:
        # A fresh copy of the template each call: replace_by_pure_dict writes in place.
        state = jax.tree.map(lambda leaf: leaf, weights)
        nnx.replace_by_pure_dict(state, values)
        return nnx.merge(graphdef, state, rest)(*inputs)

    return fn, params


def export_flax(
    module: Any,
    inputs: Sequence[Any],
    outputs: Sequence[Any] | None = None,
    batch_sizes: Sequence[int] = (),
    out: str | os.PathLike[str] | None = None,
    **options: Any,
) -> Path:
    """Export an NNX module (or a factory returning one) as a bundle at ``out``.

    ``inputs``, ``outputs``, ``batch_sizes`` and the keyword ``options`` mean what they mean
    for :func:`~reactantserver.export.export_jax`. The weights are the module's parameters
    and batch statistics in sorted path order.
    """
    nnx = nnx_module()
    model = module if isinstance(module, nnx.Module) else module()
    fn, params = flax_function(model)
    from reactantserver.export._export import export_flat, source_dir_of
    from reactantserver.export._params import flatten_params

    flat = flatten_params(params)
    model_type = type(model)
    return export_flat(
        lambda _index: lambda weights, xs: fn(flat.rebuild(weights), *xs),
        list(zip(flat.names, flat.arrays, strict=True)),
        inputs,
        outputs,
        batch_sizes,
        (),
        out,
        entry=f"{model_type.__module__}:{model_type.__qualname__}",
        source_framework="flax",
        source_dir=source_dir_of(model_type),
        **options,
    )
