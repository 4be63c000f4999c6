"""A tritonclient process owns a system shared-memory region; we read from and write into it."""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import textwrap
import uuid
from typing import Any

import numpy as np
import pytest

from reactantserver.core.codec import decode_request, encode_response
from reactantserver.core.hooks import NamedTensor
from reactantserver.core.protocol import grpc_service_pb2 as pb
from reactantserver.core.shm import SharedMemoryRegistry
from reactantserver.core.types import InferResponse

pytestmark = pytest.mark.slow

# The client side, as a Triton user writes it. It talks JSON lines over stdin/stdout.
CLIENT = textwrap.dedent(
    """
    import json
    import sys

    import numpy as np
    import tritonclient.grpc as tc
    import tritonclient.utils.shared_memory as shm
    from tritonclient.grpc import _utils, service_pb2
    from tritonclient.utils import serialize_byte_tensor

    def send(**fields):
        print(json.dumps(fields), flush=True)

    def receive():
        return json.loads(sys.stdin.readline())

    name, key = sys.argv[1], sys.argv[2]
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    words = serialize_byte_tensor(np.array([b"alpha", b"", b"omega"], dtype=object))
    handle = shm.create_shared_memory_region(name, key, 1024)
    shm.set_shared_memory_region(handle, [x], offset=0)
    shm.set_shared_memory_region(handle, [words], offset=64)

    inputs = [
        tc.InferInput("x", [3, 4], "FP32").set_shared_memory(name, x.nbytes),
        tc.InferInput("w", [3], "BYTES").set_shared_memory(name, len(words.item()), offset=64),
    ]
    y = tc.InferRequestedOutput("y")
    y.set_shared_memory(name, 48, offset=256)
    v = tc.InferRequestedOutput("v")
    v.set_shared_memory(name, 128, offset=512)
    outputs = [y, tc.InferRequestedOutput("z"), v]
    request = _utils._get_inference_request(
        model_name="m", inputs=inputs, model_version="", request_id="interop",
        outputs=outputs, sequence_id=0, sequence_start=False, sequence_end=False,
        priority=0, timeout=None, parameters=None,
    )
    send(request=request.SerializeToString().hex())

    response = service_pb2.ModelInferResponse.FromString(bytes.fromhex(receive()["response"]))
    result = tc.InferResult(response)
    y_out = result.get_output("y")
    y_params = y_out.parameters
    v_out = result.get_output("v")
    y_data = shm.get_contents_as_numpy(
        handle, np.float32, list(y_out.shape),
        offset=y_params["shared_memory_offset"].int64_param,
    )
    v_data = shm.get_contents_as_numpy(
        handle, np.object_, list(v_out.shape),
        offset=v_out.parameters["shared_memory_offset"].int64_param,
    )
    send(
        y=y_data.tolist(),
        y_region=y_params["shared_memory_region"].string_param,
        y_byte_size=y_params["shared_memory_byte_size"].int64_param,
        z=[b.decode() for b in result.as_numpy("z").tolist()],
        v=[b.decode() for b in v_data.tolist()],
    )

    receive()
    shm.destroy_shared_memory_region(handle)
    send(destroyed=True)
    """
)


class _Client:
    """The tritonclient process and its line protocol, with a bound on every wait."""

    def __init__(self, name: str, key: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CLIENT, name, key],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._selector = selectors.DefaultSelector()
        assert self.proc.stdout is not None
        self._selector.register(self.proc.stdout, selectors.EVENT_READ)

    def receive(self, timeout: float = 60.0) -> dict[str, Any]:
        assert self.proc.stdout is not None
        if not self._selector.select(timeout):
            raise AssertionError("tritonclient process did not answer")
        line = self.proc.stdout.readline()
        if not line:
            assert self.proc.stderr is not None
            raise AssertionError(f"tritonclient process exited: {self.proc.stderr.read()}")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def send(self, **fields: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(fields) + "\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        self._selector.close()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate(timeout=30)


def test_tritonclient_region_round_trip() -> None:
    name = f"interop-{uuid.uuid4().hex[:8]}"
    key = f"/rs-test-interop-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    path = "/dev/shm" + key
    client = _Client(name, key)
    registry = SharedMemoryRegistry()
    try:
        msg = pb.ModelInferRequest.FromString(bytes.fromhex(client.receive()["request"]))
        registry.register(name, key, 0, 1024)
        assert registry.is_same_namespace(key)

        request = decode_request(msg, registry=registry, max_recv_msg_bytes=1 << 20, now_ns=0)
        x, w = request.inputs
        np.testing.assert_array_equal(x.data, np.arange(12, dtype=np.float32).reshape(3, 4))
        assert w.data.tolist() == [b"alpha", b"", b"omega"]
        assert [o.name for o in request.outputs] == ["y", "z", "v"]

        response = InferResponse(
            model_name="m",
            id=request.id,
            outputs=[
                NamedTensor("v", np.array([s.upper() for s in w.data], dtype=object)),
                NamedTensor("y", x.data * 2),
                NamedTensor("z", w.data[::-1]),
            ],
        )
        encoded = encode_response(response, requested=request.outputs, registry=registry)
        del x, w
        request.inputs.clear()
        request.release()
        client.send(response=encoded.SerializeToString().hex())

        seen = client.receive()
        assert seen["y"] == (np.arange(12, dtype=np.float32).reshape(3, 4) * 2).tolist()
        assert seen["y_region"] == name
        assert seen["y_byte_size"] == 48
        assert seen["z"] == ["omega", "", "alpha"]
        assert seen["v"] == ["ALPHA", "", "OMEGA"]

        # Unregistering leaves the client's object alone; the client then destroys it.
        registry.unregister(name)
        assert registry.live_mappings() == 0
        assert os.path.exists(path)
        client.send(destroy=True)
        assert client.receive() == {"destroyed": True}
        assert client.proc.wait(timeout=60) == 0
        assert client.proc.stderr is not None
        stderr = client.proc.stderr.read()
        assert "Traceback" not in stderr
        assert "leaked" not in stderr  # the client's resource tracker saw a clean destroy
        assert not os.path.exists(path)
    finally:
        registry.close()
        client.close()
        if os.path.exists(path):
            os.unlink(path)
