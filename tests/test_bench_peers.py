"""``bench.peers``: the shared MLPs, the raw cap, the counters, the venv checks, the report
built from fake windows, our worker serving the exported tiny MLP, and a ``--quick`` run
without prepared peers (reported unavailable, ours still measured).

No peer is installed here: the peers' venvs take GBs and a network. Benchmark figures are
never asserted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench._peers import cells
from bench._peers.counters import Counter, counter_path
from bench._peers.markdown import markdown
from bench._peers.models import MODELS, OUR_BATCH_SIZES, compiled, params, sample
from bench._peers.raw import measure, rows_per_s
from bench._peers.spec import PeerSpec
from bench._peers.venvs import PEERS, check, fingerprint
from bench._suite_plots import plot_peers
from tests._bench_support import run_bench

TINY = MODELS["tiny_mlp"]


def _reference(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The tiny MLP in plain numpy."""
    weights = params(TINY)
    h = np.maximum(x @ weights["dense0"]["w"] + weights["dense0"]["b"], 0.0)
    out: np.ndarray[Any, Any] = h @ weights["dense1"]["w"] + weights["dense1"]["b"]
    return out


def test_weights_come_from_the_seed() -> None:
    first, second = params(TINY), params(TINY)
    assert list(first) == ["dense0", "dense1"]
    assert first["dense0"]["w"].shape == (64, 64)
    assert first["dense1"]["w"].shape == (64, 16)
    assert first["dense1"]["b"].dtype == np.float32
    np.testing.assert_array_equal(first["dense1"]["w"], second["dense1"]["w"])
    heavy = MODELS["heavy_mlp"]
    assert (heavy.in_features, heavy.out_features) == (1024, 1000)


def test_compiled_forward_matches_numpy() -> None:
    run = compiled(TINY, warm=(1, 3))
    x = sample(TINY, 3, seed=5)
    y = run(x)
    assert y.shape == (3, 16)
    np.testing.assert_allclose(y, _reference(x), rtol=1e-4, atol=1e-4)


def test_raw_rows_per_s_counts_rows_of_every_call() -> None:
    point = rows_per_s(lambda x: x, np.zeros((8, 4), np.float32), 0.01)
    assert point["batch"] == 8
    assert point["calls"] >= 3
    assert point["rows_per_s"] == pytest.approx(8 / (point["ms_per_call"] / 1e3))
    assert [p["batch"] for p in measure(TINY, [1, 4], 0.01)] == [1, 4]


def test_counter_is_shared_through_its_file(tmp_path: Path) -> None:
    path = counter_path(tmp_path, "kserve", "tiny_mlp")
    Counter.create(path)
    writer = Counter.open(path)
    writer.add(3)
    writer.add(5)
    assert Counter.open(path).read() == (2, 8)
    assert Counter.create(path).read() == (0, 0)


def test_spec_round_trips(tmp_path: Path) -> None:
    spec = PeerSpec("mlserver", 1, 2, 3, ("tiny_mlp", "heavy_mlp"), str(tmp_path), 32)
    assert PeerSpec.read(spec.write(tmp_path / "spec.json")) == spec
    assert spec.batch_delay_us == 1000


def test_unprepared_venvs_are_reported_with_how_to_prepare(tmp_path: Path) -> None:
    peer = PEERS["kserve"]
    state = check(peer, tmp_path)
    assert state.python is None
    assert "--prepare --peers kserve" in (state.reason or "")
    venv = tmp_path / "kserve"
    venv.mkdir()
    (venv / "bench-peers-failed.json").write_text(json.dumps({"error": "pip exited 1"}))
    assert "failed to prepare: pip exited 1" in (check(peer, tmp_path).reason or "")
    (venv / "bench-peers.json").write_text(json.dumps({"fingerprint": "stale"}))
    assert "other pins" in (check(peer, tmp_path).reason or "")
    (venv / "bench-peers.json").write_text(json.dumps({"fingerprint": fingerprint(peer)}))
    assert check(peer, tmp_path).python == venv / "bin" / "python"


def test_the_fingerprint_follows_requirements_not_comments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bench._peers import venvs

    monkeypatch.setattr(venvs, "REQUIREMENTS", tmp_path)
    peer = PEERS["kserve"]
    (tmp_path / "kserve.txt").write_text("# why\nkserve==1.0\n")
    before = fingerprint(peer)
    (tmp_path / "kserve.txt").write_text("# why, said better\n\nkserve==1.0  # the peer\n")
    assert fingerprint(peer) == before
    (tmp_path / "kserve.txt").write_text("kserve==1.1\n")
    assert fingerprint(peer) != before


def _window(
    server: str, model: str, c: int, rps: float, p99: float, **extra: Any
) -> dict[str, Any]:
    return {
        "server": server,
        "model": model,
        "concurrency": c,
        "requests": int(rps * 2),
        "errors": 0,
        "requests_per_s": rps,
        "p50_ms": p99 / 2,
        "p99_ms": p99,
        "server_cpu_us_per_request": 500.0,
        "executions": extra.get("executions", 10),
        "rows": extra.get("rows", 10),
        "first_error": None,
    }


def _fake_report() -> dict[str, Any]:
    windows = [
        # tiny c=8: the cap is far; kserve is the best peer.
        _window("pytriton", "tiny_mlp", 8, 1000, 5.0, executions=100, rows=400),
        _window("kserve", "tiny_mlp", 8, 1600, 6.0),
        _window("kserve", "tiny_mlp", 8, 1400, 6.4),
        _window("reactantserver", "tiny_mlp", 8, 2500, 6.0),
        # heavy c=1: 1.5x the best peer (200) exceeds the cap (262): the cap binds.
        _window("kserve", "heavy_mlp", 1, 200, 6.0),
        _window("reactantserver", "heavy_mlp", 1, 240, 5.0, executions=0, rows=0),
    ]
    raw: list[dict[str, list[dict[str, Any]]]] = [
        {
            "tiny_mlp": [{"batch": 8, "rows_per_s": 2e5}],
            "heavy_mlp": [{"batch": 1, "rows_per_s": 262}],
        }
    ]
    table = cells.servers_table(windows)
    caps = cells.raw_caps(raw)
    rows = cells.cells(table, caps, ours="reactantserver")
    available = [
        {"server": s, "version": "1", "batching": "-", "available": True, "reason": None}
        for s in ("pytriton", "kserve")
    ]
    return {
        "machine": {
            "cpu_model": "cpu",
            "cpus": 2,
            "gpus": [],
            "platform": "linux",
            "python": "3.11",
            "loadavg_1m": 1.0,
        },
        "command": "python -m bench.peers",
        "args": {
            "models": ["tiny_mlp", "heavy_mlp"],
            "client": "asyncio",
            "rounds": 2,
            "duration": 2.0,
            "warmup": 0.5,
        },
        "pinned": None,
        "order": ["pytriton", "kserve", "mlserver", "reactantserver"],
        "servers": [
            *available,
            {
                "server": "mlserver",
                "version": "-",
                "batching": "-",
                "available": False,
                "reason": "no prepared venv",
            },
            {
                "server": "reactantserver",
                "version": "0.1.0",
                "batching": "-",
                "available": True,
                "reason": None,
            },
        ],
        "raw_caps": {m: {str(b): v for b, v in p.items()} for m, p in caps.items()},
        "table": table,
        "cells": rows,
        "figures": cells.figures(rows),
        "errors": [],
    }


def test_table_takes_medians_and_counts_rows_per_execution() -> None:
    table = {(r["server"], r["model"]): r for r in _fake_report()["table"]}
    kserve = table["kserve", "tiny_mlp"]
    assert kserve["rounds"] == 2
    assert kserve["requests_per_s"] == {"median": 1500, "min": 1400, "max": 1600}
    assert kserve["p99_ms"] == pytest.approx(6.2)
    assert table["pytriton", "tiny_mlp"]["rows_per_execution"] == 4.0
    assert table["reactantserver", "heavy_mlp"]["rows_per_execution"] is None


def test_a_window_without_answers_counts_for_throughput_not_latency() -> None:
    stalled = {**_window("kserve", "tiny_mlp", 1, 0, 0.0), "p50_ms": 0.0}
    [row] = cells.servers_table([_window("kserve", "tiny_mlp", 1, 100, 4.0), stalled])
    assert row["requests_per_s"] == {"median": 50, "min": 0, "max": 100}
    assert row["p99_ms"] == 4.0
    [only] = cells.servers_table([stalled])
    assert only["p99_ms"] is None


def test_cells_pick_the_best_peer_and_say_where_the_cap_binds() -> None:
    by_cell = {(c["model"], c["concurrency"]): c for c in _fake_report()["cells"]}
    tiny = by_cell["tiny_mlp", 8]
    assert tiny["best_peer"] == "kserve"
    assert tiny["ours_over_best_peer"] == pytest.approx(2500 / 1500)
    assert tiny["ours_p99_over_peer_p99"] == pytest.approx(6.0 / 6.2)
    assert not tiny["cap_binds"]
    heavy = by_cell["heavy_mlp", 1]
    assert heavy["cap_binds"]
    assert heavy["ours_over_cap"] == pytest.approx(240 / 262)


def test_figures_carry_the_issue_targets() -> None:
    figures = {f["name"]: f for f in _fake_report()["figures"]}
    peer = figures["ours / best peer (kserve) req/s (tiny, c=8)"]
    assert (peer["target"], peer["met"]) == (">= 1.5", True)
    assert figures["ours p99 / kserve p99 (tiny, c=8)"]["met"] is True
    assert figures["ours / raw cap at batch 8 (tiny, c=8)"]["target"] is None
    # Where the cap binds, the target moves from the best peer to the cap.
    assert figures["ours / best peer (kserve) req/s (heavy, c=1)"]["target"] is None
    cap = figures["ours / raw cap at batch 1 (heavy, c=1)"]
    assert (cap["target"], cap["met"]) == (">= 0.90", True)
    for f in figures.values():
        assert set(f) == {"name", "value", "unit", "target", "met"}


def test_the_floor_is_never_the_best_peer_and_bounds_what_the_front_allows() -> None:
    windows = [
        _window("floor", "tiny_mlp", 1, 2400, 0.5, executions=0, rows=0),
        _window("kserve", "tiny_mlp", 1, 1400, 0.9),
        _window("reactantserver", "tiny_mlp", 1, 1450, 0.9),
    ]
    table = cells.servers_table(windows)
    [row] = cells.cells(table, {"tiny_mlp": {1: 4e4}}, ours="reactantserver", floor="floor")
    assert row["best_peer"] == "kserve"  # faster than every peer, yet not one
    assert row["floor_over_best_peer"] == pytest.approx(2400 / 1400)
    assert row["ours_over_floor"] == pytest.approx(1450 / 2400)
    named = {f["name"]: f for f in cells.figures([row])}
    headroom = named["floor / best peer (kserve) req/s (tiny, c=1)"]
    assert (headroom["value"], headroom["target"], headroom["met"]) == (
        pytest.approx(2400 / 1400),
        None,
        None,
    )
    assert named["ours / floor req/s (tiny, c=1)"]["value"] == pytest.approx(1450 / 2400)
    # Without a floor in the run: the three figures per cell of before.
    [plain] = cells.cells(table, {"tiny_mlp": {1: 4e4}}, ours="reactantserver")
    assert plain["floor_requests_per_s"] is None
    assert len(cells.figures([plain])) == 3


def test_figures_without_peers_have_no_verdict() -> None:
    table = cells.servers_table([_window("reactantserver", "tiny_mlp", 1, 900, 2.0)])
    rows = cells.cells(table, {"tiny_mlp": {1: 2e4}}, ours="reactantserver")
    figures = cells.figures(rows)
    assert figures[0]["name"] == "ours / best peer (no peer ran) req/s (tiny, c=1)"
    assert [f["met"] for f in figures[:2]] == [None, None]
    assert figures[2]["value"] == pytest.approx(900 / 2e4)


def test_markdown_and_plot_render_the_fake_report(tmp_path: Path) -> None:
    report = _fake_report()
    text = "\n".join(markdown(report))
    assert text.startswith("# Peers benchmark")
    assert "| mlserver | - | - | unavailable: no prepared venv | -% | - |" in text
    assert "| kserve | 1,500 (1,400-1,600) | 200 |" in text
    assert "| raw cap (rows/s at batch min(c, 32)) | 200,000 | 262 |" in text
    assert plot_peers({"peers": report}, tmp_path / "peers.png")
    assert (tmp_path / "peers.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_worker_serves_the_exported_tiny_mlp(tmp_path: Path) -> None:
    import tritonclient.grpc as grpcclient

    from bench._grpc_servers import start_worker
    from bench._peers.export import export

    [bundle] = export(tmp_path / "models", ["tiny_mlp"])
    sizes = sorted(int(p.name.split(".")[1][1:]) for p in bundle.glob("model.b*.mlir"))
    assert tuple(sizes) == OUR_BATCH_SIZES
    worker = start_worker(tmp_path, tmp_path / "models", {}, None)
    try:
        worker.wait_ready(["tiny_mlp"], 120)
        client = grpcclient.InferenceServerClient(worker.url)
        x = sample(TINY, 3, seed=9)
        tensor = grpcclient.InferInput("x", [3, 64], "FP32")
        tensor.set_data_from_numpy(x)
        y = client.infer("tiny_mlp", [tensor]).as_numpy("y")
        client.close()
    finally:
        assert worker.stop() == 0
    np.testing.assert_allclose(y, _reference(x), rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_quick_run_without_prepared_peers_measures_ours(tmp_path: Path) -> None:
    argv = ["--quick", "--venvs", str(tmp_path / "none"), "--peers", "kserve"]
    argv += ["--models", "tiny_mlp", "--concurrency", "1", "8"]
    bench = run_bench("bench.peers", argv, tmp_path / "out", "peers-cpu")
    report = bench.report
    servers = {s["server"]: s for s in report["servers"]}
    assert not servers["kserve"]["available"]
    assert "--prepare" in servers["kserve"]["reason"]
    assert report["order"] == ["floor", "reactantserver"]
    assert {(w["server"], w["concurrency"]) for w in report["windows"]} == {
        (server, c) for server in ("floor", "reactantserver") for c in (1, 8)
    }
    for w in report["windows"]:
        assert w["requests"] > 0
        assert w["errors"] == 0, w["first_error"]
        if w["server"] == "floor":
            assert w["executions"] is None  # it runs no model
            continue
        assert w["executions"] > 0
        assert w["rows"] >= w["executions"]
    assert set(report["raw_caps"]["tiny_mlp"]) == {"1", "8"}
    # Per cell: ours / best peer, p99, cap; ours / floor (no peer ran: no floor / best peer).
    assert len(report["figures"]) == 8
    assert all(f["met"] is None for f in report["figures"][:2])
    assert [c["best_peer"] for c in report["cells"]] == [None, None]
    assert all(c["floor_requests_per_s"] > 0 for c in report["cells"])
    assert "unavailable: no prepared venv" in bench.markdown
    assert (tmp_path / "out" / "plots" / "peers-cpu.png").exists()
