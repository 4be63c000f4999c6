"""Bundle file layout on real directories: module files, weights, model.py, bytecode magic."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import yaml

from reactantserver.core.errors import BundleError
from reactantserver.core.manifest import (
    MLIR_BYTECODE_MAGIC,
    Manifest,
    ModuleFile,
    is_mlir_bytecode,
    load_manifest,
    module_filename,
    resolve_layout,
)

MLIR_TEXT = "module @jit_f {\n  func.func public @main() {\n    return\n  }\n}\n"


def tensor(name: str, shape: str, **dims: int) -> dict[str, Any]:
    return {"name": name, "dtype": "f32", "shape": shape, "dims": dims}


def make_bundle(
    root: Path,
    files: list[str],
    *,
    sizes: list[int] | None = None,
    variants: list[dict[str, int]] | None = None,
    weights: bool = True,
    model_py: bool = False,
    name: str = "m",
) -> tuple[Path, Manifest]:
    bundle = root / name
    bundle.mkdir()
    shape = "nw" if variants else "nk"
    dims = {"w": -1} if variants else {"k": 4}
    data: dict[str, Any] = {
        "format_version": "3.0",
        "executable_inputs": [tensor("x", shape, **dims)],
        "executable_outputs": [tensor("y", "n")],
    }
    if sizes is not None:
        data["batching"] = {"compiled_batch_sizes": sizes}
    if variants is not None:
        data["input_shapes"] = variants
    (bundle / "manifest.yaml").write_text(yaml.safe_dump(data))
    for file in files:
        (bundle / file).write_text(MLIR_TEXT)
    if weights:
        (bundle / "weights.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")
    if model_py:
        (bundle / "model.py").write_text("register_model('m')\n")
    return bundle, load_manifest(bundle)


def test_lone_module(tmp_path: Path) -> None:
    bundle, manifest = make_bundle(tmp_path, ["model.mlir"])
    layout = resolve_layout(bundle, manifest)
    assert layout.modules == (ModuleFile(None, 0, bundle / "model.mlir"),)
    assert layout.module_path(None, 0) == bundle / "model.mlir"
    assert layout.weights == bundle / "weights.safetensors"
    assert layout.manifest == bundle / "manifest.yaml"
    assert layout.model_py is None
    assert layout.warnings == ()


def test_lone_module_missing(tmp_path: Path) -> None:
    bundle, manifest = make_bundle(tmp_path, ["model.b1.mlir"])
    with pytest.raises(BundleError, match=r"model\.mlir: missing module file") as info:
        resolve_layout(bundle, manifest)
    assert str(bundle / "model.mlir") in str(info.value)


def test_batched_modules(tmp_path: Path) -> None:
    bundle, manifest = make_bundle(tmp_path, ["model.b1.mlir", "model.b8.mlir"], sizes=[8, 1])
    layout = resolve_layout(bundle, manifest)
    assert [(m.variant, m.batch_size, m.path.name) for m in layout.modules] == [
        (None, 1, "model.b1.mlir"),
        (None, 8, "model.b8.mlir"),
    ]
    assert layout.module_path(None, 8) == bundle / "model.b8.mlir"
    with pytest.raises(KeyError):
        layout.module_path(None, 0)
    assert layout.warnings == ()


def test_batched_module_missing(tmp_path: Path) -> None:
    bundle, manifest = make_bundle(tmp_path, ["model.b1.mlir"], sizes=[1, 8, 32])
    with pytest.raises(BundleError) as info:
        resolve_layout(bundle, manifest)
    message = str(info.value)
    assert message.startswith(str(bundle / "model.b8.mlir")), message
    assert "compiled_batch_sizes lists 8" in message
    assert "also missing: model.b32.mlir" in message


def test_ignored_modules_warn(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    files = ["model.mlir", "model.b1.mlir", "model.b4.mlir", "model.b8.mlir", "model.b08.mlir"]
    bundle, manifest = make_bundle(tmp_path, files, sizes=[1, 8])
    with caplog.at_level(logging.WARNING, logger="reactantserver.core.manifest"):
        layout = resolve_layout(bundle, manifest)
    assert [m.path.name for m in layout.modules] == ["model.b1.mlir", "model.b8.mlir"]
    assert len(layout.warnings) == 3
    by_file = {w.split(": ignored: ")[0]: w for w in layout.warnings}
    assert "compiled_batch_sizes is non-empty" in by_file[str(bundle / "model.mlir")]
    assert "batch size 4 is not in" in by_file[str(bundle / "model.b4.mlir")]
    assert "canonical" in by_file[str(bundle / "model.b08.mlir")]
    assert [r.getMessage() for r in caplog.records] == list(layout.warnings)


def test_batched_file_next_to_lone_module_warns(tmp_path: Path) -> None:
    bundle, manifest = make_bundle(tmp_path, ["model.mlir", "model.b2.mlir"])
    layout = resolve_layout(bundle, manifest)
    assert layout.module_path(None, 0) == bundle / "model.mlir"
    assert len(layout.warnings) == 1
    assert "model.b2.mlir: ignored: batching.compiled_batch_sizes is empty" in layout.warnings[0]


def test_non_module_files_are_ignored_silently(tmp_path: Path) -> None:
    files = ["model.mlir", "vocab.txt", "model.mlir.bak", "working_tree.patch", "notes.mlir"]
    bundle, manifest = make_bundle(tmp_path, files)
    assert resolve_layout(bundle, manifest).warnings == ()


def test_variant_modules(tmp_path: Path) -> None:
    files = ["model.v0.b1.mlir", "model.v0.b4.mlir", "model.v1.b1.mlir", "model.v1.b4.mlir"]
    variants = [{"w": 8}, {"w": 16}]
    bundle, manifest = make_bundle(tmp_path, files, sizes=[1, 4], variants=variants)
    layout = resolve_layout(bundle, manifest)
    assert [(m.variant, m.batch_size) for m in layout.modules] == [(0, 1), (0, 4), (1, 1), (1, 4)]
    assert layout.module_path(1, 4) == bundle / "model.v1.b4.mlir"
    assert layout.warnings == ()


def test_unbatched_variant_modules(tmp_path: Path) -> None:
    bundle, manifest = make_bundle(
        tmp_path, ["model.v0.mlir", "model.v1.mlir"], variants=[{"w": 8}, {"w": 16}]
    )
    layout = resolve_layout(bundle, manifest)
    assert [m.path.name for m in layout.modules] == ["model.v0.mlir", "model.v1.mlir"]
    assert layout.module_path(1, 0) == bundle / "model.v1.mlir"


def test_variant_module_missing(tmp_path: Path) -> None:
    files = ["model.v0.b1.mlir", "model.v0.b4.mlir", "model.v1.b1.mlir"]
    variants = [{"w": 8}, {"w": 16}]
    bundle, manifest = make_bundle(tmp_path, files, sizes=[1, 4], variants=variants)
    with pytest.raises(BundleError) as info:
        resolve_layout(bundle, manifest)
    message = str(info.value)
    assert message.startswith(str(bundle / "model.v1.b4.mlir")), message
    assert "input_shapes[1]" in message


def test_stray_files_in_variant_bundle_warn(tmp_path: Path) -> None:
    files = ["model.v0.mlir", "model.mlir", "model.b1.mlir", "model.v3.mlir", "model.v0.b2.mlir"]
    bundle, manifest = make_bundle(tmp_path, files, variants=[{"w": 8}])
    layout = resolve_layout(bundle, manifest)
    assert [m.path.name for m in layout.modules] == ["model.v0.mlir"]
    reasons = {w.split(": ignored: ")[0].rsplit("/", 1)[1]: w for w in layout.warnings}
    assert sorted(reasons) == ["model.b1.mlir", "model.mlir", "model.v0.b2.mlir", "model.v3.mlir"]
    assert "declares input_shapes" in reasons["model.mlir"]
    assert "input_shapes has 1 entries" in reasons["model.v3.mlir"]
    assert "compiled_batch_sizes is empty" in reasons["model.v0.b2.mlir"]


def test_variant_files_without_input_shapes_warn(tmp_path: Path) -> None:
    bundle, manifest = make_bundle(tmp_path, ["model.mlir", "model.v0.mlir"])
    (warning,) = resolve_layout(bundle, manifest).warnings
    assert "model.v0.mlir: ignored: the manifest declares no input_shapes" in warning


def test_module_that_is_a_directory_counts_as_missing(tmp_path: Path) -> None:
    bundle, manifest = make_bundle(tmp_path, [])
    (bundle / "model.mlir").mkdir()
    with pytest.raises(BundleError, match=r"model\.mlir: missing"):
        resolve_layout(bundle, manifest)


def test_weights_required_for_models(tmp_path: Path) -> None:
    bundle, manifest = make_bundle(tmp_path, ["model.mlir"], weights=False)
    with pytest.raises(
        BundleError, match=r"weights\.safetensors: missing: required for kind: model"
    ):
        resolve_layout(bundle, manifest)


def test_model_py_reported(tmp_path: Path) -> None:
    bundle, manifest = make_bundle(tmp_path, ["model.mlir"], model_py=True)
    assert resolve_layout(bundle, manifest).model_py == bundle / "model.py"


def test_not_a_directory(tmp_path: Path) -> None:
    bundle, manifest = make_bundle(tmp_path, ["model.mlir"])
    with pytest.raises(BundleError, match="not a directory"):
        resolve_layout(bundle / "model.mlir", manifest)


def write_meta(bundle: Path) -> None:
    bundle.mkdir()
    data = {
        "format_version": "3.0",
        "kind": "meta",
        "meta": {"calls": ["a"]},
        "client_inputs": [tensor("x", "k", k=1)],
        "client_outputs": [tensor("y", "k", k=1)],
    }
    (bundle / "manifest.yaml").write_text(yaml.safe_dump(data))


def test_meta_layout(tmp_path: Path) -> None:
    bundle = tmp_path / "detector"
    write_meta(bundle)
    (bundle / "model.py").write_text("")
    (bundle / "model.mlir").write_text(MLIR_TEXT)
    manifest = load_manifest(bundle)
    layout = resolve_layout(bundle, manifest)
    assert layout.modules == ()
    assert layout.weights is None
    assert layout.model_py == bundle / "model.py"
    assert len(layout.warnings) == 1
    assert "model.mlir: ignored: a meta model has no modules" in layout.warnings[0]


def test_meta_layout_requires_model_py(tmp_path: Path) -> None:
    bundle = tmp_path / "detector"
    write_meta(bundle)
    (bundle / "model.py").write_text("")
    manifest = load_manifest(bundle)
    (bundle / "model.py").unlink()
    with pytest.raises(BundleError, match=r"model\.py: missing: required for kind: meta"):
        resolve_layout(bundle, manifest)


# --- module files ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("variant", "batch", "expected"),
    [
        (None, 0, "model.mlir"),
        (None, 8, "model.b8.mlir"),
        (0, 0, "model.v0.mlir"),
        (3, 32, "model.v3.b32.mlir"),
    ],
)
def test_module_filename(variant: int | None, batch: int, expected: str) -> None:
    assert module_filename(variant, batch) == expected


def test_bytecode_magic_value() -> None:
    assert bytes([0x4D, 0x4C, 0xEF, 0x52]) == MLIR_BYTECODE_MAGIC


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (MLIR_BYTECODE_MAGIC + b"\x01\x00stablehlo", True),
        (MLIR_BYTECODE_MAGIC, True),
        (MLIR_TEXT.encode(), False),
        (b"ML\xef", False),
        (b"", False),
        (b"\x52\xef\x4c\x4d rest", False),
    ],
)
def test_is_mlir_bytecode(tmp_path: Path, content: bytes, expected: bool) -> None:
    path = tmp_path / "model.mlir"
    path.write_bytes(content)
    assert is_mlir_bytecode(path) is expected
