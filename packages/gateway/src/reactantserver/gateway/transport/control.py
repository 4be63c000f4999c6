"""``GatewayControl`` and the gateway's one ``WorkerControl`` method, ``CompactMemory``.

Scheduling control is delegated to the running policy when it implements
:class:`SchedulingControl` (``lpt_packing``, ``model_aware``); under ``round_robin``
``GetSchedulingStatus`` reports only the mode and every mutator is ``FAILED_PRECONDITION``.
``CompactMemory`` fans out to every worker with the same list and sums ``reloaded_models``
(``UNAVAILABLE`` if every worker failed); the other ``WorkerControl`` RPCs are
``UNIMPLEMENTED`` at the gateway.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol, TypeAlias, runtime_checkable

import grpc

from reactantserver.core.errors import ReactantError, status_of
from reactantserver.core.protocol import control_pb2, control_pb2_grpc
from reactantserver.core.serving import RpcRegistry
from reactantserver.gateway.config import GatewayConfig
from reactantserver.gateway.policies.policy import Policy
from reactantserver.gateway.transport.merge import merge_compact
from reactantserver.gateway.transport.proxy import ForwardError
from reactantserver.gateway.transport.service import fan_out
from reactantserver.gateway.workers.link import COMPACT_MEMORY, WorkerLink, compact_deadline

__all__ = ["SchedulingControl", "add_control_services"]

_log = logging.getLogger("reactantserver.gateway")


_Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"


@runtime_checkable
class SchedulingControl(Protocol):
    """What a policy with live knobs answers to ``GatewayControl`` (errors: ForwardError)."""

    def scheduling_status(self) -> control_pb2.GetSchedulingStatusResponse:
        """``GetSchedulingStatus``."""

    def set_scheduling_policy(
        self, request: control_pb2.SetSchedulingPolicyRequest
    ) -> control_pb2.SetSchedulingPolicyResponse:
        """``SetSchedulingPolicy``."""

    def set_model_placement(
        self, request: control_pb2.SetModelPlacementRequest
    ) -> control_pb2.SetModelPlacementResponse:
        """``SetModelPlacement``."""

    async def repack_rpc(self, request: control_pb2.RepackRequest) -> control_pb2.RepackResponse:
        """``Repack``."""


async def _abort(context: _Context, error: ForwardError) -> None:
    await context.abort(error.code, error.details)


class _GatewayControl(control_pb2_grpc.GatewayControlServicer):
    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.control = policy if isinstance(policy, SchedulingControl) else None

    def _require(self, rpc: str) -> SchedulingControl:
        if self.control is None:
            raise ForwardError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{rpc} needs scheduling.mode lpt_packing or model_aware "
                f"(running {self.policy.mode})",
            )
        return self.control

    async def _call(self, context: _Context, fn: Any, *args: Any) -> Any:
        try:
            result = fn(*args)
            if hasattr(result, "__await__"):
                result = await result
        except ForwardError as error:
            await _abort(context, error)
            raise  # pragma: no cover - abort raises
        except ReactantError as error:
            await context.abort(status_of(error), str(error))
            raise  # pragma: no cover
        except Exception as error:
            _log.exception("GatewayControl failed")
            await context.abort(grpc.StatusCode.INTERNAL, f"unexpected error: {error}")
            raise  # pragma: no cover
        return result

    async def GetSchedulingStatus(
        self, request: control_pb2.GetSchedulingStatusRequest, context: _Context
    ) -> control_pb2.GetSchedulingStatusResponse:
        if self.control is None:
            return control_pb2.GetSchedulingStatusResponse(mode=self.policy.mode)
        result: control_pb2.GetSchedulingStatusResponse = await self._call(
            context, self.control.scheduling_status
        )
        return result

    async def SetSchedulingPolicy(
        self, request: control_pb2.SetSchedulingPolicyRequest, context: _Context
    ) -> control_pb2.SetSchedulingPolicyResponse:
        result: control_pb2.SetSchedulingPolicyResponse = await self._call(
            context, lambda: self._require("SetSchedulingPolicy").set_scheduling_policy(request)
        )
        return result

    async def SetModelPlacement(
        self, request: control_pb2.SetModelPlacementRequest, context: _Context
    ) -> control_pb2.SetModelPlacementResponse:
        result: control_pb2.SetModelPlacementResponse = await self._call(
            context, lambda: self._require("SetModelPlacement").set_model_placement(request)
        )
        return result

    async def Repack(
        self, request: control_pb2.RepackRequest, context: _Context
    ) -> control_pb2.RepackResponse:
        result: control_pb2.RepackResponse = await self._call(
            context, lambda: self._require("Repack").repack_rpc(request)
        )
        return result


class _CompactFanOut(control_pb2_grpc.WorkerControlServicer):
    def __init__(self, links: Sequence[WorkerLink], timeout: float) -> None:
        self.links = list(links)
        self.timeout = timeout

    async def CompactMemory(
        self, request: control_pb2.CompactMemoryRequest, context: _Context
    ) -> control_pb2.CompactMemoryResponse:
        outcomes = await fan_out(
            self.links, COMPACT_MEMORY, request.SerializeToString(), timeout=self.timeout
        )
        answers = [
            control_pb2.CompactMemoryResponse.FromString(o)
            for o in outcomes
            if isinstance(o, bytes)
        ]
        if not answers:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "CompactMemory failed on every worker")
        return merge_compact(answers)

    async def _unimplemented(self, context: _Context) -> Any:
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED, "the gateway serves only CompactMemory of WorkerControl"
        )

    async def ModelControlStatus(self, request: Any, context: _Context) -> Any:
        return await self._unimplemented(context)

    async def SetModelResidency(self, request: Any, context: _Context) -> Any:
        return await self._unimplemented(context)

    async def SetModelPolicy(self, request: Any, context: _Context) -> Any:
        return await self._unimplemented(context)


def add_control_services(
    server: RpcRegistry,
    policy: Policy,
    links: Sequence[WorkerLink],
    config: GatewayConfig,
) -> None:
    """Register ``GatewayControl`` and the ``CompactMemory`` fan-out on ``server``."""
    control_pb2_grpc.add_GatewayControlServicer_to_server(_GatewayControl(policy), server)
    timeout = compact_deadline(config.worker_client.request_timeout_seconds)
    control_pb2_grpc.add_WorkerControlServicer_to_server(_CompactFanOut(links, timeout), server)
