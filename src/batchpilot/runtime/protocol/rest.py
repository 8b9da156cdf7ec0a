"""The REST front-end: a plain ASGI layer in front of KServe's FastAPI app.

Inference, metadata, readiness and Triton's extensions are answered here directly (no FastAPI routing,
no per-request middleware, no Python lists for binary tensors); every other path falls through to
KServe's app unchanged (v1 model list, repository extension, /metrics, docs).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from batchpilot.runtime.batching.request import RECEIVED
from batchpilot.runtime.errors import InternalError, PayloadTooLarge, RequestError, report_unhandled, request_id
from batchpilot.runtime.hub import ModelHub
from batchpilot.runtime.protocol import v1_codec, v2_codec

log = logging.getLogger("batchpilot.rest")
_BINARY_HEADER = v2_codec.BINARY_HEADER.encode()

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]  # as in an ASGI scope: lower-case names
Response = tuple[int, bytes, dict[str, str]]  # status, body, headers
Handler = Callable[[Headers, bytes], Awaitable[Response]]  # (request headers, request body) -> response

#: Paths whose inference route is remembered (clients send the same few paths; past this many, it starts over).
_ROUTES_KEPT = 1024


class RestFrontend:
    """The ASGI app (`__call__`), and the same handling without ASGI for `fast_lane.py`: `inference_route`
    picks an inference handler from the request line, `respond` runs it on the body (errors included)."""

    def __init__(self, hub: ModelHub, fallback: ASGIApp, *, max_body_bytes: int) -> None:
        self.hub = hub
        self.fallback = fallback
        self.max_body_bytes = max_body_bytes
        self._routes: dict[str, Handler | None] = {}  # path -> its inference handler (None: not inference)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.fallback(scope, receive, send)
        method, path, headers = scope["method"], scope["path"], scope["headers"]
        handler = self.inference_route(method, path)
        if handler is not None:
            RECEIVED.set(time.perf_counter())
            try:
                body = await self._body(receive)
            except Exception as exc:
                status, body, reply_headers = self.error_response(exc, method, path, headers)
            else:
                status, body, reply_headers = await self.respond(handler, method, path, headers, body)
        else:
            view = self._view_route(method, path)
            if view is None:
                return await self.fallback(scope, receive, send)
            status, body, reply_headers = await self.respond(view, method, path, headers, b"")
        raw_headers = [(k.encode(), v.encode()) for k, v in reply_headers.items()]
        raw_headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": raw_headers})
        await send({"type": "http.response.body", "body": body})

    async def respond(self, handler: Handler, method: str, path: str, headers: Headers, body: bytes) -> Response:
        """`handler`'s response to `body`; a failure is answered here (a RequestError with its status, a
        bug with a 500 and a request id). Cancellation passes through."""
        try:
            return await handler(headers, body)
        except Exception as exc:
            return self.error_response(exc, method, path, headers)

    def error_response(self, exc: Exception, method: str, path: str, headers: Headers) -> Response:
        """The response to a failed request: a RequestError's status and message, or for anything else (a bug
        of ours) a 500 with a request id, reported on one log line (traceback at DEBUG)."""
        if isinstance(exc, RequestError):
            body = orjson.dumps({"error": exc.message})
            return exc.status, body, {"content-type": "application/json", **exc.headers()}
        sent = next((v.decode("latin-1") for k, v in headers if k == b"x-request-id"), None)
        rid = request_id(sent)
        message = report_unhandled(log, exc, f"{method} {path}", rid)
        body = orjson.dumps({"error": message, "request_id": rid})
        return 500, body, {"content-type": "application/json", "x-request-id": rid}

    def too_large(self) -> PayloadTooLarge:
        return PayloadTooLarge(f"request body exceeds the limit of {self.max_body_bytes} bytes")

    # -- routing ----------------------------------------------------------------------------------------
    def inference_route(self, method: str, path: str) -> Handler | None:
        """The handler of an inference request (POST /v2/models/{m}[/versions/{v}]/infer, POST
        /v1/models/{m}:predict), None for any other request."""
        if method != "POST":
            return None
        if path in self._routes:
            return self._routes[path]
        if len(self._routes) >= _ROUTES_KEPT:
            self._routes.clear()
        handler = self._routes[path] = self._inference_handler(path)
        return handler

    def _inference_handler(self, path: str) -> Handler | None:
        parts = path.strip("/").split("/")
        if len(parts) == 3 and parts[0] == "v1" and parts[1] == "models":
            model, _, verb = parts[2].partition(":")
            return (lambda headers, body: self._v1_predict(model, body)) if verb == "predict" else None
        if len(parts) < 4 or parts[0] != "v2" or parts[1] != "models":
            return None
        model, rest = parts[2], parts[3:]
        if len(rest) >= 2 and rest[0] == "versions":
            rest = rest[2:]  # one version per model: accept any version segment
        return (lambda headers, body: self._v2_infer(model, headers, body)) if rest == ["infer"] else None

    def _view_route(self, method: str, path: str) -> Handler | None:
        if method != "GET":
            return None
        parts = path.strip("/").split("/")
        if not parts or parts[0] != "v2":
            return self._ready if path == "/batchpilot/ready" else None
        if len(parts) == 1:
            return self._server_metadata
        if parts[1:] == ["health", "ready"]:
            return self._ready
        if len(parts) < 3 or parts[1] != "models":
            return None
        if parts[2] == "stats" and len(parts) == 3:
            return self._all_stats
        model, rest = parts[2], parts[3:]
        if len(rest) >= 2 and rest[0] == "versions":
            rest = rest[2:]
        views = {
            (): lambda: self.hub.model_metadata(model),
            ("ready",): lambda: self._model_ready(model),
            ("config",): lambda: self.hub.triton_config(model),
            ("stats",): lambda: {"model_stats": self.hub.triton_stats(model)},
            ("batching",): lambda: self.hub.batching(model).to_json(),
        }
        view = views.get(tuple(rest))
        return None if view is None else (lambda headers, body: self._json(view()))

    # -- views --------------------------------------------------------------------------------------------
    async def _json(self, doc: Any, status: int = 200) -> Response:
        if isinstance(doc, tuple):
            status, doc = doc
        return status, orjson.dumps(doc), {"content-type": "application/json"}

    def _model_ready(self, name: str) -> tuple[int, dict[str, Any]]:
        ready, error = self.hub.model_readiness(name)
        doc: dict[str, Any] = {"name": name, "ready": ready}
        if error:
            doc["error"] = error
        return (200 if ready else 503), doc

    async def _ready(self, headers: Headers, body: bytes) -> Response:
        return await self._json(
            (200 if self.hub.ready else 503, {"ready": self.hub.ready, "models": self.hub.readiness()})
        )

    async def _server_metadata(self, headers: Headers, body: bytes) -> Response:
        return await self._json(self.hub.server_metadata())

    async def _all_stats(self, headers: Headers, body: bytes) -> Response:
        return await self._json({"model_stats": self.hub.triton_stats()})

    # -- inference ------------------------------------------------------------------------------------------
    async def _body(self, receive: Receive) -> bytes:
        """The request body, refused with 413 past the limit. A moderately oversized body is read to its
        end (and dropped) so the client gets the 413 instead of a reset connection."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise asyncio.CancelledError
            chunk = message.get("body", b"")
            size += len(chunk)
            if size <= self.max_body_bytes:
                chunks.append(chunk)
            elif size > 4 * self.max_body_bytes:
                break
            if not message.get("more_body", False):
                break
        if size > self.max_body_bytes:
            raise self.too_large()
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def _v2_infer(self, model: str, headers: Headers, body: bytes) -> Response:
        header_length = None
        for key, value in headers:
            if key == _BINARY_HEADER:
                header_length = value.decode("latin-1")
        request = v2_codec.decode(body, header_length)
        spec, outputs = await self.hub.infer(
            model, request.inputs, outputs=request.outputs, priority=request.priority, timeout_us=request.timeout_us
        )
        reply, reply_headers = v2_codec.encode(spec, request, outputs)
        return 200, reply, reply_headers

    async def _v1_predict(self, model: str, body: bytes) -> Response:
        spec = self.hub.spec(model)
        groups = v1_codec.decode(spec, body)
        results: list[Any]
        if len(groups) == 1:  # one request (a stacked model's instances): no task to gather
            try:
                results = [await self.hub.infer(model, groups[0])]
            except Exception as exc:
                results = [exc]
        else:
            results = await asyncio.gather(*(self.hub.infer(model, g) for g in groups), return_exceptions=True)
        answers = []
        for result in results:
            if isinstance(result, BaseException):
                raise result if isinstance(result, RequestError) else InternalError(str(result))
            answers.append(result[1])
        return 200, v1_codec.encode(spec, answers), {"content-type": "application/json"}
