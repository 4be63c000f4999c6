"""Parameter trees and entry points: flatten to named weights, load ``--params``, import
``MODULE:FN``.

Weight names are the ``/``-joined key paths of ``jax.tree_util.tree_flatten_with_path`` and
their order is ``argument_order``. Flat files (``.safetensors``,
``.npz``) store those names; :func:`unflatten` rebuilds nested dicts, and lists where the
keys of a level are exactly ``0 … k-1``.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from reactantserver.export._errors import ExportError

__all__ = [
    "FlatParams",
    "call_with_seed",
    "flatten_params",
    "import_object",
    "load_params",
    "unflatten",
]


class FlatParams:
    """A flattened parameter tree: names and host arrays in ``argument_order``, and the
    function that rebuilds the tree from a list of leaves."""

    def __init__(
        self, names: Sequence[str], arrays: Sequence[np.ndarray[Any, Any]], treedef: Any
    ) -> None:
        self.names = tuple(names)
        self.arrays = tuple(arrays)
        self._treedef = treedef

    def rebuild(self, leaves: Sequence[Any]) -> Any:
        """The parameter tree with ``leaves`` (in ``argument_order``) in place of the arrays."""
        import jax

        return jax.tree_util.tree_unflatten(self._treedef, list(leaves))


def _key_name(key: Any) -> str:
    for attr in ("key", "idx", "name"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def _host_leaf(leaf: Any) -> np.ndarray[Any, Any]:
    # Python numbers take jax's default widths (as they would inside a jitted function), so a
    # float in a parameter tree does not turn the whole model into f64 under x64.
    if isinstance(leaf, bool):
        return np.asarray(leaf)
    if isinstance(leaf, int):
        return np.asarray(leaf, np.int32)
    if isinstance(leaf, float):
        return np.asarray(leaf, np.float32)
    return np.asarray(leaf)


def flatten_params(params: Any) -> FlatParams:
    """Flatten a parameter pytree; every leaf must be an array or a number (Python ints and
    floats become i32/f32, jax's default widths)."""
    import jax
    import jax.numpy as jnp

    leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
    names: list[str] = []
    arrays: list[np.ndarray[Any, Any]] = []
    for path, leaf in leaves:
        name = "/".join(_key_name(k) for k in path) or "params"
        if not isinstance(leaf, np.ndarray | np.generic | int | float | bool | jax.Array):
            raise ExportError(
                f"parameter {name!r} is a {type(leaf).__name__}, not an array: every leaf of "
                "the parameter tree becomes a weight"
            )
        if isinstance(leaf, jax.Array) and jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            raise ExportError(
                f"parameter {name!r} is a typed PRNG key; pass jax.random.key_data(key) instead"
            )
        names.append(name)
        arrays.append(_host_leaf(leaf))
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ExportError(f"parameter names collide after joining key paths with '/': {duplicates}")
    return FlatParams(names, arrays, treedef)


def unflatten(flat: Mapping[str, Any]) -> Any:
    """Nested dicts (lists for levels keyed ``0 … k-1``) from ``/``-joined names."""
    root: dict[str, Any] = {}
    for name, value in flat.items():
        parts = name.split("/")
        node = root
        for depth, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ExportError(
                    f"parameter {name!r}: {'/'.join(parts[: depth + 1])!r} is also a leaf"
                )
            node = child
        if parts[-1] in node:
            raise ExportError(f"parameter {name!r} is both a leaf and a prefix of other names")
        node[parts[-1]] = value
    return _listify(root)


def _listify(node: Any) -> Any:
    if not isinstance(node, dict):
        return node
    items = {k: _listify(v) for k, v in node.items()}
    if items and sorted(items) == sorted(str(i) for i in range(len(items))):
        return [items[str(i)] for i in range(len(items))]
    return items


def import_object(target: str, what: str = "MODULE:ATTR") -> Any:
    """Import ``MODULE:ATTR`` (``ATTR`` may be dotted); the current directory is importable,
    like ``python -m``."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ExportError(f"{target!r}: expected {what}, e.g. mypkg.model:forward")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ExportError(f"{target!r}: cannot import module {module_name!r}: {exc}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ExportError(f"{target!r}: {module_name} has no attribute {attr!r}") from None
    return obj


def call_with_seed(factory: Callable[..., Any], seed: int) -> Any:
    """Call ``factory(seed=seed)`` when it takes a ``seed`` keyword, else ``factory()``."""
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        parameters = {}  # type: ignore[assignment]
    takes_seed = "seed" in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
    )
    return factory(seed=seed) if takes_seed else factory()


def _load_safetensors(path: Path) -> dict[str, Any]:
    from safetensors.numpy import load_file

    try:
        return dict(load_file(str(path)))
    except Exception as first:
        # safetensors' numpy loader knows no bf16/fp8; core's reader does (it needs the
        # file's argument_order, which every bundle weights file has).
        from reactantserver.core.weights import SafetensorsReader

        try:
            with SafetensorsReader(path) as reader:
                return {name: reader.read(name) for name in reader.argument_order}
        except Exception as exc:
            raise ExportError(f"{path}: cannot read parameters: {first}; {exc}") from exc


def load_params(spec: str, *, seed: int = 0) -> Any:
    """Parameters from ``path.safetensors``, ``path.npz`` or ``MODULE:ATTR`` (a pytree, or a
    callable returning one, called with ``seed=`` when it accepts it)."""
    path = Path(spec)
    if spec.endswith((".safetensors", ".npz")):
        if not path.is_file():
            raise ExportError(f"--params {spec}: no such file")
        if spec.endswith(".npz"):
            with np.load(path, allow_pickle=False) as data:
                return unflatten({name: data[name] for name in data.files})
        return unflatten(_load_safetensors(path))
    if ":" not in spec:
        raise ExportError(
            f"--params {spec!r}: expected a .safetensors or .npz file, or MODULE:ATTR"
        )
    value = import_object(spec)
    if callable(value):
        value = call_with_seed(value, seed)
    return value
