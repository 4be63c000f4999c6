"""merge_expositions: one HELP/TYPE per family, samples grouped, lines kept verbatim."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from reactantserver.gateway.views.exposition import merge_expositions

WORKER0 = """\
# HELP reactantserver_worker_requests_total Inference requests by final status.
# TYPE reactantserver_worker_requests_total counter
reactantserver_worker_requests_total{model="m",status="OK",worker="w0"} 3.0
# HELP reactantserver_worker_request_latency_seconds Inference handler wall time.
# TYPE reactantserver_worker_request_latency_seconds histogram
reactantserver_worker_request_latency_seconds_bucket{le="0.001",model="m",worker="w0"} 1.0
reactantserver_worker_request_latency_seconds_bucket{le="+Inf",model="m",worker="w0"} 3.0
reactantserver_worker_request_latency_seconds_count{model="m",worker="w0"} 3.0
reactantserver_worker_request_latency_seconds_sum{model="m",worker="w0"} 0.5
# HELP reactantserver_worker_queue_depth Queued requests.
# TYPE reactantserver_worker_queue_depth gauge
reactantserver_worker_queue_depth{model="m",worker="w0"} 0.0
"""

WORKER1 = WORKER0.replace('worker="w0"', 'worker="w1"').replace(
    "Inference requests by final status.", "Other help text."
)


def lines(text: str) -> list[str]:
    return text.splitlines()


def families(text: str) -> dict[str, tuple[str, list[tuple[str, dict[str, str], float]]]]:
    """Parsed families: name -> (type, [(sample name, labels, value)])."""
    out: dict[str, tuple[str, list[tuple[str, dict[str, str], float]]]] = {}
    for family in text_string_to_metric_families(text):
        assert family.name not in out, f"family {family.name} split"
        out[family.name] = (family.type, [(s.name, s.labels, s.value) for s in family.samples])
    return out


def test_one_help_and_type_per_family_with_every_sources_samples_grouped() -> None:
    merged = merge_expositions([WORKER0.encode(), WORKER1])
    out = lines(merged)
    assert sum(line.startswith("# HELP reactantserver_worker_requests_total ") for line in out) == 1
    assert (
        sum(
            line.startswith("# TYPE reactantserver_worker_request_latency_seconds ") for line in out
        )
        == 1
    )
    # The first HELP wins.
    assert "# HELP reactantserver_worker_requests_total Inference requests by final status." in out
    assert "Other help text." not in merged
    # Family order is first-seen; each family's samples are contiguous, source order kept.
    start = out.index("# TYPE reactantserver_worker_request_latency_seconds histogram")
    assert out[start + 1 : start + 9] == [
        'reactantserver_worker_request_latency_seconds_bucket{le="0.001",model="m",worker="w0"} '
        "1.0",
        'reactantserver_worker_request_latency_seconds_bucket{le="+Inf",model="m",worker="w0"} 3.0',
        'reactantserver_worker_request_latency_seconds_count{model="m",worker="w0"} 3.0',
        'reactantserver_worker_request_latency_seconds_sum{model="m",worker="w0"} 0.5',
        'reactantserver_worker_request_latency_seconds_bucket{le="0.001",model="m",worker="w1"} '
        "1.0",
        'reactantserver_worker_request_latency_seconds_bucket{le="+Inf",model="m",worker="w1"} 3.0',
        'reactantserver_worker_request_latency_seconds_count{model="m",worker="w1"} 3.0',
        'reactantserver_worker_request_latency_seconds_sum{model="m",worker="w1"} 0.5',
    ]
    assert merged.endswith("\n")
    parsed = families(merged)
    assert list(parsed) == [
        "reactantserver_worker_requests",
        "reactantserver_worker_request_latency_seconds",
        "reactantserver_worker_queue_depth",
    ]
    kind, samples = parsed["reactantserver_worker_request_latency_seconds"]
    assert kind == "histogram"
    assert len(samples) == 8
    assert {s[1]["worker"] for s in samples} == {"w0", "w1"}


def test_sample_lines_are_copied_verbatim() -> None:
    odd = '# TYPE x gauge\nx{a="1"}    7 1700000000000\nx{a="2"} 1e3\n'
    merged = merge_expositions(['# TYPE x gauge\nx{a="0"} 0\n', odd])
    assert lines(merged) == [
        "# TYPE x gauge",
        'x{a="0"} 0',
        'x{a="1"}    7 1700000000000',
        'x{a="2"} 1e3',
    ]
    kind, samples = families(merged)["x"]
    assert kind == "gauge"
    assert [s[2] for s in samples] == [0.0, 7.0, 1000.0]


def test_other_comments_and_blank_lines_are_dropped() -> None:
    text = "# a comment\n\n# HELP g G.\n# TYPE g gauge\n# EOF-ish remark\ng 1\n\n"
    assert lines(merge_expositions([text])) == ["# HELP g G.", "# TYPE g gauge", "g 1"]


def test_samples_without_type_become_untyped_families() -> None:
    merged = merge_expositions(['loose{worker="w0"} 1\n', "# TYPE g gauge\ng 2\nloose 3\n"])
    assert lines(merged) == [
        "# TYPE loose untyped",
        'loose{worker="w0"} 1',
        "loose 3",
        "# TYPE g gauge",
        "g 2",
    ]
    parsed = families(merged)
    assert parsed["loose"] == ("unknown", [("loose", {"worker": "w0"}, 1.0), ("loose", {}, 3.0)])


def test_a_later_type_adopts_untyped_samples_of_its_names() -> None:
    untyped = 'h_bucket{le="+Inf"} 1\nh_count 1\n'
    typed = '# TYPE h histogram\nh_bucket{le="+Inf",worker="w1"} 2\nh_count{worker="w1"} 2\n'
    merged = merge_expositions([untyped, typed])
    out = lines(merged)
    assert out[0] == "# TYPE h histogram"
    assert "untyped" not in merged
    assert len(out) == 5
    kind, samples = families(merged)["h"]
    assert kind == "histogram"
    assert len(samples) == 4


def test_a_source_without_type_lines_joins_the_known_family() -> None:
    merged = merge_expositions(["# TYPE c_total counter\nc_total 1\n", 'c_total{worker="w1"} 2\n'])
    assert lines(merged) == ["# TYPE c_total counter", "c_total 1", 'c_total{worker="w1"} 2']


def test_a_contradicting_type_drops_that_sources_samples() -> None:
    first = "# TYPE m gauge\nm 1\n"
    second = "# TYPE m counter\nm 5\n# TYPE other gauge\nother 2\n"
    merged = merge_expositions([first, second])
    assert lines(merged) == ["# TYPE m gauge", "m 1", "# TYPE other gauge", "other 2"]


def test_help_without_type_then_type_elsewhere() -> None:
    merged = merge_expositions(["# HELP g Gauge help.\ng 1\n", "# TYPE g gauge\ng 2\n"])
    assert lines(merged) == ["# HELP g Gauge help.", "# TYPE g gauge", "g 1", "g 2"]


def test_garbage_lines_are_dropped_and_empty_input_merges_to_nothing() -> None:
    assert merge_expositions([]) == ""
    assert merge_expositions(["", b"\n\n"]) == ""
    assert lines(merge_expositions(["{bad} 1\n# TYPE g gauge\ng 1\n"])) == ["# TYPE g gauge", "g 1"]


def test_prometheus_client_renders_merge_and_parse_back() -> None:
    """Real registries (counters, created gauges, histograms, labelled workers) round-trip."""
    bodies: list[bytes] = []
    for worker in ("w0", "w1", "w2"):
        registry = CollectorRegistry()
        requests = Counter(
            "reactantserver_worker_requests", "Requests.", ["model", "worker"], registry=registry
        )
        latency = Histogram(
            "worker_latency_seconds", "Latency.", ["worker"], buckets=(0.1, 1.0), registry=registry
        )
        Gauge(
            "reactantserver_worker_models_loaded", "Models.", ["worker"], registry=registry
        ).labels(worker).set(2)
        requests.labels("m", worker).inc(3)
        latency.labels(worker).observe(0.5)
        bodies.append(generate_latest(registry))
    merged = merge_expositions(bodies)
    parsed = families(merged)
    assert parsed["reactantserver_worker_requests"][0] == "counter"
    assert [s[1]["worker"] for s in parsed["reactantserver_worker_requests"][1]] == [
        "w0",
        "w1",
        "w2",
    ]
    kind, samples = parsed["worker_latency_seconds"]
    assert kind == "histogram"
    assert len(samples) == 3 * 5  # three buckets, count and sum per worker
    assert (
        sum(line.startswith("# TYPE worker_latency_seconds_created") for line in lines(merged)) == 1
    )
    assert [s[2] for s in parsed["reactantserver_worker_models_loaded"][1]] == [2.0, 2.0, 2.0]
