"""Request tensors against declared specs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from reactantserver.core.errors import InvalidArgumentError
from reactantserver.core.hooks import NamedTensor
from reactantserver.core.types import Batch, Fixed, Variable
from reactantserver.worker.validation import batch_rows, check_tensor, order_tensors

from ._builders import spec

IMAGE = spec("image", Batch(), Fixed(3), Variable(), Variable())  # nchw, h/w variable
TOKENS = spec("tokens", Variable(), Batch(), dtype="INT64")  # batch axis 1
SCALE = spec("scale", Fixed(1))  # unbatched

Arrays = list[np.ndarray[Any, Any]]


# -- check_tensor ------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(1, 3, 8, 8), (5, 3, 1, 300), (0, 3, 2, 2)])
def test_batch_and_variable_axes_accept_any_extent(shape: tuple[int, ...]) -> None:
    check_tensor(IMAGE, np.zeros(shape, np.float32), model="m")


def test_fixed_extent() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        check_tensor(IMAGE, np.zeros((1, 4, 8, 8), np.float32), model="m")
    assert str(info.value) == (
        "input 'image' of model 'm' has shape [1, 4, 8, 8], expected [-1, 3, -1, -1]"
    )


def test_rank() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        check_tensor(SCALE, np.zeros((1, 1), np.float32), model="m")
    assert str(info.value) == "input 'scale' of model 'm' has shape [1, 1], expected rank 1 ([1])"


def test_dtype() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        check_tensor(TOKENS, np.zeros((2, 1), np.int32), model="m")
    assert str(info.value) == "input 'tokens' of model 'm' has datatype INT32, expected INT64"


def test_bytes_against_a_numeric_spec() -> None:
    with pytest.raises(InvalidArgumentError, match="has datatype BYTES, expected FP32"):
        check_tensor(SCALE, np.array([b"x"], dtype=object), model="m")


def test_unsupported_element_type() -> None:
    with pytest.raises(InvalidArgumentError, match="unsupported element type complex64"):
        check_tensor(SCALE, np.zeros(1, np.complex64), model="m")


# -- batch_rows --------------------------------------------------------------------------------


def test_batch_rows_reads_each_inputs_own_axis() -> None:
    arrays: Arrays = [np.zeros((4, 3, 2, 2), np.float32), np.zeros((7, 4), np.int64)]
    assert batch_rows([IMAGE, TOKENS], arrays, model="m") == 4


def test_batch_rows_is_one_without_a_batch_axis() -> None:
    assert batch_rows([SCALE], [np.zeros(1, np.float32)], model="m") == 1


def test_batch_rows_ignores_unbatched_inputs() -> None:
    arrays: Arrays = [np.zeros(1, np.float32), np.zeros((7, 2), np.int64)]
    assert batch_rows([SCALE, TOKENS], arrays, model="m") == 2


def test_batch_rows_disagreement() -> None:
    arrays: Arrays = [np.zeros((4, 3, 2, 2), np.float32), np.zeros((7, 3), np.int64)]
    with pytest.raises(InvalidArgumentError) as info:
        batch_rows([IMAGE, TOKENS], arrays, model="m")
    assert str(info.value) == (
        "batched inputs of model 'm' disagree on the batch size: 'image' has 4 rows, 'tokens' has 3"
    )


def test_batch_rows_zero() -> None:
    with pytest.raises(InvalidArgumentError, match="input 'tokens' of model 'm' has 0 rows"):
        batch_rows([TOKENS], [np.zeros((7, 0), np.int64)], model="m")


# -- order_tensors -----------------------------------------------------------------------------


def _tensors() -> list[NamedTensor]:
    return [
        NamedTensor("scale", np.ones(1, np.float32)),
        NamedTensor("tokens", np.zeros((5, 2), np.int64)),
        NamedTensor("image", np.zeros((2, 3, 4, 4), np.float32)),
    ]


def test_order_tensors_follows_the_specs() -> None:
    tensors = _tensors()
    arrays = order_tensors([IMAGE, TOKENS, SCALE], tensors, model="m")
    assert [a.shape for a in arrays] == [(2, 3, 4, 4), (5, 2), (1,)]
    assert arrays[0] is tensors[2].data


def test_order_tensors_missing() -> None:
    with pytest.raises(InvalidArgumentError, match="model 'm' expects input 'image', missing"):
        order_tensors([IMAGE, TOKENS, SCALE], _tensors()[:2], model="m")


def test_order_tensors_undeclared() -> None:
    with pytest.raises(InvalidArgumentError, match="unexpected inference input 'scale'"):
        order_tensors([IMAGE, TOKENS], _tensors(), model="m")


def test_order_tensors_duplicate() -> None:
    tensors = [*_tensors(), NamedTensor("scale", np.ones(1, np.float32))]
    with pytest.raises(InvalidArgumentError, match="input 'scale' appears more than once"):
        order_tensors([IMAGE, TOKENS, SCALE], tensors, model="m")


def test_order_tensors_checks_rows() -> None:
    tensors = _tensors()
    tensors[1] = NamedTensor("tokens", np.zeros((5, 3), np.int64))
    with pytest.raises(InvalidArgumentError, match="disagree on the batch size"):
        order_tensors([IMAGE, TOKENS, SCALE], tensors, model="m")
