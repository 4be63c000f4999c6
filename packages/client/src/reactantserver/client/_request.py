"""One inference request as a flow: transport choice, retries, stale-registration recovery.

Each attempt sends the *remaining* budget as the gRPC timeout and as ``reactant_timeout_ns``.
A stale registration (the server forgot a region this request referenced) is re-registered
once and the request re-sent; if that does not help, staging pools fall back to inline bytes
(the request is re-sent inline) and anything else is raised. Retryable statuses wait out a
jittered backoff.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Mapping, Sequence

import attrs
import grpc

from reactantserver.client._flow import Exclusive, Flow, Unary
from reactantserver.client._model import KServeModel
from reactantserver.client._retry import retrying_flow
from reactantserver.client._staging import StagingPool
from reactantserver.client._tensors import InferInput, RequestedOutput
from reactantserver.client._transport import is_stale
from reactantserver.core import codec
from reactantserver.core.dtypes import DType
from reactantserver.core.errors import DeadlineExceededError
from reactantserver.core.hooks import NamedTensor
from reactantserver.core.protocol import INFERENCE_METHODS
from reactantserver.core.protocol import grpc_service_pb2 as pb
from reactantserver.core.types import InferRequest, OutputRequest, ParameterValue

__all__ = ["Call", "infer_flow"]

_INFER = INFERENCE_METHODS["ModelInfer"]
_NS = 1_000_000_000


@attrs.frozen
class Call:
    """Everything one request needs; ``deadline_ns`` is absolute ``time.monotonic_ns()``."""

    model: KServeModel
    inputs: Sequence[InferInput]
    outputs: Sequence[RequestedOutput]
    deadline_ns: int
    priority: int = 0
    request_id: str = ""
    parameters: Mapping[str, ParameterValue] = attrs.field(factory=dict)

    def pools(self) -> list[StagingPool]:
        """The SHM staging pools this request could reference in place."""
        found: dict[str, StagingPool] = {}
        for pool in [*(i.pool for i in self.inputs), *(o.pool for o in self.outputs)]:
            if pool is not None:
                found[pool.name] = pool
        return list(found.values())

    def build(self, shm_pools: frozenset[str]) -> tuple[pb.ModelInferRequest, list[str]]:
        """The request message, and the region names it references."""
        shm_inputs = {}
        regions: list[str] = []
        for tensor in self.inputs:
            ref = tensor.placement(shm_pools)
            if ref is not None:
                shm_inputs[tensor.name] = ref
                regions.append(ref.region)
        wanted = []
        for output in self.outputs:
            ref = output.placement(shm_pools)
            wanted.append(OutputRequest(output.name, ref))
            if ref is not None:
                regions.append(ref.region)
        request = InferRequest(
            model_name=self.model.model_name,
            id=self.request_id,
            inputs=[NamedTensor(t.name, t.array) for t in self.inputs],
            outputs=wanted,
            priority=self.priority,
            parameters=dict(self.parameters),
        )
        return codec.encode_request(request, shm_inputs=shm_inputs), list(dict.fromkeys(regions))

    def remaining_ns(self) -> int:
        """Budget left; ``DeadlineExceededError`` when none is."""
        remaining = self.deadline_ns - time.monotonic_ns()
        if remaining <= 0:
            raise DeadlineExceededError(
                f"deadline exceeded before sending to model {self.model.model_name!r}"
            )
        return remaining


def infer_flow(call: Call) -> Flow[pb.ModelInferResponse]:
    """Send ``call`` until it succeeds, fails for good, or the budget runs out."""
    return (
        yield from retrying_flow(call.model.retry, call.deadline_ns, lambda: _attempt_flow(call))
    )


def _attempt_flow(call: Call) -> Flow[pb.ModelInferResponse]:
    """One attempt, with at most one re-registration and one fall-back to inline."""
    model, endpoint = call.model, call.model.endpoint
    recovered = False
    while True:
        shm_pools = set()
        for pool in call.pools():
            budget = call.remaining_ns() / _NS
            if (yield from endpoint.use_shm_flow(model.key, pool, model.shared_memory, budget)):
                shm_pools.add(pool.name)
        msg, regions = call.build(frozenset(shm_pools))
        remaining = call.remaining_ns()
        msg.parameters["reactant_timeout_ns"].int64_param = remaining
        seen = endpoint.generation
        try:
            reply: pb.ModelInferResponse = yield Unary(model.key, _INFER, msg, remaining / _NS)
        except grpc.RpcError as error:
            if not regions or not is_stale(error):
                raise
            if not recovered:
                recovered = True
                fixed = yield Exclusive(
                    endpoint.guard,
                    functools.partial(
                        endpoint.reregister_flow,
                        model.key,
                        regions,
                        seen,
                        call.remaining_ns() / _NS,
                    ),
                )
                if fixed:
                    continue
            if not shm_pools:
                raise
            for pool in call.pools():
                if pool.name in shm_pools:
                    endpoint.latch_inline(model.key, pool, model.shm_reprobe_interval)
            continue
        if shm_pools:
            _copy_back(reply, call.outputs, frozenset(shm_pools))
        return reply


def _copy_back(
    reply: pb.ModelInferResponse, outputs: Sequence[RequestedOutput], shm_pools: frozenset[str]
) -> None:
    """Move outputs the server wrote into a staging pool into the reply's raw contents."""
    in_pool = {o.name: o for o in outputs if o.pool is not None and o.pool.name in shm_pools}
    if not in_pool:
        return
    raw = list(reply.raw_output_contents) or [b""] * len(reply.outputs)
    for index, tensor in enumerate(reply.outputs):
        output = in_pool.get(tensor.name)
        if output is None or codec.SHM_REGION not in tensor.parameters:
            continue
        assert output.pool is not None
        assert output.shm is not None
        written = math.prod(tensor.shape) * DType.from_kserve(tensor.datatype).itemsize
        raw[index] = bytes(output.pool.view(output.shm.offset, min(written, output.shm.byte_size)))
        for param in (codec.SHM_REGION, codec.SHM_OFFSET, codec.SHM_BYTE_SIZE):
            del tensor.parameters[param]
    del reply.raw_output_contents[:]
    reply.raw_output_contents.extend(raw)
