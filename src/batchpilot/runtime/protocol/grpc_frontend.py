"""The gRPC front-end: KServe's v2 servicer with inference, metadata and readiness answered by the hub.

Tensors travel as `raw_input_contents` / `raw_output_contents` (read with `np.frombuffer`); the typed
`contents` fields are accepted too. Triton's ModelConfig/ModelStatistics RPCs are a separate generic
handler (see triton_grpc).
"""

from __future__ import annotations

import logging
from typing import Any

import grpc
import numpy as np
from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc
from kserve.protocol.grpc.servicer import InferenceServicer

from ..errors import InvalidRequest, RequestError
from ..hub import Decoded, ModelHub
from ..tensors import DATATYPE_OF, RawInput, select_outputs
from .grpc_tolerant import tolerant
from .rest import SERVER_EXTENSIONS, model_metadata

log = logging.getLogger("batchpilot.grpc")

_CONTENTS_FIELD = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents",
}


def _param(params: Any, key: str) -> int | None:
    if key not in params:
        return None
    p = params[key]
    kind = p.WhichOneof("parameter_choice")
    if kind not in ("int64_param", "uint64_param"):
        raise InvalidRequest(f"parameter {key!r} must be an integer")
    return getattr(p, kind)


def decode(request: pb.ModelInferRequest) -> list[Decoded]:
    raw_contents = request.raw_input_contents
    if raw_contents and len(raw_contents) != len(request.inputs):
        raise InvalidRequest(f"{len(raw_contents)} raw_input_contents for {len(request.inputs)} inputs")
    decoded: list[Decoded] = []
    for i, tensor in enumerate(request.inputs):
        raw = RawInput(tensor.name, tensor.datatype, tuple(tensor.shape))
        if raw_contents:
            decoded.append((raw, raw_contents[i]))
            continue
        field = _CONTENTS_FIELD.get(tensor.datatype)
        if field is None:
            raise InvalidRequest(f"input {tensor.name!r}: datatype {tensor.datatype!r} needs raw_input_contents")
        decoded.append((raw, list(getattr(tensor.contents, field))))
    return decoded


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

    async def _abort(self, context: grpc.aio.ServicerContext, exc: RequestError) -> None:
        if exc.retry_after_s is not None:
            context.set_trailing_metadata((("retry-after", str(max(1, round(exc.retry_after_s)))),))
        await context.abort(exc.grpc_code, exc.message)

    async def ModelInfer(self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext) -> pb.ModelInferResponse:
        try:
            spec = self.hub.get(request.model_name).spec
            # Unknown outputs are refused before queueing; a model without a spec is refused by infer().
            names = select_outputs(spec, [o.name for o in request.outputs] or None) if spec is not None else []
            spec, outputs = await self.hub.infer(
                request.model_name, decode(request),
                priority=_param(request.parameters, "priority") or 0,
                timeout_us=_param(request.parameters, "timeout"),
            )
        except RequestError as exc:
            await self._abort(context, exc)
            raise AssertionError("unreachable")  # abort raises
        response = pb.ModelInferResponse(model_name=spec.name, model_version="1", id=request.id)
        for name in names:
            array = np.ascontiguousarray(outputs[name])
            response.outputs.add(name=name, datatype=DATATYPE_OF[array.dtype], shape=array.shape)
            response.raw_output_contents.append(array.tobytes())
        return response

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: grpc.aio.ServicerContext) -> pb.ModelMetadataResponse:
        try:
            model = self.hub.get(request.name)
        except RequestError as exc:
            await self._abort(context, exc)
        if model.spec is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"model {request.name!r} failed to load: {model.error}")
        meta = model_metadata(model.spec)
        return pb.ModelMetadataResponse(
            name=meta["name"], versions=meta["versions"], platform=meta["platform"],
            inputs=[pb.ModelMetadataResponse.TensorMetadata(**t) for t in meta["inputs"]],
            outputs=[pb.ModelMetadataResponse.TensorMetadata(**t) for t in meta["outputs"]],
        )

    async def ModelReady(self, request: pb.ModelReadyRequest, context: grpc.aio.ServicerContext) -> pb.ModelReadyResponse:
        try:
            return pb.ModelReadyResponse(ready=self.hub.get(request.name).ready)
        except RequestError as exc:
            await self._abort(context, exc)

    async def ServerReady(self, request: pb.ServerReadyRequest, context: grpc.aio.ServicerContext) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.hub.ready)

    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: grpc.aio.ServicerContext) -> pb.ServerMetadataResponse:
        from batchpilot import __version__

        return pb.ServerMetadataResponse(name="batchpilot", version=__version__, extensions=SERVER_EXTENSIONS)
