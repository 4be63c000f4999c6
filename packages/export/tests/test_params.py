"""``--params`` sources and the parameter tree <-> weight-name mapping."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from reactantserver.export import ExportError, load_params
from reactantserver.export._params import call_with_seed, flatten_params, unflatten


def test_flatten_names_and_order() -> None:
    params = {"b": [np.zeros(2), np.ones(3)], "a": {"w": np.zeros((2, 2)), "s": 1.5}}
    flat = flatten_params(params)
    assert flat.names == ("a/s", "a/w", "b/0", "b/1")
    assert flat.arrays[0].shape == ()
    assert flat.arrays[0].dtype == np.float32  # a Python float takes jax's default width
    rebuilt = flat.rebuild(list(flat.arrays))
    assert rebuilt["b"][1].shape == (3,)


def test_unflatten_rebuilds_dicts_and_lists() -> None:
    tree = unflatten({"layers/0/w": 1, "layers/1/w": 2, "head": 3})
    assert tree == {"layers": [{"w": 1}, {"w": 2}], "head": 3}
    assert unflatten({"0": "a", "1": "b"}) == ["a", "b"]
    with pytest.raises(ExportError, match=r"both a leaf and a prefix|is also a leaf"):
        unflatten({"a": 1, "a/b": 2})


def test_load_from_files(tmp_path: Path) -> None:
    arrays = {"dense/w": np.ones((2, 3), np.float32), "dense/b": np.zeros(3, np.float32)}
    save_file(arrays, str(tmp_path / "p.safetensors"))
    np.savez(tmp_path / "p.npz", **arrays)  # type: ignore[arg-type]
    for name in ("p.safetensors", "p.npz"):
        params = load_params(str(tmp_path / name))
        assert sorted(params["dense"]) == ["b", "w"]
        np.testing.assert_array_equal(params["dense"]["w"], arrays["dense/w"])
    with pytest.raises(ExportError, match="no such file"):
        load_params(str(tmp_path / "missing.npz"))
    with pytest.raises(
        ExportError, match=r"expected a \.safetensors or \.npz file, or MODULE:ATTR"
    ):
        load_params("weights.bin")


def test_load_from_module_attributes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "params_mod_a.py").write_text(
        "import numpy as np\n"
        "TREE = {'w': np.ones(2)}\n"
        "def init(seed=0):\n    return {'seed': np.array(seed)}\n"
        "def fixed():\n    return {'w': np.zeros(1)}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_params("params_mod_a:TREE")["w"].shape == (2,)
    assert int(load_params("params_mod_a:init", seed=7)["seed"]) == 7
    assert load_params("params_mod_a:fixed", seed=7)["w"].shape == (1,)
    with pytest.raises(ExportError, match="has no attribute 'nope'"):
        load_params("params_mod_a:nope")
    with pytest.raises(ExportError, match="cannot import module 'no_such_module_x'"):
        load_params("no_such_module_x:f")


def test_call_with_seed_handles_kwargs() -> None:
    def with_kwargs(**kwargs: Any) -> Any:
        return kwargs

    assert call_with_seed(with_kwargs, 3) == {"seed": 3}
