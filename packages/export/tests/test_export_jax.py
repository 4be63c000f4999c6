"""``export_jax``: real lowering on the CPU into bundles that core parses exactly."""

from __future__ import annotations

import importlib.util
import io
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from reactantserver.core.dtypes import DType
from reactantserver.core.manifest import MLIR_BYTECODE_MAGIC, load_manifest, resolve_layout
from reactantserver.core.types import Batch, Fixed, Variable
from reactantserver.core.weights import SafetensorsReader
from reactantserver.export import ExportError, export_jax, validate
from reactantserver.export._progress import Progress

Model = tuple[Callable[..., Any], dict[str, dict[str, np.ndarray[Any, Any]]]]


def test_bundle_is_exactly_spec_01(tiny_bundle: Path) -> None:
    manifest = load_manifest(tiny_bundle)
    layout = resolve_layout(tiny_bundle, manifest)
    assert manifest.format_version == "3.0"
    assert manifest.name == manifest.declared_name == "tiny"
    assert manifest.compiled_batch_sizes == (1, 4)
    assert manifest.letters.executable_inputs == ("nf",)
    assert manifest.letters.executable_outputs == ("na",)
    assert manifest.executable_outputs[0].name == "logits"
    assert manifest.executable_outputs[0].shape == (Batch(), Fixed(3))
    assert manifest.coalescable
    assert [m.path.name for m in layout.modules] == ["model.b1.mlir", "model.b4.mlir"]
    for module in layout.modules:
        assert module.path.read_bytes()[:4] == MLIR_BYTECODE_MAGIC
    with SafetensorsReader(tiny_bundle / "weights.safetensors") as reader:
        # tree_flatten_with_path order: sorted dict keys, '/'-joined.
        assert reader.argument_order == ("dense/b", "dense/w", "head/w")
        assert reader.weight_nbytes == (5 + 30 + 15) * 4
    provenance = manifest.provenance
    for key in (
        "exported_at",
        "reactantserver_export_version",
        "jax_version",
        "jaxlib_version",
        "python_version",
        "lowering_platform",
        "source_framework",
        "entry",
    ):
        assert key in provenance, key
    assert provenance["source_framework"] == "jax"
    assert provenance["lowering_platform"] == "cpu"
    assert provenance["entry"].endswith(":tiny_forward")
    # conftest.py lives in this repository's work tree.
    assert len(provenance["git_commit"]) == 40
    assert isinstance(provenance["git_dirty"], bool)
    if provenance["git_dirty"]:
        assert provenance["git_diff_file"] == "working_tree.patch"
        assert (tiny_bundle / "working_tree.patch").is_file()


def test_outside_git_only_base_provenance(tmp_path: Path, models: Path) -> None:
    source = tmp_path / "outside_model.py"
    source.write_text("def forward(params, x):\n    return x * params['s']\n")
    spec = importlib.util.spec_from_file_location("outside_model", source)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    bundle = export_jax(
        module.forward,
        {"s": np.float32(2.0)},
        ["x=f32[3]"],
        out=models / "scaled",
        progress=False,
        provenance_extra={"team": "ml"},
    )
    provenance = load_manifest(bundle).provenance
    assert not any(key.startswith("git") for key in provenance)
    assert provenance["team"] == "ml"
    assert sorted(p.name for p in bundle.iterdir()) == [
        "manifest.yaml",
        "model.mlir",
        "weights.safetensors",
    ]
    assert load_manifest(bundle).batch_keys == (0,)


def test_dict_outputs_text_copies_and_hook_template(models: Path) -> None:
    def fn(params: dict[str, Any], a: Any, b: Any) -> dict[str, Any]:
        return {"total": (a + b).sum(axis=1), "scaled": a * params["k"]}

    bundle = export_jax(
        fn,
        {"k": np.ones(4, np.float32)},
        ["a=f32[n,d=4]", "b=f32[n,d=4]"],
        batch_sizes=(2, 3),
        out=models / "dicty",
        progress=False,
        with_hooks=True,
        text_copies=True,
    )
    manifest = load_manifest(bundle)
    # Dict keys become output names in sorted order.
    assert [s.name for s in manifest.executable_outputs] == ["scaled", "total"]
    assert manifest.executable_outputs[1].shape == (Batch(),)
    assert "func.func public @main" in (bundle / "model.b2.mlir.txt").read_text()
    assert resolve_layout(bundle, manifest).warnings == ()
    source = (bundle / "model.py").read_text()
    assert "register_model('dicty', preprocess=preprocess, postprocess=postprocess)" in source
    compile(source, "model.py", "exec")


def test_variants_and_64_bit(models: Path, needs_worker: None) -> None:
    def fn(params: dict[str, Any], tokens: Any) -> tuple[Any, Any]:
        return tokens.sum(axis=1) + params["bias"], tokens * 2

    bundle = export_jax(
        fn,
        {"bias": np.array(7, np.int64)},
        ["tokens=i64[n,l=-1]"],
        ["total", "doubled"],
        batch_sizes=(1, 2),
        variants=[{"l": 3}, {"l": 5}],
        out=models / "seq",
        progress=False,
    )
    manifest = load_manifest(bundle)
    assert manifest.variant_keys == ((3,), (5,))
    assert manifest.executable_inputs[0].dtype is DType.I64
    assert manifest.executable_outputs[0].shape == (Batch(),)
    # The second output's length follows the variant: a variable axis.
    assert manifest.executable_outputs[1].shape == (Batch(), Variable())
    names = sorted(p.name for p in bundle.glob("*.mlir"))
    assert names == ["model.v0.b1.mlir", "model.v0.b2.mlir", "model.v1.b1.mlir", "model.v1.b2.mlir"]
    report = validate(bundle, reference=fn)
    assert report.ok, report.to_text()
    assert len(report.modules) == 4


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"inputs": ["x=f32[n,6]"], "batch_sizes": ()}, "give the batch sizes"),
        ({"inputs": ["x=f32[6]"], "batch_sizes": (1,)}, "no input has a batch axis"),
        ({"inputs": ["x=f32[n,6]", "y=f32[6]"]}, "mix batched and unbatched"),
        ({"inputs": ["x=f32[n,l=-1]"]}, "need one --variant"),
        ({"inputs": ["x=f32[n,l=-1]"], "variants": [{"q": 6}]}, "must size exactly"),
        ({"variants": [{"l": 6}]}, "no input has a variable axis"),
        ({"outputs": ["a", "b"]}, "2 output names given but the function returns 1"),
        ({"outputs": ["logits=f32[n,k=4]"]}, "the lowered output has shape"),
        ({"name": "other"}, "must match the basename of --out"),
        ({"inputs": ["x=f32[n,7]"]}, "lowering failed|tracing failed"),
        ({"client_inputs": ["raw=u8[n,6]"]}, "client inputs/outputs need hooks"),
    ],
)
def test_bad_requests_fail_before_writing(
    tiny: Model, models: Path, kwargs: dict[str, Any], message: str
) -> None:
    fn, params = tiny
    arguments: dict[str, Any] = {"inputs": ["x=f32[n,6]"], "batch_sizes": (1, 2)}
    arguments.update(kwargs)
    with pytest.raises(ExportError, match=message):
        export_jax(fn, params, out=models / "tiny", progress=False, **arguments)
    assert list(models.iterdir()) == []


def test_bad_parameter_trees(models: Path) -> None:
    with pytest.raises(ExportError, match="'w' is a str, not an array"):
        export_jax(lambda p, x: x, {"w": "nope"}, ["x=f32[2]"], out=models / "m", progress=False)
    with pytest.raises(ExportError, match="typed PRNG key"):
        export_jax(
            lambda p, x: x,
            {"key": jax.random.key(0)},
            ["x=f32[2]"],
            out=models / "m",
            progress=False,
        )


def test_existing_bundle_needs_force(tiny: Model, tiny_bundle: Path) -> None:
    fn, params = tiny
    with pytest.raises(ExportError, match="already exists"):
        export_jax(fn, params, ["x=f32[n,6]"], batch_sizes=(1,), out=tiny_bundle, progress=False)
    export_jax(
        fn, params, ["x=f32[n,6]"], batch_sizes=(2,), out=tiny_bundle, force=True, progress=False
    )
    assert load_manifest(tiny_bundle).compiled_batch_sizes == (2,)
    assert sorted(p.name for p in tiny_bundle.parent.iterdir()) == ["tiny"]


def test_single_batch_size_output_axis_follows_the_input(models: Path) -> None:
    def fn(params: Any, x: Any) -> tuple[Any, Any]:
        return x.T * params["w"].sum(), jnp.zeros((3,)) + params["w"].sum()

    with pytest.raises(ExportError, match="batch axis is ambiguous"):
        export_jax(
            fn, {"w": np.ones((4, 2), np.float32)}, ["x=f32[n,a=4]"], batch_sizes=(2,),
            out=models / "amb", progress=False,
        )  # fmt: skip
    bundle = export_jax(
        fn,
        {"w": np.ones((4, 2), np.float32)},
        ["x=f32[n,a=4]"],
        ["t=f32[a=4,n]", "c"],
        batch_sizes=(2,),
        out=models / "amb",
        progress=False,
    )
    manifest = load_manifest(bundle)
    assert manifest.letters.executable_outputs == ("an", "a")
    assert manifest.executable_outputs[1].shape == (Fixed(3),)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not Progress(3, "x").shown  # pytest captures stderr: not a TTY
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    with Progress(2, "export m") as bar:
        assert bar.shown
        bar.step("model.b1.mlir")
        bar.step("weights")
    assert "export m" in terminal.getvalue()
    assert "2/2" in terminal.getvalue()
    assert not Progress(2, "x", enabled=False).shown
