"""``python -m bench.scaling --quick`` runs end to end: a worker per front-thread count, client
processes, a report. Only the report's shape is checked, never its numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.scaling import split_cpus
from tests._bench_support import run_bench


def test_clients_and_server_get_cpus_of_their_own_where_there_are_two() -> None:
    clients, servers = split_cpus(0.5)
    assert clients
    assert servers
    if len(clients) + len(servers) > 1 and clients != servers:
        assert not set(clients) & set(servers)


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
    assert report["errors"] == []
    assert report["note"]
