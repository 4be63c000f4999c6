"""``python -m bench.scaling --quick`` runs end to end: a worker per front-thread count, a
worker behind a front process (a gateway over its lane), client processes, a report. Only the
report's shape is checked, never its numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.scaling import WORKER_CORES, split_cpus, split_fronts
from tests._bench_support import run_bench


def test_clients_and_server_get_cpus_of_their_own_where_there_are_two() -> None:
    clients, servers = split_cpus(0.5)
    assert clients
    assert servers
    if len(clients) + len(servers) > 1 and clients != servers:
        assert not set(clients) & set(servers)


def test_fronts_get_cores_of_their_own_only_when_the_worker_keeps_enough() -> None:
    # 16 cores: clients 8, the worker its three, the fronts the other five.
    fronts, worker = split_fronts(list(range(8)), list(range(8, 16)))
    assert worker == [8, 9, 10][:WORKER_CORES]
    assert fronts == list(range(8 + WORKER_CORES, 16))
    # 2 cores: the worker keeps its one; the fronts share the clients' CPU.
    assert split_fronts([0], [1]) == ([0], [1])


@pytest.mark.slow
def test_quick_run_writes_a_report(tmp_path: Path) -> None:
    bench = run_bench(
        "bench.scaling",
        ["--quick", "--threads", "1", "2", "--clients", "8"],
        tmp_path,
        "scaling-cpu",
    )
    report = bench.report
    assert [r["threads"] for r in report["rows"]] == [1, 2]
    assert all(r["requests_per_s"] > 0 for r in report["rows"])
    [front] = report["front_rows"]
    assert front["fronts"] == 1
    assert front["requests_per_s"] > 0
    assert "Front processes" in bench.markdown
    assert report["errors"] == []
    assert report["note"]
