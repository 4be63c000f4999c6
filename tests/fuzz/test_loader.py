"""Property: a broken bundle fails to load with a clear reason and never takes the worker down.

One real worker in ``explicit`` mode serves ``mlp``; each case writes a mutated copy of ``mlp``
as ``fuzzed`` into its model directory and asks ``RepositoryModelLoad`` for it. The status must
be the documented one, a failure's message is one line naming the
model, the index shows it ``UNAVAILABLE`` with the reason, and ``mlp`` keeps serving. At the
end the pristine bundle loads under the same name and serves ``mlp``'s numbers.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2

from . import _report
from ._loader import INTERNAL, MANIFEST, BundleCase, bundle_files, manifest_texts, manifests
from ._probe import CLIENT_DEADLINE_S, Probe, check_response, response_logits
from ._requests import OK, base_request
from ._settings import fuzz_settings

pytestmark = pytest.mark.slow

FUZZED = "fuzzed"
RSS_GROWTH_BOUND = 64 << 20
ROWS = 5


@pytest.fixture(scope="module")
def pristine(fuzz_repo: Path) -> Path:
    """The exported ``mlp`` bundle every case starts from (never written to)."""
    return fuzz_repo / "mlp"


@pytest.fixture(scope="module")
def pristine_manifest(pristine: Path) -> dict[str, Any]:
    """``mlp``'s manifest as parsed YAML."""
    data: dict[str, Any] = yaml.safe_load((pristine / MANIFEST).read_text())
    return data


@pytest.fixture(scope="module", autouse=True)
def rss_after_warm_up(loader_probe: Probe, loader_repo: Path, pristine: Path) -> int:
    """The loader worker's RSS after one good load and unload of ``fuzzed``."""
    install(loader_repo, pristine, lambda bundle: None)
    assert repository(loader_probe, "Load", FUZZED) == (OK, "")
    assert repository(loader_probe, "Unload", FUZZED) == (OK, "")
    return loader_probe.rss()


def install(repo: Path, pristine: Path, write: Any) -> None:
    """A fresh copy of ``pristine`` as ``repo/fuzzed``, then ``write`` applied to it."""
    target = repo / FUZZED
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(pristine, target)
    write(target)


def repository(probe: Probe, verb: str, name: str) -> tuple[str, str]:
    """``(status, message)`` of ``RepositoryModel{verb}(name)``."""
    method = getattr(probe.stub, f"RepositoryModel{verb}")
    request = getattr(service_pb2, f"RepositoryModel{verb}Request")(model_name=name)
    try:
        method(request, timeout=CLIENT_DEADLINE_S)
    except grpc.RpcError as error:
        return error.code().name, str(error.details() or "")
    return OK, ""


def index_entry(probe: Probe, name: str) -> Any:
    """``name``'s ``RepositoryIndex`` entry, or ``None``."""
    index = probe.stub.RepositoryIndex(
        service_pb2.RepositoryIndexRequest(), timeout=CLIENT_DEADLINE_S
    )
    return next((model for model in index.models if model.name == name), None)


def run_case(probe: Probe, repo: Path, pristine: Path, case: BundleCase) -> None:
    """Install ``case``, load it, judge the answer, leave ``fuzzed`` unloaded, check health."""
    repository(probe, "Unload", FUZZED)  # a clean start, whatever the last case left behind
    install(repo, pristine, case.write)
    status, message = repository(probe, "Load", FUZZED)
    _report.record(f"loader: {case.family}", status)
    assert status in case.expected, (
        f"{case.label}: got {status} ({message!r}), expected one of {sorted(case.expected)}"
    )
    if status == OK:
        ready = probe.stub.ModelReady(
            service_pb2.ModelReadyRequest(name=FUZZED), timeout=CLIENT_DEADLINE_S
        )
        assert ready.ready, case.label
        assert repository(probe, "Unload", FUZZED) == (OK, ""), case.label
    else:
        assert message, f"{case.label}: no message"
        assert "\n" not in message, f"{case.label}: multi-line message {message!r}"
        assert FUZZED in message, f"{case.label}: the message does not name the model: {message}"
        if status == INTERNAL:
            entry = index_entry(probe, FUZZED)
            assert entry is not None, case.label
            assert entry.state == "UNAVAILABLE", (case.label, entry)
            assert entry.reason, f"{case.label}: no reason in the index"
    probe.assert_healthy(case.label)


@fuzz_settings(0.08)
@given(data=st.data())
def test_mutated_manifests(
    loader_probe: Probe,
    loader_repo: Path,
    pristine: Path,
    pristine_manifest: dict[str, Any],
    data: st.DataObject,
) -> None:
    case = data.draw(manifests(pristine_manifest), label="case")
    run_case(loader_probe, loader_repo, pristine, case)


@fuzz_settings(0.03)
@given(case=manifest_texts())
def test_manifest_texts(
    loader_probe: Probe, loader_repo: Path, pristine: Path, case: BundleCase
) -> None:
    run_case(loader_probe, loader_repo, pristine, case)


@fuzz_settings(0.04)
@given(case=bundle_files())
def test_broken_bundle_files(
    loader_probe: Probe, loader_repo: Path, pristine: Path, case: BundleCase
) -> None:
    run_case(loader_probe, loader_repo, pristine, case)


def test_good_bundle_loads_after_the_fuzz(
    loader_probe: Probe, loader_repo: Path, pristine: Path, rss_after_warm_up: int
) -> None:
    install(loader_repo, pristine, lambda bundle: None)
    assert repository(loader_probe, "Load", FUZZED) == (OK, "")
    entry = index_entry(loader_probe, FUZZED)
    assert entry is not None
    assert entry.state == "READY", entry
    request = base_request(ROWS)
    request.model_name = FUZZED
    response = loader_probe.stub.ModelInfer(request, timeout=CLIENT_DEADLINE_S)
    assert response.model_name == FUZZED
    response.model_name = "mlp"  # check_response knows the fuzzed model by mlp's name
    check_response(response)
    mlp = loader_probe.stub.ModelInfer(base_request(ROWS), timeout=CLIENT_DEADLINE_S)
    assert response_logits(response).tolist() == response_logits(mlp).tolist()
    loader_probe.assert_healthy("the whole run")
    rss = loader_probe.rss()
    _report.RSS["loader worker"] = (rss_after_warm_up, rss)
    growth = rss - rss_after_warm_up
    assert growth < RSS_GROWTH_BOUND, f"RSS grew by {growth / _report.MIB:.1f} MiB"
