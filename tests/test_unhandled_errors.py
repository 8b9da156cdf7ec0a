"""A bug met while answering (an unhandled exception) is a 500 / INTERNAL with a request id, logged on
ONE line with that id and the exception type; the traceback goes to DEBUG. Bugs are injected in-process."""

from __future__ import annotations

import logging
from typing import Any

import grpc
import orjson
import pytest
from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
from prometheus_client import CollectorRegistry

from batchpilot.runtime.demo_models import text_spec
from batchpilot.runtime.hub import HostedModel, ModelHub
from batchpilot.runtime.metrics import RuntimeMetrics
from batchpilot.runtime.protocol import grpc_codec, grpc_frontend, v2_codec
from batchpilot.runtime.protocol.rest import RestFrontend

SECRET = "zq-payload-in-exception-message"


def hub() -> ModelHub:
    hub = ModelHub(RuntimeMetrics(CollectorRegistry()))
    spec = text_spec()
    hub.add(HostedModel(spec.name, spec, batcher=None))
    return hub


def bug(*args: Any, **kwargs: Any) -> Any:
    raise KeyError(SECRET)  # a bug whose message quotes the payload: it must not reach the ERROR line


async def call_rest(
    app: RestFrontend, headers: list[tuple[bytes, bytes]]
) -> tuple[int, dict[bytes, bytes], dict[str, Any]]:
    sent: list[dict[str, Any]] = []
    body = b'{"inputs":[{"name":"input_ids","datatype":"INT64","shape":[1,1],"data":[1]}]}'

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v2/models/textcls/infer", "headers": headers}
    await app(scope, receive, send)
    return sent[0]["status"], dict(sent[0]["headers"]), orjson.loads(sent[1]["body"])


def errors_and_debug(caplog: pytest.LogCaptureFixture) -> tuple[list[logging.LogRecord], list[logging.LogRecord]]:
    records = [r for r in caplog.records if r.name.startswith("batchpilot")]
    return [r for r in records if r.levelno >= logging.WARNING], [r for r in records if r.levelno == logging.DEBUG]


@pytest.mark.parametrize("sent_id", [None, "client-id-42", "x" * 500])
async def test_rest_bug_is_a_500_with_a_request_id_and_one_log_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, sent_id: str | None
) -> None:
    monkeypatch.setattr(v2_codec, "decode", bug)
    app = RestFrontend(hub(), fallback=bug, max_body_bytes=1 << 20)
    caplog.set_level(logging.DEBUG, logger="batchpilot")
    headers = [] if sent_id is None else [(b"x-request-id", sent_id.encode())]
    status, reply_headers, doc = await call_rest(app, headers)

    assert status == 500
    rid = doc["request_id"]
    assert rid and reply_headers[b"x-request-id"] == rid.encode()
    assert doc["error"] == f"internal error: KeyError (request id {rid})"
    if sent_id == "client-id-42":
        assert rid == sent_id  # the client's id is kept, so both sides can find the request
    elif sent_id is not None:
        assert rid != sent_id and len(rid) == 32  # too long to be an id: one of ours instead
    errors, debug = errors_and_debug(caplog)
    assert len(errors) == 1, [r.getMessage() for r in errors]
    line = errors[0].getMessage()
    assert rid in line and "KeyError" in line and "\n" not in line and SECRET not in line
    assert errors[0].exc_info is None  # no traceback at ERROR
    assert any(r.exc_info and rid in r.getMessage() for r in debug)  # it is at DEBUG


async def test_rest_keeps_serving_after_a_bug(monkeypatch: pytest.MonkeyPatch) -> None:
    app = RestFrontend(hub(), fallback=bug, max_body_bytes=1 << 20)
    with monkeypatch.context() as patch:
        patch.setattr(v2_codec, "decode", bug)
        assert (await call_rest(app, []))[0] == 500
    status, _, doc = await call_rest(app, [])
    assert status == 503 and "not ready" in doc["error"]  # the normal answer of a model without a batcher


async def test_grpc_bug_is_internal_with_a_request_id_and_one_log_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(grpc_codec, "decode", bug)  # decoding lives in grpc_codec
    caplog.set_level(logging.DEBUG, logger="batchpilot")
    server = grpc.aio.server()
    grpc_frontend.add_servicer(grpc_frontend.BatchPilotServicer(hub(), None, None), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary(
                "/inference.GRPCInferenceService/ModelInfer", request_serializer=pb.ModelInferRequest.SerializeToString
            )
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await call(pb.ModelInferRequest(model_name="textcls"), metadata=(("x-request-id", "g-7"),), timeout=10)
            assert failed.value.code() == grpc.StatusCode.INTERNAL
            assert failed.value.details() == "internal error: KeyError (request id g-7)"
            ready = await channel.unary_unary("/inference.GRPCInferenceService/ServerReady")(b"", timeout=10)
            assert pb.ServerReadyResponse.FromString(ready).ready is False  # still answering
    finally:
        await server.stop(None)
    errors, debug = errors_and_debug(caplog)
    assert len(errors) == 1, [r.getMessage() for r in errors]
    line = errors[0].getMessage()
    assert "g-7" in line and "KeyError" in line and "ModelInfer" in line and SECRET not in line
    assert errors[0].exc_info is None and any(r.exc_info and "g-7" in r.getMessage() for r in debug)
