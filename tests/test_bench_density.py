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
from bench._density_measure import cache_row
from bench._density_workers import COUNTERS
from bench._traces import Arrival
from bench.density import paced
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
    assert report["exit_status"] == {"uncapped": 0, "capped": 0, "resident": 0}
    catalog, arenas = report["catalog"], report["arenas"]
    assert catalog["budget_bytes"] < catalog["total_bytes"]
    assert arenas["resident"]["budget_bytes"] == catalog["total_bytes"]
    assert arenas["capped"]["bandwidth_bytes_per_s"] == 25e9
    assert arenas["uncapped"]["bandwidth_bytes_per_s"] == 0
    assert [v["variant"] for v in report["variants"]] == ["uncapped", "capped"]
    for variant in report["variants"]:
        assert variant["slots"] == catalog["slots"]
        assert variant["batch1_execution_ms"] > 0
        assert variant["load_to_execution"] > 0
        assert [t["trace"] for t in variant["traces"]] == ["zipf", "bursty"]
        for trace in variant["traces"]:
            low, full = trace["modes"]
            assert (low["mode"], full["mode"]) == ("constrained", "resident")
            for row in (low, full):
                assert row["requests"] > 0
                assert row["errors"] == 0, row["first_error"]
                assert 0 < row["p50_ms"] <= row["p99_ms"]
            # Loads happen on the constrained worker only, and Belady's yardstick is there.
            assert low["weight_loads"] > 0
            assert low["belady_loads_per_1000"] > 0
            assert low["loads_vs_belady"] > 0
            assert full["weight_evicts"] == 0
            assert full["belady_loads_per_1000"] is None
    (zipf, bursty) = report["variants"][0]["traces"]
    assert len(zipf["rounds"]) == report["args"]["rounds"]
    assert bursty["modes"][0]["requests_sent"] == report["bursty_requests"]

    figures = {f["name"]: f for f in report["figures"]}
    assert figures["density_zipf_uncapped_throughput_ratio"]["target"] == ">= 0.70"
    assert figures["density_zipf_capped_p99_ratio"]["target"] == "<= 3"
    assert figures["density_bursty_uncapped_loads_vs_belady"]["target"] == "<= 1.5"
    assert figures["density_capped_load_to_execution"]["target"] == "0.5 to 2"
    assert all(f["value"] is not None for f in figures.values())
    assert "| zipf | constrained |" in run.markdown
    assert "| bursty | resident |" in run.markdown


def test_cache_row_sets_loads_next_to_beladys_optimum() -> None:
    moved = dict.fromkeys(COUNTERS, 0.0)
    moved.update(
        reactantserver_worker_weight_loads_total=3.0,
        reactantserver_worker_weight_load_seconds_total=0.3,
    )
    row = cache_row(moved, list("abcab"), slots=2)
    # Belady with two slots: a, b, c (evicts a: b is used first), a again -> 4 loads.
    assert row["belady_loads_per_1000"] == 1000 * 4 / 5
    assert row["loads_vs_belady"] == 3 / 4
    assert row["ms_per_load"] == pytest.approx(100.0)
    assert cache_row(moved, list("ab"), slots=None)["belady_loads_per_1000"] is None


def test_ballast_grows_every_copy(tmp_path: Path) -> None:
    catalog = build_catalog(tmp_path / "models", 2, seed=1, ballast_bytes=4096)
    assert catalog.model_bytes == 5672 + 4096
    with safe_open(str(catalog.root / "cnn_001" / "weights.safetensors"), "np") as f:
        assert f.get_tensor("ballast/w").shape == (1024,)


def test_paced_trace_keeps_the_requests_and_changes_the_rate() -> None:
    trace = [Arrival(0.0, "a"), Arrival(1.0, "b"), Arrival(2.0, "a")]
    fast = paced(trace, 200.0)  # from the nominal 100 req/s to 200: half the gaps
    assert [a.model for a in fast] == ["a", "b", "a"]
    assert [a.at_s for a in fast] == [0.0, 0.5, 1.0]
