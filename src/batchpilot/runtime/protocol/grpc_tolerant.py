"""gRPC handlers that answer undecodable request bytes with INVALID_ARGUMENT, and a bug with INTERNAL.

Left to itself grpc answers UNKNOWN and logs a traceback per message, which lets any client fill the
logs and looks like a server fault. An unhandled exception (a bug of ours) is answered INTERNAL with a
request id and logged on one line with that id; its traceback goes to DEBUG.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from batchpilot.runtime.errors import report_unhandled, request_id

log = logging.getLogger("batchpilot.grpc")


class _Undecodable:
    """Stands in for request bytes that are not a valid message of the method's type."""


def tolerant(handler: grpc.RpcMethodHandler, method: str = "a gRPC method") -> grpc.RpcMethodHandler:
    """The same handler, answering undecodable bytes with INVALID_ARGUMENT."""
    parse, behaviour = handler.request_deserializer, handler.unary_unary
    if parse is None or behaviour is None:
        return handler

    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except DecodeError:
            return _Undecodable()

    async def guarded(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, _Undecodable):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "request is not a valid protobuf message")
        try:
            return await behaviour(request, context)
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as exc:  # a bug of ours: say so, keep serving
            sent = next((str(v) for k, v in (context.invocation_metadata() or ()) if k == "x-request-id"), None)
            rid = request_id(sent)
            message = report_unhandled(log, exc, method, rid)
            context.set_trailing_metadata((("x-request-id", rid),))
            await context.abort(grpc.StatusCode.INTERNAL, message)

    return handler._replace(request_deserializer=deserialize, unary_unary=guarded)
