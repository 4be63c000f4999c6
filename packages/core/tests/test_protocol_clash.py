"""tritonclient.grpc and reactantserver.core load into ONE interpreter without a clash."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import sys
    order = sys.argv[1]
    if order == "triton-first":
        import tritonclient.grpc as tc
        from tritonclient.grpc import service_pb2 as theirs
        from reactantserver.core import protocol
    else:
        from reactantserver.core import protocol
        import tritonclient.grpc as tc
        from tritonclient.grpc import service_pb2 as theirs
    from google.protobuf import descriptor_pool

    pool = descriptor_pool.Default()
    # Both packages are registered side by side, each under its own name.
    assert pool.FindMessageTypeByName("inference.ModelInferRequest") is (
        theirs.ModelInferRequest.DESCRIPTOR)
    ours = protocol.grpc_service_pb2
    assert pool.FindMessageTypeByName("reactantserver.kserve.v2.ModelInferRequest") is (
        ours.ModelInferRequest.DESCRIPTOR)
    # The default pool never holds an inference.* symbol of ours.
    assert ours.DESCRIPTOR.package == "reactantserver.kserve.v2"
    assert "inference" not in {f.package for f in [ours.DESCRIPTOR,
                                                     protocol.model_config_pb2.DESCRIPTOR]}

    # Same wire: what one side writes, the other reads field for field.
    request = ours.ModelInferRequest(model_name="m", id="7")
    tensor = request.inputs.add(name="x", datatype="FP32", shape=[2, 3])
    tensor.parameters["shared_memory_region"].string_param = "r"
    request.raw_input_contents.append(bytes(24))
    request.parameters["timeout"].int64_param = 1000
    parsed = theirs.ModelInferRequest.FromString(request.SerializeToString())
    assert parsed.model_name == "m" and parsed.id == "7"
    assert list(parsed.inputs[0].shape) == [2, 3]
    assert parsed.inputs[0].parameters["shared_memory_region"].string_param == "r"
    assert parsed.parameters["timeout"].int64_param == 1000
    assert ours.ModelInferRequest.FromString(parsed.SerializeToString()) == request

    # tritonclient builds its request messages as usual.
    inp = tc.InferInput("x", [1], "FP32")
    assert inp._get_tensor().name == "x"
    print("ok")
    """
)


@pytest.mark.parametrize("order", ["triton-first", "ours-first"])
def test_one_interpreter_both_protocols(order: str) -> None:
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", SCRIPT, order],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
