"""The gRPC front-end: KServe's v2 servicer with inference, metadata and readiness answered by the hub.

Each RPC decodes (grpc_codec), asks the hub and encodes. Triton's ModelConfig/ModelStatistics RPCs are a
separate generic handler (see triton_grpc).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import grpc
from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc
from kserve.protocol.grpc.servicer import InferenceServicer

from batchpilot.runtime.batching.request import RECEIVED
from batchpilot.runtime.errors import RequestError
from batchpilot.runtime.hub import ModelHub
from batchpilot.runtime.protocol import grpc_codec
from batchpilot.runtime.protocol.grpc_tolerant import tolerant

log = logging.getLogger("batchpilot.grpc")


class _TolerantRegistrar:
    """What the generated `add_..._to_server` needs of a server, registering tolerant handlers instead."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self.server = server

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass  # the same methods arrive as a dict just after, through add_registered_method_handlers

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        tolerant_handlers = {name: tolerant(h, f"{service}/{name}") for name, h in handlers.items()}
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, tolerant_handlers),))
        self.server.add_registered_method_handlers(service, tolerant_handlers)


def add_servicer(servicer: InferenceServicer, server: grpc.aio.Server) -> None:
    """Like `add_GRPCInferenceServiceServicer_to_server`, with undecodable requests refused as invalid."""
    grpc_predict_v2_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, _TolerantRegistrar(server))


class BatchPilotServicer(InferenceServicer):
    def __init__(self, hub: ModelHub, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hub = hub

    async def _abort(self, context: grpc.aio.ServicerContext, exc: RequestError) -> Exception:
        """Answer with the error's code (abort raises; the return value only satisfies the type checker)."""
        if exc.retry_after_s is not None:
            context.set_trailing_metadata((("retry-after", str(max(1, round(exc.retry_after_s)))),))
        await context.abort(exc.grpc_code, exc.message)
        return AssertionError("unreachable")

    async def ModelInfer(
        self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelInferResponse:
        RECEIVED.set(time.perf_counter())
        try:
            self.hub.get(request.model_name)
            decoded = grpc_codec.decode(request)
            spec, outputs = await self.hub.infer(
                request.model_name,
                decoded.inputs,
                outputs=decoded.outputs,
                priority=decoded.priority,
                timeout_us=decoded.timeout_us,
            )
        except RequestError as exc:
            raise await self._abort(context, exc) from None
        return grpc_codec.encode(request, spec.name, outputs)

    async def ModelMetadata(
        self, request: pb.ModelMetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelMetadataResponse:
        try:
            return grpc_codec.model_metadata(self.hub.model_metadata(request.name))
        except RequestError as exc:
            raise await self._abort(context, exc) from None

    async def ModelReady(
        self, request: pb.ModelReadyRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelReadyResponse:
        try:
            ready, _ = self.hub.model_readiness(request.name)
        except RequestError as exc:
            raise await self._abort(context, exc) from None
        return pb.ModelReadyResponse(ready=ready)

    async def ServerReady(
        self, request: pb.ServerReadyRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.hub.ready)

    async def ServerMetadata(
        self, request: pb.ServerMetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerMetadataResponse:
        meta = self.hub.server_metadata()
        return pb.ServerMetadataResponse(name=meta["name"], version=meta["version"], extensions=meta["extensions"])
