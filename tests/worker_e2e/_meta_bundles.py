"""Bundles of the meta-model end-to-end tests: test metas, bad metas and references.

The repository of ``test_meta.py`` holds the ``pipeline`` example (``pipeline_embed``,
``pipeline_score`` and the meta ``pipeline``), :data:`~._bundles.SPIN` and copies of it, and
the test metas written here with ``reactantserver.export.write_bundle(kind="meta")``:

- :data:`PARKED` embeds, then waits in its glue until a flag file exists (holds its gate permit);
- :data:`COMPUTE_ONLY` is pure NumPy (no sub-models, no gate);
- :data:`TWO_STAGE_SLOW` sleeps :data:`GLUE_SLEEP_S` between its two sub-calls (deadlines);
- :data:`UNDECLARED` declares ``pipeline_embed`` only but calls ``pipeline_score`` as well.

The explicit-mode worker also gets metas that must fail to load (:func:`add_bad_metas`,
:func:`add_calls_meta`), a meta whose callee is missing (:data:`ORPHAN`) and a meta added
with its callee after start-up (:func:`add_late_pair`). :func:`pipeline_reference` runs the
``pipeline`` glue in this process with the jax stages on the CPU, which is what the served
numbers must match.
"""

from __future__ import annotations

import contextlib
import importlib
import shutil
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from reactantserver.core.hooks import NamedTensor, collect_registrations
from reactantserver.export import write_bundle

from ._bundles import ROOT

__all__ = [
    "BOOT_CALLEE",
    "BOOT_CALLS_META",
    "CALLS_META",
    "COMPUTE_ONLY",
    "EMBED",
    "FLAG_DIR_VARIABLE",
    "GLUE_SLEEP_S",
    "LATE",
    "LATE_EMBED",
    "META",
    "NO_OUTPUTS",
    "ORPHAN",
    "ORPHAN_SUB",
    "PARKED",
    "REGISTERS_MODEL",
    "SCORE",
    "SELF_CALL",
    "TWO_STAGE_SLOW",
    "UNDECLARED",
    "LocalCall",
    "add_bad_metas",
    "add_calls_meta",
    "add_late_pair",
    "add_test_metas",
    "compute_only_reference",
    "copy_bundle",
    "embed_reference",
    "pipeline_reference",
    "release",
]

EMBED = "pipeline_embed"
SCORE = "pipeline_score"
META = "pipeline"
"""The shipped meta example and its two sub-models."""

PARKED = "parked"
COMPUTE_ONLY = "compute_only"
TWO_STAGE_SLOW = "two_stage_slow"
UNDECLARED = "undeclared"
FLAG_DIR_VARIABLE = "META_TEST_FLAG_DIR"
"""The worker's environment names the directory where :data:`PARKED` looks for its flags."""
PARK_LIMIT_S = 60.0
""":data:`PARKED` gives up (``INTERNAL``) after this long without its flag."""
GLUE_SLEEP_S = 1.0
""":data:`TWO_STAGE_SLOW`'s glue between its sub-calls."""

CALLS_META = "calls_meta"
"""Calls the compute-only meta :data:`COMPUTE_ONLY`: a meta may call regular models only."""
SELF_CALL = "self_call"
NO_OUTPUTS = "no_outputs"
REGISTERS_MODEL = "registers_model"
ORPHAN = "orphan"
"""A valid meta whose callee :data:`ORPHAN_SUB` has no bundle when the worker starts."""
ORPHAN_SUB = "orphan_sub"
BOOT_CALLS_META = "boot_calls_meta"
"""Calls the compute-only meta :data:`BOOT_CALLEE`; both bundles are there at start-up."""
BOOT_CALLEE = "boot_callee"
LATE = "late"
"""A meta added after start-up with its callee :data:`LATE_EMBED`: loaded by one load_model."""
LATE_EMBED = "late_embed"

_ITEMS = "x=f32[k=-1,f=16]"
_EMBEDDED = "emb=f32[m=-1,e=8]"
_COMPUTED = "y=f32[m=-1,f=16]"
_SCORED = "scores=f32[m=-1]"
_HEADER = '''"""Test meta {name!r} of tests/worker_e2e/_meta_bundles.py."""

import os
import time
from pathlib import Path

import numpy as np

from reactantserver.core.hooks import NamedTensor, register_meta_model, register_model

'''

PARKED_PY = f'''
def run(inputs, call):
    (x,) = inputs
    (emb,) = call("{EMBED}", [NamedTensor("x", x.data)])
    flag = Path(os.environ["{FLAG_DIR_VARIABLE}"]) / f"release-{{int(x.data[0, 0])}}"
    stop_at = time.monotonic() + {PARK_LIMIT_S!r}
    while not flag.exists():
        if time.monotonic() > stop_at:
            raise RuntimeError(f"parked: {{flag}} did not appear in {PARK_LIMIT_S} s")
        time.sleep(0.01)
    return [NamedTensor("emb", np.array(emb.data, np.float32))]


register_meta_model("{PARKED}", run=run)
'''


def _compute_only_py(name: str) -> str:
    """A compute-only meta: ``y = 2 x + 1`` in NumPy (:func:`compute_only_reference`)."""
    return f'''
def run(inputs, call):
    (x,) = inputs
    return [NamedTensor("y", (x.data * np.float32(2.0) + np.float32(1.0)).astype(np.float32))]


register_meta_model("{name}", run=run)
'''


TWO_STAGE_SLOW_PY = f'''
def run(inputs, call):
    (x,) = inputs
    (emb,) = call("{EMBED}", [NamedTensor("x", x.data)])
    time.sleep({GLUE_SLEEP_S!r})
    (score,) = call("{SCORE}", [NamedTensor("emb", emb.data)])
    return [NamedTensor("scores", np.ascontiguousarray(score.data[:, 0], np.float32))]


register_meta_model("{TWO_STAGE_SLOW}", run=run)
'''

UNDECLARED_PY = f'''
def run(inputs, call):
    (x,) = inputs
    (emb,) = call("{EMBED}", [NamedTensor("x", x.data)])
    (score,) = call("{SCORE}", [NamedTensor("emb", emb.data)])  # not in meta.calls
    return [NamedTensor("scores", np.ascontiguousarray(score.data[:, 0], np.float32))]


register_meta_model("{UNDECLARED}", run=run)
'''


def _relay_py(name: str, callee: str, output: str) -> str:
    """A meta that passes ``x`` to ``callee`` and returns its first output as ``output``."""
    return f'''
def run(inputs, call):
    (x,) = inputs
    (out,) = call("{callee}", [NamedTensor("x", x.data)])
    return [NamedTensor("{output}", np.array(out.data, np.float32))]


register_meta_model("{name}", run=run)
'''


REGISTERS_MODEL_PY = f'''
register_model("{REGISTERS_MODEL}")
'''


def _write_meta(
    root: Path, name: str, calls: Sequence[str], outputs: Sequence[str], body: str
) -> Path:
    return write_bundle(
        root / name,
        name=name,
        kind="meta",
        meta_calls=list(calls),
        client_inputs=[_ITEMS],
        client_outputs=list(outputs),
        model_py=_HEADER.format(name=name) + body,
        description=f"test meta {name} (tests/worker_e2e/_meta_bundles.py)",
        force=True,
    )


def add_test_metas(root: Path) -> None:
    """:data:`PARKED`, :data:`COMPUTE_ONLY`, :data:`TWO_STAGE_SLOW` and :data:`UNDECLARED`."""
    _write_meta(root, PARKED, [EMBED], [_EMBEDDED], PARKED_PY)
    _write_meta(root, COMPUTE_ONLY, [], [_COMPUTED], _compute_only_py(COMPUTE_ONLY))
    _write_meta(root, TWO_STAGE_SLOW, [EMBED, SCORE], [_SCORED], TWO_STAGE_SLOW_PY)
    _write_meta(root, UNDECLARED, [EMBED], [_SCORED], UNDECLARED_PY)


def _edit_manifest(bundle: Path, **changes: Any) -> None:
    """Rewrite ``bundle``'s manifest with yaml directly (``None`` drops a key)."""
    path = bundle / "manifest.yaml"
    manifest: dict[str, Any] = yaml.safe_load(path.read_text())
    for key, value in changes.items():
        if value is None:
            manifest.pop(key, None)
        else:
            manifest[key] = value
    path.write_text(yaml.safe_dump(manifest, sort_keys=False))


def _embedding_meta(root: Path, name: str, callee: str) -> Path:
    return _write_meta(root, name, [callee], [_EMBEDDED], _relay_py(name, callee, "emb"))


def add_bad_metas(root: Path) -> None:
    """Metas that must fail to load, :data:`ORPHAN` (its callee missing) and a boot-time pair.

    ``write_bundle`` refuses a meta calling itself and one without client outputs, so those
    two start valid and get their manifest edited with yaml. :data:`BOOT_CALLS_META` calls the
    compute-only meta :data:`BOOT_CALLEE`, both there when the worker starts.
    """
    _embedding_meta(root, SELF_CALL, EMBED)
    _edit_manifest(root / SELF_CALL, meta={"calls": [EMBED, SELF_CALL]})
    _embedding_meta(root, NO_OUTPUTS, EMBED)
    _edit_manifest(root / NO_OUTPUTS, client_outputs=None)
    _write_meta(root, REGISTERS_MODEL, [EMBED], [_EMBEDDED], REGISTERS_MODEL_PY)
    _embedding_meta(root, ORPHAN, ORPHAN_SUB)
    _write_meta(root, BOOT_CALLEE, [], [_COMPUTED], _compute_only_py(BOOT_CALLEE))
    body = _relay_py(BOOT_CALLS_META, BOOT_CALLEE, "y")
    _write_meta(root, BOOT_CALLS_META, [BOOT_CALLEE], [_COMPUTED], body)


def add_calls_meta(root: Path) -> Path:
    """:data:`CALLS_META`, a well-formed meta whose callee is the meta :data:`COMPUTE_ONLY`."""
    body = _relay_py(CALLS_META, COMPUTE_ONLY, "y")
    return _write_meta(root, CALLS_META, [COMPUTE_ONLY], [_COMPUTED], body)


def add_late_pair(root: Path, embed_bundle: Path) -> None:
    """:data:`LATE` and its callee :data:`LATE_EMBED` (a copy of ``embed_bundle``)."""
    copy_bundle(embed_bundle, root / LATE_EMBED)
    _embedding_meta(root, LATE, LATE_EMBED)


def copy_bundle(source: Path, target: Path) -> Path:
    """Copy a bundle under another name (its manifest renamed: the directory names a model)."""
    staging = target.with_name(f"{target.name}.tmp")  # ignored by the scanner
    shutil.copytree(source, staging)
    _edit_manifest(staging, name=target.name)
    staging.rename(target)
    return target


def release(flag_dir: Path, token: int) -> None:
    """Let the :data:`PARKED` request whose ``x[0, 0]`` is ``token`` return."""
    (flag_dir / f"release-{token}").touch()


# -- references -----------------------------------------------------------------------------------


@contextlib.contextmanager
def _examples_importable() -> Iterator[None]:
    added = str(ROOT) not in sys.path
    if added:
        sys.path.insert(0, str(ROOT))
    try:
        yield
    finally:
        if added:
            sys.path.remove(str(ROOT))


def _network() -> Any:
    with _examples_importable():
        return importlib.import_module("examples.pipeline.network")


def _glue() -> Any:
    # Importing the glue runs its register_meta_model, which needs a collection in progress.
    with _examples_importable(), collect_registrations():
        return importlib.import_module("examples.pipeline.meta")


class LocalCall:
    """The ``call`` of ``examples.pipeline.meta.run`` run in this process (jax on the CPU)."""

    def __init__(self) -> None:
        network = _network()
        self._stages = {
            EMBED: (network.embed, network.init_embed_params()),
            SCORE: (network.score, network.init_score_params()),
        }
        self.calls: list[tuple[str, int]] = []

    def __call__(
        self,
        name: str,
        inputs: list[NamedTensor],
        *,
        requested_outputs: Sequence[str] | None = None,
    ) -> list[NamedTensor]:
        """Run stage ``name`` with its seeded parameters."""
        function, params = self._stages[name]
        (tensor,) = inputs
        self.calls.append((name, tensor.shape[0]))
        output = "emb" if name == EMBED else "score"
        return [NamedTensor(output, np.asarray(function(params, tensor.data)))]

    def scratch(self, shape: Any, dtype: Any = None) -> Any:
        """A plain array, as the server hands out when it has no scratch pool."""
        return np.empty(shape, dtype)


def pipeline_reference(items: np.ndarray[Any, Any]) -> tuple[Any, Any]:
    """``(scores, indices)`` of the ``pipeline`` glue and stages run directly in Python."""
    call = LocalCall()
    scores, indices = _glue().run([NamedTensor("items", items)], call)
    assert [name for name, _ in call.calls] == [EMBED, SCORE]
    return scores.data, indices.data


def embed_reference(x: np.ndarray[Any, Any]) -> Any:
    """``pipeline_embed``'s numbers for ``x`` (what :data:`PARKED` returns)."""
    network = _network()
    return np.asarray(network.embed(network.init_embed_params(), x))


def compute_only_reference(x: np.ndarray[Any, Any]) -> Any:
    """What :data:`COMPUTE_ONLY` returns for ``x``."""
    return x * np.float32(2.0) + np.float32(1.0)
