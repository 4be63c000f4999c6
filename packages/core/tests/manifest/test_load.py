"""Reading manifest.yaml from a bundle directory; model and directory names; public surface."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from reactantserver.core import manifest as manifest_module
from reactantserver.core.errors import BundleError, ManifestError
from reactantserver.core.manifest import (
    is_bundle_dir_name,
    is_valid_model_name,
    load_manifest,
)
from reactantserver.core.types import Batch, Fixed

MANIFEST_3 = """\
format_version: 3.0
name: classifier
description: a test model
executable_inputs:
  - {name: image, dtype: f32, shape: nchw, dims: {c: 3, h: 224, w: 224}}
executable_outputs:
  - {name: logits, dtype: f32, shape: nk, dims: {k: 1000}}
batching: {compiled_batch_sizes: [32, 1, 8]}
provenance: {exporter: reactantserver-export, jax: "0.4.30"}
"""

MANIFEST_2 = """\
format_version: 2
executable_inputs:
  - {name: image, dtype: f32, shape: whcn, dims: {w: 1024, h: 768, c: 3}}
executable_outputs:
  - {name: logits, dtype: f32, shape: kb, dims: {k: 10}}
batching: {batch_dim: 4, compiled_batch_sizes: [1, 4]}
exported_by: ReactantServer.jl
"""


def write(root: Path, name: str, text: str, *, model_py: bool = False) -> Path:
    bundle = root / name
    bundle.mkdir()
    (bundle / "manifest.yaml").write_text(text)
    if model_py:
        (bundle / "model.py").write_text("")
    return bundle


def test_load_3(tmp_path: Path) -> None:
    bundle = write(tmp_path, "resnet", MANIFEST_3)
    manifest = load_manifest(bundle)
    assert manifest.name == "resnet"
    assert manifest.declared_name == "classifier"
    assert manifest.description == "a test model"
    assert manifest.source == str(bundle / "manifest.yaml")
    assert manifest.source_format == "3.0"
    assert manifest.format_version == "3.0"
    assert manifest.compiled_batch_sizes == (1, 8, 32)
    assert manifest.executable_inputs[0].wire_shape == [-1, 3, 224, 224]
    assert manifest.provenance == {"exporter": "reactantserver-export", "jax": "0.4.30"}
    assert manifest.coalescable


def test_load_2(tmp_path: Path) -> None:
    manifest = load_manifest(write(tmp_path, "jl-model", MANIFEST_2))
    assert manifest.source_format == "2.0"
    assert manifest.format_version == "2"
    assert manifest.letters.executable_inputs == ("nchw",)
    assert manifest.executable_inputs[0].wire_shape == [-1, 3, 768, 1024]
    assert manifest.executable_outputs[0].shape == (Batch(), Fixed(10))
    assert manifest.wire_batch_input == "image"
    assert manifest.wire_batch_axis == 1


def test_load_detects_model_py(tmp_path: Path) -> None:
    text = MANIFEST_3 + "client_inputs:\n  - {name: jpeg, dtype: bytes, shape: n}\n"
    with pytest.raises(ManifestError, match="client_inputs: allowed only when"):
        load_manifest(write(tmp_path, "a", text))
    manifest = load_manifest(write(tmp_path, "b", text, model_py=True))
    assert manifest.client_inputs[0].name == "jpeg"


def test_yaml_boolean_dims_rejected(tmp_path: Path) -> None:
    text = MANIFEST_3.replace("{k: 1000}", "{k: yes}")
    with pytest.raises(ManifestError) as info:
        load_manifest(write(tmp_path, "m", text))
    message = str(info.value)
    assert message.startswith(str(tmp_path / "m" / "manifest.yaml"))
    assert "executable_outputs[0].dims.k" in message
    assert "bool True" in message


def test_invalid_yaml(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="invalid YAML") as info:
        load_manifest(write(tmp_path, "m", "format_version: [3.0\n"))
    assert str(tmp_path / "m" / "manifest.yaml") in str(info.value)


def test_empty_manifest(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="top level must be a mapping"):
        load_manifest(write(tmp_path, "m", ""))


def test_missing_manifest(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    with pytest.raises(BundleError, match=r"manifest\.yaml: missing"):
        load_manifest(tmp_path / "m")


def test_invalid_directory_name(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="invalid model name '_hidden'"):
        load_manifest(write(tmp_path, "_hidden", MANIFEST_3))


def test_relative_path_names_the_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bundle = write(tmp_path, "resnet", MANIFEST_3)
    monkeypatch.chdir(bundle)
    assert load_manifest(Path()).name == "resnet"


def test_symlinked_bundle_is_named_by_the_link(tmp_path: Path) -> None:
    target = write(tmp_path, "resnet-v2", MANIFEST_3)
    link = tmp_path / "resnet"
    os.symlink(target, link)
    assert load_manifest(link).name == "resnet"


@pytest.mark.parametrize(
    "name",
    ["m", "resnet50", "ResNet-50", "bert_base.uncased", "0model", "a" * 128, "a.b-c_d"],
)
def test_valid_model_names(name: str) -> None:
    assert is_valid_model_name(name)


@pytest.mark.parametrize(
    "name",
    ["", ".hidden", "_x", "-x", "a" * 129, "a b", "a/b", "café", "m\n", "a:b", "a+b"],
)
def test_invalid_model_names(name: str) -> None:
    assert not is_valid_model_name(name)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("resnet", True),
        ("resnet.v2", True),
        ("tmp", True),
        (".git", False),
        (".resnet.tmp", False),
        ("resnet.tmp", False),
        ("resnet.old", False),
        ("resnet.TMP", True),
    ],
)
def test_is_bundle_dir_name(name: str, expected: bool) -> None:
    assert is_bundle_dir_name(name) is expected


def test_public_surface_is_sorted_and_complete() -> None:
    names = manifest_module.__all__
    # The order ruff's RUF022 keeps: CONSTANTS, then Classes, then functions.
    assert names == sorted(
        names, key=lambda n: (0 if n.isupper() else 1 if n[0].isupper() else 2, n)
    )
    for name in names:
        assert hasattr(manifest_module, name), name
