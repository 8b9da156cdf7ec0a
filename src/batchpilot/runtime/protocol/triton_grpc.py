"""Triton's `ModelConfig` and `ModelStatistics` RPCs on KServe's gRPC server.

KServe serves `inference.GRPCInferenceService` but not these two methods. They are added as a generic
handler for the same service name (`server.add_generic_rpc_handlers((handler,))` next to KServe's
servicer), so Triton clients and perf_analyzer find them at the method paths they expect.

The messages come from `batchpilot_triton.proto`: wire-compatible with Triton's but in package
`batchpilot.triton`, because KServe's protos already own `inference.*` in protobuf's default pool and
tritonclient's cannot be loaded beside them. gRPC method paths do not depend on message packages.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import grpc
from google.protobuf import json_format
from google.protobuf.message import Message

from batchpilot.runtime.errors import RequestError
from batchpilot.runtime.protocol import batchpilot_triton_pb2 as pb
from batchpilot.runtime.protocol.grpc_tolerant import tolerant

SERVICE = "inference.GRPCInferenceService"
MODEL_CONFIG_METHOD = f"/{SERVICE}/ModelConfig"
MODEL_STATISTICS_METHOD = f"/{SERVICE}/ModelStatistics"


def _check_version(request: pb.ModelConfigRequest | pb.ModelStatisticsRequest) -> str | None:
    """Why the request is malformed, or None. Versions are decimal strings in Triton's protocol."""
    if request.version and not request.version.isdecimal():
        return f"model version must be a decimal number, got {request.version!r}"
    return None


def _unknown_version(request: pb.ModelConfigRequest | pb.ModelStatisticsRequest) -> str:
    return f"model {request.name!r} has no version {request.version}"


def model_config_response(config: dict) -> pb.ModelConfigResponse:
    """Triton's config JSON (see triton_config.model_config_json) as a ModelConfigResponse."""
    return pb.ModelConfigResponse(config=json_format.ParseDict(config, pb.ModelConfig()))


def model_statistics_response(stats: list[dict]) -> pb.ModelStatisticsResponse:
    """Triton's per-model stats JSON entries (see stats.ModelStats.to_json) as a ModelStatisticsResponse."""
    return json_format.ParseDict({"model_stats": stats}, pb.ModelStatisticsResponse())


def triton_extension_handler(
    config_for: Callable[[str], dict], stats_for: Callable[[str], list[dict]]
) -> grpc.GenericRpcHandler:
    """Async gRPC handlers (for a `grpc.aio` server) for Triton's ModelConfig and ModelStatistics.

    `config_for(name)` returns the model's config JSON; `stats_for(name)` its stats entries, one per
    version, and `stats_for("")` those of every model (Triton's "all models" query). Both raise
    KeyError for an unknown model, answered NOT_FOUND. Bad request fields are INVALID_ARGUMENT; a
    dict that does not fit the messages is a server bug and surfaces as INTERNAL via grpc.
    """

    async def model_config(request: pb.ModelConfigRequest, context: grpc.aio.ServicerContext) -> Message:
        problem = "model name is required" if not request.name else _check_version(request)
        if problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        try:
            config = config_for(request.name)
            # The config does not carry versions; the model's stats entries list them.
            versions = {entry.get("version") for entry in stats_for(request.name)}
        except KeyError:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown model {request.name!r}")
        except RequestError as exc:  # the hub's own refusals (not hosted, not ready) keep their codes
            await context.abort(exc.grpc_code, exc.message)
        if request.version and request.version not in versions:
            await context.abort(grpc.StatusCode.NOT_FOUND, _unknown_version(request))
        return model_config_response(config)

    async def model_statistics(request: pb.ModelStatisticsRequest, context: grpc.aio.ServicerContext) -> Message:
        problem = _check_version(request)
        if problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        try:
            stats = stats_for(request.name)
        except KeyError:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown model {request.name!r}")
        except RequestError as exc:
            await context.abort(exc.grpc_code, exc.message)
        if request.version:
            stats = [entry for entry in stats if entry.get("version") == request.version]
            if not stats:
                await context.abort(grpc.StatusCode.NOT_FOUND, _unknown_version(request))
        return model_statistics_response(stats)

    def unary(
        handler: Callable[..., Awaitable[Message]], request_type: type[Message], response_type: type[Message]
    ) -> grpc.RpcMethodHandler:
        return tolerant(
            grpc.unary_unary_rpc_method_handler(
                handler,
                request_deserializer=request_type.FromString,
                response_serializer=response_type.SerializeToString,
            )
        )

    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "ModelConfig": unary(model_config, pb.ModelConfigRequest, pb.ModelConfigResponse),
            "ModelStatistics": unary(model_statistics, pb.ModelStatisticsRequest, pb.ModelStatisticsResponse),
        },
    )
