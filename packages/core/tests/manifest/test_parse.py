"""Top-level manifest rules: format, kind, meta, list presence, dtypes, batching, derived values."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from reactantserver.core.dtypes import DType
from reactantserver.core.errors import ManifestError
from reactantserver.core.manifest import Manifest, parse_manifest
from reactantserver.core.types import Batch, Fixed, TensorSpec

SOURCE = "/bundles/m/manifest.yaml"
DROP: Any = object()


def tensor(name: str, shape: str, dtype: str = "f32", **dims: int) -> dict[str, Any]:
    return {"name": name, "dtype": dtype, "shape": shape, "dims": dims}


def model(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "format_version": "3.0",
        "executable_inputs": [tensor("x", "nk", k=4)],
        "executable_outputs": [tensor("y", "nk", k=2)],
    }
    data.update(overrides)
    return {key: value for key, value in data.items() if value is not DROP}


def meta(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "format_version": "3.0",
        "kind": "meta",
        "meta": {"calls": ["a", "b"]},
        "client_inputs": [tensor("image", "chw", c=3, h=8, w=8)],
        "client_outputs": [tensor("boxes", "kf", k=-1, f=6)],
    }
    data.update(overrides)
    return {key: value for key, value in data.items() if value is not DROP}


def parse(data: Any, *, model_py: bool = False, name: str = "m") -> Manifest:
    return parse_manifest(data, source=SOURCE, model_name=name, has_model_py=model_py)


def reject(data: Any, *fragments: str, model_py: bool = False, name: str = "m") -> str:
    with pytest.raises(ManifestError) as info:
        parse(data, model_py=model_py, name=name)
    message = str(info.value)
    assert message.startswith(SOURCE), message
    for fragment in fragments:
        assert fragment in message, message
    return message


# --- format_version -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [("3.0", "3.0"), ("3", "3.0"), (3, "3.0"), (3.0, "3.0"), ("2.0", "2.0"), ("2", "2.0"),
     (2, "2.0"), (2.0, "2.0")],
)  # fmt: skip
def test_format_version_accepted(value: object, expected: str) -> None:
    manifest = parse(model(format_version=value))
    assert manifest.source_format == expected
    assert manifest.format_version == str(value)


@pytest.mark.parametrize("value", ["4.0", "3.1", 3.1, "v3", "3.00", "", True, [3], {"v": 3}])
def test_format_version_rejected(value: object) -> None:
    reject(model(format_version=value), "format_version")


def test_format_version_required() -> None:
    reject(model(format_version=DROP), "format_version", "required")


@pytest.mark.parametrize("data", [None, [], "format_version: 3.0", 3])
def test_top_level_must_be_mapping(data: object) -> None:
    reject(data, "top level must be a mapping")


def test_unknown_top_level_key_rejected_in_3() -> None:
    reject(model(max_batch_size=8), "max_batch_size: unknown key")


def test_unknown_top_level_key_ignored_in_2() -> None:
    manifest = parse(model(format_version="2.0", max_batch_size=8))
    assert manifest.source_format == "2.0"


# --- name, description, provenance ---------------------------------------------------------


def test_name_is_informational() -> None:
    manifest = parse(model(name="something-else", description="a model"), name="resnet")
    assert manifest.name == "resnet"
    assert manifest.declared_name == "something-else"
    assert manifest.description == "a model"


def test_defaults() -> None:
    manifest = parse(model())
    assert manifest.declared_name == ""
    assert manifest.description == ""
    assert manifest.kind == "model"
    assert manifest.meta_calls == ()
    assert manifest.compiled_batch_sizes == ()
    assert manifest.variants == ()
    assert dict(manifest.provenance) == {}
    assert manifest.source == SOURCE


@pytest.mark.parametrize("key", ["name", "description"])
def test_name_and_description_must_be_strings(key: str) -> None:
    reject(model(**{key: 12}), f"{key}: must be a string")


def test_null_optional_keys_count_as_absent() -> None:
    manifest = parse(model(name=None, description=None, batching=None, provenance=None))
    assert manifest.declared_name == ""
    assert manifest.compiled_batch_sizes == ()


def test_provenance_is_stored_as_a_private_copy() -> None:
    provenance: dict[str, Any] = {"git": {"commit": "abc", "dirty": True}, "jax": "0.4"}
    manifest = parse(model(provenance=provenance))
    provenance["git"]["commit"] = "changed"
    assert manifest.provenance["git"] == {"commit": "abc", "dirty": True}
    hash(manifest)  # provenance is unhashable but kept out of the hash


def test_provenance_must_be_mapping() -> None:
    reject(model(provenance=["x"]), "provenance: must be a mapping")


def test_manifest_is_frozen() -> None:
    manifest = parse(model())
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        manifest.name = "other"  # type: ignore[misc]


# --- kind and meta -------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["Model", "regular", 1, True])
def test_kind_rejected(value: object) -> None:
    reject(model(kind=value), "kind: must be")


def test_meta_minimal() -> None:
    manifest = parse(meta(), model_py=True, name="detector")
    assert manifest.kind == "meta"
    assert manifest.is_meta
    assert manifest.meta_calls == ("a", "b")
    assert manifest.executable_inputs == ()
    assert manifest.executable_outputs == ()
    assert [t.name for t in manifest.client_inputs] == ["image"]
    assert manifest.letters.client_outputs == ("kf",)
    assert manifest.batch_keys == ()
    assert not manifest.coalescable
    assert manifest.wire_batch_input == ""
    assert manifest.wire_batch_axis == 0


def test_meta_calls_may_be_empty() -> None:
    manifest = parse(meta(meta={"calls": []}), model_py=True)
    assert manifest.meta_calls == ()


def test_meta_allows_empty_executable_lists_and_batching() -> None:
    data = meta(executable_inputs=[], executable_outputs=[], input_shapes=[])
    data["batching"] = {"compiled_batch_sizes": []}
    assert parse(data, model_py=True).is_meta


@pytest.mark.parametrize(
    ("overrides", "fragments"),
    [
        ({"meta": DROP}, ("meta: required",)),
        ({"meta": ["a"]}, ("meta: must be a mapping",)),
        ({"meta": {}}, ("meta.calls: required",)),
        ({"meta": {"calls": "a"}}, ("meta.calls: must be a list",)),
        ({"meta": {"calls": ["a", 3]}}, ("meta.calls[1]: must be a string",)),
        ({"meta": {"calls": ["a", "b", "a"]}}, ("meta.calls[2]", "duplicate callee 'a'")),
        ({"meta": {"calls": ["a", "detector"]}}, ("meta.calls[1]", "must not call itself")),
        ({"meta": {"calls": [], "parallel": 2}}, ("meta.parallel: unknown key",)),
        ({"executable_inputs": [tensor("x", "k", k=1)]}, ("executable_inputs: must be absent",)),
        ({"executable_outputs": [tensor("y", "k", k=1)]}, ("executable_outputs: must be absent",)),
        ({"client_inputs": DROP}, ("client_inputs: required and non-empty",)),
        ({"client_inputs": []}, ("client_inputs: required and non-empty",)),
        ({"client_outputs": DROP}, ("client_outputs: required and non-empty",)),
        ({"client_outputs": []}, ("client_outputs: required and non-empty",)),
        ({"batching": {"compiled_batch_sizes": [1]}}, ("batching.compiled_batch_sizes",)),
        ({"input_shapes": [{"k": 1}]}, ("input_shapes: forbidden for kind: meta",)),
    ],
)
def test_meta_rejected(overrides: dict[str, Any], fragments: tuple[str, ...]) -> None:
    reject(meta(**overrides), *fragments, model_py=True, name="detector")


def test_meta_requires_model_py() -> None:
    reject(meta(), "kind: a meta model requires model.py")


def test_meta_unknown_key_ignored_in_2() -> None:
    data = meta(format_version="2.0", meta={"calls": ["a"], "parallel": 2})
    assert parse(data, model_py=True).meta_calls == ("a",)


def test_meta_key_forbidden_for_models() -> None:
    reject(model(meta={"calls": []}), "meta: allowed only with kind: meta")


# --- list presence for kind: model ----------------------------------------------------------


def test_executable_inputs_required() -> None:
    reject(model(executable_inputs=DROP), "executable_inputs: required")


def test_executable_inputs_may_be_empty() -> None:
    manifest = parse(model(executable_inputs=[]))
    assert manifest.executable_inputs == ()
    assert not manifest.has_batch_axis
    assert not manifest.coalescable


@pytest.mark.parametrize("value", [DROP, []])
def test_executable_outputs_required_non_empty(value: object) -> None:
    reject(model(executable_outputs=value), "executable_outputs: required and non-empty")


@pytest.mark.parametrize("value", ["x", {"name": "x"}, 3])
def test_tensor_lists_must_be_lists(value: object) -> None:
    reject(model(executable_inputs=value), "executable_inputs: must be a list")


@pytest.mark.parametrize("key", ["client_inputs", "client_outputs"])
def test_client_lists_need_model_py(key: str) -> None:
    reject(model(**{key: [tensor("q", "k", k=1)]}), f"{key}: allowed only when", "model.py")


def test_client_lists_default_to_executable_lists() -> None:
    manifest = parse(model(), model_py=True)
    assert manifest.client_inputs == manifest.executable_inputs
    assert manifest.client_outputs == manifest.executable_outputs
    assert manifest.letters.client_inputs == manifest.letters.executable_inputs
    assert not manifest.client_inputs_declared
    assert not manifest.client_outputs_declared


def test_client_lists_with_model_py() -> None:
    data = model(
        client_inputs=[tensor("text", "n", "bytes")],
        client_outputs=[tensor("label", "n", "bytes"), tensor("score", "n")],
    )
    manifest = parse(data, model_py=True)
    assert manifest.client_inputs == (TensorSpec("text", DType.BYTES, (Batch(),)),)
    assert [t.name for t in manifest.client_outputs] == ["label", "score"]
    assert manifest.client_inputs_declared
    assert manifest.client_outputs_declared
    assert manifest.executable_inputs[0].shape == (Batch(), Fixed(4))


def test_empty_client_inputs_allowed_for_models() -> None:
    manifest = parse(model(client_inputs=[]), model_py=True)
    assert manifest.client_inputs == ()
    assert manifest.client_inputs_declared


# --- dtype rules ----------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["executable_inputs", "executable_outputs"])
def test_bytes_only_in_client_lists(key: str) -> None:
    data = model(**{key: [tensor("x", "nk", k=4), tensor("raw", "n", "bytes")]})
    reject(data, f"{key}[1].dtype", "'raw'", "bytes tensors are legal only in client_")


@pytest.mark.parametrize("token", ["f8_e4m3", "f8_e5m2"])
@pytest.mark.parametrize("key", ["executable_inputs", "executable_outputs"])
def test_fp8_not_client_facing_without_model_py(key: str, token: str) -> None:
    data = model(**{key: [tensor("x", "nk", k=4), tensor("q8", "nk", token, k=4)]})
    reject(data, f"{key}[1].dtype", "'q8'", "wire datatype", token)


def test_fp8_not_client_facing_when_client_lists_default() -> None:
    data = model(executable_inputs=[tensor("q8", "nk", "f8_e4m3", k=4)])
    reject(data, "executable_inputs[0].dtype", "no client_inputs declared", model_py=True)


def test_fp8_allowed_in_executable_lists_behind_client_lists() -> None:
    data = model(
        executable_inputs=[tensor("q8", "nk", "f8_e4m3", k=4)],
        executable_outputs=[tensor("o8", "nk", "f8_e5m2", k=2)],
        client_inputs=[tensor("x", "nk", k=4)],
        client_outputs=[tensor("y", "nk", "bf16", k=2)],
    )
    manifest = parse(data, model_py=True)
    assert manifest.executable_inputs[0].dtype is DType.F8_E4M3
    assert manifest.client_outputs[0].dtype is DType.BF16


@pytest.mark.parametrize("key", ["client_inputs", "client_outputs"])
def test_fp8_rejected_in_client_lists(key: str) -> None:
    data = model(**{key: [tensor("a", "k", k=1), tensor("b", "k", "f8_e5m2", k=1)]})
    reject(data, f"{key}[1].dtype", "'b'", "wire datatype", model_py=True)


def test_fp8_rejected_in_meta_client_outputs() -> None:
    data = meta(client_outputs=[tensor("boxes", "kf", "f8_e4m3", k=-1, f=6)])
    reject(data, "client_outputs[0].dtype", "wire datatype", model_py=True)


# --- batching -------------------------------------------------------------------------------


def test_compiled_batch_sizes_sorted() -> None:
    manifest = parse(model(batching={"compiled_batch_sizes": [32, 1, 8]}))
    assert manifest.compiled_batch_sizes == (1, 8, 32)
    assert manifest.batch_keys == (1, 8, 32)


def test_empty_batching_means_lone_module() -> None:
    manifest = parse(model(batching={}))
    assert manifest.compiled_batch_sizes == ()
    assert manifest.batch_keys == (0,)


@pytest.mark.parametrize(
    ("batching", "fragments"),
    [
        ([1, 8], ("batching: must be a mapping",)),
        ({"compiled_batch_sizes": 8}, ("batching.compiled_batch_sizes: must be a list",)),
        ({"compiled_batch_sizes": [1, "8"]}, ("compiled_batch_sizes[1]", "int > 0")),
        ({"compiled_batch_sizes": [1, 8.0]}, ("compiled_batch_sizes[1]", "int > 0")),
        ({"compiled_batch_sizes": [True]}, ("compiled_batch_sizes[0]", "bool")),
        ({"compiled_batch_sizes": [0]}, ("compiled_batch_sizes[0]", "int > 0")),
        ({"compiled_batch_sizes": [-4]}, ("compiled_batch_sizes[0]", "int > 0")),
        ({"compiled_batch_sizes": [1, 8, 1]}, ("compiled_batch_sizes[2]", "duplicate", "[0]")),
        ({"compiled_batch_sizes": [1], "batch_dim": 1}, ("batching.batch_dim: unknown key",)),
    ],
)
def test_batching_rejected(batching: object, fragments: tuple[str, ...]) -> None:
    reject(model(batching=batching), *fragments)


def test_unknown_batching_keys_ignored_in_2() -> None:
    data = model(format_version="2.0", batching={"batch_dim": 2, "compiled_batch_sizes": [4]})
    assert parse(data).compiled_batch_sizes == (4,)


def test_mixed_batched_and_unbatched_inputs_rejected() -> None:
    data = model(executable_inputs=[tensor("x", "nk", k=4), tensor("const", "k", k=4)])
    reject(data, "executable_inputs[1]", "mixes batched and unbatched inputs: `const`")


def test_mixed_inputs_error_names_every_unbatched_input() -> None:
    data = model(
        executable_inputs=[tensor("a", "k", k=1), tensor("b", "nk", k=1), tensor("c", "k", k=1)]
    )
    reject(data, "executable_inputs[0]", "`a`, `c`", "`b`")


def test_several_batch_sizes_require_batch_axis() -> None:
    data = model(
        executable_inputs=[tensor("x", "k", k=4)],
        batching={"compiled_batch_sizes": [1, 8]},
    )
    reject(data, "batching.compiled_batch_sizes", "require a batch axis")


def test_single_batch_size_without_batch_axis_is_legal_but_not_coalescable() -> None:
    data = model(
        executable_inputs=[tensor("x", "k", k=4)],
        batching={"compiled_batch_sizes": [4]},
    )
    manifest = parse(data)
    assert not manifest.has_batch_axis
    assert not manifest.coalescable
    assert manifest.batch_keys == (4,)


def test_client_tensors_exempt_from_all_or_nothing() -> None:
    data = model(
        client_inputs=[tensor("query", "k", k=4), tensor("keys", "nk", k=4)],
        batching={"compiled_batch_sizes": [1, 8]},
    )
    manifest = parse(data, model_py=True)
    assert manifest.wire_batch_input == "keys"
    assert manifest.wire_batch_axis == 1


def test_coalescable() -> None:
    manifest = parse(model(batching={"compiled_batch_sizes": [1, 8]}))
    assert manifest.has_batch_axis
    assert manifest.coalescable


def test_not_coalescable_with_lone_module() -> None:
    manifest = parse(model())
    assert manifest.has_batch_axis
    assert not manifest.coalescable


def test_not_coalescable_with_unbatched_output() -> None:
    data = model(
        executable_outputs=[tensor("y", "nk", k=2), tensor("stats", "k", k=2)],
        batching={"compiled_batch_sizes": [1, 8]},
    )
    assert not parse(data).coalescable


def test_not_coalescable_without_inputs() -> None:
    data = model(executable_inputs=[], batching={"compiled_batch_sizes": [4]})
    assert not parse(data).coalescable


# --- wire batch input / axis ----------------------------------------------------------------


def test_wire_batch_axis_is_one_based() -> None:
    data = model(executable_inputs=[tensor("image", "nchw", c=3, h=4, w=4)])
    manifest = parse(data)
    assert manifest.wire_batch_input == "image"
    assert manifest.wire_batch_axis == 1


def test_wire_batch_axis_at_later_position() -> None:
    data = model(
        executable_inputs=[tensor("a", "kn", k=4), tensor("b", "tkn", t=2, k=3)],
        executable_outputs=[tensor("y", "kn", k=2)],
    )
    manifest = parse(data)
    assert manifest.executable_inputs[0].batch_axis == 1
    assert manifest.executable_inputs[1].batch_axis == 2
    assert manifest.wire_batch_input == "a"
    assert manifest.wire_batch_axis == 2


def test_no_wire_batch_input() -> None:
    manifest = parse(model(executable_inputs=[tensor("x", "k", k=4)]))
    assert manifest.wire_batch_input == ""
    assert manifest.wire_batch_axis == 0


def test_wire_batch_input_uses_client_lists() -> None:
    data = model(client_inputs=[tensor("prompt", "t", t=16), tensor("image", "hwn", h=2, w=2)])
    manifest = parse(data, model_py=True)
    assert manifest.wire_batch_input == "image"
    assert manifest.wire_batch_axis == 3


def test_meta_wire_batch_input_from_client_inputs() -> None:
    data = meta(client_inputs=[tensor("image", "nchw", c=3, h=8, w=8)])
    manifest = parse(data, model_py=True)
    assert manifest.wire_batch_input == "image"
    assert manifest.wire_batch_axis == 1


# --- the documented example ---------------------------------------------------------------------


def test_spec_example() -> None:
    data = {
        "format_version": "3.0",
        "kind": "model",
        "executable_inputs": [tensor("image", "nchw", c=3, h=224, w=224)],
        "executable_outputs": [tensor("logits", "nk", k=1000)],
        "batching": {"compiled_batch_sizes": [1, 8, 32]},
    }
    manifest = parse(data, name="resnet")
    assert manifest.executable_inputs == (
        TensorSpec("image", DType.F32, (Batch(), Fixed(3), Fixed(224), Fixed(224))),
    )
    assert manifest.executable_outputs[0].wire_shape == [-1, 1000]
    assert manifest.compiled_batch_sizes == (1, 8, 32)
    assert manifest.coalescable
    assert manifest.wire_batch_input == "image"
    assert manifest.wire_batch_axis == 1
    assert manifest.letters.executable_inputs == ("nchw",)
    assert manifest == parse(data, name="resnet")
    assert hash(manifest) == hash(parse(data, name="resnet"))
