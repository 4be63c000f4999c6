"""``validate_io`` through a served model, and ``manifest_io_spec`` against ``metadata()``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt
import pytest

from reactantserver import client as rc
from reactantserver.core.protocol import grpc_service_pb2 as pb
from tests.worker_e2e._bundles import EXAMPLES, assert_close
from tests.worker_e2e._harness import WorkerProcess

from ._helpers import EXAMPLE_OUTPUTS, Tensors, example_inputs, reference

pytestmark = pytest.mark.slow

N = 7
CHUNK = 3


class ExampleRows:
    """Any example's inputs, item by item: carved from the slot, outputs gathered by name."""

    def __init__(self, tensors: Tensors, outputs: dict[str, tuple[Any, tuple[int, ...]]]) -> None:
        self.tensors = tensors
        self.declared = outputs
        self.results: dict[str, npt.NDArray[Any]] = {
            name: np.zeros((len(tensors[0][1]), *shape), dtype)
            for name, (dtype, shape) in outputs.items()
        }

    def __len__(self) -> int:
        return len(self.tensors[0][1])

    def item_input_bytes(self) -> int:
        return sum(array[0].nbytes for _, array, _ in self.tensors)

    def output_specs(self) -> tuple[rc.OutputSpec, ...]:
        return tuple(rc.OutputSpec(n, dt, shape) for n, (dt, shape) in self.declared.items())

    def encode_chunk(self, items: range, slot: rc.StagingSlot) -> list[rc.InferInput]:
        specs = [(name, (len(items), *a.shape[1:]), a.dtype) for name, a, _ in self.tensors]
        buffers = slot.scratch(specs)
        inputs = []
        for (name, array, _), buffer in zip(self.tensors, buffers, strict=True):
            buffer[...] = array[items.start : items.stop]
            inputs.append(rc.InferInput.from_slot(name, buffer))
        return inputs

    def decode_chunk(self, items: range, response: pb.ModelInferResponse) -> None:
        for name, result in self.results.items():
            result[items.start : items.stop] = rc.InferOutput(response, name)


def _declared(spec: rc.ModelIOSpec) -> dict[str, tuple[Any, tuple[int, ...]]]:
    return {t.name: (t.dtype, t.shape[1:]) for t in spec.outputs}


@pytest.mark.parametrize("model", EXAMPLES)
def test_manifest_io_spec_equals_metadata(worker: WorkerProcess, repo: Path, model: str) -> None:
    offline = rc.manifest_io_spec(repo / model)
    assert rc.manifest_io_spec(repo / model / "manifest.yaml") == offline
    with rc.KServeModel(worker.url, model) as served:
        online = served.metadata()
    # the platform is the worker's backend ("cpu", ...), which a bundle does not decide
    assert offline.platform == ""
    assert attrs.evolve(offline, platform=online.platform) == online
    assert [t.name for t in offline.outputs] == list(EXAMPLE_OUTPUTS[model])


@pytest.mark.parametrize("model", EXAMPLES)
def test_validated_io_runs_every_example(
    worker: WorkerProcess,
    triton: Any,
    make_pool: Callable[..., rc.StagingPool],
    model: str,
) -> None:
    tensors = example_inputs(model, N, seed=80 + len(model))
    want = reference(triton, model, tensors)
    pool = make_pool(1 << 20, 4)
    with rc.KServeModel(worker.url, model, max_batch_size=CHUNK, pool=pool) as served:
        io = ExampleRows(tensors, _declared(served.metadata()))
        rc.validate_io(served, io, items=CHUNK)
        rc.validate_io(rc.manifest_io_spec(Path(worker.repo) / model), io)
        rc.infer_sync(served, io)
    assert list(io.results) == list(want)
    for name, array in io.results.items():
        assert_close(array, want[name])


def test_validate_io_reports_mismatches_through_a_model(worker: WorkerProcess) -> None:
    x = example_inputs("mlp", N, seed=90)[0][1].astype(np.float64)
    io = ExampleRows([("x", x, "FP64")], {"logits": (np.float32, (5,)), "extra": (np.int64, ())})
    with (
        rc.KServeModel(worker.url, "mlp") as served,
        pytest.raises(ValueError, match="does not match model 'mlp'") as caught,
    ):
        rc.validate_io(served, io, items=2)
    message = str(caught.value)
    assert "input 'x': datatype: expected FP32, got FP64" in message
    assert "output 'logits': per_item_shape" in message
    assert "output 'extra': not an output of model 'mlp'" in message
