"""The Flax zoo: an NNX ResNet-18 and a small NNX transformer encoder, each in f32 and bf16
at batch sizes 1, 8 and 32, exported with ``export_flax`` (f32) or ``export_jax`` (bf16),
validated against eager Flax (NNX outside jit), then served by a worker and compared with
eager Flax through tritonclient (tolerances: ``_catalogue.TOLERANCE``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.zoo._support import require

require("flax")

from tests.worker_e2e._harness import WorkerProcess  # noqa: E402
from tests.zoo._catalogue import BATCH_SIZES, ZooModel, flax_zoo  # noqa: E402
from tests.zoo._support import (  # noqa: E402
    assert_parity,
    export_all,
    infer,
    sample,
    serve,
    validate_against_eager,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

ZOO = flax_zoo()


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, BaseException]]:
    """Every entry exported into one model directory, and the failures by name."""
    models = tmp_path_factory.mktemp("flax-zoo")
    return models, export_all(ZOO, models)


@pytest.fixture(scope="module")
def worker(
    exported: tuple[Path, dict[str, BaseException]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    """One worker serving every bundle that exported."""
    yield from serve(exported[0], tmp_path_factory.mktemp("logs") / "worker.log")


def _bundle(exported: tuple[Path, dict[str, BaseException]], entry: ZooModel) -> Path:
    models, failures = exported
    if entry.name in failures:
        raise failures[entry.name]
    return models / entry.name


@pytest.mark.parametrize("entry", ZOO, ids=lambda e: e.name)
def test_exports_and_validates_against_eager(
    exported: tuple[Path, dict[str, BaseException]], entry: ZooModel
) -> None:
    validate_against_eager(entry, _bundle(exported, entry))


@pytest.mark.parametrize("entry", ZOO, ids=lambda e: e.name)
def test_served_like_eager(
    exported: tuple[Path, dict[str, BaseException]], worker: WorkerProcess, entry: ZooModel
) -> None:
    _bundle(exported, entry)
    for batch in BATCH_SIZES:
        x = sample(entry, batch)
        assert_parity(entry, x, infer(worker, entry, x))
