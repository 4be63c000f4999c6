"""Bundles and started workers for the meta-model tests.

The sub-models are the pipeline example's two jax stages, exported once per test module by
``examples.pipeline.export.export`` (with the example meta ``pipeline``), plus ``hooked``: the
embed stage behind a ``preprocess``/``postprocess`` pair. Further metas are written with
``reactantserver.export.write_bundle(kind="meta")`` from a ``model.py`` source string::

    exported = export_bundles(tmp_path_factory.mktemp("models"))
    meta = write_meta(root, "twice", [EMBED], TWICE_SOURCE)
    world = start_meta_world(meta_config(cache_dir), [exported.embed, meta])
    try:
        ...  # world.runtime.metas serves the meta; world.runtime.scheduler is running
    finally:
        world.close()

Both exporters need ``reactantserver-export``; without it (the worker-only nox session) the
fixtures that call :func:`export_bundles` skip.
"""

from __future__ import annotations

import asyncio
import importlib
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest

from packages.worker.tests._world import World, start_world
from reactantserver.core.config import (
    ModelControlMode,
    SchedulingDiscipline,
    WorkerConfig,
    worker_config_from_mapping,
)
from reactantserver.core.hooks import NamedTensor
from reactantserver.core.types import InferRequest, InferResponse
from reactantserver.worker.meta import MetaModel, MetaRunner
from reactantserver.worker.registry import ModelEntry
from reactantserver.worker.repository.digest import BundleDigester, dir_identity
from reactantserver.worker.repository.reconcile import Seen

__all__ = [
    "EMBED",
    "HOOKED",
    "META",
    "REPOSITORY",
    "SCORE",
    "WAIT_S",
    "Exported",
    "entry_of",
    "export_bundles",
    "infer",
    "items",
    "meta_config",
    "meta_model",
    "runner",
    "seen",
    "stages",
    "start_meta_world",
    "wait_for",
    "write_meta",
]

REPOSITORY = Path(__file__).resolve().parents[4]
"""The repository root (``examples/`` lives there)."""

EMBED = "pipeline_embed"
SCORE = "pipeline_score"
META = "pipeline"
HOOKED = "hooked"
WAIT_S = 30.0
"""Generous bound for waits on other threads (never reached when things work)."""

ITEMS_DECL = "items=f32[k=-1,f=16]"
OUTPUT_DECLS = ("scores=f32[m=-1]", "indices=i64[m=-1]")

HOOKED_SOURCE = """\
import numpy as np


def preprocess(inputs):
    (raw,) = inputs
    return [NamedTensor("x", raw.data * np.float32(2.0))]


def postprocess(outputs):
    (emb,) = outputs
    norm = np.linalg.norm(emb.data, axis=1).astype(np.float32)
    return [NamedTensor("norm", norm), NamedTensor("emb", emb.data + np.float32(1.0))]


register_model("hooked", preprocess=preprocess, postprocess=postprocess)
"""
"""``hooked``: client ``raw`` is doubled into ``x``; ``emb`` comes back + 1 with its ``norm``."""


@attrs.frozen
class Exported:
    """The bundles every meta test module starts from (read-only: copy before editing)."""

    root: Path
    embed: Path
    score: Path
    pipeline: Path
    hooked: Path


def export_bundles(root: Path) -> Exported:
    """Export the pipeline example and ``hooked`` under ``root`` (skips without the exporter)."""
    pytest.importorskip("reactantserver.export")
    from reactantserver.export import export_jax

    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(REPOSITORY))  # examples/ is not an installed package
        export = importlib.import_module("examples.pipeline.export").export
        network = importlib.import_module("examples.pipeline.network")
    embed, init_embed_params = network.embed, network.init_embed_params
    embed_bundle, score_bundle, meta_bundle = export(root, progress=False)
    hooked = export_jax(
        embed,
        init_embed_params(),
        ["x=f32[n,f=16]"],
        ["emb=f32[n,e=8]"],
        batch_sizes=(1, 8),
        out=root / HOOKED,
        client_inputs=["raw=f32[n,f=16]"],
        client_outputs=["emb=f32[n,e=8]", "norm=f32[n]"],
        model_py=HOOKED_SOURCE,
        progress=False,
    )
    return Exported(root, embed_bundle, score_bundle, meta_bundle, hooked)


def write_meta(
    root: Path,
    name: str,
    calls: Sequence[str],
    source: str,
    *,
    client_inputs: Sequence[str] = (ITEMS_DECL,),
    client_outputs: Sequence[str] = OUTPUT_DECLS,
) -> Path:
    """A meta bundle ``root/name`` whose ``model.py`` is ``source`` (replaced if present)."""
    from reactantserver.export import write_bundle

    return write_bundle(
        root / name,
        name=name,
        kind="meta",
        meta_calls=list(calls),
        client_inputs=list(client_inputs),
        client_outputs=list(client_outputs),
        model_py=source,
        force=True,
    )


def meta_config(
    cache_dir: Path,
    *,
    mode: ModelControlMode = ModelControlMode.DYNAMIC,
    discipline: SchedulingDiscipline = SchedulingDiscipline.FAIR,
    budget: int = 0,
    model_dirs: Sequence[Path] = (),
    concurrency: int = 2,
    scratch_bytes: int = 1 << 20,
    scratch_slots: int = 4,
    expose_sub_models: bool = False,
    hook_threads: int = 4,
) -> WorkerConfig:
    """A worker configuration with a ``meta`` block (``budget > 0``: weight cache on)."""
    data: dict[str, Any] = {
        "cache_dir": str(cache_dir),
        "model_dirs": [str(d) for d in model_dirs],
        "model_control_mode": mode.value,
        "runtime": {"weight_cache_max_bytes": budget},
        "scheduler": {"discipline": discipline.value},
        "meta": {
            "concurrency": concurrency,
            "scratch_bytes": scratch_bytes,
            "scratch_slots": scratch_slots,
            "expose_sub_models": expose_sub_models,
        },
    }
    return worker_config_from_mapping(data, {"REACTANTSERVER_WORKER_THREADS": str(hook_threads)})


def start_meta_world(config: WorkerConfig, bundles: Sequence[Path]) -> World:
    """:func:`start_world`: regular models are scheduled, a meta's entry only registered.

    The caller must :meth:`World.close` the result.
    """
    return start_world(config, bundles)


def runner(world: World) -> MetaRunner:
    """The world's own meta runner (built by ``boot.build_runtime``)."""
    metas = world.runtime.metas
    assert metas is not None
    return metas


def meta_model(
    template: MetaModel,
    name: str,
    run: Callable[[list[NamedTensor], Any], list[NamedTensor]],
    calls: Sequence[str] = (EMBED, SCORE),
) -> MetaModel:
    """A meta generation with ``template``'s client tensors running ``run``."""
    return attrs.evolve(template, name=name, run=run, calls=tuple(calls), warned_oversize=False)


def items(count: int, seed: int = 0) -> np.ndarray[Any, Any]:
    """``count`` random client items f32[count, 16]."""
    return np.random.default_rng(seed).standard_normal((count, 16)).astype(np.float32)


def infer(
    metas: MetaRunner,
    meta: MetaModel,
    inputs: Sequence[NamedTensor],
    *,
    deadline_ns: int | None = None,
) -> InferResponse:
    """One request of ``meta`` through ``metas`` on a fresh event loop."""
    request = InferRequest(model_name=meta.name, inputs=list(inputs), deadline_ns=deadline_ns)
    return asyncio.run(metas.infer(meta, request))


def stages(world: World, x: np.ndarray[Any, Any]) -> tuple[np.ndarray[Any, Any], ...]:
    """The pipeline computed by calling both stages directly: ``(scores, indices)``.

    The glue is restated here (rows whose embedding norm exceeds the median, else the
    largest), independent of ``examples/pipeline/meta.py``.
    """
    scheduler = world.runtime.scheduler
    (out,) = scheduler.call(EMBED, [NamedTensor("x", x)])
    emb = np.asarray(out)
    norms = np.linalg.norm(emb, axis=1)
    keep = np.flatnonzero(norms > np.median(norms))
    if keep.size == 0:
        keep = np.array([int(np.argmax(norms))])
    selected = emb[keep]
    (score,) = scheduler.call(SCORE, [NamedTensor("emb", selected)])
    return np.asarray(score)[:, 0], keep.astype(np.int64)


def seen(path: Path, digester: BundleDigester) -> Seen:
    """What a repository scan sees of ``path`` now."""
    return Seen(path, dir_identity(path), digester.digest(path))


def wait_for(predicate: Callable[[], bool], timeout: float = WAIT_S) -> None:
    """Poll ``predicate`` until it holds (``AssertionError`` after ``timeout`` seconds)."""
    end = time.monotonic() + timeout
    event = threading.Event()
    while not predicate():
        assert time.monotonic() < end, "condition never became true"
        event.wait(0.002)


def entry_of(world: World, name: str) -> ModelEntry:
    """The registry entry of ``name`` (hidden ones included); it must exist."""
    entry = world.state.registry.get(name)
    assert entry is not None, name
    return entry
