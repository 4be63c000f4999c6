"""ScheduledModel: executable-level request checks and the effective max batch."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from reactantserver.core.errors import InvalidArgumentError
from reactantserver.core.hooks import NamedTensor
from reactantserver.core.manifest import VariableAxis
from reactantserver.core.types import Batch, Fixed, Variable
from reactantserver.worker.scheduler.model import ScheduledModel

from ._builders import scheduled, spec

Array = np.ndarray[Any, Any]

X = spec("x", Batch(), Fixed(2))
Y = spec("y", Fixed(3), Batch(), dtype="INT32")  # batch axis 1


def _plain(sizes: tuple[int, ...] = (1, 4)) -> ScheduledModel:
    return scheduled("m", inputs=(X, Y), sizes=sizes)


def _x(rows: int) -> NamedTensor:
    return NamedTensor("x", np.zeros((rows, 2), np.float32))


def _y(rows: int) -> NamedTensor:
    return NamedTensor("y", np.zeros((3, rows), np.int32))


def _rejects(model: ScheduledModel, tensors: list[NamedTensor], message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message) as info:
        model.prepare(tensors)
    assert info.value.status.name == "INVALID_ARGUMENT"


# -- the plain (single-variant, multi-size) model ---------------------------------------------


def test_prepare_orders_inputs_and_counts_rows() -> None:
    model = _plain()
    x, y = _x(3), _y(3)
    arrays, variant, rows = model.prepare([y, x])
    assert arrays[0] is x.data
    assert arrays[1] is y.data
    assert variant is None
    assert rows == 3


def test_derived_sizes_and_axes() -> None:
    model = scheduled("m", inputs=(X, Y), sizes=(8, 1, 4))
    assert model.sizes == {None: (1, 4, 8)}
    assert model.input_axes == (0, 1)


def test_missing_input() -> None:
    _rejects(_plain(), [_x(1)], "model 'm' expects input 'y', missing")


def test_undeclared_input() -> None:
    extra = NamedTensor("z", np.zeros((1, 2), np.float32))
    _rejects(_plain(), [_x(1), _y(1), extra], "unexpected inference input 'z' for model 'm'")


def test_duplicate_input() -> None:
    _rejects(_plain(), [_x(1), _y(1), _x(1)], "input 'x' appears more than once")


def test_dtype_mismatch() -> None:
    wrong = NamedTensor("x", np.zeros((1, 2), np.float64))
    _rejects(_plain(), [wrong, _y(1)], "input 'x' of model 'm' has datatype FP64, expected FP32")


def test_rank_mismatch() -> None:
    wrong = NamedTensor("x", np.zeros((1, 2, 1), np.float32))
    _rejects(_plain(), [wrong, _y(1)], r"has shape \[1, 2, 1\], expected rank 2 \(\[-1, 2\]\)")


def test_fixed_extent_mismatch() -> None:
    wrong = NamedTensor("x", np.zeros((1, 5), np.float32))
    _rejects(
        _plain(), [wrong, _y(1)], r"input 'x' of model 'm' has shape \[1, 5\], expected \[-1, 2\]"
    )


def test_batched_inputs_disagree_on_rows() -> None:
    _rejects(_plain(), [_x(2), _y(3)], "disagree on the batch size: 'x' has 2 rows, 'y' has 3")


def test_zero_rows() -> None:
    _rejects(_plain(), [_x(0), _y(0)], "input 'x' of model 'm' has 0 rows")


def test_rows_above_the_largest_compiled_size() -> None:
    model = _plain()
    assert model.prepare([_x(4), _y(4)])[2] == 4
    _rejects(
        model, [_x(5), _y(5)], "batch size 5 of model 'm' exceeds its largest compiled batch size 4"
    )


# -- variants ----------------------------------------------------------------------------------

IMG = spec("img", Batch(), Variable(), Variable())
MASK = spec("mask", Batch(), Variable())
AXES = (
    VariableAxis(input_index=0, input_name="img", axis=1, letter="h", key_index=0),
    VariableAxis(input_index=0, input_name="img", axis=2, letter="w", key_index=1),
    VariableAxis(input_index=1, input_name="mask", axis=1, letter="h", key_index=0),
)


def _variants() -> ScheduledModel:
    return scheduled(
        "v",
        inputs=(IMG, MASK),
        sizes=(1, 2),
        variants=(0, 1),
        variable_axes=AXES,
        variant_keys={(2, 3): 0, (4, 2): 1},
    )


def _image(rows: int, h: int, w: int, mask_h: int | None = None) -> list[NamedTensor]:
    return [
        NamedTensor("img", np.zeros((rows, h, w), np.float32)),
        NamedTensor("mask", np.zeros((rows, h if mask_h is None else mask_h), np.float32)),
    ]


@pytest.mark.parametrize(("h", "w", "variant"), [(2, 3, 0), (4, 2, 1)])
def test_variant_resolution(h: int, w: int, variant: int) -> None:
    _, got, rows = _variants().prepare(_image(2, h, w))
    assert got == variant
    assert rows == 2


def test_uncompiled_variant() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        _variants().prepare(_image(1, 5, 5))
    assert str(info.value) == (
        "no compiled program for input shape variant [5, 5]; compiled: [[2, 3], [4, 2]]"
    )


def test_inputs_sharing_a_letter_must_agree() -> None:
    _rejects(_variants(), _image(1, 2, 3, mask_h=4), "disagree on variable axis 'h': 2 vs 4")


def test_variant_rows_above_the_largest_size() -> None:
    _rejects(_variants(), _image(3, 2, 3), "exceeds its largest compiled batch size 2")


# -- a lone model.mlir -------------------------------------------------------------------------


def test_lone_module_with_a_batch_axis_needs_its_static_rows() -> None:
    model = scheduled("lone", inputs=(X,), sizes=(0,), coalescable=False, lone_rows=3)
    assert model.prepare([_x(3)])[1:] == (None, 3)
    _rejects(model, [_x(2)], "model 'lone' is compiled for exactly 3 rows, got 2")


def test_lone_module_without_a_batch_axis() -> None:
    fixed = spec("f", Fixed(2))
    model = scheduled("lone", inputs=(fixed,), sizes=(0,), coalescable=False)
    arrays, variant, rows = model.prepare([NamedTensor("f", np.ones(2, np.float32))])
    assert (variant, rows) == (None, 1)
    assert model.input_axes == (None,)
    assert arrays[0].shape == (2,)


# -- max_batch ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sizes", "coalescable", "cap", "expected"),
    [
        ((1, 4, 8), True, None, 8),
        ((1, 4, 8), True, 6, 6),
        ((1, 4, 8), True, 16, 8),
        ((1, 4, 8), False, None, 0),
        ((0,), False, None, 0),
    ],
)
def test_max_batch(
    sizes: tuple[int, ...], coalescable: bool, cap: int | None, expected: int
) -> None:
    model = scheduled(sizes=sizes, inputs=(X,), coalescable=coalescable, max_batch_size=cap)
    assert model.max_batch == expected


def test_max_batch_over_variants() -> None:
    assert _variants().max_batch == 2
