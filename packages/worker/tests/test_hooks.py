"""Loading ``model.py`` from real bundle directories and running hooks with checked outputs."""

from __future__ import annotations

import asyncio
import contextvars
import os
import shutil
import sys
import textwrap
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
import ml_dtypes
import numpy as np
import pytest
import yaml

from reactantserver.core.config import WorkerConfig, worker_config_from_mapping
from reactantserver.core.dtypes import DType
from reactantserver.core.errors import BundleError, InvalidArgumentError
from reactantserver.core.hooks import MetaCall, NamedTensor
from reactantserver.core.manifest import Manifest, load_manifest
from reactantserver.core.types import Batch, Fixed, TensorSpec, Variable
from reactantserver.worker.hooks import (
    MODULE_NAME_PREFIX,
    THREAD_NAME_PREFIX,
    BundleHooks,
    HookError,
    bundle_module_name,
    check_hook_output,
    hook_pool,
    hook_pool_size,
    load_hooks,
    run_in_pool,
    run_postprocess,
    run_preprocess,
)

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"

X = {"name": "x", "dtype": "f32", "shape": "nk", "dims": {"k": 3}}
Y = {"name": "y", "dtype": "f32", "shape": "nk", "dims": {"k": 2}}
MODEL_MANIFEST: dict[str, Any] = {
    "format_version": "3.0",
    "executable_inputs": [X],
    "executable_outputs": [Y],
    "batching": {"compiled_batch_sizes": [1, 4]},
}
META_MANIFEST: dict[str, Any] = {
    "format_version": "3.0",
    "kind": "meta",
    "meta": {"calls": []},
    "client_inputs": [X],
    "client_outputs": [Y],
}
REGISTER_MODEL = 'register_model("m")\n'
REGISTER_META = 'register_meta_model("m", run=lambda inputs, call: inputs)\n'


def write_bundle(
    root: Path, name: str, manifest: dict[str, Any], model_py: str | None = None
) -> Path:
    """``root/name`` with ``manifest.yaml`` and (unless ``None``) ``model.py``."""
    bundle = root / name
    bundle.mkdir(parents=True, exist_ok=True)
    (bundle / "manifest.yaml").write_text(yaml.safe_dump(manifest))
    if model_py is not None:
        (bundle / "model.py").write_text(textwrap.dedent(model_py))
    return bundle


def load(bundle: Path, *, generation: int = 1) -> tuple[Manifest, BundleHooks]:
    manifest = load_manifest(bundle)
    return manifest, load_hooks(bundle, manifest, generation=generation)


def loaded_bundle_modules() -> list[str]:
    return [name for name in sys.modules if name.startswith(MODULE_NAME_PREFIX)]


def spec(name: str, dtype: DType, *dims: Fixed | Batch | Variable) -> TensorSpec:
    return TensorSpec(name, dtype, tuple(dims))


# --------------------------------------------------------------------------------------------
# The examples' model.py files (copied next to a hand-written manifest: the worker-only nox
# session cannot import ``examples``, which needs reactantserver-export)


def test_classifier_hooks_example(tmp_path: Path) -> None:
    manifest_data = {
        "format_version": "3.0",
        "executable_inputs": [
            {"name": "pixels", "dtype": "f32", "shape": "nchw", "dims": {"c": 3, "h": 28, "w": 28}}
        ],
        "executable_outputs": [
            {"name": "logits", "dtype": "f32", "shape": "nk", "dims": {"k": 10}}
        ],
        "client_inputs": [
            {"name": "image", "dtype": "u8", "shape": "nhwc", "dims": {"h": 28, "w": 28, "c": 3}}
        ],
        "client_outputs": [
            {"name": "indices", "dtype": "i64", "shape": "nk", "dims": {"k": 3}},
            {"name": "scores", "dtype": "f32", "shape": "nk", "dims": {"k": 3}},
        ],
        "batching": {"compiled_batch_sizes": [1, 8]},
    }
    bundle = write_bundle(tmp_path, "classifier_hooks", manifest_data)
    shutil.copyfile(EXAMPLES / "classifier_hooks" / "hooks.py", bundle / "model.py")
    manifest, hooks = load(bundle)
    assert hooks.preprocess is not None
    assert hooks.postprocess is not None
    assert hooks.run is None
    assert hooks.source == bundle / "model.py"

    image = np.zeros((2, 28, 28, 3), np.uint8)
    image[1] = 255
    (pixels,) = run_preprocess(
        "classifier_hooks", hooks, [NamedTensor("image", image)], manifest.executable_inputs
    )
    assert pixels.name == "pixels"
    assert pixels.shape == (2, 3, 28, 28)
    np.testing.assert_allclose(pixels.data[0], -1.0)
    np.testing.assert_allclose(pixels.data[1], 1.0)

    logits = np.tile(np.arange(10, dtype=np.float32), (2, 1))
    indices, scores = run_postprocess(
        "classifier_hooks", hooks, [NamedTensor("logits", logits)], manifest.client_outputs
    )
    assert (indices.name, scores.name) == ("indices", "scores")
    np.testing.assert_array_equal(indices.data, [[9, 8, 7], [9, 8, 7]])
    assert scores.dtype is DType.F32
    assert np.all(np.diff(scores.data, axis=1) < 0)


def test_pipeline_example(tmp_path: Path) -> None:
    manifest_data = {
        "format_version": "3.0",
        "kind": "meta",
        "meta": {"calls": ["pipeline_embed", "pipeline_score"]},
        "client_inputs": [
            {"name": "items", "dtype": "f32", "shape": "kf", "dims": {"k": -1, "f": 16}}
        ],
        "client_outputs": [
            {"name": "scores", "dtype": "f32", "shape": "m", "dims": {"m": -1}},
            {"name": "indices", "dtype": "i64", "shape": "m", "dims": {"m": -1}},
        ],
    }
    bundle = write_bundle(tmp_path, "pipeline", manifest_data)
    shutil.copyfile(EXAMPLES / "pipeline" / "meta.py", bundle / "model.py")
    manifest, hooks = load(bundle)
    assert hooks.preprocess is None
    assert hooks.postprocess is None
    assert hooks.run is not None

    class StandIn:
        """Stand-in sub-models: embed = the first 8 features, score = the row sum."""

        def __call__(
            self,
            name: str,
            inputs: list[NamedTensor],
            *,
            requested_outputs: Sequence[str] | None = None,
        ) -> list[NamedTensor]:
            (tensor,) = inputs
            if name == "pipeline_embed":
                return [NamedTensor("emb", tensor.data[:, :8])]
            return [NamedTensor("score", tensor.data.sum(axis=1, keepdims=True))]

        def scratch(self, shape: Any, dtype: Any = None) -> Any:
            return np.empty(shape, dtype)

    items = np.zeros((4, 16), np.float32)
    items[:, 0] = [1.0, 5.0, 2.0, 7.0]
    meta_call: MetaCall = StandIn()
    result = hooks.run([NamedTensor("items", items)], meta_call)
    scores, indices = check_hook_output("pipeline", "run", result, manifest.client_outputs)
    np.testing.assert_array_equal(indices.data, [1, 3])
    np.testing.assert_allclose(scores.data, [5.0, 7.0])

    with pytest.raises(InvalidArgumentError, match="1 to 32 rows"):
        hooks.run([NamedTensor("items", np.zeros((33, 16), np.float32))], meta_call)


# --------------------------------------------------------------------------------------------
# Loading


def test_bundle_without_model_py_has_no_hooks(tmp_path: Path) -> None:
    bundle = write_bundle(tmp_path, "plain", MODEL_MANIFEST)
    manifest, hooks = load(bundle)
    assert hooks == BundleHooks()
    assert hooks.source is None
    assert hooks.module is None

    # Identity, but still checked and returned in spec order.
    specs = [spec("a", DType.F32, Batch()), spec("b", DType.I32, Batch())]
    a = NamedTensor("a", np.zeros(2, np.float32))
    b = NamedTensor("b", np.zeros(2, np.int32))
    assert run_preprocess("plain", hooks, [b, a], specs) == [a, b]
    assert run_postprocess("plain", hooks, [b, a], specs) == [a, b]
    with pytest.raises(
        HookError, match="preprocess hook of model 'plain' did not return tensor 'b'"
    ):
        run_preprocess("plain", hooks, [a], specs)
    assert manifest.executable_inputs[0].name == "x"


def test_injected_names_and_bundle_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bundle = write_bundle(
        tmp_path,
        "injected",
        MODEL_MANIFEST,
        """
        import numpy as np

        SCALE = float((BUNDLE_DIR / "scale.txt").read_text())
        SEEN = {
            "bundle_dir": BUNDLE_DIR,
            "named_tensor": NamedTensor,
            "invalid_argument": InvalidArgumentError,
            "register_meta_model": register_meta_model,
        }

        def preprocess(inputs):
            (x,) = inputs
            return [NamedTensor("x", x.data * np.float32(SCALE))]

        register_model("injected", preprocess=preprocess)
        """,
    )
    (bundle / "scale.txt").write_text("4")
    monkeypatch.chdir(tmp_path)
    manifest = load_manifest(Path("injected"))
    hooks = load_hooks(Path("injected"), manifest)  # a relative path: BUNDLE_DIR is absolute

    assert hooks.module is not None
    seen = hooks.module.SEEN
    assert seen["bundle_dir"] == bundle
    assert seen["bundle_dir"].is_absolute()
    assert isinstance(seen["bundle_dir"], Path)
    assert seen["named_tensor"] is NamedTensor
    assert seen["invalid_argument"] is InvalidArgumentError
    assert callable(seen["register_meta_model"])
    x = NamedTensor("x", np.ones((2, 3), np.float32))
    (out,) = run_preprocess("injected", hooks, [x], manifest.executable_inputs)
    np.testing.assert_array_equal(out.data, np.full((2, 3), 4.0, np.float32))


def test_import_leaves_no_trace(tmp_path: Path) -> None:
    bundle = write_bundle(
        tmp_path,
        "trace",
        MODEL_MANIFEST,
        """
        import dataclasses
        import sys

        # Present in sys.modules while it runs, so dataclasses and friends work.
        DURING_IMPORT = sys.modules.get(__name__) is not None
        PATH_HAS_BUNDLE = str(BUNDLE_DIR) in sys.path

        @dataclasses.dataclass(frozen=True)
        class Settings:
            scale: float = 2.0

        SETTINGS = Settings()

        register_model("trace")
        """,
    )
    before_path = list(sys.path)
    before_modules = loaded_bundle_modules()
    _, hooks = load(bundle, generation=5)
    assert hooks.module is not None
    assert hooks.module.__name__ == "reactantserver_bundle_trace_5"
    assert hooks.module.DURING_IMPORT is True
    assert hooks.module.PATH_HAS_BUNDLE is False
    assert hooks.module.SETTINGS.scale == 2.0
    assert sys.path == before_path
    assert loaded_bundle_modules() == before_modules
    assert not (bundle / "__pycache__").exists()


def test_module_names() -> None:
    assert bundle_module_name("resnet", 1) == "reactantserver_bundle_resnet_1"
    assert bundle_module_name("resnet-50.v2", 12) == "reactantserver_bundle_resnet_50_v2_12"
    assert bundle_module_name("9lives", 0).isidentifier()
    with pytest.raises(ValueError, match="generation"):
        bundle_module_name("resnet", -1)


def test_model_name_with_dots_and_dashes(tmp_path: Path) -> None:
    bundle = write_bundle(tmp_path, "my-model.v1", MODEL_MANIFEST, REGISTER_MODEL)
    _, hooks = load(bundle, generation=3)
    assert hooks.module is not None
    assert hooks.module.__name__ == "reactantserver_bundle_my_model_v1_3"


GENERATION_SOURCE = """
import numpy as np

FACTOR = {factor}
CALLS = []

def preprocess(inputs):
    CALLS.append(len(CALLS))
    (x,) = inputs
    return [NamedTensor("x", x.data * np.float32(FACTOR))]

register_model("gen", preprocess=preprocess)
"""


def test_generations_do_not_share_globals(tmp_path: Path) -> None:
    bundle = write_bundle(tmp_path, "gen", MODEL_MANIFEST, GENERATION_SOURCE.format(factor="2.0"))
    manifest, first = load(bundle, generation=1)
    # Same size, same second: a cached .pyc would be taken for the old file.
    (bundle / "model.py").write_text(GENERATION_SOURCE.format(factor="3.0"))
    _, second = load(bundle, generation=2)
    assert first.module is not None
    assert second.module is not None
    assert first.module.__name__ == "reactantserver_bundle_gen_1"
    assert second.module.__name__ == "reactantserver_bundle_gen_2"

    x = [NamedTensor("x", np.ones((1, 3), np.float32))]
    specs = manifest.executable_inputs
    (a,) = run_preprocess("gen", first, x, specs)
    (b,) = run_preprocess("gen", first, x, specs)
    (c,) = run_preprocess("gen", second, x, specs)
    np.testing.assert_array_equal(a.data, np.full((1, 3), 2.0, np.float32))
    np.testing.assert_array_equal(c.data, np.full((1, 3), 3.0, np.float32))
    np.testing.assert_array_equal(b.data, a.data)
    assert first.module.CALLS == [0, 1]
    assert second.module.CALLS == [0]
    first.module.__dict__["FACTOR"] = 10.0
    (d,) = run_preprocess("gen", second, x, specs)
    np.testing.assert_array_equal(d.data, c.data)

    # Reloading the same generation number again gives a fresh module too.
    _, again = load(bundle, generation=2)
    assert again.module is not None
    assert again.module is not second.module
    assert again.module.CALLS == []


BUNDLE_ERRORS: list[tuple[str, dict[str, Any], str, str]] = [
    ("syntax", MODEL_MANIFEST, "def broken(:\n    pass\n", "import failed: SyntaxError"),
    (
        "raises",
        MODEL_MANIFEST,
        "X = 1\nY = X / 0\nregister_model('m')\n",
        "import failed at line 2: ZeroDivisionError: division by zero",
    ),
    (
        "missing_import",
        MODEL_MANIFEST,
        "import reactantserver_no_such_module\n",
        "import failed at line 1: ModuleNotFoundError",
    ),
    (
        "exits",
        MODEL_MANIFEST,
        "import sys\nsys.exit(3)\n",
        "import failed at line 2: SystemExit: 3",
    ),
    ("zero", MODEL_MANIFEST, "X = 1\n", "registers nothing; a bundle of kind: model must call"),
    (
        "two",
        MODEL_MANIFEST,
        REGISTER_MODEL + 'register_model("other")\n',
        "2 registrations (register_model('m'), register_model('other'))",
    ),
    (
        "model_registers_meta",
        MODEL_MANIFEST,
        REGISTER_META,
        "calls register_meta_model('m') but the manifest declares kind: model, "
        "which must call register_model()",
    ),
    (
        "meta_registers_model",
        META_MANIFEST,
        REGISTER_MODEL,
        "calls register_model('m') but the manifest declares kind: meta, "
        "which must call register_meta_model()",
    ),
    (
        "meta_zero",
        META_MANIFEST,
        "X = 1\n",
        "registers nothing; a bundle of kind: meta must call register_meta_model()",
    ),
    (
        "not_callable",
        MODEL_MANIFEST,
        'register_model("m", preprocess="scale")\n',
        "passes preprocess=str, which is not callable",
    ),
    (
        "meta_run_none",
        META_MANIFEST,
        'register_meta_model("m", run=None)\n',
        "passes run=None",
    ),
]


@pytest.mark.parametrize(
    ("name", "manifest_data", "source", "message"),
    BUNDLE_ERRORS,
    ids=[case[0] for case in BUNDLE_ERRORS],
)
def test_bundle_errors(
    tmp_path: Path, name: str, manifest_data: dict[str, Any], source: str, message: str
) -> None:
    bundle = write_bundle(tmp_path, name, manifest_data, source)
    manifest = load_manifest(bundle)
    before = loaded_bundle_modules()
    with pytest.raises(BundleError) as caught:
        load_hooks(bundle, manifest)
    text = str(caught.value)
    assert text.startswith(f"{bundle / 'model.py'}: ")
    assert message in text
    assert loaded_bundle_modules() == before


def test_meta_without_model_py(tmp_path: Path) -> None:
    bundle = write_bundle(tmp_path, "meta", META_MANIFEST, REGISTER_META)
    manifest = load_manifest(bundle)  # the manifest requires model.py for a meta
    (bundle / "model.py").unlink()
    with pytest.raises(BundleError, match=r"model\.py: missing: required for kind: meta"):
        load_hooks(bundle, manifest)


def test_meta_loads(tmp_path: Path) -> None:
    bundle = write_bundle(tmp_path, "meta", META_MANIFEST, REGISTER_META)
    _, hooks = load(bundle)
    assert hooks.run is not None
    assert hooks.preprocess is None
    assert hooks.postprocess is None


# --------------------------------------------------------------------------------------------
# Hook output checks

SPECS = [
    spec("x", DType.F32, Batch(), Fixed(3)),
    spec("y", DType.I32, Batch()),
]


def good() -> list[NamedTensor]:
    return [NamedTensor("x", np.zeros((2, 3), np.float32)), NamedTensor("y", np.zeros(2, np.int32))]


def x_as(array: np.ndarray[Any, Any]) -> list[NamedTensor]:
    return [NamedTensor("x", array), NamedTensor("y", np.zeros(2, np.int32))]


def raise_runtime_error() -> list[NamedTensor]:
    raise RuntimeError("boom")


HOOK_ERRORS: list[tuple[str, Callable[[], object], str]] = [
    ("none", lambda: None, "returned None, expected a list of NamedTensor"),
    ("dict", lambda: {"x": 1}, "returned dict, expected a list of NamedTensor"),
    ("string", lambda: "xy", "returned str, expected a list of NamedTensor"),
    (
        "arrays",
        lambda: [t.data for t in good()],
        "returned ndarray at position 0, expected NamedTensor",
    ),
    ("missing", lambda: good()[:1], "did not return tensor 'y'"),
    (
        "extra",
        lambda: [*good(), NamedTensor("z", np.zeros(2, np.float32))],
        "returned unexpected tensor 'z' (expected: x, y)",
    ),
    ("duplicate", lambda: [*good(), good()[0]], "returned tensor 'x' more than once"),
    (
        "dtype",
        lambda: x_as(np.zeros((2, 3), np.float64)),
        "returned tensor 'x' with dtype f64, expected f32",
    ),
    (
        "unsupported_dtype",
        lambda: x_as(np.zeros((2, 3), np.complex64)),
        "returned tensor 'x' with dtype complex64, expected f32",
    ),
    (
        "rank",
        lambda: x_as(np.zeros((2, 3, 1), np.float32)),
        "returned tensor 'x' that breaks its spec: tensor 'x' of model 'm' has shape [2, 3, 1], "
        "expected rank 2 ([-1, 3])",
    ),
    (
        "extent",
        lambda: x_as(np.zeros((2, 4), np.float32)),
        "returned tensor 'x' that breaks its spec: tensor 'x' of model 'm' has shape [2, 4], "
        "expected [-1, 3]",
    ),
    ("raises", raise_runtime_error, "raised RuntimeError: boom"),
]


@pytest.mark.parametrize("hook", ["preprocess", "postprocess"])
@pytest.mark.parametrize(
    ("case", "returns", "message"), HOOK_ERRORS, ids=[case[0] for case in HOOK_ERRORS]
)
def test_hook_errors(hook: str, case: str, returns: Callable[[], object], message: str) -> None:
    def fn(inputs: list[NamedTensor]) -> list[NamedTensor]:
        result: Any = returns()
        return result  # type: ignore[no-any-return]

    hooks = BundleHooks(preprocess=fn) if hook == "preprocess" else BundleHooks(postprocess=fn)
    runner = run_preprocess if hook == "preprocess" else run_postprocess
    with pytest.raises(HookError) as caught:
        runner("m", hooks, good(), SPECS)
    assert caught.value.status is grpc.StatusCode.INTERNAL
    assert str(caught.value) == f"{hook} hook of model 'm' {message}"
    if case == "raises":
        assert isinstance(caught.value.__cause__, RuntimeError)


def test_preprocess_rows_must_agree() -> None:
    def uneven(inputs: list[NamedTensor]) -> list[NamedTensor]:
        return [
            NamedTensor("x", np.zeros((2, 3), np.float32)),
            NamedTensor("y", np.zeros(3, np.int32)),
        ]

    with pytest.raises(HookError) as caught:
        run_preprocess("m", BundleHooks(preprocess=uneven), good(), SPECS)
    assert caught.value.status is grpc.StatusCode.INTERNAL
    assert str(caught.value).startswith("preprocess hook of model 'm' returned an invalid batch: ")
    assert "'x' has 2 rows, 'y' has 3" in str(caught.value)

    def empty(inputs: list[NamedTensor]) -> list[NamedTensor]:
        return [
            NamedTensor("x", np.zeros((0, 3), np.float32)),
            NamedTensor("y", np.zeros(0, np.int32)),
        ]

    with pytest.raises(HookError, match="input 'x' of model 'm' has 0 rows"):
        run_preprocess("m", BundleHooks(preprocess=empty), good(), SPECS)

    # postprocess outputs carry no row rule (a client output may have any extent there).
    out = run_postprocess("m", BundleHooks(postprocess=uneven), good(), SPECS)
    assert [t.shape for t in out] == [(2, 3), (3,)]


def test_executable_only_dtypes_are_named_by_token() -> None:
    specs = [spec("q", DType.F8_E4M3, Batch(), Fixed(2))]

    def as_f32(inputs: list[NamedTensor]) -> list[NamedTensor]:
        return [NamedTensor("q", np.zeros((1, 2), np.float32))]

    with pytest.raises(HookError, match="returned tensor 'q' with dtype f32, expected f8_e4m3"):
        run_preprocess("m", BundleHooks(preprocess=as_f32), [], specs)

    def as_f8(inputs: list[NamedTensor]) -> list[NamedTensor]:
        return [NamedTensor("q", np.zeros((1, 2), ml_dtypes.float8_e4m3fn))]

    (q,) = run_preprocess("m", BundleHooks(preprocess=as_f8), [], specs)
    assert q.dtype is DType.F8_E4M3


def test_invalid_argument_passes_through() -> None:
    raised = InvalidArgumentError("image must be square")

    def reject(inputs: list[NamedTensor]) -> list[NamedTensor]:
        raise raised

    for runner, hooks in [
        (run_preprocess, BundleHooks(preprocess=reject)),
        (run_postprocess, BundleHooks(postprocess=reject)),
    ]:
        with pytest.raises(InvalidArgumentError) as caught:
            runner("m", hooks, good(), SPECS)
        assert caught.value is raised
        assert not isinstance(caught.value, HookError)
        assert caught.value.status is grpc.StatusCode.INVALID_ARGUMENT


def test_output_in_spec_order_and_input_list_copied() -> None:
    received: list[list[NamedTensor]] = []

    def reverse(inputs: list[NamedTensor]) -> list[NamedTensor]:
        received.append(inputs)
        result = list(reversed(inputs))
        inputs.clear()  # a hook that mutates its list does not touch the caller's
        return result

    tensors = good()
    out = run_preprocess("m", BundleHooks(preprocess=reverse), tensors, SPECS)
    assert [t.name for t in out] == ["x", "y"]
    assert [t.name for t in tensors] == ["x", "y"]
    assert received[0] is not tensors

    # A tuple is a fine sequence; no declared tensors means an empty result.
    tensors = good()
    assert check_hook_output("m", "run", tuple(reversed(tensors)), SPECS) == tensors
    assert check_hook_output("m", "run", [], []) == []
    with pytest.raises(HookError, match=r"unexpected tensor 'x' \(expected: none\)"):
        check_hook_output("m", "run", good()[:1], [])


def test_variable_axes_accept_any_extent() -> None:
    specs = [spec("v", DType.F32, Fixed(2), Variable())]
    for width in (1, 7):
        tensor = NamedTensor("v", np.zeros((2, width), np.float32))
        assert check_hook_output("m", "postprocess", [tensor], specs) == [tensor]


# --------------------------------------------------------------------------------------------
# The hook pool


def test_hook_pool_size() -> None:
    usable = len(os.sched_getaffinity(0))
    assert hook_pool_size() == max(1, min(usable, 16))
    assert hook_pool_size(WorkerConfig(hook_threads=5)) == 5
    config = worker_config_from_mapping({}, {"REACTANTSERVER_WORKER_THREADS": "3"})
    assert hook_pool_size(config) == 3


def test_hook_pool_threads() -> None:
    with hook_pool(2) as pool:
        assert pool._max_workers == 2
        name = pool.submit(lambda: threading.current_thread().name).result()
    assert name.startswith(f"{THREAD_NAME_PREFIX}_")
    with hook_pool() as pool:
        assert pool._max_workers == hook_pool_size()
    with pytest.raises(ValueError, match="must be >= 1"):
        hook_pool(0)


REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="")


def test_run_in_pool_runs_off_the_loop() -> None:
    def where(scale: int, tensors: list[NamedTensor]) -> tuple[str, str, int]:
        return threading.current_thread().name, REQUEST_ID.get(), scale * len(tensors)

    def fail() -> None:
        raise RuntimeError("in the pool")

    async def main() -> tuple[str, tuple[str, str, int]]:
        REQUEST_ID.set("req-7")
        with hook_pool(1) as pool:
            result = await run_in_pool(pool, where, 3, good())
            with pytest.raises(RuntimeError, match="in the pool"):
                await run_in_pool(pool, fail)
        return threading.current_thread().name, result

    loop_thread, (thread, request_id, value) = asyncio.run(main())
    assert thread != loop_thread
    assert thread.startswith(f"{THREAD_NAME_PREFIX}_")
    assert request_id == "req-7"
    assert value == 6


def test_run_in_pool_runs_hooks() -> None:
    def double(inputs: list[NamedTensor]) -> list[NamedTensor]:
        (x, y) = inputs
        return [NamedTensor("x", x.data * 2), y]

    hooks = BundleHooks(preprocess=double)
    tensors = [
        NamedTensor("x", np.ones((2, 3), np.float32)),
        NamedTensor("y", np.zeros(2, np.int32)),
    ]

    async def main() -> list[NamedTensor]:
        with hook_pool(1) as pool:
            return await run_in_pool(pool, run_preprocess, "m", hooks, tensors, SPECS)

    x, _ = asyncio.run(main())
    np.testing.assert_array_equal(x.data, np.full((2, 3), 2.0, np.float32))
