"""``export_torch``: a PyTorch ``nn.Module`` -> bundle via ``torch.export`` and torchax (extra
``torch``; docs/guides/pytorch.md).

Per batch size the module is captured with ``torch.export.export`` (non-strict by default),
converted by torchax into a JAX function plus its state (parameters, buffers, lifted
constants in placeholder order = ``argument_order``), then lowered and gated by the JAX
procedure. torch and torchax are imported before the jax-heavy modules, as torchax wants.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from reactantserver.core.dtypes import DType
from reactantserver.export._errors import ExportError

__all__ = ["TORCH_EXTRA_HINT", "export_torch", "torch_modules"]

TORCH_EXTRA_HINT = (
    "pip install 'reactantserver-export[torch]' (torch==2.12.1 and torchax==0.0.13; "
    "torchax 0.0.13 fails to import with torch 2.13 and newer)"
)
"""How to install what the PyTorch path needs."""


def torch_modules() -> tuple[Any, Any]:
    """``(torch, torchax.export)``, or an :class:`ExportError` saying how to install them."""
    try:
        with warnings.catch_warnings():
            # Third-party import noise must not become an error under -W error.
            warnings.simplefilter("ignore")
            torch = importlib.import_module("torch")
            torchax = importlib.import_module("torchax")
            torchax_export = importlib.import_module("torchax.export")
            # Creating the default environment registers torchax's aten lowerings, which
            # exported_program_to_jax(export_raw=True) relies on without doing it itself.
            torchax.default_env()
    except Exception as exc:
        raise ExportError(
            f"the PyTorch path needs torch and torchax: {type(exc).__name__}: {exc}; "
            f"{TORCH_EXTRA_HINT}"
        ) from exc
    return torch, torchax_export


def _host(torch: Any, tensor: Any) -> np.ndarray[Any, Any]:
    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        import ml_dtypes

        return np.asarray(tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16))
    return np.asarray(tensor.numpy())


def _zeros(torch: Any, shape: tuple[int, ...], dtype: DType) -> Any:
    """A zero example input; torch.from_numpy knows no bfloat16, so that one is made by torch."""
    if dtype is DType.BF16:
        return torch.zeros(shape, dtype=torch.bfloat16)
    return torch.from_numpy(np.zeros(shape, dtype.numpy))


def _traced(func: Callable[..., Any], states: list[Any], xs: tuple[Any, ...]) -> Any:
    """``func(states, xs)`` without the int64 truncation warning of torchax's lowerings.

    Index arithmetic in aten (nearest interpolation, gathers) asks for int64; the export runs
    without jax_enable_x64 unless a tensor of the bundle is 64-bit, and jax then computes those
    indices in int32, which holds any index of a servable tensor.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="Explicitly requested dtype int64", category=UserWarning
        )
        return func(states, xs)


def _as_flat_call(func: Callable[..., Any]) -> Callable[[Sequence[Any], Sequence[Any]], Any]:
    """torchax's ``func(states, inputs)`` as the exporter's ``call(weights, inputs)``."""
    return lambda weights, xs: _traced(func, list(weights), tuple(xs))


def _used_states(
    captured: Mapping[int, tuple[list[str], list[np.ndarray[Any, Any]], Callable[..., Any]]],
    decls: Sequence[Any],
    names: Sequence[str],
    arrays: Sequence[np.ndarray[Any, Any]],
    platform: str,
) -> list[bool]:
    """Which state entries any batch size's lowering reads (the state-dict entries kept
    by the lowering); e.g. BatchNorm's num_batches_tracked is read by none in eval mode."""
    import jax

    from reactantserver.export._export import needs_x64
    from reactantserver.export._gate import ArgSpec
    from reactantserver.export._lower import weights_read
    from reactantserver.export._weights_file import as_weight

    weights = []
    for name, array in zip(names, arrays, strict=True):
        dtype, host = as_weight(name, array)
        weights.append(ArgSpec("weight", name, tuple(host.shape), dtype))
    used = [False] * len(names)
    wide = needs_x64([w.dtype for w in weights] + [d.dtype for d in decls])
    for batch, (_, _, func) in captured.items():
        inputs = [ArgSpec("input", d.name, d.concrete_shape(batch, {}), d.dtype) for d in decls]
        with jax.enable_x64(True) if wide else contextlib.nullcontext():
            read = weights_read(_as_flat_call(func), inputs, weights, platform=platform)
        used = [u or r for u, r in zip(used, read, strict=True)]
    return used


def export_torch(
    module: Any,
    inputs: Sequence[Any],
    outputs: Sequence[Any] | None = None,
    batch_sizes: Sequence[int] = (),
    out: str | os.PathLike[str] | None = None,
    *,
    strict: bool = False,
    platform: str = "cpu",
    name: str | None = None,
    with_hooks: bool = False,
    force: bool = False,
    description: str = "",
    provenance_extra: Mapping[str, Any] | None = None,
    progress: bool = True,
    client_inputs: Sequence[Any] | None = None,
    client_outputs: Sequence[Any] | None = None,
    model_py: str | os.PathLike[str] | None = None,
    text_copies: bool = False,
) -> Path:
    """Export an ``nn.Module`` (or a factory returning one) as a bundle at ``out``.

    ``inputs``/``outputs``/``batch_sizes`` and the keyword arguments mean what they mean for
    :func:`~reactantserver.export.export_jax`; ``strict`` selects ``torch.export``'s strict
    (TorchDynamo) capture. The module is put in eval mode. Variable axes are not supported.
    """
    torch, torchax_export = torch_modules()
    from reactantserver.export._export import bundle_path, checked_batch_sizes, export_flat
    from reactantserver.export._spec import as_decls

    model = module if isinstance(module, torch.nn.Module) else module()
    if not isinstance(model, torch.nn.Module):
        raise ExportError(f"{module!r} is neither an nn.Module nor a factory returning one")
    model.eval()
    decls = as_decls(inputs, "inputs")
    if any(d.variable_letters for d in decls):
        raise ExportError("the PyTorch path does not support variable axes (LETTER=-1)")
    bundle_path(out, name, force)
    sizes = checked_batch_sizes(decls, batch_sizes) or [0]
    captured: dict[int, tuple[list[str], list[np.ndarray[Any, Any]], Callable[..., Any]]] = {}
    for batch in sizes:
        example = tuple(_zeros(torch, d.concrete_shape(batch, {}), d.dtype) for d in decls)
        try:
            with warnings.catch_warnings(), torch.no_grad():
                warnings.simplefilter("ignore", FutureWarning)
                warnings.simplefilter("ignore", DeprecationWarning)
                program = torch.export.export(model, example, strict=strict)
                names, states, func = torchax_export.exported_program_to_jax(
                    program, export_raw=True
                )
        except Exception as exc:
            raise ExportError(
                f"torch.export / torchax failed at batch size {batch}: {type(exc).__name__}: {exc}"
            ) from exc
        captured[batch] = (list(names), [_host(torch, s) for s in states], func)
    first_names, first_arrays, _ = captured[sizes[0]]
    for batch, (names, arrays, _) in captured.items():
        shapes = [a.shape for a in arrays]
        if names != first_names or shapes != [a.shape for a in first_arrays]:
            raise ExportError(
                f"batch size {batch} captures other weights than batch size {sizes[0]}: "
                f"{names} vs {first_names}"
            )

    used = _used_states(captured, decls, first_names, first_arrays, platform)
    kept = [i for i, keep in enumerate(used) if keep]

    def make_call(index: tuple[int | None, int]) -> Callable[[Sequence[Any], Sequence[Any]], Any]:
        func = captured[index[1]][2]

        def call(weights: Sequence[Any], xs: Sequence[Any]) -> Any:
            # The state entries the computation never reads are not weights of the bundle;
            # the interpreter still wants every placeholder, so they get (host) zeros.
            states: list[Any] = [np.zeros_like(a) for a in first_arrays]
            for position, weight in zip(kept, weights, strict=True):
                states[position] = weight
            return _traced(func, states, tuple(xs))

        return call

    model_type = type(model)
    return export_flat(
        make_call,
        [(first_names[i], first_arrays[i]) for i in kept],
        decls,
        outputs,
        [b for b in sizes if b],
        (),
        out,
        entry=f"{model_type.__module__}:{model_type.__qualname__}",
        source_framework="pytorch",
        platform=platform,
        name=name,
        with_hooks=with_hooks,
        force=force,
        description=description,
        provenance_extra=provenance_extra,
        progress=progress,
        client_inputs=client_inputs,
        client_outputs=client_outputs,
        model_py=model_py,
        text_copies=text_copies,
    )
