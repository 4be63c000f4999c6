"""Hypothesis strategies that break a real exported bundle: its manifest and its files.

Each strategy draws a :class:`BundleCase` that rewrites a fresh copy of ``mlp`` and names the
statuses ``RepositoryModelLoad`` may answer: a bundle the documentation calls
invalid must fail with ``INTERNAL`` and the load error,
a directory without ``manifest.yaml`` is no bundle (``NOT_FOUND``), and a change the documentation
allows (free text, provenance, renamed tensors) may load.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import yaml
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from ._requests import NOT_FOUND, OK

INTERNAL = "INTERNAL"
MUST_FAIL = frozenset({INTERNAL})
MAY_LOAD = frozenset({OK, INTERNAL})

MANIFEST = "manifest.yaml"
WEIGHTS = "weights.safetensors"
MODULES = ("model.b1.mlir", "model.b8.mlir", "model.b32.mlir")


@attrs.frozen
class BundleCase:
    """A rewrite of a bundle directory and the statuses its load may end with."""

    family: str
    label: str
    write: Callable[[Path], None]
    expected: frozenset[str]


# (key path, required): the paths of the exported ``mlp`` manifest a mutation may hit.
_PATHS: list[tuple[tuple[str | int, ...], bool]] = [
    (("format_version",), True),
    (("name",), False),
    (("description",), False),
    (("kind",), False),
    (("executable_inputs",), True),
    (("executable_outputs",), True),
    (("batching",), True),
    (("batching", "compiled_batch_sizes"), True),
    (("provenance",), False),
    *[
        ((side, 0, key), True)
        for side in ("executable_inputs", "executable_outputs")
        for key in ("name", "dtype", "shape", "dims")
    ],
    (("executable_inputs", 0, "dims", "f"), True),
    (("executable_outputs", 0, "dims", "k"), True),
]
_REQUIRED = [path for path, required in _PATHS if required]
_FREE_TEXT = {
    ("name",),
    ("description",),
    ("executable_inputs", 0, "name"),
    ("executable_outputs", 0, "name"),
}
_VALUES = st.one_of(
    st.sampled_from([16.0, "16", True, 4.0, "4", "nf"]),  # near misses of the real values
    st.integers(-(1 << 40), 1 << 40),
    st.text(max_size=6),
    st.lists(st.integers(-2, 40), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.none(),
    st.floats(allow_nan=False),
    st.booleans(),
)
_DTYPES = st.one_of(
    st.sampled_from(["f16", "bf16", "f64", "i8", "i32", "i64", "u8", "bool", "bytes", "f8e4m3fn"]),
    st.text(max_size=5).filter(lambda token: token != "f32"),
)


def _parent(data: Any, path: tuple[str | int, ...]) -> Any:
    for key in path[:-1]:
        data = data[key]
    return data


def _get(data: Any, path: tuple[str | int, ...]) -> Any:
    return _parent(data, path)[path[-1]]


def _manifest_case(
    label: str, edit: Callable[[dict[str, Any]], None], expected: frozenset[str]
) -> BundleCase:
    def write(bundle: Path) -> None:
        data = yaml.safe_load((bundle / MANIFEST).read_text())
        edit(data)
        (bundle / MANIFEST).write_text(yaml.safe_dump(data, sort_keys=False))

    return BundleCase("manifests", label, write, expected)


def manifests(pristine: dict[str, Any]) -> st.SearchStrategy[BundleCase]:
    """A mutated ``manifest.yaml``: missing keys, wrong types, bad dtypes and dims, and more."""
    return st.one_of(
        _deleted_keys(),
        _retyped(pristine),
        _dtypes(),
        _dims(),
        _batch_sizes(),
        _unknown_keys(pristine),
        _formats(),
    )


@st.composite
def _deleted_keys(draw: st.DrawFn) -> BundleCase:
    path = draw(st.sampled_from([p for p, _ in _PATHS]))
    return _manifest_case(
        f"delete {path}",
        lambda data: _parent(data, path).pop(path[-1]),
        MUST_FAIL if path in _REQUIRED else MAY_LOAD,
    )


@st.composite
def _retyped(draw: st.DrawFn, pristine: dict[str, Any]) -> BundleCase:
    path = draw(st.sampled_from([p for p, _ in _PATHS]))
    old = _get(pristine, path)
    value = draw(_VALUES.filter(lambda v: type(v) is not type(old)))
    # Free text and provenance take anything; numbers are stringified in format_version; a
    # null optional key reads as absent (its default).
    lax = path in _FREE_TEXT or path in (("provenance",), ("format_version",))
    lax = lax or (value is None and path not in _REQUIRED)
    return _manifest_case(
        f"{path} = {value!r}",
        lambda data: _parent(data, path).__setitem__(path[-1], value),
        MAY_LOAD if lax else MUST_FAIL,
    )


@st.composite
def _dtypes(draw: st.DrawFn) -> BundleCase:
    side = draw(st.sampled_from(["executable_inputs", "executable_outputs"]))
    token = draw(_DTYPES)
    return _manifest_case(
        f"{side} dtype {token!r}",
        lambda data: data[side][0].__setitem__("dtype", token),
        MUST_FAIL,
    )


@st.composite
def _dims(draw: st.DrawFn) -> BundleCase:
    path = draw(st.sampled_from([p for p, _ in _PATHS if p[-1] in ("f", "k")]))
    size = draw(st.one_of(st.integers(-(1 << 63), 0), st.just(-1), st.integers(17, 1 << 62)))
    # A variable (-1) output axis is legal; a variable input axis needs ``input_shapes``.
    variable_output = size == -1 and path[0] == "executable_outputs"
    return _manifest_case(
        f"{path} = {size}",
        lambda data: _parent(data, path).__setitem__(path[-1], size),
        MAY_LOAD if variable_output else MUST_FAIL,
    )


@st.composite
def _batch_sizes(draw: st.DrawFn) -> BundleCase:
    sizes = draw(
        st.one_of(
            st.lists(st.integers(-(1 << 40), 1 << 62), max_size=4),
            st.lists(st.sampled_from([1, 8, 32]), min_size=1, max_size=4),
            st.sampled_from([[0], [], [1 << 62], [1, 8, 32, 1 << 30], [1, 1, 8, 32]]),
        )
    )
    subset = len(set(sizes)) == len(sizes) and set(sizes) <= {1, 8, 32}
    return _manifest_case(
        f"compiled_batch_sizes {sizes}",
        lambda data: data["batching"].__setitem__("compiled_batch_sizes", sizes),
        MAY_LOAD if subset and sizes else MUST_FAIL,
    )


@st.composite
def _unknown_keys(draw: st.DrawFn, pristine: dict[str, Any]) -> BundleCase:
    where = draw(st.sampled_from(["top", "tensor", "batching", "provenance"]))
    key = draw(st.text(min_size=1, max_size=8))
    value = draw(_VALUES)

    def add(data: dict[str, Any]) -> None:
        target = {
            "top": data,
            "tensor": data["executable_inputs"][0],
            "batching": data["batching"],
            "provenance": data["provenance"],
        }[where]
        if key not in target:
            target[key] = value

    known = (
        set(pristine)
        | set(pristine["executable_inputs"][0])
        | {"compiled_batch_sizes", "meta", "client_inputs", "client_outputs", "input_shapes"}
    )
    lax = where == "provenance" or key in known
    return _manifest_case(f"{where} key {key!r}", add, MAY_LOAD if lax else MUST_FAIL)


@st.composite
def _formats(draw: st.DrawFn) -> BundleCase:
    version = draw(st.one_of(st.sampled_from(["2.0", "2", "4.0", "", "3.0.1"]), st.text()))
    return _manifest_case(
        f"format_version {version!r}",
        lambda data: data.__setitem__("format_version", version),
        MAY_LOAD if version in ("3", "3.0") else MUST_FAIL,
    )


@st.composite
def manifest_texts(draw: st.DrawFn) -> BundleCase:
    """``manifest.yaml`` cut short, replaced by garbage or by a YAML that is no mapping."""
    kind = draw(st.sampled_from(["cut", "garbage", "not a mapping", "empty", "deleted"]))
    cut = draw(st.floats(0.0, 0.999))
    garbage = draw(st.binary(min_size=1, max_size=200))
    scalar = draw(st.sampled_from(["[]", "5", "null", "- a\n- b\n", "'text'"]))

    def write(bundle: Path) -> None:
        path = bundle / MANIFEST
        text = path.read_bytes()
        if kind == "cut":
            path.write_bytes(text[: int(len(text) * cut)])
        elif kind == "garbage":
            path.write_bytes(garbage)
        elif kind == "not a mapping":
            path.write_text(scalar)
        elif kind == "empty":
            path.write_bytes(b"")
        else:
            path.unlink()

    # A cut inside ``provenance`` (the last key) leaves a valid manifest behind.
    expected = {"cut": MAY_LOAD, "deleted": frozenset({NOT_FOUND})}.get(kind, MUST_FAIL)
    return BundleCase("manifest text", f"manifest {kind}", write, expected)


@st.composite
def bundle_files(draw: st.DrawFn) -> BundleCase:
    """Truncated or garbage weights and modules, wrong weight shapes, a broken ``model.py``."""
    kind = draw(
        st.sampled_from(
            [
                "weights cut",
                "weights garbage",
                "weight shape",
                "weight dtype",
                "weight missing",
                "weight extra",
                "module missing",
                "module cut",
                "module garbage",
                "model.py",
                "stray file",
            ]
        )
    )
    module = draw(st.sampled_from(MODULES))
    fraction = draw(st.floats(0.0, 0.99))
    garbage = draw(st.binary(max_size=256))
    tensor = draw(st.integers(0, 3))
    model_py, model_py_loads = draw(
        st.sampled_from(
            [
                ("def broken(:\n", False),
                ("raise RuntimeError('model.py fails at import')\n", False),
                ("x = 1\n", False),  # never calls register_model
                ("register_model('m')\nregister_model('m')\n", False),
                ("register_meta_model('m', run=lambda inputs, call: inputs)\n", False),
                ("register_model('someone_else')\n", True),  # the name is informational
            ]
        )
    )

    def write(bundle: Path) -> None:
        weights = bundle / WEIGHTS
        if kind == "weights cut":
            data = weights.read_bytes()
            weights.write_bytes(data[: int(len(data) * fraction)])
        elif kind == "weights garbage":
            weights.write_bytes(garbage)
        elif kind.startswith("weight "):
            with safe_open(str(weights), "np") as opened:
                metadata = opened.metadata()
            arrays = dict(load_file(str(weights)))
            name = sorted(arrays)[tensor % len(arrays)]
            _edit_weights(arrays, name, kind)
            save_file(arrays, str(weights), metadata=metadata)
        elif kind == "module missing":
            (bundle / module).unlink()
        elif kind == "module cut":
            data = (bundle / module).read_bytes()
            (bundle / module).write_bytes(data[: int(len(data) * fraction)])
        elif kind == "module garbage":
            (bundle / module).write_bytes(garbage)
        elif kind == "model.py":
            (bundle / "model.py").write_text(model_py)
        else:
            (bundle / "NOTES.txt").write_bytes(garbage)

    lax = kind in ("weight extra", "stray file") or (kind == "model.py" and model_py_loads)
    label = f"{kind} ({module}, tensor {tensor}, model.py {model_py!r})"
    return BundleCase("bundle files", label, write, MAY_LOAD if lax else MUST_FAIL)


def _edit_weights(arrays: dict[str, np.ndarray[Any, Any]], name: str, kind: str) -> None:
    array = arrays[name]
    if kind == "weight shape":
        arrays[name] = np.zeros((*array.shape[:-1], array.shape[-1] + 1), array.dtype)
    elif kind == "weight dtype":
        arrays[name] = array.astype(np.float64)
    elif kind == "weight missing":
        del arrays[name]
    else:
        arrays["fuzz/extra"] = copy.deepcopy(array)
