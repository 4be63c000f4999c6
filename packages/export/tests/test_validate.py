"""``validate`` on good and corrupted bundles: failures name the problem."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from reactantserver.export import ExportError, ValidationReport, export_jax, validate, write_bundle

pytestmark = pytest.mark.usefixtures("needs_worker")

Model = tuple[Callable[..., Any], dict[str, dict[str, np.ndarray[Any, Any]]]]


def _failures(report: ValidationReport) -> str:
    assert not report.ok, report.to_text()
    return report.to_text()


def _edit_header(path: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    """Rewrite a safetensors header in place, keeping the data section."""
    raw = path.read_bytes()
    length = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + length])
    edit(header)
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    path.write_bytes(len(encoded).to_bytes(8, "little") + encoded + raw[8 + length :])


def test_good_bundle_passes_with_and_without_reference(tiny: Model, tiny_bundle: Path) -> None:
    fn, params = tiny
    report = validate(tiny_bundle, reference=fn, params=params)
    assert report.ok, report.to_text()
    assert [(m.file, m.status) for m in report.modules] == [
        ("model.b1.mlir", "servable"),
        ("model.b4.mlir", "servable"),
    ]
    assert all(
        o.max_abs is not None and o.max_abs <= 1e-5 for m in report.modules for o in m.outputs
    )
    # Without params the reference gets the bundle's own weights, rebuilt into a tree.
    assert validate(tiny_bundle, reference=fn).ok
    plain = validate(tiny_bundle)
    assert plain.ok
    assert "no reference" in plain.to_text()
    markdown = plain.to_markdown()
    assert "| model.b4.mlir | servable | logits (executable) | [4,3] | float32 |" in markdown
    assert markdown.rstrip().endswith("**PASSED**")


def test_missing_module(tiny_bundle: Path) -> None:
    (tiny_bundle / "model.b4.mlir").unlink()
    text = _failures(validate(tiny_bundle))
    assert "model.b4.mlir: missing module file" in text


def test_argument_order_names_an_absent_tensor(tiny_bundle: Path) -> None:
    def edit(header: dict[str, Any]) -> None:
        header["__metadata__"]["argument_order"] = json.dumps(["dense/b", "dense/x", "head/w"])

    _edit_header(tiny_bundle / "weights.safetensors", edit)
    text = _failures(validate(tiny_bundle))
    assert "argument_order lists 'dense/x', which is not a tensor of the file" in text


def test_argument_order_in_the_wrong_order(tiny_bundle: Path) -> None:
    def edit(header: dict[str, Any]) -> None:
        header["__metadata__"]["argument_order"] = json.dumps(["dense/w", "dense/b", "head/w"])

    _edit_header(tiny_bundle / "weights.safetensors", edit)
    report = validate(tiny_bundle)
    text = _failures(report)
    assert all(m.status == "UNSERVABLE" for m in report.modules)
    assert "argument 1 (weight 'dense/w') is 5xf32, expected 6x5xf32" in text


def test_truncated_weights(tiny_bundle: Path) -> None:
    path = tiny_bundle / "weights.safetensors"
    path.write_bytes(path.read_bytes()[:-16])
    text = _failures(validate(tiny_bundle))
    assert "weights.safetensors" in text
    assert "run past the end of the file" in text


def test_module_with_another_signature(tiny: Model, tiny_bundle: Path, models: Path) -> None:
    fn, params = tiny
    other = export_jax(
        lambda p, x: fn(p, x[:, :6]),
        params,
        ["x=f32[n,8]"],
        batch_sizes=(1,),
        out=models / "other",
        progress=False,
    )
    shutil.copy(other / "model.b1.mlir", tiny_bundle / "model.b1.mlir")
    report = validate(tiny_bundle)
    text = _failures(report)
    assert report.modules[0].status == "UNSERVABLE"
    assert report.modules[1].ok
    assert "argument 0 (input 'x') is 1x8xf32, expected 1x6xf32" in text


def test_reference_mismatch_reports_the_error(tiny: Model, tiny_bundle: Path) -> None:
    fn, params = tiny
    report = validate(tiny_bundle, reference=lambda p, x: fn(p, x) + 0.01, params=params)
    text = _failures(report)
    assert "exceeds atol 0.001 + rtol 0.001*|reference|" in text
    worst = max(o.max_abs or 0.0 for m in report.modules for o in m.outputs)
    assert worst == pytest.approx(0.01, rel=1e-3)
    assert validate(tiny_bundle, reference=lambda p, x: fn(p, x) + 0.01, atol=0.02).ok
    bad_count = validate(tiny_bundle, reference=lambda p, x: (fn(p, x), x), params=params)
    assert "the module returns 1 outputs, the reference 2" in _failures(bad_count)


def test_integer_outputs_must_match_exactly(models: Path) -> None:
    def fn(params: Any, x: Any) -> Any:
        return x * params["k"]

    bundle = export_jax(
        fn, {"k": np.array(3, np.int32)}, ["x=i32[n,4]"], batch_sizes=(2,),
        out=models / "ints", progress=False,
    )  # fmt: skip
    assert validate(bundle, reference=fn).ok
    text = _failures(validate(bundle, reference=lambda p, x: fn(p, x) + 1))
    assert "integers and bools must match exactly" in text


HOOKS = """
import numpy as np

def preprocess(inputs):
    (raw,) = inputs
    return [NamedTensor("x", raw.data.astype(np.{dtype}) / 255.0)]

def postprocess(outputs):
    (logits,) = outputs
    return [NamedTensor("best", np.argmax(logits.data, axis=1).astype(np.int64))]

register_model("hooked", preprocess=preprocess, postprocess=postprocess)
"""


def _hooked(tiny: Model, models: Path, dtype: str) -> Path:
    fn, params = tiny
    return export_jax(
        fn,
        params,
        ["x=f32[n,f=6]"],
        ["logits"],
        batch_sizes=(1, 3),
        out=models / "hooked",
        progress=False,
        client_inputs=["raw=u8[n,f=6]"],
        client_outputs=["best=i64[n]"],
        model_py=HOOKS.format(dtype=dtype),
    )


def test_hooks_run_like_the_server(tiny: Model, models: Path) -> None:
    fn, params = tiny
    bundle = _hooked(tiny, models, "float32")
    report = validate(bundle, reference=fn, params=params)
    assert report.ok, report.to_text()
    stages = [(o.name, o.stage, o.shape) for o in report.modules[1].outputs]
    assert stages == [("logits", "executable", (3, 3)), ("best", "client", (3,))]


def test_hook_results_are_checked(tiny: Model, models: Path) -> None:
    bundle = _hooked(tiny, models, "float64")
    text = _failures(validate(bundle))
    assert "preprocess output 'x': dtype f64, expected f32" in text


def test_model_py_that_fails_to_register(tiny: Model, models: Path) -> None:
    bundle = _hooked(tiny, models, "float32")
    (bundle / "model.py").write_text("register_meta_model('x', run=lambda i, c: i)\n")
    text = _failures(validate(bundle))
    assert "must call register_model(), not register_meta_model()" in text


def test_meta_bundles_are_checked_not_run(models: Path) -> None:
    arguments: dict[str, Any] = {
        "name": "meta",
        "kind": "meta",
        "meta_calls": ["sub"],
        "client_inputs": ["items=f32[k=-1,f=4]"],
        "client_outputs": ["scores=f32[m=-1]"],
    }
    bundle = write_bundle(
        models / "meta", model_py="register_meta_model('meta', run=lambda i, c: i)\n", **arguments
    )
    report = validate(bundle)
    assert report.ok, report.to_text()
    assert report.kind == "meta"
    assert "running it needs the server (it calls sub)" in report.to_text()
    (bundle / "model.py").write_text("raise ValueError('broken hooks')\n")
    assert "import failed: ValueError: broken hooks" in _failures(validate(bundle))


def test_not_a_bundle(tmp_path: Path) -> None:
    text = _failures(validate(tmp_path / "nothing"))
    assert "manifest.yaml: missing" in text


def test_missing_worker_is_a_clear_error(
    tiny_bundle: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A None entry makes the import fail, as if the validate extra were not installed.
    monkeypatch.setitem(sys.modules, "reactantserver.worker.runtime.jax_backend", None)
    with pytest.raises(ExportError, match=r"reactantserver-export\[validate\]"):
        validate(tiny_bundle)
