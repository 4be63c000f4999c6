"""Multi-shape variants (``input_shapes``): rules, key order, and the 2.0 key recomputation."""

from __future__ import annotations

from typing import Any

import pytest

from reactantserver.core.errors import ManifestError
from reactantserver.core.manifest import Manifest, VariableAxis, Variant, parse_manifest
from reactantserver.core.types import Batch, Fixed, Variable

SOURCE = "/bundles/m/manifest.yaml"


def tensor(name: str, shape: str, dtype: str = "f32", **dims: int) -> dict[str, Any]:
    return {"name": name, "dtype": dtype, "shape": shape, "dims": dims}


def bundle(*inputs: dict[str, Any], variants: Any = None, version: str = "3.0") -> dict[str, Any]:
    data: dict[str, Any] = {
        "format_version": version,
        "executable_inputs": list(inputs),
        "executable_outputs": [tensor("y", "nk", k=1)],
    }
    if variants is not None:
        data["input_shapes"] = variants
    return data


def image() -> dict[str, Any]:
    return {"name": "image", "dtype": "f32", "shape": "nchw", "dims": {"c": 3, "h": -1, "w": -1}}


def parse(data: Any) -> Manifest:
    return parse_manifest(data, source=SOURCE, model_name="m", has_model_py=False)


def reject(data: Any, *fragments: str) -> str:
    with pytest.raises(ManifestError) as info:
        parse(data)
    message = str(info.value)
    assert message.startswith(SOURCE), message
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_variants_parsed_in_row_major_key_order() -> None:
    manifest = parse(bundle(image(), variants=[{"w": 1024, "h": 768}, {"h": 512, "w": 512}]))
    assert manifest.variable_letters == ("h", "w")
    assert manifest.variants == (Variant(0, (768, 1024)), Variant(1, (512, 512)))
    assert manifest.variant_keys == ((768, 1024), (512, 512))
    assert manifest.variants[1].file_prefix == "model.v1"
    assert manifest.executable_inputs[0].shape == (Batch(), Fixed(3), Variable(), Variable())


def test_variable_axes_and_key_order_over_inputs() -> None:
    data = bundle(
        tensor("tokens", "nt", "i32", t=-1),
        tensor("image", "nhw", h=-1, w=-1),
        tensor("mask", "nt", "bool", t=-1),
        variants=[{"w": 4, "t": 16, "h": 3}],
    )
    manifest = parse(data)
    # Collected over inputs in order, then axes row-major; a shared letter shares one slot.
    assert manifest.variable_letters == ("t", "h", "w")
    assert manifest.variants[0].key == (16, 3, 4)
    assert manifest.variable_axes == (
        VariableAxis(0, "tokens", 1, "t", 0),
        VariableAxis(1, "image", 1, "h", 1),
        VariableAxis(1, "image", 2, "w", 2),
        VariableAxis(2, "mask", 1, "t", 0),
    )


def test_file_index_is_list_position() -> None:
    manifest = parse(bundle(image(), variants=[{"h": 9, "w": 9}, {"h": 1, "w": 1}]))
    assert [v.index for v in manifest.variants] == [0, 1]


def test_find_variant() -> None:
    manifest = parse(bundle(image(), variants=[{"h": 2, "w": 3}, {"h": 4, "w": 2}]))
    assert manifest.find_variant((4, 2)) == Variant(1, (4, 2))
    assert manifest.find_variant((5, 5)) is None


def test_letter_variable_in_one_input_and_fixed_in_another() -> None:
    data = bundle(tensor("a", "nw", w=-1), tensor("b", "nw", w=8), variants=[{"w": 5}])
    manifest = parse(data)
    assert manifest.variable_letters == ("w",)
    assert manifest.variants[0].key == (5,)


def test_variable_output_axis_needs_no_variants() -> None:
    data = bundle(tensor("x", "nk", k=4))
    data["executable_outputs"] = [tensor("boxes", "nkf", k=-1, f=6)]
    assert parse(data).variants == ()


@pytest.mark.parametrize("variants", [None, []])
def test_variable_input_axis_requires_input_shapes(variants: Any) -> None:
    reject(bundle(image(), variants=variants), "input_shapes: required", "image.h", "image.w")


def test_input_shapes_require_a_variable_input_axis() -> None:
    data = bundle(tensor("x", "nk", k=4), variants=[{"k": 4}])
    reject(data, "input_shapes: allowed only when", "VARIABLE")


def test_empty_input_shapes_without_variable_axes_is_absent() -> None:
    assert parse(bundle(tensor("x", "nk", k=4), variants=[])).variants == ()


def test_input_shapes_must_be_a_list() -> None:
    reject(bundle(image(), variants={"h": 1, "w": 1}), "input_shapes: must be a list")


def test_variant_entry_must_be_mapping() -> None:
    reject(
        bundle(image(), variants=[{"h": 1, "w": 1}, [1, 1]]), "input_shapes[1]: must be a mapping"
    )


def test_missing_variable_letter() -> None:
    reject(bundle(image(), variants=[{"h": 2, "w": 3}, {"h": 2}]), "input_shapes[1].w", "missing")


@pytest.mark.parametrize("letter", ["c", "n", "q"])
def test_non_variable_letter(letter: str) -> None:
    data = bundle(image(), variants=[{"h": 2, "w": 3, letter: 3}])
    reject(data, f"input_shapes[0].{letter}", "not a variable letter", "image.h")


@pytest.mark.parametrize("size", [0, -1, True, 2.0, "2", None])
def test_variant_size_must_be_positive_int(size: object) -> None:
    reject(bundle(image(), variants=[{"h": size, "w": 3}]), "input_shapes[0].h", "int > 0")


def test_duplicate_variants() -> None:
    variants = [{"h": 2, "w": 3}, {"h": 4, "w": 4}, {"w": 3, "h": 2}]
    reject(bundle(image(), variants=variants), "input_shapes[2]", "duplicate", "input_shapes[0]")


# --- format 2.0 -----------------------------------------------------------------------------


def test_2_variant_key_recomputed_in_3_axis_order() -> None:
    # 2.0 `whcn` is 3.0 `nchw`: the key orders h before w although the file writes w first.
    data = bundle(
        tensor("image", "whcn", w=-1, h=-1, c=3),
        variants=[{"w": 1024, "h": 768}, {"w": 640, "h": 480}],
        version="2.0",
    )
    manifest = parse(data)
    assert manifest.letters.executable_inputs == ("nchw",)
    assert manifest.variable_letters == ("h", "w")
    assert manifest.variants == (Variant(0, (768, 1024)), Variant(1, (480, 640)))
    assert manifest.executable_inputs[0].wire_shape == [-1, 3, -1, -1]


def test_2_variant_keys_over_several_inputs() -> None:
    data = bundle(
        tensor("a", "stb", s=-1, t=-1),
        tensor("b", "ub", u=-1),
        variants=[{"s": 1, "t": 2, "u": 3}],
        version="2.0",
    )
    manifest = parse(data)
    assert manifest.letters.executable_inputs == ("nts", "nu")
    assert manifest.variable_letters == ("t", "s", "u")
    assert manifest.variants[0].key == (2, 1, 3)


@pytest.mark.parametrize("marker", ["b", "n"])
def test_2_batch_marker_is_not_a_variant_letter(marker: str) -> None:
    data = bundle(
        tensor("image", f"wh{marker}", w=-1, h=-1),
        variants=[{"w": 2, "h": 2, marker: 4}],
        version="2.0",
    )
    reject(data, f"input_shapes[0].{marker}", "not a variable letter")


def test_2_variant_rules_still_apply() -> None:
    data = bundle(tensor("image", "whb", w=-1, h=-1), variants=[{"w": 2}], version="2.0")
    reject(data, "input_shapes[0].h", "missing")
