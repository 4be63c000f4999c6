"""chunk_plan and chunks: the geometry of the batched IO drivers, with worked examples."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from reactantserver import client
from reactantserver.client import (
    ChunkPlan,
    InferenceIO,
    InferInput,
    OutputSpec,
    StagingPool,
    StagingSlot,
    chunk_plan,
)
from reactantserver.client._io import chunks, output_specs, zeros_for
from reactantserver.core.protocol import grpc_service_pb2 as pb

SHM = Path("/dev/shm")
UNCAPPED = 10**6


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    yield
    client.shutdown()
    left = sorted(SHM.glob(f"reactantserver-client-{os.getpid()}-*"))
    assert not left, f"staging pools left behind: {left}"


@pytest.fixture
def plain() -> Iterator[StagingPool]:
    """Eight 1024-byte slots of plain memory."""
    with closing(StagingPool(8 * 1024, 8, shm=False)) as pool:
        yield pool


@pytest.fixture
def shm() -> Iterator[StagingPool]:
    """Eight 1024-byte slots of shared memory."""
    with closing(StagingPool(8 * 1024, 8)) as pool:
        yield pool


# -- the documented examples (1024-byte slots) ----------------------------------------------------


@pytest.mark.parametrize(
    ("item_bytes", "expected"),
    [
        (16, ChunkPlan(per_item=16, span=1, chunk=64)),
        (2000, ChunkPlan(per_item=2000, span=2, chunk=1)),
        (1025, ChunkPlan(per_item=1025, span=2, chunk=1)),
        (2049, ChunkPlan(per_item=2049, span=3, chunk=1)),
    ],
)
def test_spec_examples(plain: StagingPool, item_bytes: int, expected: ChunkPlan) -> None:
    assert chunk_plan(item_bytes, (), plain, UNCAPPED) == expected


@pytest.mark.parametrize(
    ("item_bytes", "expected"),
    [
        (16, ChunkPlan(16, 1, 3)),
        (1024, ChunkPlan(1024, 1, 1)),
        (500, ChunkPlan(500, 1, 2)),
    ],
)
def test_max_batch_size_caps_a_chunk(
    plain: StagingPool, item_bytes: int, expected: ChunkPlan
) -> None:
    assert chunk_plan(item_bytes, (), plain, 3) == expected


def test_more_items_fit_a_wider_span(plain: StagingPool) -> None:
    assert chunk_plan(1000, (), plain, UNCAPPED) == ChunkPlan(1000, 1, 1)
    assert chunk_plan(700, (), plain, UNCAPPED) == ChunkPlan(700, 1, 1)
    assert chunk_plan(1500, (), plain, UNCAPPED) == ChunkPlan(1500, 2, 1)
    assert chunk_plan(3000, (), plain, UNCAPPED) == ChunkPlan(3000, 3, 1)
    assert chunk_plan(1, (), plain, UNCAPPED) == ChunkPlan(1, 1, 1024)


def test_the_whole_pool_is_the_largest_span(plain: StagingPool) -> None:
    assert chunk_plan(8192, (), plain, UNCAPPED) == ChunkPlan(8192, 8, 1)


@pytest.mark.parametrize("item_bytes", [8193, 10**9])
def test_span_beyond_the_pool(plain: StagingPool, item_bytes: int) -> None:
    with pytest.raises(ValueError, match="only 8 slots"):
        chunk_plan(item_bytes, (), plain, UNCAPPED)


# -- declared outputs -------------------------------------------------------------------------


def _out(name: str, dtype: npt.DTypeLike, shape: tuple[int, ...]) -> OutputSpec:
    # OutputSpec's ``converter=tuple`` types per_item_shape as Iterable[_T_co], which mypy
    # cannot match to any argument; called through Any until the converter is typed.
    make: Any = OutputSpec
    spec: OutputSpec = make(name, dtype, shape)
    return spec


SPECS = (_out("y", np.float32, (4,)),)  # 16 bytes per item


def test_outputs_count_for_an_shm_pool(shm: StagingPool) -> None:
    assert chunk_plan(16, SPECS, shm, UNCAPPED) == ChunkPlan(32, 1, 32)


def test_outputs_do_not_count_for_a_plain_pool(plain: StagingPool) -> None:
    assert chunk_plan(16, SPECS, plain, UNCAPPED) == ChunkPlan(16, 1, 64)


def test_outputs_can_push_an_item_over_a_slot(shm: StagingPool, plain: StagingPool) -> None:
    big = (_out("y", np.float64, (2, 4)), _out("z", np.int8, (3,)))  # 64 + 3
    assert chunk_plan(1000, big, shm, UNCAPPED) == ChunkPlan(1067, 2, 1)
    assert chunk_plan(1000, big, plain, UNCAPPED) == ChunkPlan(1000, 1, 1)


def test_outputs_can_push_an_item_over_the_pool(shm: StagingPool) -> None:
    huge = (_out("y", np.uint8, (1,)),)
    assert chunk_plan(8191, huge, shm, UNCAPPED) == ChunkPlan(8192, 8, 1)
    with pytest.raises(ValueError, match="slots"):
        chunk_plan(8192, huge, shm, UNCAPPED)


@pytest.mark.parametrize(("item_bytes", "max_batch_size"), [(-1, 1), (16, 0), (16, -5)])
def test_bad_arguments(plain: StagingPool, item_bytes: int, max_batch_size: int) -> None:
    with pytest.raises(ValueError, match=">= "):
        chunk_plan(item_bytes, (), plain, max_batch_size)


# -- OutputSpec -------------------------------------------------------------------------------


def test_output_spec() -> None:
    make: Any = OutputSpec  # see _out
    spec = make("y", "float64", [2, 3])
    assert isinstance(spec, OutputSpec)
    assert spec.dtype == np.dtype(np.float64)
    assert spec.per_item_shape == (2, 3)
    assert spec.per_item_bytes == 48
    assert _out("s", np.int8, ()).per_item_bytes == 1


def test_zeros_for() -> None:
    zeros = zeros_for(_out("y", np.int16, (2, 3)), 5)
    assert zeros.shape == (5, 2, 3)
    assert zeros.dtype == np.dtype(np.int16)
    assert not zeros.any()


# -- chunks -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n_items", "chunk"), [(10, 3), (9, 3), (1, 64), (64, 64), (65, 64), (7, 1), (100, 7)]
)
def test_chunks_cover_the_items_exactly(n_items: int, chunk: int) -> None:
    ranges = list(chunks(n_items, chunk))
    assert [i for r in ranges for i in r] == list(range(n_items))
    assert all(r.step == 1 for r in ranges)
    assert all(len(r) == chunk for r in ranges[:-1])
    assert 1 <= len(ranges[-1]) <= chunk
    assert len(ranges) == -(-n_items // chunk)


def test_chunks_examples() -> None:
    assert list(chunks(10, 3)) == [range(3), range(3, 6), range(6, 9), range(9, 10)]
    assert list(chunks(0, 5)) == []
    assert list(chunks(4, 100)) == [range(4)]


# -- the InferenceIO protocol -----------------------------------------------------------------


class _Minimal:
    """An IO with the four required methods and no ``output_specs``."""

    def __len__(self) -> int:
        return 3

    def item_input_bytes(self) -> int:
        return 16

    def encode_chunk(self, items: range, slot: StagingSlot) -> Sequence[InferInput]:
        return [InferInput.from_slot("x", slot.scratch((len(items), 4), np.float32))]

    def decode_chunk(self, items: range, response: pb.ModelInferResponse) -> None:
        return None


class _Declared(_Minimal):
    """The same IO declaring one output."""

    def output_specs(self) -> Sequence[OutputSpec]:
        return list(SPECS)


def test_protocol_is_runtime_checkable() -> None:
    assert isinstance(_Minimal(), InferenceIO)
    assert isinstance(_Declared(), InferenceIO)
    assert not isinstance([InferInput("x", np.zeros(1))], InferenceIO)


def test_output_specs_default_to_none_declared() -> None:
    assert output_specs(_Minimal()) == ()
    assert output_specs(_Declared()) == SPECS


def test_an_io_refuses_outputs_given_by_argument(plain: StagingPool) -> None:
    # No server is needed: the batch is refused before anything is sent.
    with (
        client.KServeModel("127.0.0.1:1", "m", pool=plain) as model,
        pytest.raises(ValueError, match="output_specs"),
    ):
        client.infer_sync(model, _Minimal(), outputs=["y"])
