"""A worker configured for tracing serves as usual when OpenTelemetry cannot be imported.

The worker runs in a subprocess whose ``sys.modules`` blocks every ``opentelemetry`` import
(as if the ``tracing`` extra were not installed); a stock client's inference still works,
``TraceSetting`` answers with the level ``OFF`` and refuses to turn it on, and nothing of
OpenTelemetry was loaded.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from ._servers import MODEL, TRACING, Servers, free_port

SCRIPT = textwrap.dedent(
    """
    import sys
    sys.modules["opentelemetry"] = None  # every import of it now fails
    import asyncio, json
    import numpy as np
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException
    from reactantserver.core.config import worker_config_from_mapping
    from reactantserver.worker.server import WorkerServer

    models, cache, port, model, tracing = sys.argv[1:6]
    config = worker_config_from_mapping(
        {
            "model_dirs": [models],
            "cache_dir": cache,
            "model_control_mode": "static",
            "endpoints": {"host": "127.0.0.1", "port": int(port)},
            "tracing": json.loads(tracing),
        },
        {},
    )

    def client_calls() -> dict:
        with grpcclient.InferenceServerClient(f"127.0.0.1:{port}") as client:
            x = grpcclient.InferInput("x", [1, 3], "FP32")
            x.set_data_from_numpy(np.ones((1, 3), np.float32))
            headers = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
            out = client.infer(model, [x], headers=headers).as_numpy("y")
            settings = client.get_trace_settings(as_json=True)["settings"]
            try:
                client.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]})
                refused = ""
            except InferenceServerException as exc:
                refused = str(exc.status())
        return {"out": out.tolist(), "level": settings["trace_level"]["value"], "refused": refused}

    async def main() -> dict:
        server = WorkerServer(config, version="0")
        await server.start()
        try:
            await server.wait_booted()
            return await asyncio.to_thread(client_calls)
        finally:
            await server.shut_down()

    result = asyncio.run(main())
    result["loaded"] = sorted(m for m in sys.modules if m.startswith("opentelemetry."))
    print(json.dumps(result))
    """
)


def test_worker_serves_untraced_without_opentelemetry(servers: Servers) -> None:
    models = servers.worker.config.model_dirs[0]
    cache = servers.worker.config.cache_dir
    args = [models, cache, str(free_port()), MODEL, json.dumps(TRACING)]
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["out"] == [[0.5, -2.0, 3.25]]
    assert result["level"] == ["OFF"]
    assert result["refused"] == "StatusCode.FAILED_PRECONDITION"
    assert result["loaded"] == []
    assert "OpenTelemetry" in done.stderr or "opentelemetry" in done.stderr
