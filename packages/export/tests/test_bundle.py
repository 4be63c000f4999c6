"""``write_bundle``: exactly the files and manifest of a bundle, checked with core's parsers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import yaml
from safetensors.numpy import load_file

from reactantserver.core.dtypes import DType
from reactantserver.core.manifest import load_manifest, resolve_layout
from reactantserver.core.types import Batch, Fixed, Variable
from reactantserver.core.weights import SafetensorsReader
from reactantserver.export import ExportError, write_bundle

# A module body only has to be non-empty bytes for the writer; the server never sees these.
FAKE_MODULE = b"ML\xefR fake bytecode"


def _weights() -> list[tuple[str, np.ndarray[Any, Any]]]:
    return [
        ("z/last", np.arange(6, dtype=np.float32).reshape(2, 3)),
        ("a/first", np.array([1, 2, 3], dtype=np.int64)),
        ("half", np.ones(4, dtype=ml_dtypes.bfloat16)),
    ]


def test_model_bundle_round_trips_through_core(models: Path) -> None:
    bundle = write_bundle(
        models / "clf",
        name="clf",
        executable_inputs=["image=f32[n,c=3,h=8,w=8]"],
        executable_outputs=["logits=f32[n,k=10]"],
        modules={1: FAKE_MODULE, 8: FAKE_MODULE + b"8"},
        weights=_weights(),
        description="a classifier",
        provenance={"entry": "m:f", "git_dirty": False},
    )
    assert sorted(p.name for p in bundle.iterdir()) == [
        "manifest.yaml",
        "model.b1.mlir",
        "model.b8.mlir",
        "weights.safetensors",
    ]
    manifest = load_manifest(bundle)
    assert manifest.format_version == "3.0"
    assert manifest.source_format == "3.0"
    assert manifest.kind == "model"
    assert manifest.description == "a classifier"
    assert manifest.compiled_batch_sizes == (1, 8)
    assert manifest.letters.executable_inputs == ("nchw",)
    assert manifest.executable_inputs[0].shape == (Batch(), Fixed(3), Fixed(8), Fixed(8))
    assert manifest.wire_batch_axis == 1
    assert manifest.coalescable
    assert manifest.provenance == {"entry": "m:f", "git_dirty": False}
    layout = resolve_layout(bundle, manifest)
    assert layout.module_path(None, 8).read_bytes() == FAKE_MODULE + b"8"
    assert layout.warnings == ()

    with SafetensorsReader(bundle / "weights.safetensors") as reader:
        assert reader.argument_order == ("z/last", "a/first", "half")
        assert reader.weight_nbytes == 6 * 4 + 3 * 8 + 4 * 2
        assert [s.dtype for s in reader.specs()] == [DType.F32, DType.I64, DType.BF16]
        assert reader.read("half").dtype == ml_dtypes.bfloat16
        np.testing.assert_array_equal(reader.read("z/last"), _weights()[0][1])
        # The data section follows argument_order.
        offsets = [reader.tensors[n].data_offsets[0] for n in reader.argument_order]
        assert offsets == sorted(offsets)
        assert json.loads(reader.metadata["argument_order"]) == ["z/last", "a/first", "half"]
    # The safetensors reference implementation agrees (it cannot load bf16 into numpy).
    text = (bundle / "manifest.yaml").read_text()
    assert text.startswith("format_version: '3.0'\n")
    assert "  - {name: image, dtype: f32, shape: nchw, dims: {c: 3, h: 8, w: 8}}" in text
    assert "batching: {compiled_batch_sizes: [1, 8]}" in text


def test_weights_file_reads_with_the_safetensors_package(models: Path) -> None:
    weights = _weights()[:2]
    bundle = write_bundle(
        models / "m",
        name="m",
        executable_inputs=["x=f32[n,4]"],
        executable_outputs=["y=f32[n,4]"],
        modules={2: FAKE_MODULE},
        weights=weights,
    )
    loaded = load_file(str(bundle / "weights.safetensors"))
    for name, array in weights:
        np.testing.assert_array_equal(loaded[name], array)


def test_unbatched_model_and_variants(models: Path) -> None:
    plain = write_bundle(
        models / "plain",
        name="plain",
        executable_inputs=["x=f32[4]"],
        executable_outputs=["y=f32[4]"],
        modules={0: FAKE_MODULE},
        weights=[],
    )
    manifest = load_manifest(plain)
    assert manifest.batch_keys == (0,)
    assert resolve_layout(plain, manifest).module_path(None, 0).name == "model.mlir"
    with SafetensorsReader(plain / "weights.safetensors") as reader:
        assert reader.argument_order == ()

    shaped = write_bundle(
        models / "shaped",
        name="shaped",
        executable_inputs=["img=f32[n,h=-1,w=-1]"],
        executable_outputs=["y=f32[n,h=-1]"],
        modules={(v, b): FAKE_MODULE for v in (0, 1) for b in (1, 2)},
        weights=[("w", np.zeros(2, np.float32))],
        input_shapes=[{"h": 4, "w": 6}, {"h": 8, "w": 2}],
    )
    manifest = load_manifest(shaped)
    assert manifest.variant_keys == ((4, 6), (8, 2))
    assert manifest.executable_inputs[0].shape == (Batch(), Variable(), Variable())
    layout = resolve_layout(shaped, manifest)
    assert layout.module_path(1, 2).name == "model.v1.b2.mlir"


def test_meta_bundle(models: Path) -> None:
    source = "register_meta_model('m', run=lambda inputs, call: inputs)\n"
    bundle = write_bundle(
        models / "meta",
        name="meta",
        kind="meta",
        meta_calls=["a", "b"],
        client_inputs=["items=f32[k=-1,f=4]"],
        client_outputs=["scores=f32[m=-1]"],
        model_py=source,
    )
    assert sorted(p.name for p in bundle.iterdir()) == ["manifest.yaml", "model.py"]
    manifest = load_manifest(bundle)
    assert manifest.is_meta
    assert manifest.meta_calls == ("a", "b")
    assert manifest.executable_inputs == ()
    assert (bundle / "model.py").read_text() == source
    data = yaml.safe_load((bundle / "manifest.yaml").read_text())
    assert data["meta"] == {"calls": ["a", "b"]}
    assert "executable_inputs" not in data


def test_model_py_copied_from_a_path_and_client_tensors(models: Path, tmp_path: Path) -> None:
    hooks = tmp_path / "hooks.py"
    hooks.write_text("register_model('x')\n")
    bundle = write_bundle(
        models / "hooked",
        name="hooked",
        executable_inputs=["x=f32[n,4]"],
        executable_outputs=["y=f32[n,4]"],
        client_inputs=["raw=u8[n,4]"],
        client_outputs=["label=i64[n]"],
        modules={1: FAKE_MODULE},
        weights=[],
        model_py=hooks,
        extra_files={"model.b1.mlir.txt": b"module {}"},
    )
    manifest = load_manifest(bundle)
    assert manifest.client_inputs_declared
    assert [s.name for s in manifest.client_outputs] == ["label"]
    assert (bundle / "model.py").read_text() == "register_model('x')\n"
    assert resolve_layout(bundle, manifest).warnings == ()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "other"}, "must be the bundle directory's name"),
        ({"modules": {}}, "at least one module"),
        ({"modules": {0: FAKE_MODULE, 8: FAKE_MODULE}}, "batch size 0"),
        ({"modules": {(0, 1): FAKE_MODULE}}, "needs input_shapes"),
        ({"modules": {1: b""}}, "modules are non-empty"),
        ({"client_inputs": ["raw=u8[n,4]"]}, "allowed only when the bundle has model.py"),
        ({"executable_inputs": ["x=f32[n,4]", "c=f32[3]"]}, "mixes batched and unbatched"),
        ({"weights": [("w", np.zeros(1)), ("w", np.zeros(1))]}, "used twice"),
        ({"extra_files": {"manifest.yaml": b""}}, "not allowed"),
        ({"meta_calls": ["a"]}, "only for kind='meta'"),
    ],
)
def test_bad_bundles_are_refused_before_writing(
    models: Path, kwargs: dict[str, Any], message: str
) -> None:
    arguments: dict[str, Any] = {
        "name": "m",
        "executable_inputs": ["x=f32[n,4]"],
        "executable_outputs": ["y=f32[n,4]"],
        "modules": {1: FAKE_MODULE},
        "weights": [],
    }
    arguments.update(kwargs)
    with pytest.raises(ExportError, match=message):
        write_bundle(models / "m", **arguments)
    assert list(models.iterdir()) == []
