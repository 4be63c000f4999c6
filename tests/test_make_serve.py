"""``make serve`` from a fresh clone: install, export, serve every example its venv can export
(flax always; the torch examples with TORCH=1), stop on Ctrl-C.

The clone gets its own virtual environment (``make`` creates it; pip may reuse its cache), its
own public ports through the node's listen overrides and its own cache and runtime directories.
Ctrl-C is a SIGINT to the foreground process group, which is how the test stops it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, triton_to_np_dtype

from tests.worker_e2e._harness import free_port

ROOT = Path(__file__).resolve().parent.parent
READY_TIMEOUT_S = 900.0
"""Install (a fresh venv), export and first compiles on two cores; not a timing assertion."""
STOP_TIMEOUT_S = 90.0

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1200),
    pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed"),
]


def _inputs(metadata: dict[str, Any]) -> list[grpcclient.InferInput]:
    """One row of fixed-seed data for every input the model declares."""
    rng = np.random.default_rng(0)
    inputs = []
    for tensor in metadata["inputs"]:
        shape = [1 if int(d) < 0 else int(d) for d in tensor["shape"]]
        datatype = tensor["datatype"]
        given = grpcclient.InferInput(tensor["name"], shape, datatype)
        if datatype == "BYTES":
            data = np.full(shape, b"reactant", dtype=np.object_)
        else:
            dtype = triton_to_np_dtype(datatype)
            data = rng.random(shape).astype(dtype)
        given.set_data_from_numpy(data)
        inputs.append(given)
    return inputs


def _wait_ready(proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
    stop_at = time.monotonic() + READY_TIMEOUT_S
    with grpcclient.InferenceServerClient(url) as client:
        while True:
            code = proc.poll()
            if code is not None:
                tail = log.read_text(errors="replace")[-8000:]
                raise AssertionError(f"make serve exited with {code}:\n{tail}")
            with contextlib.suppress(InferenceServerException):
                if client.is_server_ready(client_timeout=2.0):
                    return
            if time.monotonic() > stop_at:
                tail = log.read_text(errors="replace")[-8000:]
                raise AssertionError(f"not ready after {READY_TIMEOUT_S} s:\n{tail}")
            time.sleep(1.0)


def _ours(clone: Path) -> list[psutil.Process]:
    marker = str(clone)
    found = []
    for process in psutil.process_iter(["cmdline", "status", "cwd"]):
        with contextlib.suppress(psutil.Error):
            cmdline = process.info["cmdline"] or []
            mentions = any(marker in arg for arg in cmdline) or (
                (process.info["cwd"] or "").startswith(marker)
            )
            if mentions and process.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(process)
    return found


def test_make_serve_from_a_fresh_clone(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    grpc_port, http_port, rest_port = free_port(), free_port(), free_port()
    while len({grpc_port, http_port, rest_port}) < 3:
        http_port, rest_port = free_port(), free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("REACTANTSERVER_", "REACTANT_", "INFERENCE_SERVER_"))
    }
    env.pop("VIRTUAL_ENV", None)
    env.update(
        {
            "REACTANTSERVER_GATEWAY_LISTEN_GRPC": f"127.0.0.1:{grpc_port}",
            "REACTANTSERVER_GATEWAY_LISTEN_METRICS": f"127.0.0.1:{http_port}",
            "REACTANTSERVER_GATEWAY_LISTEN_HTTP": f"127.0.0.1:{rest_port}",
            "REACTANTSERVER_CACHE_DIR": str(tmp_path / "cache"),
            "XDG_RUNTIME_DIR": str(tmp_path / "run"),
            "PYTHONUNBUFFERED": "1",
        }
    )
    (tmp_path / "run").mkdir(mode=0o700)
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["make", "serve", f"PYTHON={sys.executable}"],
            cwd=clone,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        url = f"127.0.0.1:{grpc_port}"
        _wait_ready(proc, url, log)
        deadline = time.monotonic() + 60
        while "Press Ctrl-C to stop." not in log.read_text(errors="replace"):
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-4000:]
            time.sleep(0.5)
        text = log.read_text(errors="replace")
        assert f"localhost:{grpc_port}" in text or f"127.0.0.1:{grpc_port}" in text
        assert "tritonclient.grpc" in text
        assert f"http://127.0.0.1:{rest_port}/v2" in text
        with httpclient.InferenceServerClient(f"127.0.0.1:{rest_port}") as rest:
            assert rest.is_server_ready()

        # Every example whose framework the clone's venv has (flax always; torch with TORCH=1).
        available = subprocess.run(
            [str(clone / ".venv" / "bin" / "python"), "-m", "examples._available"],
            cwd=clone,
            capture_output=True,
            text=True,
            check=True,
        )
        examples = available.stdout.split()
        assert "resnet18_flax" in examples, available
        if "resnet50_torch" not in examples:
            assert "skipping examples/resnet50_torch: needs torch" in text, text[-6000:]
        with grpcclient.InferenceServerClient(url) as client:
            index = {m["name"] for m in client.get_model_repository_index(as_json=True)["models"]}
            served = [name for name in examples if name in index]
            assert served == examples, (examples, sorted(index))
            for name in served:
                metadata = client.get_model_metadata(name, as_json=True)
                result = client.infer(name, _inputs(metadata), client_timeout=120)
                for output in metadata["outputs"]:
                    assert result.as_numpy(output["name"]) is not None, (name, output)
    finally:
        # Ctrl-C: SIGINT to the whole foreground process group.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(STOP_TIMEOUT_S)
        finally:
            leftovers = _ours(clone)
            for process in leftovers:
                with contextlib.suppress(psutil.Error):
                    process.kill()
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text(errors="replace")
    assert not leftovers, (leftovers, text[-6000:])
    assert "the node stopped cleanly" in text, text[-6000:]
