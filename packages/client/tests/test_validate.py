"""validate_io and manifest_io_spec against real exported bundles and hand-built specs.

Validation through a ``KServeModel`` (metadata fetched from a running worker), and
``manifest_io_spec`` equal to what a worker reports, are covered by the end-to-end suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import pytest
import yaml

from reactantserver.client import (
    InferInput,
    InferOutput,
    ModelIOSpec,
    OutputSpec,
    StagingPool,
    StagingSlot,
    TensorInfo,
    chunk_plan,
    manifest_io_spec,
    shutdown,
    validate_io,
)
from reactantserver.client._staging import live_pools
from reactantserver.core.dtypes import DType
from reactantserver.core.errors import BundleError
from reactantserver.core.protocol import grpc_service_pb2 as pb

ROOT = Path(__file__).resolve().parents[3]
SHM_DIR = Path("/dev/shm")
EXPORTED = ("mlp", "two_io", "pipeline")
"""``pipeline`` writes three bundles: two plain models and the meta model ``pipeline``."""


def _client_shm() -> set[Path]:
    """This process's staging-pool files (other processes on the machine have their own)."""
    return set(SHM_DIR.glob(f"reactantserver-client-{os.getpid()}-*"))


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    before = _client_shm()
    open_before = {id(p) for p in live_pools() if not p.closed}
    yield
    assert {id(p) for p in live_pools() if not p.closed} <= open_before, "a dry-run pool leaked"
    shutdown()
    assert _client_shm() <= before


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The exported example bundles (one interpreter for all of them)."""
    repo = tmp_path_factory.mktemp("models")
    script = "import importlib, sys\n" + "".join(
        f"importlib.import_module('examples.{name}.export').export(sys.argv[1], progress=False)\n"
        for name in EXPORTED
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(repo)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert done.returncode == 0, f"export failed:\n{done.stdout}\n{done.stderr}"
    return repo


@pytest.fixture(scope="module")
def mlp(bundles: Path) -> ModelIOSpec:
    return manifest_io_spec(bundles / "mlp")


@pytest.fixture(scope="module")
def two_io(bundles: Path) -> ModelIOSpec:
    return manifest_io_spec(bundles / "two_io")


# -- IO drivers under test -------------------------------------------------------------------

UNSET = 7
"""What a result holds until ``decode_chunk`` writes it."""


class ArrayIO:
    """Items stored as rows of named input arrays; outputs gathered into result arrays.

    Every knob makes one kind of mistake: wrong input names or dtypes, extra batch rows, a
    wrong ``item_input_bytes``, wrong output declarations.
    """

    def __init__(
        self,
        inputs: dict[str, npt.NDArray[Any]],
        outputs: dict[str, tuple[npt.DTypeLike, tuple[int, ...]]],
        *,
        declare: bool = True,
        declared: Sequence[OutputSpec] | None = None,
        item_bytes: int | None = None,
        extra_rows: int = 0,
    ) -> None:
        self.inputs = inputs
        self.n = len(next(iter(inputs.values())))
        self.outputs = outputs
        self.results = {
            name: np.full((self.n, *shape), UNSET, dtype)
            for name, (dtype, shape) in outputs.items()
        }
        self.declare = declare
        self.declared = declared
        self.item_bytes = item_bytes
        self.extra_rows = extra_rows
        self.encoded: list[range] = []
        self.decoded: list[range] = []

    def __len__(self) -> int:
        return self.n

    def item_input_bytes(self) -> int:
        if self.item_bytes is not None:
            return self.item_bytes
        return sum(a[0].nbytes for a in self.inputs.values())

    def encode_chunk(self, items: range, slot: StagingSlot) -> Sequence[InferInput]:
        self.encoded.append(items)
        rows = len(items) + self.extra_rows
        specs = [(name, (rows, *a.shape[1:]), a.dtype) for name, a in self.inputs.items()]
        buffers = slot.scratch(specs)
        result = []
        for (name, array), buffer in zip(self.inputs.items(), buffers, strict=True):
            buffer[: len(items)] = array[items.start : items.stop]
            result.append(InferInput.from_slot(name, buffer))
        return result

    def decode_chunk(self, items: range, response: pb.ModelInferResponse) -> None:
        self.decoded.append(items)
        for name, (dtype, shape) in self.outputs.items():
            got = InferOutput(response, name, dtype)
            self.results[name][items.start : items.stop] = got.reshape(len(items), *shape)

    def output_specs(self) -> Sequence[OutputSpec]:
        if self.declared is not None:
            return self.declared
        if not self.declare:
            return ()
        return [out(n, dtype, shape) for n, (dtype, shape) in self.outputs.items()]


def mlp_io(n: int = 8, **kwargs: Any) -> ArrayIO:
    x = np.arange(n * 16, dtype=np.float32).reshape(n, 16)
    return ArrayIO({"x": x}, {"logits": (np.float32, (4,))}, **kwargs)


def two_io_io(n: int = 8, **kwargs: Any) -> ArrayIO:
    a = np.ones((n, 8), np.float32)
    return ArrayIO(
        {"a": a, "b": 2 * a}, {"sum": (np.float32, (8,)), "dot": (np.float32, (1,))}, **kwargs
    )


def out(name: str, dtype: npt.DTypeLike, per_item_shape: tuple[int, ...]) -> OutputSpec:
    """An ``OutputSpec``; the cast because mypy cannot type its ``converter=tuple`` field."""
    return OutputSpec(name, dtype, cast(Any, per_item_shape))


def problems(info: pytest.ExceptionInfo[ValueError]) -> list[str]:
    """The problem lines of a validate_io report (after its header line)."""
    head, *lines = str(info.value).splitlines()
    assert "does not match model" in head
    assert all(line.startswith("  - ") for line in lines), lines
    return [line[4:] for line in lines]


def only_problem(info: pytest.ExceptionInfo[ValueError]) -> str:
    (line,) = problems(info)
    return line


# -- a correct IO ------------------------------------------------------------------------------


@pytest.mark.parametrize("items", [1, 5])
def test_correct_io_passes(mlp: ModelIOSpec, items: int) -> None:
    io = mlp_io()
    validate_io(mlp, io, items)
    assert io.encoded == [range(items)]
    assert io.decoded == [range(items)]
    assert (io.results["logits"][:items] == 0).all()  # decode saw the synthetic zeros
    assert (io.results["logits"][items:] == UNSET).all()


@pytest.mark.parametrize("items", [1, 5])
def test_correct_two_input_io_passes(two_io: ModelIOSpec, items: int) -> None:
    io = two_io_io()
    validate_io(two_io, io, items)
    assert io.decoded == [range(items)]
    assert (io.results["sum"][:items] == 0).all()
    assert (io.results["dot"][:items] == 0).all()


@pytest.mark.parametrize("items", [1, 5])
def test_io_without_declared_outputs_gets_every_model_output(
    two_io: ModelIOSpec, items: int
) -> None:
    io = two_io_io(declare=False)
    validate_io(two_io, io, items)
    assert (io.results["sum"][:items] == 0).all()
    assert (io.results["dot"][:items] == 0).all()


def test_declaring_a_subset_of_outputs_passes(two_io: ModelIOSpec) -> None:
    a = np.ones((4, 8), np.float32)
    io = ArrayIO({"a": a, "b": a}, {"dot": (np.float32, (1,))})
    validate_io(two_io, io, 3)
    assert (io.results["dot"][:3] == 0).all()


def test_items_must_be_within_the_io(mlp: ModelIOSpec) -> None:
    with pytest.raises(ValueError, match="items must be >= 1"):
        validate_io(mlp, mlp_io(), 0)
    with pytest.raises(ValueError, match=r"items \(9\) exceeds the io's 8 items"):
        validate_io(mlp, mlp_io(8), 9)


# -- each kind of mismatch ---------------------------------------------------------------------


def test_unknown_and_missing_input_names(mlp: ModelIOSpec) -> None:
    io = ArrayIO({"X": np.zeros((4, 16), np.float32)}, {"logits": (np.float32, (4,))})
    with pytest.raises(ValueError, match="does not match model") as info:
        validate_io(mlp, io)
    unknown, missing = problems(info)
    assert unknown.startswith("input 'X': not an input of model 'mlp'")
    assert "expected one of ['x']" in unknown
    assert missing.startswith("input 'x': missing: expected FP32[1, 16]")


def test_input_datatype_mismatch(mlp: ModelIOSpec) -> None:
    io = ArrayIO(
        {"x": np.zeros((4, 16), np.float64)}, {"logits": (np.float32, (4,))}, item_bytes=64
    )
    with pytest.raises(ValueError, match="does not match model") as info:
        validate_io(mlp, io, 2)
    datatype, nbytes = problems(info)
    assert datatype.startswith("input 'x': datatype: expected FP32, got FP64")
    assert nbytes.startswith("item_input_bytes(): expected 128")


def test_input_shape_mismatch(mlp: ModelIOSpec) -> None:
    io = ArrayIO({"x": np.zeros((4, 15), np.float32)}, {"logits": (np.float32, (4,))})
    with pytest.raises(ValueError, match="does not match model") as info:
        validate_io(mlp, io, 3)
    line = only_problem(info)
    assert line.startswith("input 'x': shape: expected [3, 16] (model [-1, 16]")
    assert line.endswith("got [3, 15]")


def test_input_batch_axis_must_hold_the_items(mlp: ModelIOSpec) -> None:
    io = mlp_io(extra_rows=1, item_bytes=64)
    with pytest.raises(ValueError, match="does not match model") as info:
        validate_io(mlp, io, 3)
    shape, nbytes = problems(info)
    assert "input 'x': shape: expected [3, 16]" in shape
    assert shape.endswith("got [4, 16]")
    assert "batch axis = items = 3" in shape
    assert nbytes.startswith("item_input_bytes(): expected 85.33 (the inputs hold 256 bytes")


def test_item_input_bytes_mismatch(two_io: ModelIOSpec) -> None:
    io = two_io_io(item_bytes=32)
    with pytest.raises(ValueError, match="does not match model") as info:
        validate_io(two_io, io, 5)
    line = only_problem(info)
    assert line == (
        "item_input_bytes(): expected 64 (the inputs hold 320 bytes for 5 items: "
        "a 160 + b 160), got 32"
    )


def test_item_input_bytes_overstated(mlp: ModelIOSpec) -> None:
    with pytest.raises(ValueError, match="does not match model") as info:
        validate_io(mlp, mlp_io(item_bytes=1000))
    assert only_problem(info).endswith("got 1000")


def test_output_name_unknown(mlp: ModelIOSpec) -> None:
    io = mlp_io(declared=[out("probs", np.float32, (4,))])
    io.outputs = {}  # decode reads nothing: only the declaration is wrong
    with pytest.raises(ValueError, match="does not match model") as info:
        validate_io(mlp, io)
    line = only_problem(info)
    assert line.startswith("output 'probs': not an output of model 'mlp'")
    assert "expected one of ['logits']" in line


def test_output_dtype_mismatch(mlp: ModelIOSpec) -> None:
    io = mlp_io(declared=[out("logits", np.float16, (4,))])
    with pytest.raises(ValueError, match="does not match model") as info:
        validate_io(mlp, io)
    line = only_problem(info)
    assert line == "output 'logits': dtype: expected FP32, got float16 (FP16)"


def test_output_per_item_shape_mismatch(two_io: ModelIOSpec) -> None:
    io = two_io_io(declared=[out("sum", np.float32, (8,)), out("dot", "f4", ())])
    with pytest.raises(ValueError, match="does not match model") as info:
        validate_io(two_io, io)
    line = only_problem(info)
    assert line == (
        "output 'dot': per_item_shape: expected (1,) (model [-1, 1] without the batch axis), got ()"
    )


GRID = ModelIOSpec(
    "grid",
    inputs=(TensorInfo("x", "FP32", (-1, 4)),),
    outputs=(TensorInfo("y", "FP32", (-1, 3, 10)), TensorInfo("z", "INT64", (-1, -1, 2))),
)
"""A hand-built spec with a 2-D per-item output and a variable axis."""


def grid_io(**kwargs: Any) -> ArrayIO:
    x = np.zeros((6, 4), np.float32)
    return ArrayIO({"x": x}, {"y": (np.float32, (3, 10)), "z": (np.int64, (5, 2))}, **kwargs)


@pytest.mark.parametrize("items", [1, 5])
def test_hand_built_spec_with_variable_axis_passes(items: int) -> None:
    io = grid_io()
    validate_io(GRID, io, items)
    assert (io.results["z"][:items] == 0).all()


def test_reversed_per_item_shape_gets_a_hint() -> None:
    io = grid_io(declared=[out("y", np.float32, (10, 3)), out("z", np.int64, (5, 2))])
    with pytest.raises(ValueError, match="does not match model") as info:
        validate_io(GRID, io, 2)
    line = only_problem(info)
    assert line.startswith(
        "output 'y': per_item_shape: expected (3, 10) (model [-1, 3, 10] without the batch "
        "axis), got (10, 3)"
    )
    assert "reversed" in line


def test_reversed_hint_respects_variable_axes() -> None:
    io = grid_io(declared=[out("z", np.int64, (2, 5))])
    io.outputs = {}
    with pytest.raises(ValueError, match="does not match model") as info:
        validate_io(GRID, io)
    assert "reversed" in only_problem(info)  # (-1, 2) read backwards is (2, -1)


def test_wrong_2d_shape_that_is_not_reversed_gets_no_hint() -> None:
    io = grid_io(declared=[out("y", np.float32, (5, 6))])
    io.outputs = {}
    with pytest.raises(ValueError, match="does not match model") as info:
        validate_io(GRID, io)
    line = only_problem(info)
    assert "expected (3, 10)" in line
    assert "reversed" not in line


def test_several_problems_reported_at_once(two_io: ModelIOSpec) -> None:
    io = ArrayIO(
        {"a": np.zeros((4, 8), np.float64), "c": np.zeros((4, 7), np.float32)},
        {},
        declared=[
            out("sum", np.float32, (8, 1)),
            out("dot", np.int32, (1,)),
            out("mean", np.float32, (1,)),
        ],
        item_bytes=10,
    )
    with pytest.raises(ValueError, match="does not match model") as info:
        validate_io(two_io, io, 2)
    message = str(info.value)
    assert message.splitlines()[0] == (
        "ArrayIO does not match model 'two_io' (7 problems, items=2):"
    )
    lines = problems(info)
    assert [line.split(":")[0] for line in lines] == [
        "input 'a'",
        "input 'c'",
        "input 'b'",
        "item_input_bytes()",
        "output 'sum'",
        "output 'dot'",
        "output 'mean'",
    ]
    assert "datatype: expected FP32, got FP64" in lines[0]
    assert "missing" in lines[2]
    assert "expected (8,)" in lines[4]
    assert "expected FP32, got int32 (INT32)" in lines[5]


def test_duplicate_names_are_reported(mlp: ModelIOSpec) -> None:
    class Twice(ArrayIO):
        def encode_chunk(self, items: range, slot: StagingSlot) -> Sequence[InferInput]:
            (x,) = super().encode_chunk(items, slot)
            return [x, x]

    io = Twice(
        {"x": np.zeros((2, 16), np.float32)},
        {"logits": (np.float32, (4,))},
        declared=[out("logits", np.float32, (4,))] * 2,
        item_bytes=128,
    )
    with pytest.raises(ValueError, match="does not match model") as info:
        validate_io(mlp, io)
    assert problems(info) == [
        "input 'x': returned more than once by encode_chunk",
        "output 'logits': declared more than once in output_specs()",
    ]


def test_bytes_outputs_cannot_be_declared() -> None:
    spec = ModelIOSpec(
        "tagger",
        inputs=(TensorInfo("x", "FP32", (-1, 4)),),
        outputs=(TensorInfo("tag", "BYTES", (-1,)),),
    )
    io = ArrayIO({"x": np.zeros((2, 4), np.float32)}, {}, declared=[out("tag", "O", ())])
    with pytest.raises(ValueError, match="does not match model") as info:
        validate_io(spec, io)
    assert "data-dependent sizes" in only_problem(info)


def test_bytes_outputs_decode_inline() -> None:
    spec = ModelIOSpec(
        "tagger",
        inputs=(TensorInfo("x", "FP32", (-1, 4)),),
        outputs=(TensorInfo("tag", "BYTES", (-1,)),),
    )
    seen: list[npt.NDArray[Any]] = []

    class Tagger(ArrayIO):
        def decode_chunk(self, items: range, response: pb.ModelInferResponse) -> None:
            seen.append(InferOutput(response, "tag"))

    validate_io(spec, Tagger({"x": np.zeros((3, 4), np.float32)}, {}, declare=False), 3)
    (tags,) = seen
    assert tags.dtype == object
    assert tags.tolist() == [b"", b"", b""]


def test_fixed_leading_output_axis_is_not_a_batch_axis() -> None:
    spec = ModelIOSpec(
        "fixed",
        inputs=(TensorInfo("x", "FP32", (-1, 4)),),
        outputs=(TensorInfo("table", "FP32", (7, 4)),),
    )
    io = ArrayIO({"x": np.zeros((3, 4), np.float32)}, {}, declared=[out("table", "f4", (4,))])
    with pytest.raises(ValueError, match="does not match model") as info:
        validate_io(spec, io, 2)
    assert "leading axis is fixed at 7" in only_problem(info)


# -- errors of the io itself -------------------------------------------------------------------


def test_encode_error_propagates_with_a_note(mlp: ModelIOSpec) -> None:
    class Broken(ArrayIO):
        def encode_chunk(self, items: range, slot: StagingSlot) -> Sequence[InferInput]:
            raise KeyError("no such row")

    with pytest.raises(KeyError, match="no such row") as info:
        validate_io(mlp, Broken({"x": np.zeros((2, 16), np.float32)}, {}))
    assert any("encode_chunk(range(0, 1)) failed" in note for note in info.value.__notes__)


def test_encode_overflowing_the_slot_propagates_with_a_note(mlp: ModelIOSpec) -> None:
    io = mlp_io(item_bytes=0, extra_rows=1 << 20)  # 64 MiB: far beyond the dry-run slot
    with pytest.raises(ValueError, match="overflows") as info:
        validate_io(mlp, io)
    assert any("item_input_bytes() = 0" in note for note in info.value.__notes__)


def test_encode_returning_something_else_is_a_type_error(mlp: ModelIOSpec) -> None:
    class Raw(ArrayIO):
        def encode_chunk(self, items: range, slot: StagingSlot) -> Sequence[Any]:
            return [np.zeros((len(items), 16), np.float32)]

    with pytest.raises(TypeError, match="must return InferInput objects, got ndarray"):
        validate_io(mlp, Raw({"x": np.zeros((2, 16), np.float32)}, {}))


def test_decode_error_propagates_with_a_note(mlp: ModelIOSpec) -> None:
    io = mlp_io(declare=False)
    io.outputs = {"logits": (np.float32, (5,))}  # cannot reshape 4 values per item to 5
    with pytest.raises(ValueError, match="cannot reshape") as info:
        validate_io(mlp, io, 2)
    assert any("decode_chunk(range(0, 2)) failed" in note for note in info.value.__notes__)


def test_decode_error_joins_the_report_when_there_are_problems(mlp: ModelIOSpec) -> None:
    io = mlp_io(declared=[out("logits", np.float64, (4,))])
    io.outputs = {"logits": (np.float64, (4,))}  # InferOutput cannot view FP32 as float64
    with pytest.raises(ValueError, match="does not match model") as info:
        validate_io(mlp, io)
    dtype, decode = problems(info)
    assert dtype.startswith("output 'logits': dtype: expected FP32, got float64")
    assert decode.startswith("decode_chunk(range(0, 1)) raised ValueError: output 'logits'")
    assert isinstance(info.value.__cause__, ValueError)


# -- manifest_io_spec --------------------------------------------------------------------------


def _from_manifest_file(bundle: Path) -> ModelIOSpec:
    """The spec read straight from ``manifest.yaml`` (3.0 letters, ``n`` = batch)."""
    data = yaml.safe_load((bundle / "manifest.yaml").read_text())
    meta = data.get("kind") == "meta"

    def tensors(key: str) -> tuple[TensorInfo, ...]:
        listed = data.get(f"client_{key}") or data[f"executable_{key}"]
        return tuple(
            TensorInfo(
                t["name"],
                DType.from_token(t["dtype"]).kserve,
                tuple(-1 if c == "n" else int(t["dims"][c]) for c in t["shape"]),
            )
            for t in listed
        )

    return ModelIOSpec(
        name=bundle.name,
        inputs=tensors("inputs"),
        outputs=tensors("outputs"),
        platform="reactantserver_meta" if meta else "",
        versions=("1",),
    )


@pytest.mark.parametrize("name", ["mlp", "two_io", "pipeline", "pipeline_embed"])
def test_manifest_io_spec_matches_the_manifest(bundles: Path, name: str) -> None:
    spec = manifest_io_spec(bundles / name)
    assert spec == _from_manifest_file(bundles / name)
    assert manifest_io_spec(bundles / name / "manifest.yaml") == spec
    assert manifest_io_spec(str(bundles / name)) == spec


def test_manifest_io_spec_of_the_examples(mlp: ModelIOSpec, two_io: ModelIOSpec) -> None:
    assert mlp == ModelIOSpec(
        "mlp",
        (TensorInfo("x", "FP32", (-1, 16)),),
        (TensorInfo("logits", "FP32", (-1, 4)),),
        "",
        ("1",),
    )
    assert [t.name for t in two_io.inputs] == ["a", "b"]
    assert [t.name for t in two_io.outputs] == ["sum", "dot"]
    assert two_io.output("dot").shape == (-1, 1)


def test_manifest_io_spec_of_a_meta_model(bundles: Path) -> None:
    spec = manifest_io_spec(bundles / "pipeline")
    assert spec.platform == "reactantserver_meta"
    assert spec.inputs == (TensorInfo("items", "FP32", (-1, 16)),)
    assert spec.outputs == (
        TensorInfo("scores", "FP32", (-1,)),
        TensorInfo("indices", "INT64", (-1,)),
    )


def test_manifest_io_spec_is_named_by_the_directory(bundles: Path, tmp_path: Path) -> None:
    copy = tmp_path / "renamed"
    copy.mkdir()
    (copy / "manifest.yaml").write_bytes((bundles / "mlp" / "manifest.yaml").read_bytes())
    assert manifest_io_spec(copy).name == "renamed"


def test_manifest_io_spec_client_tensors_and_format_2(tmp_path: Path) -> None:
    bundle = tmp_path / "img"
    bundle.mkdir()
    manifest: dict[str, Any] = {
        "format_version": "2.0",
        "executable_inputs": [{"name": "x", "dtype": "f32", "shape": "whcn", "dims": {}}],
        "executable_outputs": [{"name": "y", "dtype": "f32", "shape": "kn", "dims": {"k": 2}}],
        "client_inputs": [
            {"name": "jpeg", "dtype": "bytes", "shape": "n", "dims": {}},
        ],
    }
    for tensor in manifest["executable_inputs"]:
        tensor["dims"] = {"w": 8, "h": 6, "c": 3}
    (bundle / "manifest.yaml").write_text(yaml.safe_dump(manifest))
    (bundle / "model.py").write_text("")
    spec = manifest_io_spec(bundle / "manifest.yaml")
    assert spec.inputs == (TensorInfo("jpeg", "BYTES", (-1,)),)
    assert spec.outputs == (TensorInfo("y", "FP32", (-1, 2)),)  # 2.0 letters are column-major


def test_manifest_io_spec_without_a_bundle(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="missing"):
        manifest_io_spec(tmp_path)


def test_validate_against_manifest_spec_of_a_meta_model(bundles: Path) -> None:
    spec = manifest_io_spec(bundles / "pipeline")
    seen: dict[str, npt.NDArray[Any]] = {}

    class Rows(ArrayIO):
        def decode_chunk(self, items: range, response: pb.ModelInferResponse) -> None:
            seen.update({t.name: InferOutput(response, t.name) for t in response.outputs})

    validate_io(spec, Rows({"items": np.zeros((4, 16), np.float32)}, {}, declare=False), 4)
    assert seen["scores"].shape == (4,)
    assert seen["indices"].dtype == np.int64


# -- found while writing these tests -----------------------------------------------------------


def test_a_planned_chunk_fits_its_slot_with_several_inputs() -> None:
    # Three float32 inputs per item: per_item = 12, so a 1024-byte slot is planned for 85
    # items, but three 340-byte arrays padded to 64-byte boundaries need 1108 bytes.
    pool = StagingPool(4096, 4, shm=False)
    try:
        plan = chunk_plan(12, (), pool, 1000)
        with pool.acquire(plan.span) as slot:
            specs = [(name, (plan.chunk,), np.float32) for name in "abc"]
            StagingSlot(slot).scratch(specs)
    finally:
        pool.close()
