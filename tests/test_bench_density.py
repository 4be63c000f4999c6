"""``python -m bench.density --quick`` runs end to end; the catalog and traffic helpers.

Only the shape of the report is checked: benchmark figures are never asserted in tests.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import yaml
from safetensors import safe_open

from bench._density_catalog import Cursor, build_catalog, top_share, zipf_sequence
from tests._bench_support import run_bench


def test_catalog_copies_have_their_own_weights(tmp_path: Path) -> None:
    catalog = build_catalog(tmp_path / "models", 3, seed=1)
    assert catalog.names == ("cnn_000", "cnn_001", "cnn_002")
    assert catalog.total_bytes == 3 * catalog.model_bytes == 3 * 5672
    assert not (tmp_path / "models-base").exists()
    weights = []
    for name in catalog.names:
        bundle = catalog.root / name
        assert yaml.safe_load((bundle / "manifest.yaml").read_text())["name"] == name
        with safe_open(str(bundle / "weights.safetensors"), "np") as f:
            assert "argument_order" in (f.metadata() or {})
            weights.append({k: f.get_tensor(k) for k in f.keys()})  # noqa: SIM118
    assert weights[0].keys() == weights[1].keys()
    for key in weights[0]:
        assert weights[0][key].shape == weights[1][key].shape
        assert weights[0][key].dtype == weights[1][key].dtype == np.float32
        assert not np.array_equal(weights[0][key], weights[1][key])


def test_zipf_sequence_is_fixed_and_skewed() -> None:
    names = [f"m{i}" for i in range(20)]
    seq, by_rank = zipf_sequence(names, 5000, seed=3)
    assert (seq, by_rank) == zipf_sequence(names, 5000, seed=3)
    assert sorted(by_rank) == sorted(names)
    counts = Counter(seq)
    assert counts.most_common(1)[0][0] == by_rank[0]
    assert top_share(20, 20) == pytest.approx(1.0)
    assert 0 < top_share(20, 4) < 1


def test_cursor_hands_out_the_sequence_in_order() -> None:
    cursor = Cursor(["a", "b", "c"])
    assert [cursor() for _ in range(5)] == ["a", "b", "c", "a", "b"]
    assert cursor.issued == 5


@pytest.mark.slow
def test_quick_run_writes_a_report(tmp_path: Path) -> None:
    run = run_bench("bench.density", ["--quick"], tmp_path / "results", "density-cpu")
    report = run.report
    (section,) = report["sections"]
    assert section["exit_status"] == {"constrained": 0, "resident": 0}
    budgets = section["catalog"]["budget_bytes"]
    assert budgets["resident"] == section["catalog"]["total_bytes"] > budgets["constrained"]
    rows = {r["mode"]: r for r in section["modes"]}
    for mode, row in rows.items():
        assert row["requests"] > 0
        assert row["errors"] == 0, row["first_error"]
        assert 0 < row["p50_ms"] <= row["p99_ms"]
        # The budget took effect: the worker logged it and exports it.
        assert section["log"][mode]["budgets"] == [budgets[mode]]
        assert row["budget_bytes"] == budgets[mode]
    assert rows["constrained"]["weight_loads"] > 0
    assert rows["resident"]["weight_evicts"] == 0

    figures = {f["name"]: f for f in report["figures"]}
    assert figures["density_throughput_ratio"]["target"] == ">= 0.70"
    assert figures["density_p99_ratio"]["target"] == "<= 3"
    assert all(f["value"] is not None for f in figures.values())
    assert "| constrained |" in run.markdown
    assert "| resident |" in run.markdown


def test_ballast_grows_every_copy(tmp_path: Path) -> None:
    catalog = build_catalog(tmp_path / "models", 2, seed=1, ballast_bytes=4096)
    assert catalog.model_bytes == 5672 + 4096
    with safe_open(str(catalog.root / "cnn_001" / "weights.safetensors"), "np") as f:
        assert f.get_tensor("ballast/w").shape == (1024,)
