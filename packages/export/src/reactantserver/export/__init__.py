"""Turns JAX (Flax, PyTorch) models into ReactantServer bundles, and validates bundles.

The CLI ``reactantserver-export`` is a thin wrapper over this API::

    from reactantserver.export import export_jax, validate

    bundle = export_jax(forward, params, ["x=f32[n,f=16]"], ["logits"],
                        batch_sizes=(1, 8, 32), out="models/mlp")
    report = validate(bundle, reference=forward, params=params)
    assert report.ok, report.to_text()

Importing this package is cheap: jax loads with the first export or validation.
"""

from __future__ import annotations

from importlib import import_module
from importlib.metadata import version as _version
from typing import TYPE_CHECKING, Any

from reactantserver.export._bundle import FORMAT_VERSION, write_bundle
from reactantserver.export._errors import ExportError, UnservableError
from reactantserver.export._hooks_loader import load_registration
from reactantserver.export._params import load_params
from reactantserver.export._report import ModuleReport, OutputReport, ValidationReport
from reactantserver.export._session import BundleSession
from reactantserver.export._spec import TensorDecl, parse_tensor_spec

if TYPE_CHECKING:
    from reactantserver.export._export import export_jax
    from reactantserver.export._flax import export_flax, flax_function
    from reactantserver.export._torch import export_torch
    from reactantserver.export._validate import validate

__version__ = _version("reactantserver-export")

__all__ = [
    "FORMAT_VERSION",
    "BundleSession",
    "ExportError",
    "ModuleReport",
    "OutputReport",
    "TensorDecl",
    "UnservableError",
    "ValidationReport",
    "__version__",
    "export_flax",
    "export_jax",
    "export_torch",
    "flax_function",
    "load_params",
    "load_registration",
    "parse_tensor_spec",
    "validate",
    "write_bundle",
]

# Names whose modules import jax (flax, torch) at import time: loaded on first use.
_LAZY = {
    "export_flax": "reactantserver.export._flax",
    "export_jax": "reactantserver.export._export",
    "export_torch": "reactantserver.export._torch",
    "flax_function": "reactantserver.export._flax",
    "validate": "reactantserver.export._validate",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value
