"""A bare grpc.aio server answering ``ModelInfer`` with a canned response (the gRPC floor).

Run by ``bench.worker_grpc`` in its own process so that it does not share a GIL with the
client::

    .venv/bin/python -m bench._bare_server --port 8001

It serves the Triton inference service at its public paths through
:func:`reactantserver.core.protocol.inference_service_handler`, on a uvloop event loop, with
the worker's message limits: ``ServerLive`` / ``ServerReady`` / ``ModelReady`` answer true
and ``ModelInfer`` answers, without looking at the inputs, one response built at start-up
for the requested model name: the example's output tensor (``logits``, one row, FP32, zeros)
with the same name, datatype and shape as the real model's. Unknown model names get the
``mlp`` response. Everything a Python gRPC server must do per call is left: HTTP/2 framing,
request parsing, the handler coroutine, response serialization (about 1 us for this message).

With ``--handoff`` each answer also makes the worker's thread round trip: the handler queues a
future under a condition variable, a second thread takes everything queued and resolves it on
the loop with one ``call_soon_threadsafe`` (as the dispatch thread does), and the handler
awaits it. The difference to the plain floor is what the hand-off itself costs.

With ``--native`` the same handlers are served by the worker's own front door
(:class:`reactantserver.core.front.GrpcFront`: h2corn, gRPC framing in Python) instead of
``grpc.aio``: the floor of our stack, what the worker would cost if a model cost nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import threading
from collections.abc import Mapping

import grpc
import uvloop

from reactantserver.core.front import GrpcFront
from reactantserver.core.protocol import grpc_service_pb2 as pb
from reactantserver.core.protocol import inference_service_handler

__all__ = ["CANNED_OUTPUTS", "canned_response", "main", "serve"]

#: Model name -> (output name, shape) of the canned answer; the shapes of the examples' outputs.
CANNED_OUTPUTS: Mapping[str, tuple[str, tuple[int, ...]]] = {
    "mlp": ("logits", (1, 4)),
    "cnn": ("logits", (1, 10)),
    # bench.peers' MLPs (bench/_peers/models.py): the floor row of its report.
    "tiny_mlp": ("y", (1, 16)),
    "heavy_mlp": ("y", (1, 1000)),
}

_MAX_MESSAGE = 512 * 1024 * 1024  # the worker's grpc.max_{recv,send}_msg_bytes default


def canned_response(model: str) -> pb.ModelInferResponse:
    """The canned ``ModelInferResponse`` for ``model`` (one FP32 output of zeros)."""
    name, shape = CANNED_OUTPUTS.get(model, CANNED_OUTPUTS["mlp"])
    count = 1
    for dim in shape:
        count *= dim
    response = pb.ModelInferResponse(model_name=model, model_version="1")
    response.outputs.add(name=name, datatype="FP32", shape=shape)
    response.raw_output_contents.append(bytes(4 * count))
    return response


Answer = asyncio.Future[pb.ModelInferResponse]


class _HandOff:
    """A thread that resolves queued futures on the loop, like the worker's dispatch thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._cond = threading.Condition()
        self._queued: list[tuple[Answer, pb.ModelInferResponse]] = []
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="bare-handoff", daemon=True)
        self._thread.start()

    def answer(self, response: pb.ModelInferResponse) -> Answer:
        future: Answer = self._loop.create_future()
        with self._cond:
            self._queued.append((future, response))
            self._cond.notify()
        return future

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queued and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                taken, self._queued = self._queued, []
            self._loop.call_soon_threadsafe(_settle_all, taken)


def _settle_all(taken: list[tuple[Answer, pb.ModelInferResponse]]) -> None:
    for future, response in taken:
        if not future.done():  # cancelled: the client went away
            future.set_result(response)


async def serve(
    host: str, port: int, stop: asyncio.Event, *, handoff: bool = False, native: bool = False
) -> None:
    """Serve on ``host:port`` until ``stop`` is set (``handoff``, ``native``: see the module
    docstring)."""
    canned = {model: canned_response(model) for model in CANNED_OUTPUTS}
    default = canned["mlp"]
    relay = _HandOff(asyncio.get_running_loop()) if handoff else None

    async def model_infer(
        request: pb.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelInferResponse:
        return canned.get(request.model_name, default)

    async def model_infer_handoff(
        request: pb.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelInferResponse:
        assert relay is not None
        return await relay.answer(canned.get(request.model_name, default))

    infer = model_infer if relay is None else model_infer_handoff

    async def server_live(
        request: pb.ServerLiveRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def server_ready(
        request: pb.ServerReadyRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=True)

    async def model_ready(
        request: pb.ModelReadyRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=True)

    handler = inference_service_handler(
        {
            "ModelInfer": infer,
            "ServerLive": server_live,
            "ServerReady": server_ready,
            "ModelReady": model_ready,
        }
    )
    server: grpc.aio.Server | GrpcFront
    if native:
        server = GrpcFront(max_recv_msg_bytes=_MAX_MESSAGE, max_send_msg_bytes=_MAX_MESSAGE)
        server.add_generic_rpc_handlers([handler])
        server.add_port(f"{host}:{port}")
    else:
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", _MAX_MESSAGE),
                ("grpc.max_send_message_length", _MAX_MESSAGE),
            ]
        )
        server.add_generic_rpc_handlers([handler])
        server.add_insecure_port(f"{host}:{port}")
    await server.start()
    try:
        await stop.wait()
    finally:
        await server.stop(0)
        if relay is not None:
            relay.stop()


async def _main(host: str, port: int, handoff: bool, native: bool) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await serve(host, port, stop, handoff=handoff, native=native)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point: serve until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--handoff", action="store_true", help="answer through a second thread (module docs)"
    )
    parser.add_argument(
        "--native", action="store_true", help="serve with the worker's front door, not grpc.aio"
    )
    args = parser.parse_args(argv)
    uvloop.run(_main(args.host, args.port, args.handoff, args.native))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
