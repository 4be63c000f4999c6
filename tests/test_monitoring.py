"""deploy/monitoring/: the Grafana dashboard and the Prometheus scrape configuration.

The dashboard must be JSON Grafana imports (panels with ids, types, titles, grid positions and
targets; unique ids; a ``datasource`` variable), and every metric name its PromQL uses must be
one a real worker or gateway exports: the slow test starts a real worker and a real
``lpt_packing`` gateway in front of it, sends requests, and reads both ``/metrics``. That worker
runs on the CPU, so the NVML families only a CUDA worker exports (``CUDA_ONLY``) are taken from
the worker's own list; packages/worker/tests/views/test_metrics.py renders them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import yaml

from reactantserver.worker.views.metrics import GPU_FAMILIES
from tests._e2e_support import make_cache_dir, worker_env
from tests.gateway_e2e._gateway import running_gateway
from tests.worker_e2e._bundles import export_examples
from tests.worker_e2e._harness import running_worker

ROOT = Path(__file__).resolve().parent.parent
MONITORING = ROOT / "deploy" / "monitoring"
DASHBOARD = MONITORING / "grafana" / "reactantserver.json"
PROMETHEUS = MONITORING / "prometheus.yml"
JOB = "reactantserver"

#: PromQL functions and aggregation operators the dashboard may call.
FUNCTIONS = frozenset(
    {
        "abs",
        "avg",
        "avg_over_time",
        "ceil",
        "clamp_min",
        "count",
        "delta",
        "deriv",
        "floor",
        "histogram_quantile",
        "increase",
        "irate",
        "max",
        "max_over_time",
        "min",
        "min_over_time",
        "quantile",
        "rate",
        "round",
        "sum",
        "topk",
        "vector",
    }
)
#: Keywords that look like identifiers outside the clauses stripped below.
KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "group_left", "group_right"})
SUFFIXES = ("_bucket", "_sum", "_count", "_total")
#: What a CUDA worker exports beyond a CPU one: the NVML families (docs/reference/metrics.md).
CUDA_ONLY = {*GPU_FAMILIES, "reactantserver_worker_device_memory_process_used_bytes"}
LPT = {
    "scheduling": {"mode": "lpt_packing", "compaction_mode": "off"},
    "startup_wait_seconds": 60,
}


def load_dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def graph_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel but rows, nested ones (collapsed rows) included."""
    out: list[dict[str, Any]] = []
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            out.extend(panel.get("panels", []))
        else:
            out.append(panel)
    return out


def expressions(dashboard: dict[str, Any]) -> list[str]:
    """The PromQL of every panel target."""
    return [target["expr"] for panel in graph_panels(dashboard) for target in panel["targets"]]


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects.

    Strings, label matchers, range selectors, grouping clauses and dashboard variables are
    stripped; what is left is function calls (which must be known), keywords, numbers and the
    metric names.
    """
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\$\{?\w+\}?", "", text)
    text = re.sub(r"\{[^{}]*\}", "", text)
    text = re.sub(r"\[[^\[\]]*\]", "", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", "", text)
    names: set[str] = set()
    for match in re.finditer(r"(?<![\w.])([A-Za-z_:][\w:]*)(\s*\()?", text):
        name, call = match.group(1), match.group(2)
        if call:
            assert name in FUNCTIONS, f"unknown PromQL function {name!r} in {expr!r}"
        elif name not in KEYWORDS:
            names.add(name)
    return names


def template_metric_names(dashboard: dict[str, Any]) -> set[str]:
    """The metrics the ``label_values(metric{...}, label)`` variables read."""
    names: set[str] = set()
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        query = variable["query"]
        text = query["query"] if isinstance(query, dict) else query
        match = re.fullmatch(
            r"label_values\(\s*([A-Za-z_:][\w:]*)\s*(?:\{.*\})?\s*,\s*\w+\s*\)", text
        )
        assert match, f"variable {variable['name']}: unexpected query {text!r}"
        names.add(match.group(1))
    return names


def test_metric_names_of_an_expression() -> None:
    expr = (
        "histogram_quantile(0.99, sum by (model, le) "
        "(rate(reactantserver_worker_request_latency_seconds_bucket"
        '{instance=~"$instance",model=~"$model"}[$__rate_interval])))'
        " / ignoring (model) group_left sum(rate(reactantserver_worker_compute_seconds_total[5m])) "
        "* 1e3"
    )
    assert metric_names(expr) == {
        "reactantserver_worker_request_latency_seconds_bucket",
        "reactantserver_worker_compute_seconds_total",
    }
    with pytest.raises(AssertionError, match="unknown PromQL function"):
        metric_names("made_up(reactantserver_worker_queue_depth)")


def test_dashboard_is_grafana_json() -> None:
    dashboard = load_dashboard()
    assert dashboard["schemaVersion"] >= 39
    assert dashboard["uid"]
    assert dashboard["title"]
    for key in ("time", "annotations", "templating", "panels"):
        assert key in dashboard
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [panel["id"] for panel in dashboard["panels"]]
    ids += [p["id"] for panel in dashboard["panels"] for p in panel.get("panels", [])]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    assert all(isinstance(i, int) for i in ids)
    for panel in dashboard["panels"]:
        assert panel["title"]
        assert panel["type"]
        grid = panel["gridPos"]
        assert {"h", "w", "x", "y"} <= set(grid)
        assert grid["x"] >= 0
        assert grid["w"] > 0
        assert grid["x"] + grid["w"] <= 24
    panels = graph_panels(dashboard)
    assert len(panels) >= 10
    for panel in panels:
        assert panel["targets"], panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        refs = [target["refId"] for target in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["expr"].strip()
            assert target["datasource"]["uid"] == "${datasource}"
            assert metric_names(target["expr"]), target["expr"]
    # No two panels overlap on the grid.
    cells: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        mine = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not cells & mine, f"{panel['title']} overlaps another panel"
        cells |= mine


def test_dashboard_covers_the_issue() -> None:
    """The panels issue 16 asks for, by the series they read."""
    used = set().union(*(metric_names(e) for e in expressions(load_dashboard())))
    for name in (
        "reactantserver_worker_requests_total",
        "reactantserver_worker_request_latency_seconds_bucket",
        "reactantserver_worker_queue_depth",
        "reactantserver_worker_queue_wait_seconds_bucket",
        "reactantserver_worker_model_resident",
        "reactantserver_worker_resident_weight_bytes",
        "reactantserver_worker_weight_cache_max_bytes",
        "reactantserver_worker_weight_loads_total",
        "reactantserver_worker_weight_evicts_total",
        "reactantserver_worker_compute_seconds_total",
        "reactantserver_worker_batch_dispatch_total",
        "reactantserver_gateway_requests_total",
        "reactantserver_gateway_failovers_total",
        "reactantserver_gateway_requests_shed_total",
        "reactantserver_gateway_replica_routed_total",
    ):
        assert name in used, name


def test_dashboard_shows_the_gpu() -> None:
    """GPU utilization, memory and power panels, on the NVML families the worker declares."""
    used = set().union(*(metric_names(e) for e in expressions(load_dashboard())))
    gpu = {n for n in used if n.startswith("reactantserver_worker_gpu_")}
    assert gpu <= set(GPU_FAMILIES)
    for name in (
        "reactantserver_worker_gpu_utilization",
        "reactantserver_worker_gpu_memory_used_bytes",
        "reactantserver_worker_gpu_memory_total_bytes",
        "reactantserver_worker_gpu_power_usage_watts",
    ):
        assert name in gpu, name
    assert documented_families() >= CUDA_ONLY


def test_prometheus_config() -> None:
    config = yaml.safe_load(PROMETHEUS.read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert list(jobs) == [JOB]
    job = jobs[JOB]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    targets = [t for static in job["static_configs"] for t in static["targets"]]
    assert targets
    assert all(t.endswith(":8002") for t in targets)
    # The commented Kubernetes variant is valid YAML once uncommented.
    lines = PROMETHEUS.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("  # - job_name:"))
    block = []
    for line in lines[start:]:
        if not line.startswith("  #"):
            break
        block.append(line[len("  # ") :] if line.startswith("  # ") else "")
    (variant,) = yaml.safe_load("\n".join(block))
    assert variant["job_name"] == JOB
    assert variant["kubernetes_sd_configs"] == [{"role": "pod"}]
    keep = [r for r in variant["relabel_configs"] if r.get("action") == "keep"]
    sources = {s for r in keep for s in r["source_labels"]}
    assert "__meta_kubernetes_pod_annotation_prometheus_io_scrape" in sources


def exported_names(text: str) -> set[str]:
    """Family and sample names of an exposition (``# HELP``/``# TYPE`` lines included)."""
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith(("# HELP ", "# TYPE ")):
            names.add(line.split()[2])
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{\s]", line, maxsplit=1)[0])
    return names


def is_exported(name: str, exported: set[str]) -> bool:
    if name in exported:
        return True
    return any(name.endswith(s) and name.removesuffix(s) in exported for s in SUFFIXES)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[set[str]]:
    """Every name a real worker and a real ``lpt_packing`` gateway export after some traffic."""
    repo = tmp_path_factory.mktemp("models")
    export_examples(repo, ("mlp", "two_io"))
    logs = tmp_path_factory.mktemp("logs")
    env = worker_env(
        make_cache_dir(tmp_path_factory),
        SCHEDULER_DISCIPLINE="fifo",
        RUNTIME_WEIGHT_CACHE_MAX_BYTES="1000000",
    )
    env["REACTANTSERVER_WORKER_NAME"] = "w0"
    with (
        running_worker(repo, logs / "worker.log", env) as worker,
        running_gateway([worker], logs, settings=LPT) as gateway,
        grpcclient.InferenceServerClient(gateway.url) as client,
    ):
        rng = np.random.default_rng(0)
        for _ in range(8):
            x = grpcclient.InferInput("x", [1, 16], "FP32")
            x.set_data_from_numpy(rng.standard_normal((1, 16)).astype(np.float32))
            client.infer("mlp", [x])
        status, _, worker_text = worker.http_get("/metrics")
        assert status == 200
        status, gateway_text = gateway.http_get("/metrics")
        assert status == 200
        yield exported_names(worker_text) | exported_names(gateway_text)


@pytest.mark.slow
def test_dashboard_uses_only_exported_metrics(exported: set[str]) -> None:
    dashboard = load_dashboard()
    used = template_metric_names(dashboard)
    for expr in expressions(dashboard):
        used |= metric_names(expr)
    cuda = exported | CUDA_ONLY
    missing = sorted(name for name in used if not is_exported(name, cuda))
    assert not missing, f"not exported by the worker or the gateway: {missing}"
    # The check has teeth: the families are really there, by prefix.
    assert any(n.startswith("reactantserver_worker_") for n in exported)
    assert any(n.startswith("reactantserver_gateway_") for n in exported)


def documented_families() -> set[str]:
    """The families the metrics reference lists in its tables (first column)."""
    text = (ROOT / "docs" / "reference" / "metrics.md").read_text()
    return set(re.findall(r"^\| `(reactantserver_[a-z0-9_]+)` \|", text, flags=re.MULTILINE))


def is_documented(name: str, documented: set[str]) -> bool:
    """Whether ``name`` (a family or sample name) belongs to a documented family."""
    for suffix in ("", "_bucket", "_sum", "_count", "_created"):
        base = name.removesuffix(suffix) if suffix else name
        if base in documented or f"{base}_total" in documented:
            return True
    return False


@pytest.mark.slow
def test_the_metrics_reference_documents_what_is_exported(exported: set[str]) -> None:
    documented = documented_families()
    assert len(documented) > 60
    undocumented = sorted(
        n for n in exported if n.startswith("reactantserver_") and not is_documented(n, documented)
    )
    assert not undocumented, f"exported but not in docs/reference/metrics.md: {undocumented}"
    # Every family carries the one prefix.
    assert not [n for n in exported if n.startswith(("worker_", "gateway_"))]
