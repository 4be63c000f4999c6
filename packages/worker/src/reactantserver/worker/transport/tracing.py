"""The worker's spans of one traced inference request, recorded when it is answered.

A request that :attr:`~reactantserver.core.tracing.Tracing.active` lets through gets a server
span ``ModelInfer`` from the moment it is received, child of the caller's ``traceparent``;
when it is answered, its phases become child spans from the marks taken on the way (no clock
is read twice for them: the scheduler's are the ones its statistics record):

- ``queue``: from admission into the model's queue until its batch started executing;
- ``execute``: the batch's assembly, transfer, run and copy back, with the model, its
  version, the compiled batch size, this request's rows and the batch's rows;
- ``respond``: encoding the answer (the transport sends it right after).

A failure sets the span's error status with its gRPC code (and the HTTP status for REST).
"""

from __future__ import annotations

import grpc

from reactantserver.core.tracing import RequestSpan, end_span
from reactantserver.worker.scheduler.queue import TraceMarks

__all__ = ["finish_request_span"]


def finish_request_span(
    span: RequestSpan,
    marks: TraceMarks,
    *,
    model: str,
    version: str,
    respond: tuple[int, int] | None,
    code: grpc.StatusCode,
    message: str,
    http: bool,
) -> None:
    """Record the phases of one answered request under ``span``, its outcome, and end it.

    ``respond`` is the encoding's ``(start, end)`` in ``time.monotonic_ns()`` (``None`` when
    the request failed before it).
    """
    if marks.end_ns:
        span.child("queue", marks.enqueue_ns, marks.start_ns)
        span.child(
            "execute",
            marks.start_ns,
            marks.end_ns,
            {
                "reactant.model": model,
                "reactant.model_version": version,
                "reactant.batch_size": marks.batch,
                "reactant.rows": marks.rows,
                "reactant.batch_rows": marks.batch_rows,
                "reactant.batch_requests": marks.requests,
            },
        )
    if respond is not None:
        span.child("respond", *respond)
    end_span(span, code, message, http=http)
