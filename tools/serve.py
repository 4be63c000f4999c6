"""``make serve``: export the demo bundles, then run the node on them (CPU, :8000/:8001/:8002).

Each available ``examples/<name>/export.py`` is run as ``python -m examples.<name>.export --out
DIR`` (weights from a fixed seed, no downloads); an example whose framework is not installed
(``resnet50_torch`` needs the ``torch`` extra: ``make serve TORCH=1``) is skipped with a line
saying so. Then ``reactantserver-node --model-repository DIR`` (no node file: Triton's ports, a
CPU worker where no GPU is found) serves DIR. Once the node answers its healthcheck, this prints
where to connect and a tritonclient snippet to paste. Ctrl-C (SIGINT) or SIGTERM stops the
node and everything under it; the exit status is the node's. The public addresses follow the
node's own overrides, ``REACTANTSERVER_GATEWAY_LISTEN_HTTP``, ``_GRPC`` and ``_METRICS``.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parent.parent


SNIPPET = """\
import numpy as np
import tritonclient.grpc as grpcclient

client = grpcclient.InferenceServerClient("{address}")
x = np.random.default_rng(0).random((2, 16), dtype=np.float32)
inputs = [grpcclient.InferInput("x", list(x.shape), "FP32")]
inputs[0].set_data_from_numpy(x)
print(client.infer("mlp", inputs).as_numpy("logits"))
"""


def _say(message: str) -> None:
    print(f"make serve: {message}", flush=True)


def _available(python: str) -> list[str]:
    """The examples the venv can export (``examples._available``); says which it cannot."""
    done = subprocess.run(
        [python, "-m", "examples._available"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    for line in done.stderr.splitlines():
        if ": needs " in line:
            _say(f"skipping examples/{line} (make serve TORCH=1 installs the torch extra)")
    return done.stdout.split()


def _export(python: str, models: Path) -> int:
    for name in _available(python):
        _say(f"exporting examples/{name} into {models}")
        done = subprocess.run(
            [python, "-m", f"examples.{name}.export", "--out", str(models)], cwd=ROOT, check=False
        )
        if done.returncode != 0:
            _say(f"exporting examples/{name} failed ({done.returncode}).")
            return done.returncode
    return 0


def _client_address(listen: str) -> str:
    host, _, port = listen.rpartition(":")
    if host in ("", "0.0.0.0", "::", "[::]"):
        host = "localhost"
    return f"{host}:{port}"


def _banner(models: Path) -> None:
    rest = _client_address(os.environ.get("REACTANTSERVER_GATEWAY_LISTEN_HTTP", "0.0.0.0:8000"))
    grpc = _client_address(os.environ.get("REACTANTSERVER_GATEWAY_LISTEN_GRPC", "0.0.0.0:8001"))
    metrics = _client_address(
        os.environ.get("REACTANTSERVER_GATEWAY_LISTEN_METRICS", "0.0.0.0:8002")
    )
    names = sorted(p.parent.name for p in models.glob("*/manifest.yaml"))
    lines = [
        "",
        "ReactantServer is ready.",
        f"  REST (KServe V2 / Triton): http://{rest}/v2",
        f"  gRPC (KServe V2 / Triton): {grpc}",
        f"  metrics and status page: http://{metrics}/metrics  http://{metrics}/",
        f"  models: {', '.join(names)}",
        "",
        "Paste into Python (pip install 'tritonclient[grpc]' numpy):",
        "",
        SNIPPET.format(address=grpc),
        "Press Ctrl-C to stop.",
        "",
    ]
    print("\n".join(lines), flush=True)


def _wait_ready(node: subprocess.Popen[bytes], script: str, models: Path) -> bool:
    """Poll ``reactantserver-node healthcheck`` until it passes; False if the node exits."""
    while node.poll() is None:
        done = subprocess.run(
            [script, "healthcheck", "--model-repository", str(models)],
            capture_output=True,
            check=False,
        )
        if done.returncode == 0:
            return True
        time.sleep(1.0)
    return False


def main(argv: list[str] | None = None) -> int:
    """Export the examples and run the node until it stops; returns its exit status."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--venv", type=Path, default=ROOT / ".venv")
    parser.add_argument("--models", type=Path, default=ROOT / "build" / "models")
    args = parser.parse_args(argv)
    python = str(args.venv / "bin" / "python")
    models = args.models.resolve()
    models.mkdir(parents=True, exist_ok=True)
    status = _export(python, models)
    if status != 0:
        return status

    script = str(args.venv / "bin" / "reactantserver-node")
    _say(f"starting reactantserver-node --model-repository {models}")
    node = subprocess.Popen([script, "--model-repository", str(models)], cwd=ROOT)

    def forward(signum: int, _frame: FrameType | None) -> None:
        # The node stops its children gracefully; a second signal is ignored there.
        if node.poll() is None:
            node.send_signal(signum)

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    if _wait_ready(node, script, models):
        _banner(models)
    status = node.wait()
    if status == 0:
        _say("the node stopped cleanly.")
    else:
        _say(f"reactantserver-node exited with status {status}.")
    return status


if __name__ == "__main__":
    sys.exit(main())
