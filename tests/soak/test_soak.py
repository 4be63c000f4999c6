"""The soak: N mixed requests at concurrency 32, nothing lost or leaked.

One worker under an on-demand weight budget that keeps evicting serves 32 stock
``tritonclient.grpc`` clients (plain, ``async_infer`` and system shared memory in and out,
with regions registered and unregistered as they go). Every answer must match the answer its
request gets alone, and after the run the worker must hold no more than after the warm-up
(the first :data:`WARMUP_FRACTION` of the requests): RSS within :data:`RSS_BOUND_MIB`, the same
threads and descriptors, and no ``/dev/shm`` mapping.

``REACTANT_SOAK_REQUESTS`` sets N (5,000 here; ``nox -s soak`` runs 100,000); the report is
written as ``soak-report.json`` and ``soak-report.txt`` under the test's tmp dir and printed.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as grpcclient

from tests.worker_e2e._harness import WorkerProcess, sum_samples, wait_for

from ._soak import (
    SHM_DIR,
    ShmLane,
    Snapshot,
    Traffic,
    build_cases,
    compare,
    reference_answers,
    snapshot,
)

pytestmark = pytest.mark.slow

REQUESTS = int(os.environ.get("REACTANT_SOAK_REQUESTS", "5000"))
RSS_BOUND_MIB = float(os.environ.get("REACTANT_SOAK_RSS_BOUND_MIB", "48"))
"""Bound on the worker's RSS growth from the end of the warm-up to the end of the soak."""
WARMUP_FRACTION = 0.1
SETTLE_S = 30.0
"""How long released threads, sockets and mappings get to go away (not a timing assertion)."""
MIB = 1024 * 1024
COUNTERS = (
    "reactantserver_worker_weight_evicts_total",
    "reactantserver_worker_weight_loads_total",
    "reactantserver_worker_requests_shed_total",
    "reactantserver_worker_requests_cancelled_total",
)


def _metrics(worker: WorkerProcess) -> dict[str, float]:
    status, _, text = worker.http_get("/metrics")
    assert status == 200
    figures = {name: sum_samples(text, name) for name in COUNTERS}
    figures["requests_ok"] = sum_samples(text, "reactantserver_worker_requests_total", status="OK")
    figures["requests_all"] = sum_samples(text, "reactantserver_worker_requests_total")
    return figures


def _delta(after: dict[str, float], before: dict[str, float]) -> dict[str, int]:
    return {name: int(after[name] - before[name]) for name in after}


def _settled(pid: int, baseline: Snapshot, warm: Snapshot) -> Snapshot:
    """The worker's snapshot once its threads, descriptors and mappings are back (or not)."""

    def back() -> bool:
        now = snapshot(pid)
        return (
            now.threads <= warm.threads
            and now.fds <= warm.fds
            and now.shm_maps <= baseline.shm_maps
            and now.shm_fds <= baseline.shm_fds
        )

    # A timeout here is reported by the assertions of the test, with the figures.
    with contextlib.suppress(AssertionError):
        wait_for(back, "the worker to release threads, descriptors and mappings", SETTLE_S)
    return snapshot(pid)


def _report(
    traffic: Traffic,
    snaps: dict[str, Snapshot],
    seconds: dict[str, float],
    counts: dict[str, int],
    metrics: dict[str, dict[str, int]],
) -> dict[str, Any]:
    warm, end, baseline = snaps["warm"], snaps["end"], snaps["baseline"]
    growth = (end.rss - warm.rss) / MIB
    measured = counts["main"]
    mine = f"rs_soak_{os.getpid()}_"
    return {
        "requests": counts["warm"] + counts["main"],
        "warmup_requests": counts["warm"],
        "concurrency": 32,
        "cases": len(traffic.cases),
        "errors": len(traffic.errors),
        "first_errors": traffic.errors[:5],
        "wall_s": round(seconds["warm"] + seconds["main"], 1),
        "requests_per_s": round(measured / seconds["main"], 1),
        "rss_warm_mib": round(warm.rss / MIB, 1),
        "rss_end_mib": round(end.rss / MIB, 1),
        "rss_growth_mib": round(growth, 2),
        "rss_growth_mib_per_1000": round(growth / measured * 1000, 4),
        "rss_bound_mib": RSS_BOUND_MIB,
        "threads": {"warm": warm.threads, "end": end.threads},
        "fds": {"warm": warm.fds, "end": end.fds},
        "shm_maps": {"before": sorted(baseline.shm_maps), "end": sorted(end.shm_maps)},
        "shm_fds": {"before": sorted(baseline.shm_fds), "end": sorted(end.shm_fds)},
        "client_shm_left": sorted(n for n in end.dev_shm if n.startswith(mine)),
        "new_dev_shm_entries": len(end.dev_shm - baseline.dev_shm),
        "shm_region_cycles": traffic.shm_cycles,
        "worker_metrics_warm": metrics["warm"],
        "worker_metrics_main": metrics["main"],
        "sent_by_model_and_mode": dict(sorted(traffic.sent.items())),
    }


def _write(report: dict[str, Any], directory: Path) -> str:
    (directory / "soak-report.json").write_text(json.dumps(report, indent=2) + "\n")
    text = "\n".join(
        [
            f"soak: {report['requests']} requests at concurrency {report['concurrency']} "
            f"in {report['wall_s']} s ({report['requests_per_s']} req/s after the warm-up), "
            f"{report['errors']} errors",
            f"worker RSS {report['rss_warm_mib']} -> {report['rss_end_mib']} MiB after the "
            f"warm-up: growth {report['rss_growth_mib']} MiB "
            f"({report['rss_growth_mib_per_1000']} MiB per 1000 requests; "
            f"bound {report['rss_bound_mib']} MiB)",
            f"threads {report['threads']}, fds {report['fds']}, "
            f"shm maps at the end {report['shm_maps']['end']}, "
            f"client regions left {report['client_shm_left']}, "
            f"shm region cycles {report['shm_region_cycles']}",
            f"worker (after the warm-up): {report['worker_metrics_main']}",
            f"report: {directory / 'soak-report.json'}",
        ]
    )
    (directory / "soak-report.txt").write_text(text + "\n")
    return text


def _unmapped(pid: int, regions: set[str]) -> bool:
    return not regions & snapshot(pid).shm_maps


def test_unregistered_regions_are_unmapped_while_idle(soak_worker: WorkerProcess) -> None:
    """Regression: an idle worker kept its last requests' inputs, and so their regions mapped.

    Three holders, each fixed: the dispatch loop's last batch, the deadline heap of a model
    whose queue ran empty, and jaxlib's deferred release of a zero-copy transfer's host array
    (a lone request that fills its compiled batch size, ``mlp`` with one row here).
    """
    assert soak_worker.proc is not None
    pid = soak_worker.proc.pid
    cases = [case for case in build_cases() if case.model == "mlp"][:2]  # 1 row, then 3 rows
    expected = reference_answers(soak_worker.url, cases)
    with grpcclient.InferenceServerClient(soak_worker.url) as client:
        lane = ShmLane(client, f"rs_soak_{os.getpid()}_idle")
        for case, want in zip(cases, expected, strict=True):
            assert compare(case, lane.infer(case, want), want) is None
            regions = {f"{SHM_DIR}/{lane.tag}_{lane.cycles}_{side}" for side in ("in", "out")}
            assert regions <= snapshot(pid).shm_maps
            lane.close()
            wait_for(functools.partial(_unmapped, pid, regions), "the regions to be unmapped")


def test_soak(soak_worker: WorkerProcess, tmp_path: Path) -> None:
    assert soak_worker.proc is not None
    pid = soak_worker.proc.pid
    cases = build_cases()
    traffic = Traffic(soak_worker.url, cases, reference_answers(soak_worker.url, cases))
    counts = {"warm": max(len(cases), int(REQUESTS * WARMUP_FRACTION))}
    counts["main"] = REQUESTS - counts["warm"]
    assert counts["main"] > 0, f"REACTANT_SOAK_REQUESTS={REQUESTS} is too small"

    snaps = {"baseline": snapshot(pid)}
    marks = {"baseline": _metrics(soak_worker)}
    seconds = {"warm": traffic.run(counts["warm"], "warm")}
    snaps["warm"] = _settled(pid, snaps["baseline"], snapshot(pid))
    marks["warm"] = _metrics(soak_worker)
    seconds["main"] = traffic.run(counts["main"], "main")
    snaps["end"] = _settled(pid, snaps["baseline"], snaps["warm"])
    marks["end"] = _metrics(soak_worker)

    metrics = {
        "warm": _delta(marks["warm"], marks["baseline"]),
        "main": _delta(marks["end"], marks["warm"]),
    }
    report = _report(traffic, snaps, seconds, counts, metrics)
    print("\n" + _write(report, tmp_path))

    assert traffic.errors == [], traffic.errors
    assert sum(traffic.sent.values()) == REQUESTS
    assert metrics["main"]["requests_ok"] == metrics["main"]["requests_all"] == counts["main"]
    assert metrics["main"]["reactantserver_worker_requests_shed_total"] == 0
    assert metrics["main"]["reactantserver_worker_weight_evicts_total"] > 0, (
        "the budget never evicted"
    )
    assert report["rss_growth_mib"] <= RSS_BOUND_MIB, report
    warm, end = snaps["warm"], snaps["end"]
    assert end.threads <= warm.threads, report["threads"]
    assert end.fds <= warm.fds, report["fds"]
    assert end.shm_maps <= snaps["baseline"].shm_maps, report["shm_maps"]
    assert end.shm_fds <= snaps["baseline"].shm_fds, report["shm_fds"]
    assert report["client_shm_left"] == [], f"client regions left in {SHM_DIR}"
