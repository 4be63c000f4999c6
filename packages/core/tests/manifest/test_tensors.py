"""Tensor entries: keys, dtype tokens, shape letters, dims, and the 2.0 → 3.0 normalisation."""

from __future__ import annotations

from typing import Any

import pytest

from reactantserver.core.dtypes import DType
from reactantserver.core.errors import ManifestError
from reactantserver.core.manifest import Manifest, parse_manifest
from reactantserver.core.types import Batch, Fixed, TensorSpec, Variable

SOURCE = "/bundles/m/manifest.yaml"


def tensor(name: str, shape: str, dtype: str = "f32", **dims: int) -> dict[str, Any]:
    return {"name": name, "dtype": dtype, "shape": shape, "dims": dims}


def with_inputs(*entries: Any, version: str = "3.0") -> dict[str, Any]:
    return {
        "format_version": version,
        "executable_inputs": list(entries),
        "executable_outputs": [tensor("y", "k", k=1)],
    }


def parse(data: Any) -> Manifest:
    return parse_manifest(data, source=SOURCE, model_name="m", has_model_py=False)


def parse_input(entry: Any, version: str = "3.0") -> tuple[TensorSpec, str]:
    manifest = parse(with_inputs(entry, version=version))
    return manifest.executable_inputs[0], manifest.letters.executable_inputs[0]


def reject(data: Any, *fragments: str) -> str:
    with pytest.raises(ManifestError) as info:
        parse(data)
    message = str(info.value)
    assert message.startswith(SOURCE), message
    for fragment in fragments:
        assert fragment in message, message
    return message


# --- keys -----------------------------------------------------------------------------------


def test_tensor_entry_parsed() -> None:
    spec, letters = parse_input(tensor("image", "nchw", "u8", c=3, h=224, w=224))
    assert spec == TensorSpec("image", DType.U8, (Batch(), Fixed(3), Fixed(224), Fixed(224)))
    assert letters == "nchw"


def test_variable_output_axis() -> None:
    data = with_inputs(tensor("x", "k", k=1))
    data["executable_outputs"] = [tensor("boxes", "kf", k=-1, f=6)]
    assert parse(data).executable_outputs[0].shape == (Variable(), Fixed(6))


@pytest.mark.parametrize("key", ["name", "dtype", "shape"])
def test_required_tensor_keys(key: str) -> None:
    entry = tensor("x", "k", k=1)
    del entry[key]
    reject(with_inputs(entry), f"executable_inputs[0].{key}: required")


@pytest.mark.parametrize("key", ["name", "dtype", "shape"])
def test_tensor_keys_must_be_strings(key: str) -> None:
    entry = tensor("x", "k", k=1)
    entry[key] = 12
    reject(with_inputs(entry), f"executable_inputs[0].{key}: must be a string")


def test_tensor_name_non_empty() -> None:
    reject(with_inputs(tensor("", "k", k=1)), "executable_inputs[0].name", "non-empty")


def test_tensor_entry_must_be_mapping() -> None:
    reject(with_inputs("x: f32[n]"), "executable_inputs[0]: must be a mapping")


def test_duplicate_tensor_name_in_one_list() -> None:
    data = with_inputs(tensor("a", "k", k=1), tensor("b", "k", k=1), tensor("a", "k", k=2))
    reject(data, "executable_inputs[2].name", "duplicate tensor name 'a'", "executable_inputs[0]")


def test_same_name_in_different_lists_is_fine() -> None:
    data = with_inputs(tensor("y", "k", k=1))
    assert parse(data).executable_outputs[0].name == "y"


def test_unknown_tensor_key_rejected_in_3() -> None:
    entry = tensor("x", "k", k=1) | {"layout": "NCHW"}
    reject(with_inputs(entry), "executable_inputs[0].layout: unknown key")


def test_unknown_tensor_key_ignored_in_2() -> None:
    entry = tensor("x", "k", k=1) | {"layout": "NCHW"}
    spec, _ = parse_input(entry, version="2.0")
    assert spec.shape == (Fixed(1),)


def test_error_path_in_output_list() -> None:
    data = with_inputs(tensor("x", "k", k=1))
    data["executable_outputs"] = [tensor("y", "k", k=1), tensor("z", "kj", k=1)]
    reject(data, "executable_outputs[1].dims.j", "missing")


def test_error_path_in_client_list() -> None:
    data = with_inputs(tensor("x", "k", k=1))
    data["client_inputs"] = [tensor("a", "k", k=1), tensor("b", "k", k=0)]
    with pytest.raises(ManifestError, match=r"client_inputs\[1\]\.dims\.k"):
        parse_manifest(data, source=SOURCE, model_name="m", has_model_py=True)


# --- dtype ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [d for d in DType if d not in (DType.BYTES,)])
def test_every_dtype_token_accepted(dtype: DType) -> None:
    data = with_inputs(tensor("x", "nk", dtype.token, k=2))
    data["executable_outputs"] = [tensor("y", "k", "i32", k=1)]
    data["client_inputs"] = [tensor("x", "nk", "f32", k=2)]
    manifest = parse_manifest(data, source=SOURCE, model_name="m", has_model_py=True)
    assert manifest.executable_inputs[0].dtype is dtype


@pytest.mark.parametrize("token", ["float", "float32", "F32", "fp32", "bfloat16", "string"])
def test_unknown_dtype_token(token: str) -> None:
    reject(with_inputs(tensor("x", "k", token, k=1)), "executable_inputs[0].dtype", repr(token))


# --- shape letters --------------------------------------------------------------------------


def test_rank_zero() -> None:
    spec, letters = parse_input(tensor("scale", ""))
    assert spec.shape == ()
    assert spec.batch_axis is None
    assert letters == ""


@pytest.mark.parametrize("shape", ["n1", "n_k", "n k", "n,k", "né", "n-"])
def test_shape_letters_must_be_ascii_letters(shape: str) -> None:
    reject(with_inputs(tensor("x", shape, k=1)), "executable_inputs[0].shape", "invalid character")


def test_shape_letters_unique() -> None:
    reject(with_inputs(tensor("x", "nkk", k=1)), "executable_inputs[0].shape", "'k' occurs twice")


def test_batch_letter_at_most_once() -> None:
    reject(with_inputs(tensor("x", "nkn", k=1)), "executable_inputs[0].shape", "twice")


def test_batch_axis_position_is_kept() -> None:
    spec, letters = parse_input(tensor("x", "tnk", t=5, k=3))
    assert spec.shape == (Fixed(5), Batch(), Fixed(3))
    assert spec.batch_axis == 1
    assert letters == "tnk"


def test_b_is_an_ordinary_letter_in_3() -> None:
    reject(with_inputs(tensor("x", "bk", k=1)), "executable_inputs[0].dims.b", "missing")
    spec, _ = parse_input(tensor("x", "bk", b=2, k=1))
    assert spec.shape == (Fixed(2), Fixed(1))


def test_letters_are_case_sensitive() -> None:
    spec, letters = parse_input(tensor("x", "nN", N=7))
    assert spec.shape == (Batch(), Fixed(7))
    assert letters == "nN"


def test_letters_are_scoped_to_one_tensor() -> None:
    data = with_inputs(tensor("a", "nk", k=3), tensor("b", "nk", k=5))
    manifest = parse(data)
    assert [s.shape[1] for s in manifest.executable_inputs] == [Fixed(3), Fixed(5)]


# --- dims -----------------------------------------------------------------------------------


def test_dims_default_empty() -> None:
    entry = tensor("x", "n")
    del entry["dims"]
    spec, _ = parse_input(entry)
    assert spec.shape == (Batch(),)


def test_dims_must_be_mapping() -> None:
    entry = tensor("x", "nk") | {"dims": [4]}
    reject(with_inputs(entry), "executable_inputs[0].dims: must be a mapping")


def test_every_non_batch_letter_needs_dims() -> None:
    reject(with_inputs(tensor("x", "nchw", c=3, w=4)), "executable_inputs[0].dims.h", "missing")


def test_batch_letter_is_never_a_dims_key() -> None:
    reject(with_inputs(tensor("x", "nk", n=8, k=1)), "executable_inputs[0].dims.n", "batch letter")


def test_dims_key_must_occur_in_shape() -> None:
    reject(
        with_inputs(tensor("x", "nk", k=1, j=2)), "executable_inputs[0].dims.j", "does not occur"
    )


@pytest.mark.parametrize("key", [1, "kk", "", True])
def test_dims_key_must_be_a_letter(key: object) -> None:
    entry = tensor("x", "nk", k=1)
    entry["dims"][key] = 2
    reject(with_inputs(entry), f"executable_inputs[0].dims.{key}", "single letter")


@pytest.mark.parametrize("value", [0, -2, -100, True, False, 2.0, 4.5, "4", None, [4]])
def test_dims_value_rejected(value: object) -> None:
    entry = tensor("x", "nk") | {"dims": {"k": value}}
    reject(with_inputs(entry), "executable_inputs[0].dims.k", "int > 0", "-1")


def test_dims_values_fixed_and_variable() -> None:
    data = with_inputs(tensor("x", "nkt", k=2**40, t=-1))
    data["input_shapes"] = [{"t": 3}]
    spec = parse(data).executable_inputs[0]
    assert spec.shape == (Batch(), Fixed(2**40), Variable())
    assert spec.wire_shape == [-1, 2**40, -1]


# --- format 2.0 normalisation ---------------------------------------------------------------


def test_2_whcn_becomes_nchw() -> None:
    spec, letters = parse_input(tensor("image", "whcn", w=1024, h=768, c=3), version="2.0")
    assert letters == "nchw"
    assert spec.shape == (Batch(), Fixed(3), Fixed(768), Fixed(1024))
    assert spec.wire_shape == [-1, 3, 768, 1024]
    assert spec.batch_axis == 0


def test_2_nc_becomes_cn() -> None:
    spec, letters = parse_input(tensor("x", "nc", c=16), version="2.0")
    assert letters == "cn"
    assert spec.shape == (Fixed(16), Batch())
    assert spec.batch_axis == 1


def test_2_b_marker_becomes_n() -> None:
    spec, letters = parse_input(tensor("x", "kb", k=10), version="2.0")
    assert letters == "nk"
    assert spec.shape == (Batch(), Fixed(10))


def test_2_without_batch_marker() -> None:
    spec, letters = parse_input(tensor("x", "wh", w=4, h=3), version="2.0")
    assert letters == "hw"
    assert spec.shape == (Fixed(3), Fixed(4))


def test_2_outputs_and_client_lists_are_normalised() -> None:
    data = with_inputs(tensor("x", "kb", k=2), version="2.0")
    data["executable_outputs"] = [tensor("y", "jkb", j=5, k=6)]
    data["client_outputs"] = [tensor("z", "wb", w=7)]
    manifest = parse_manifest(data, source=SOURCE, model_name="m", has_model_py=True)
    assert manifest.executable_outputs[0].shape == (Batch(), Fixed(6), Fixed(5))
    assert manifest.letters.executable_outputs == ("nkj",)
    assert manifest.client_outputs[0].shape == (Batch(), Fixed(7))
    assert manifest.letters.client_outputs == ("nw",)


def test_2_wire_batch_axis_after_normalisation() -> None:
    manifest = parse(with_inputs(tensor("x", "ncw", c=2, w=3), version="2.0"))
    # 2.0 `ncw` (batch first, column-major) is 3.0 `wcn`: batch is the last row-major axis.
    assert manifest.letters.executable_inputs == ("wcn",)
    assert manifest.wire_batch_axis == 3


def test_2_n_and_b_together_rejected() -> None:
    reject(
        with_inputs(tensor("x", "nkb", k=1), version="2.0"),
        "executable_inputs[0].shape",
        "more than one batch letter",
    )


@pytest.mark.parametrize("marker", ["n", "b"])
def test_2_batch_marker_never_a_dims_key(marker: str) -> None:
    entry = tensor("x", f"k{marker}", k=1) | {"dims": {"k": 1, marker: 4}}
    reject(with_inputs(entry, version="2.0"), f"executable_inputs[0].dims.{marker}", "batch letter")


def test_2_shape_rules_still_apply() -> None:
    reject(with_inputs(tensor("x", "whcn", w=1, h=1), version="2.0"), "dims.c", "missing")
    reject(with_inputs(tensor("x", "w1", w=1), version="2.0"), "shape", "invalid character")
