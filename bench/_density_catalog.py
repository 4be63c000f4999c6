"""The catalog and the traffic of ``bench.density`` (and the catalog of ``bench.fleet``).

The catalog is ``count`` copies of a base model: the ``cnn`` example (``cnn_000``, ``cnn_001``,
...) or an MLP of 96 MiB of weights (``heavy_000`` or ``deep_000``, ...; see :data:`KINDS`),
each a bundle of its own with the same modules (so the executable cache compiles them once) and
its own ``weights.safetensors``: the original arrays plus fixed-seed noise, same names, shapes,
dtypes and ``argument_order``, the manifest renamed. The CNN's weights are tiny (5,672 B); with
``ballast_bytes`` every copy also carries an f32 ``ballast/w`` array of that size that the
network reads one element of (times zero), so a load moves real bytes while the compute stays
the CNN's. The traffic is a fixed-seed Zipf(1.1) sequence over the catalog, the popularity
ranks shuffled with the same seed, handed out in order to every client by a :class:`Cursor`.
"""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import yaml

from bench._grpc_load import Signature
from bench._grpc_servers import export_examples

__all__ = [
    "BALLAST",
    "DEEP_REPEATS",
    "HEAVY_BATCH_SIZES",
    "KINDS",
    "ZIPF_S",
    "Catalog",
    "Cursor",
    "build_catalog",
    "forward_deep",
    "forward_with_ballast",
    "top_share",
    "zipf_sequence",
]

#: The Zipf exponent of the traffic (issue 13).
ZIPF_S = 1.1
#: The ballast weight's name (a parameter group of the exported function).
BALLAST = "ballast"
#: Relative size of the noise added to each copy's weights.
_NOISE = 0.05
_WEIGHTS = "weights.safetensors"

Arrays = dict[str, np.ndarray[Any, Any]]


#: Base models a catalog copies: the ``cnn`` example (5.6 KiB of weights, compute-bound);
#: ``heavy``, the heavy MLP of ``bench.peers`` (1024-4096-4096-1000, 96 MiB of weights: a
#: ResNet-50's size), whose batch-1 execution reads every weight once, so a load (a copy of the
#: same bytes) costs about 1.5-2x an execution; or ``deep``, the same weights with the
#: 4096x4096 layer applied :data:`DEEP_REPEATS` times (tied weights), so an execution costs
#: about 1.2-1.6x a load, as a ResNet-50's does on a GPU (a few ms against a 2-4 ms load).
KINDS: Mapping[str, Signature] = {
    "cnn": ("image", (1, 1, 28, 28), "logits", (1, 10)),
    "heavy": ("x", (1, 1024), "y", (1, 1000)),
    "deep": ("x", (1, 1024), "y", (1, 1000)),
}
#: How often ``deep`` applies its middle layer.
DEEP_REPEATS = 4
#: Compiled batch sizes of the ``heavy`` base.
HEAVY_BATCH_SIZES = (1, 2, 4, 8)


@attrs.frozen
class Catalog:
    """The exported catalog: where it is, its model names and the bytes of weights each."""

    root: Path
    names: tuple[str, ...]
    model_bytes: int
    ballast_bytes: int
    kind: str = "cnn"

    @property
    def signature(self) -> Signature:
        """(input name, one-row shape, output name, one-row output shape) of every model."""
        return KINDS[self.kind]

    @property
    def total_bytes(self) -> int:
        """Bytes of weights of the whole catalog (every copy is the same size)."""
        return self.model_bytes * len(self.names)


def forward_with_ballast(params: dict[str, dict[str, Any]], image: Any) -> Any:
    """The CNN's logits, plus zero times one element of ``params["ballast"]["w"]``.

    Reading the ballast keeps it an argument of the exported program (it is transferred on
    every load) at the cost of one multiply-add.
    """
    from examples.cnn.network import forward

    cnn = {k: v for k, v in params.items() if k != BALLAST}
    return forward(cnn, image) + 0.0 * params[BALLAST]["w"][0]


def forward_deep(weights: dict[str, dict[str, Any]], x: Any) -> Any:
    """The heavy MLP with its middle layer applied :data:`DEEP_REPEATS` times."""
    import jax.numpy as jnp

    first, middle, last = weights["dense0"], weights["dense1"], weights["dense2"]
    h = jnp.maximum(x @ first["w"] + first["b"], 0.0)
    for _ in range(DEEP_REPEATS):
        h = jnp.maximum(h @ middle["w"] + middle["b"], 0.0)
    return h @ last["w"] + last["b"]


def _export_mlp(out: Path, kind: str) -> Path:
    from bench._peers.models import MODELS, forward, params
    from reactantserver.export import export_jax

    return export_jax(
        forward_deep if kind == "deep" else forward,
        params(MODELS["heavy_mlp"]),
        ["x=f32[n,f=1024]"],
        ["y=f32[n,k=1000]"],
        batch_sizes=HEAVY_BATCH_SIZES,
        out=out / kind,
        force=True,
        description=f"The {kind} MLP of bench.density and bench.fleet (96 MiB of weights)",
        progress=False,
    )


def _export_base(out: Path, ballast_bytes: int, kind: str = "cnn") -> Path:
    """The bundle every copy starts from: ``examples/cnn`` as exported, or with ballast, or
    the heavy MLP."""
    if kind in ("heavy", "deep"):
        return _export_mlp(out, kind)
    if not ballast_bytes:
        export_examples(out, ["cnn"])
        return out / "cnn"
    from examples.cnn.export import BATCH_SIZES
    from examples.cnn.network import init_params
    from reactantserver.export import export_jax

    params: dict[str, Any] = dict(init_params())
    params[BALLAST] = {"w": np.zeros(max(1, ballast_bytes // 4), np.float32)}
    return export_jax(
        forward_with_ballast,
        params,
        ["image=f32[n,c=1,h=28,w=28]"],
        ["logits=f32[n,k=10]"],
        batch_sizes=BATCH_SIZES,
        out=out / "cnn",
        force=True,
        description="The cnn example with a ballast weight (bench.density)",
        progress=False,
    )


def _read_weights(path: Path) -> tuple[Arrays, dict[str, str]]:
    from safetensors import safe_open

    with safe_open(str(path), "np") as f:
        arrays = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 - not a dict
        return arrays, dict(f.metadata() or {})


def _perturbed(arrays: Arrays, rng: np.random.Generator) -> Arrays:
    out = {}
    for name, a in arrays.items():
        scale = _NOISE * (float(np.std(a)) or 1.0)
        out[name] = (a + scale * rng.standard_normal(a.shape)).astype(a.dtype)
    return out


def build_catalog(
    root: Path, count: int, *, seed: int, ballast_bytes: int = 0, kind: str = "cnn"
) -> Catalog:
    """Export the base bundle beside ``root`` and write ``count`` copies into ``root``.

    ``kind`` (see :data:`KINDS`) names the base; ``ballast_bytes`` only applies to ``cnn``.
    Copies are named ``<kind>_000``, ``<kind>_001``, ...
    """
    from safetensors.numpy import save_file

    if kind not in KINDS:
        raise ValueError(f"unknown catalog kind {kind!r}; known: {sorted(KINDS)}")
    if kind != "cnn" and ballast_bytes:
        raise ValueError("ballast_bytes applies to the cnn catalog only")
    base = _export_base(root.parent / f"{root.name}-base", ballast_bytes, kind)
    arrays, metadata = _read_weights(base / _WEIGHTS)
    order = json.loads(metadata["argument_order"])
    model_bytes = sum(arrays[name].nbytes for name in order)
    rng = np.random.default_rng(seed)
    names = tuple(f"{kind}_{i:03d}" for i in range(count))
    root.mkdir(parents=True, exist_ok=True)
    for name in names:
        target = root / name
        shutil.copytree(base, target, ignore=shutil.ignore_patterns(_WEIGHTS))
        save_file(_perturbed(arrays, rng), str(target / _WEIGHTS), metadata=metadata)
        manifest_path = target / "manifest.yaml"
        manifest = yaml.safe_load(manifest_path.read_text())
        manifest["name"] = name
        manifest_path.write_text(yaml.safe_dump(manifest, sort_keys=False))
    shutil.rmtree(base.parent)
    return Catalog(root, names, model_bytes, ballast_bytes, kind)


def _zipf_weights(n: int, s: float) -> np.ndarray[Any, Any]:
    w = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** s
    return np.asarray(w / w.sum())


def zipf_sequence(
    names: Sequence[str], length: int, *, seed: int, s: float = ZIPF_S
) -> tuple[list[str], list[str]]:
    """(``length`` model names drawn Zipf(``s``) by popularity rank, the models by rank).

    Rank 1 is the most popular; which model holds which rank is a fixed-seed shuffle.
    """
    rng = np.random.default_rng(seed)
    by_rank = [names[i] for i in rng.permutation(len(names))]
    ranks = rng.choice(len(names), size=length, p=_zipf_weights(len(names), s))
    return [by_rank[r] for r in ranks], by_rank


def top_share(n: int, k: int, s: float = ZIPF_S) -> float:
    """The share of Zipf(``s``) traffic over ``n`` models that goes to the ``k`` most popular."""
    return float(_zipf_weights(n, s)[: max(0, k)].sum())


class Cursor:
    """Hands out a request sequence in order to every client (thread-safe), cycling."""

    def __init__(self, sequence: Sequence[str]) -> None:
        self._sequence = sequence
        self._next = 0
        self._lock = threading.Lock()

    def __call__(self) -> str:
        with self._lock:
            name = self._sequence[self._next % len(self._sequence)]
            self._next += 1
        return name

    @property
    def issued(self) -> int:
        """Requests handed out so far."""
        return self._next
