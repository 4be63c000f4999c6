"""The ``NAME=DTYPE[AXES]`` syntax and tensor declarations."""

from __future__ import annotations

import pytest

from reactantserver.core.dtypes import DType
from reactantserver.core.types import Batch, Fixed, TensorSpec, Variable
from reactantserver.export import ExportError, TensorDecl, parse_tensor_spec


def test_named_axes_and_batch_letter() -> None:
    decl = parse_tensor_spec("image=f32[n,c=3,h=224,w=224]")
    assert decl.name == "image"
    assert decl.dtype is DType.F32
    assert decl.letters == "nchw"
    assert decl.dims == (Batch(), Fixed(3), Fixed(224), Fixed(224))
    assert decl.batch_axis == 0
    assert decl.manifest_entry() == {
        "name": "image",
        "dtype": "f32",
        "shape": "nchw",
        "dims": {"c": 3, "h": 224, "w": 224},
    }
    assert str(decl) == "image=f32[n,c=3,h=224,w=224]"


def test_bare_sizes_get_auto_letters_that_avoid_explicit_ones() -> None:
    decl = parse_tensor_spec("x=f32[n,16]")
    assert decl.letters == "na"
    assert decl.dims == (Batch(), Fixed(16))
    decl = parse_tensor_spec("y = i64 [ 4 , a=2 , 7 ]")
    assert decl.letters == "bac"
    assert decl.concrete_shape(0, {}) == (4, 2, 7)


def test_variable_axis_and_concrete_shapes() -> None:
    decl = parse_tensor_spec("tokens=i32[n,l=-1]")
    assert decl.dims == (Batch(), Variable())
    assert decl.variable_letters == ("l",)
    assert decl.concrete_shape(8, {"l": 128}) == (8, 128)
    with pytest.raises(ExportError, match="no size for variable axis 'l'"):
        decl.concrete_shape(8, {})


def test_batch_axis_anywhere_and_scalars() -> None:
    assert parse_tensor_spec("x=f32[c=3,n]").batch_axis == 1
    scalar = parse_tensor_spec("t=f32[]")
    assert scalar.letters == ""
    assert scalar.manifest_entry() == {"name": "t", "dtype": "f32", "shape": ""}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("x", "expected NAME=DTYPE"),
        ("x=float32[n]", "unknown dtype token 'float32'"),
        ("x=f32[n,h]", "a lettered axis needs a size"),
        ("x=f32[n=4]", "'n' is the batch axis and takes no size"),
        ("x=f32[n,0]", "must be > 0"),
        ("x=f32[n,h=0]", "must be > 0"),
        ("x=f32[n,-1]", "a variable axis needs a letter"),
        ("x=f32[n,h=3,h=4]", "repeat a letter"),
        ("x=f32[n,n]", "repeat a letter"),
        ("x=f32[n,3.5]", "expected n, LETTER=SIZE"),
    ],
)
def test_bad_specs_name_the_problem(text: str, message: str) -> None:
    with pytest.raises(ExportError, match=message) as info:
        parse_tensor_spec(text)
    assert text.split("[", maxsplit=1)[0] in str(info.value)


def test_from_spec_and_validation() -> None:
    spec = TensorSpec("x", DType.U8, (Batch(), Fixed(28), Fixed(28)))
    decl = TensorDecl.from_spec(spec)
    assert decl.letters == "nab"
    assert decl.spec == spec
    with pytest.raises(ExportError, match="batch axis must use the letter 'n'"):
        TensorDecl("x", DType.F32, "b", (Batch(),))
    with pytest.raises(ExportError, match="batch axis must use the letter 'n'"):
        TensorDecl("x", DType.F32, "n", (Fixed(3),))
