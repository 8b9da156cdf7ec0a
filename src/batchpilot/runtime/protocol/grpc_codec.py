"""Open Inference Protocol v2 over gRPC: KServe's ModelInferRequest in, ModelInferResponse out.

Tensors travel as `raw_input_contents` / `raw_output_contents` (read with `np.frombuffer`); the typed
`contents` fields are accepted too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb

from batchpilot.runtime.errors import InvalidRequest
from batchpilot.runtime.tensors import DATATYPE_OF, Decoded, RawInput


@dataclass
class GrpcRequest:
    inputs: list[Decoded]
    priority: int = 0
    timeout_us: int | None = None
    outputs: list[str] | None = None  # None: all outputs


_CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
}


def _param(params: Any, key: str) -> int | None:
    if key not in params:
        return None
    p = params[key]
    kind = p.WhichOneof("parameter_choice")
    if kind not in ("int64_param", "uint64_param"):
        raise InvalidRequest(f"parameter {key!r} must be an integer")
    return getattr(p, kind)


def decode_inputs(request: pb.ModelInferRequest) -> list[Decoded]:
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


def decode(request: pb.ModelInferRequest) -> GrpcRequest:
    return GrpcRequest(
        inputs=decode_inputs(request),
        priority=_param(request.parameters, "priority") or 0,
        timeout_us=_param(request.parameters, "timeout"),
        outputs=[o.name for o in request.outputs] or None,
    )


def encode(request: pb.ModelInferRequest, model: str, outputs: dict[str, np.ndarray]) -> pb.ModelInferResponse:
    """The response with `outputs` (the requested ones, in order) as raw output contents."""
    response = pb.ModelInferResponse(model_name=model, model_version="1", id=request.id)
    for name, output in outputs.items():
        array = np.ascontiguousarray(output)
        response.outputs.add(name=name, datatype=DATATYPE_OF[array.dtype], shape=array.shape)
        response.raw_output_contents.append(array.tobytes())
    return response


def model_metadata(meta: dict[str, Any]) -> pb.ModelMetadataResponse:
    """The hub's model metadata as a ModelMetadataResponse."""
    return pb.ModelMetadataResponse(
        name=meta["name"],
        versions=meta["versions"],
        platform=meta["platform"],
        inputs=[pb.ModelMetadataResponse.TensorMetadata(**t) for t in meta["inputs"]],
        outputs=[pb.ModelMetadataResponse.TensorMetadata(**t) for t in meta["outputs"]],
    )
