"""gRPC handlers that answer undecodable request bytes with INVALID_ARGUMENT.

Left to itself grpc answers UNKNOWN and logs a traceback per message, which lets any client fill the
logs and looks like a server fault.
"""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf.message import DecodeError


class _Undecodable:
    """Stands in for request bytes that are not a valid message of the method's type."""


def tolerant(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
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
        return await behaviour(request, context)

    return handler._replace(request_deserializer=deserialize, unary_unary=guarded)
