"""The fast lane (protocol/fast_lane.py) answers inference requests in the HTTP protocol, without uvicorn's
ASGI cycle, and must answer exactly as that path does.

Each test serves the demo models in-process with uvicorn and the protocol of `limits.bounded_http_protocol`
on loopback, the fast lane on (or off, for the reference answers), and talks to it over raw sockets:
byte-identical responses (but the date) for good and bad requests; pipelined requests of both lanes answered
in order; `Expect: 100-continue`; chunked bodies; an early 413 after which the connection still serves;
clients that vanish mid-request leave nothing behind; graceful shutdown answers what is in flight; and the
deadlines of limits.py (body, idle, header) act on fast-lane requests too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import uvicorn
from prometheus_client import CollectorRegistry

from batchpilot.runtime.metrics import RuntimeMetrics
from batchpilot.runtime.protocol import v2_codec
from batchpilot.runtime.protocol.fast_lane import FastLaneProtocol
from batchpilot.runtime.protocol.limits import ConnectionLimits, configure
from batchpilot.runtime.protocol.rest import Headers, Response, RestFrontend
from batchpilot.runtime.repository import ModelEntry, load_repository
from batchpilot.runtime.server import ServerOptions, build_hub
from batchpilot.testing.requests import v2_binary_body

MAX_BODY = 64 * 1024
TOKENS = json.dumps(
    {"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, 8], "data": list(range(1, 9))}]}
).encode()
READY = b"GET /v2/health/ready HTTP/1.1\r\nhost: x\r\n\r\n"


def post(path: str, body: bytes, *headers: str, version: str = "1.1", length: bool = True) -> bytes:
    lines = [f"POST {path} HTTP/{version}", "host: x", *headers]
    if length:
        lines.append(f"content-length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def chunked(path: str, pieces: list[bytes]) -> bytes:
    head = post(path, b"", "transfer-encoding: chunked", length=False)
    return head + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


class Frontend(RestFrontend):
    """The real front-end; counts the requests that reach its ASGI entry, and may delay v2 inference."""

    def __init__(self, *args: Any, delay_s: float = 0.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.asgi_calls = 0
        self.delay_s = delay_s

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.asgi_calls += scope["type"] == "http"
        await super().__call__(scope, receive, send)

    async def _v2_infer(self, model: str, headers: Headers, body: bytes) -> Response:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        return await super()._v2_infer(model, headers, body)


async def fallback(scope: Any, receive: Any, send: Any) -> None:
    """Stands for KServe's app: whatever the front-end does not answer."""
    body = f"fallback {scope['method']} {scope['path']}".encode()
    headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 404, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@dataclass
class Served:
    port: int
    server: uvicorn.Server
    frontend: Frontend
    metrics: RuntimeMetrics

    def counted(self, kind: str, reason: str) -> float:
        counter = self.metrics.connections_timed_out if kind == "timed_out" else self.metrics.connections_refused
        return counter.labels(reason=reason)._value.get()


@pytest.fixture(scope="module")
def entries(demo_repository: Path) -> list[ModelEntry]:
    return load_repository(demo_repository, torch.device("cpu"))


@contextlib.asynccontextmanager
async def serving(
    entries: list[ModelEntry], *, fast: bool = True, limits: ConnectionLimits | None = None, delay_s: float = 0.0
) -> AsyncIterator[Served]:
    metrics = RuntimeMetrics(CollectorRegistry())
    hub = build_hub(entries, torch.device("cpu"), metrics, ServerOptions(model_repository=Path(".")))
    batchers = [m.batcher for m in hub.models.values() if m.batcher is not None]
    for batcher in batchers:
        batcher.start()
    frontend = Frontend(hub, fallback, max_body_bytes=MAX_BODY, delay_s=delay_s)
    config = uvicorn.Config(frontend, host="127.0.0.1", port=0, log_config=None, lifespan="off")
    config.timeout_graceful_shutdown = 10
    limits = limits or ConnectionLimits()
    configure(config, limits, metrics.connections_timed_out, metrics.connections_refused, frontend if fast else None)
    server = uvicorn.Server(config)
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield Served(port, server, frontend, metrics)
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 15)
        await asyncio.gather(*(b.drain() for b in batchers))


async def read_response(reader: asyncio.StreamReader, bodiless: bool = False) -> bytes:
    """One response (status line, headers, body by content-length unless `bodiless`), without `date`."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    lines = []
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.lower() == b"content-length":
            length = int(value)
        if name.lower() != b"date":
            lines.append(line)
    return b"\r\n".join(lines) + (b"" if bodiless else await reader.readexactly(length))


async def exchange(port: int, data: bytes, responses: int = 1) -> tuple[list[bytes], bool]:
    """Send `data` on a new connection, read `responses` responses; and whether the server then closed it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        bodiless = data.startswith(b"HEAD ")
        replies = [await asyncio.wait_for(read_response(reader, bodiless), 30) for _ in range(responses)]
        try:
            closed = await asyncio.wait_for(reader.read(1), 0.3) == b""
        except asyncio.TimeoutError:
            closed = False
        return replies, closed
    finally:
        writer.close()


def status(reply: bytes) -> int:
    return int(reply.split(b" ", 2)[1])


ids = np.arange(1, 9, dtype=np.int64).reshape(1, 8)
BINARY, BINARY_HEADERS = v2_binary_body("input_ids", "INT64", ids, ["logits", "token_scores"])
#: (request, responses it gets, taken by the fast lane)
CASES: dict[str, tuple[bytes, int, bool]] = {
    "v2 JSON": (post("/v2/models/textcls/infer", TOKENS, "content-type: application/json"), 1, True),
    "v2 binary": (post("/v2/models/textcls/infer", BINARY, *(f"{k}: {v}" for k, v in BINARY_HEADERS.items())), 1, True),
    "v2 version": (post("/v2/models/textcls/versions/7/infer", TOKENS), 1, True),
    "v2 percent-encoded path": (post("/v2/models/text%63ls/infer", TOKENS), 1, True),
    "v1": (post("/v1/models/textcls:predict", b'{"instances": [[5, 6, 7], [8, 9]]}'), 1, True),
    "not JSON": (post("/v2/models/textcls/infer", b'{"inputs": ['), 1, True),
    "unknown model": (post("/v2/models/nope/infer", TOKENS), 1, True),
    "wrong datatype": (post("/v2/models/textcls/infer", TOKENS.replace(b"INT64", b"FP32")), 1, True),
    "bad binary header": (post("/v2/models/textcls/infer", b"{}", "inference-header-content-length: abc"), 1, True),
    "model fails": (post("/v2/models/textcls/infer", TOKENS.replace(b"[1, 2,", b"[99999, 2,")), 1, True),
    "v1 no instances": (post("/v1/models/textcls:predict", b'{"inputs": []}'), 1, True),
    "too large": (post("/v2/models/textcls/infer", b"x" * (MAX_BODY + 1)), 1, True),
    "too large, connection close": (
        post("/v2/models/textcls/infer", b"x" * (3 * MAX_BODY), "connection: close"),
        1,
        True,
    ),
    "too large, past 4x": (post("/v2/models/textcls/infer", b"x" * (4 * MAX_BODY + 10)), 1, True),
    "chunked": (chunked("/v2/models/textcls/infer", [TOKENS[:10], TOKENS[10:]]), 1, True),
    "chunked, too large": (chunked("/v2/models/textcls/infer", [b"x" * 40000, b"x" * 40000]), 1, True),
    "connection close": (post("/v2/models/textcls/infer", TOKENS, "connection: close"), 1, True),
    "HTTP/1.0": (post("/v2/models/textcls/infer", TOKENS, version="1.0"), 1, True),
    "HTTP/1.0 keep-alive": (post("/v2/models/textcls/infer", TOKENS, "connection: keep-alive", version="1.0"), 1, True),
    "two on one connection": (post("/v2/models/textcls/infer", TOKENS) * 2, 2, True),
    "HEAD on infer": (b"HEAD /v2/models/textcls/infer HTTP/1.1\r\nhost: x\r\n\r\n", 1, False),
    "GET on infer": (b"GET /v2/models/textcls/infer HTTP/1.1\r\nhost: x\r\n\r\n", 1, False),
    "PUT on infer": (b"PUT /v2/models/textcls/infer HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n", 1, False),
    "POST elsewhere": (post("/v2/models/textcls/ready", TOKENS), 1, False),
    "GET view": (READY, 1, False),
}


async def all_replies(entries: list[ModelEntry], fast: bool) -> tuple[dict[str, tuple[list[bytes], bool]], int]:
    async with serving(entries, fast=fast) as served:
        replies = {label: await exchange(served.port, data, n) for label, (data, n, _) in CASES.items()}
        return replies, served.frontend.asgi_calls


async def test_the_fast_lane_answers_byte_for_byte_as_the_asgi_path(entries: list[ModelEntry]) -> None:
    fast, fast_asgi_calls = await all_replies(entries, fast=True)
    slow, slow_asgi_calls = await all_replies(entries, fast=False)
    for label in CASES:
        assert fast[label] == slow[label], (label, fast[label], slow[label])
    statuses = {label: [status(r) for r in replies] for label, (replies, _) in fast.items()}
    assert statuses["v2 JSON"] == statuses["v1"] == statuses["chunked"] == statuses["HTTP/1.0"] == [200]
    assert statuses["unknown model"] == [404] and statuses["model fails"] == [422] and statuses["not JSON"] == [400]
    assert statuses["too large"] == statuses["too large, past 4x"] == statuses["chunked, too large"] == [413]
    closing = ("connection close", "HTTP/1.0", "too large, connection close")
    assert all(b"connection: close" in fast[label][0][0] and fast[label][1] for label in closing)
    assert fast["connection close"][1] and fast["HTTP/1.0"][1] and not fast["v2 JSON"][1]
    assert b"server: uvicorn" in fast["v2 JSON"][0][0]  # uvicorn's default headers, as on its own path
    taken = sum(n for data, n, on_fast_lane in CASES.values() if on_fast_lane)
    assert slow_asgi_calls == fast_asgi_calls + taken  # the fast lane really took them


async def test_a_bug_is_a_500_with_the_clients_request_id(
    entries: list[ModelEntry], monkeypatch: pytest.MonkeyPatch
) -> None:
    def bug(*args: Any) -> Any:
        raise KeyError("a bug")

    monkeypatch.setattr(v2_codec, "decode", bug)
    request = post("/v2/models/textcls/infer", TOKENS, "x-request-id: client-7")
    async with serving(entries) as served:
        (reply,), _ = await exchange(served.port, request)
        assert served.frontend.asgi_calls == 0
    assert status(reply) == 500 and b"x-request-id: client-7\r\n" in reply
    doc = json.loads(reply.split(b"\r\n\r\n", 1)[1])
    assert doc == {"error": "internal error: KeyError (request id client-7)", "request_id": "client-7"}


async def test_pipelined_requests_of_both_lanes_are_answered_in_order(entries: list[ModelEntry]) -> None:
    """The first request takes a while; the ones behind it (either lane) must wait for its answer."""
    pipelined = (
        post("/v2/models/textcls/infer", TOKENS)
        + READY
        + post("/v2/models/nope/infer", TOKENS)
        + post("/v1/models/textcls:predict", b'{"instances": [[5, 6, 7]]}')
        + READY
        + post("/v2/models/textcls/infer", TOKENS)
    )
    got = {}
    for fast in (True, False):
        async with serving(entries, fast=fast, delay_s=0.2) as served:
            got[fast], _ = await exchange(served.port, pipelined, 6)
    assert got[True] == got[False]
    assert [status(r) for r in got[True]] == [200, 200, 404, 200, 200, 200]
    assert b'"outputs"' in got[True][0] and b'"ready"' in got[True][1] and b'"predictions"' in got[True][3]


async def test_expect_100_continue(entries: list[ModelEntry]) -> None:
    async with serving(entries) as served:
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        head = post("/v2/models/textcls/infer", TOKENS, "expect: 100-continue")[: -len(TOKENS)]
        writer.write(head)
        assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10) == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(TOKENS)
        assert status(await asyncio.wait_for(read_response(reader), 30)) == 200
        # Too large: refused at once, without "100 Continue", and the connection closes (no body may follow).
        writer.write(
            post(
                "/v2/models/textcls/infer", b"", "expect: 100-continue", f"content-length: {MAX_BODY + 1}", length=False
            )
        )
        reply = await asyncio.wait_for(read_response(reader), 10)
        assert status(reply) == 413 and b"connection: close" in reply
        assert await asyncio.wait_for(reader.read(), 10) == b""
        writer.close()


async def test_too_large_is_refused_before_the_body_and_the_connection_still_serves(entries: list[ModelEntry]) -> None:
    async with serving(entries) as served:
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        size = 3 * MAX_BODY
        writer.write(post("/v2/models/textcls/infer", b"", f"content-length: {size}", length=False))
        reply = await asyncio.wait_for(read_response(reader), 10)  # before any byte of the body
        assert status(reply) == 413 and b"exceeds the limit of 65536 bytes" in reply
        writer.write(b"x" * size)  # read and dropped
        writer.write(post("/v2/models/textcls/infer", TOKENS))
        assert status(await asyncio.wait_for(read_response(reader), 30)) == 200
        # Chunked: the 413 comes once the body is past the limit, before it ends.
        writer.write(post("/v2/models/textcls/infer", b"", "transfer-encoding: chunked", length=False))
        writer.write(b"%x\r\n%s\r\n" % (MAX_BODY + 1, b"x" * (MAX_BODY + 1)))
        assert status(await asyncio.wait_for(read_response(reader), 10)) == 413
        writer.write(b"4\r\nxxxx\r\n0\r\n\r\n" + post("/v2/models/textcls/infer", TOKENS))
        assert status(await asyncio.wait_for(read_response(reader), 30)) == 200
        writer.close()


async def test_clients_that_leave_mid_request_leave_nothing_behind(
    entries: list[ModelEntry], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    async with serving(entries, delay_s=0.3) as served:
        state = served.server.server_state
        leaving = [
            post("/v2/models/textcls/infer", TOKENS),  # gone while its handler runs
            post("/v2/models/textcls/infer", TOKENS)[:-10],  # gone mid-body
            post("/v2/models/textcls/infer", TOKENS) * 3,  # gone with two more queued behind the first
            post("/v2/models/textcls/infer", TOKENS) + READY,  # and with a request of uvicorn's lane queued
        ]
        for data in leaving * 5:
            _, writer = await asyncio.open_connection("127.0.0.1", served.port)
            writer.write(data)
            await writer.drain()
            await asyncio.sleep(0.02)
            writer.close()
        deadline = time.monotonic() + 5
        while (state.connections or state.tasks) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert not state.connections and not state.tasks, (state.connections, state.tasks)
        (reply,), _ = await exchange(served.port, post("/v2/models/textcls/infer", TOKENS))
        assert status(reply) == 200  # still serving
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], [r.getMessage() for r in caplog.records]


async def test_graceful_shutdown_answers_the_requests_in_flight(entries: list[ModelEntry]) -> None:
    async with serving(entries, delay_s=0.5) as served:
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        writer.write(post("/v2/models/textcls/infer", TOKENS) * 2)  # one in flight, one queued behind it
        idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", served.port)
        idle_writer.write(post("/v2/models/textcls/infer", TOKENS))
        assert status(await asyncio.wait_for(read_response(idle_reader), 30)) == 200
        await asyncio.sleep(0.1)
        served.server.should_exit = True  # uvicorn's shutdown: stop accepting, ask each connection to end
        first = await asyncio.wait_for(read_response(reader), 30)
        second = await asyncio.wait_for(read_response(reader), 30)
        assert status(first) == status(second) == 200
        assert b"connection: close" not in first and b"connection: close" in second
        assert await asyncio.wait_for(reader.read(), 10) == b""
        assert await asyncio.wait_for(idle_reader.read(), 10) == b""  # the idle connection is closed
        writer.close()
        idle_writer.close()


async def test_deadlines_and_caps_act_on_the_fast_lane(entries: list[ModelEntry]) -> None:
    limits = ConnectionLimits(
        header_timeout_s=0.6, body_timeout_s=0.6, keep_alive_timeout_s=0.6, max_connections=8, max_header_bytes=4096
    )

    async def until_closed(reader: asyncio.StreamReader) -> tuple[bytes, float]:
        start = time.monotonic()
        return await asyncio.wait_for(reader.read(), 10), time.monotonic() - start

    async with serving(entries, limits=limits) as served:
        # body: headers, part of the body, then nothing: 408 and closed
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        writer.write(post("/v2/models/textcls/infer", TOKENS)[:-10])
        reply, after = await until_closed(reader)
        assert reply.startswith(b"HTTP/1.1 408") and b"body timeout" in reply and 0.4 < after < 3, (reply, after)
        # idle: answered on the fast lane, then the keep-alive timer closes it (silently)
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        writer.write(post("/v2/models/textcls/infer", TOKENS))
        assert status(await asyncio.wait_for(read_response(reader), 30)) == 200
        reply, after = await until_closed(reader)
        assert reply == b"" and 0.4 < after < 3, (reply, after)
        # header: answered, then half a request line: 408 from the first byte's deadline
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        writer.write(post("/v2/models/textcls/infer", TOKENS) + b"POST /v2/models/textcls/in")
        assert status(await asyncio.wait_for(read_response(reader), 30)) == 200
        reply, after = await until_closed(reader)
        assert reply.startswith(b"HTTP/1.1 408") and b"header timeout" in reply, reply
        # header size cap, on an inference request
        (reply,), closed = await exchange(served.port, post("/v2/models/textcls/infer", TOKENS, "x-big: " + "a" * 5000))
        assert status(reply) == 400 and closed
        # connection cap
        held = [await asyncio.open_connection("127.0.0.1", served.port) for _ in range(8)]
        await asyncio.sleep(0.1)
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        assert (await asyncio.wait_for(reader.read(), 10)).startswith(b"HTTP/1.1 503")
        for _, w in held:
            w.close()
        assert served.counted("timed_out", "body") == 1 and served.counted("timed_out", "idle") == 1
        assert served.counted("timed_out", "header") == 1 and served.counted("refused", "header_too_large") == 1
        assert served.counted("refused", "max_connections") == 1


def test_the_fast_lane_is_on_only_with_a_frontend() -> None:
    from prometheus_client import Counter

    registry = CollectorRegistry()
    timed_out = Counter("t", "t", ["reason"], registry=registry)
    refused = Counter("r", "r", ["reason"], registry=registry)
    frontend = RestFrontend(None, fallback, max_body_bytes=1)  # type: ignore[arg-type]
    config = uvicorn.Config(frontend)
    configure(config, ConnectionLimits(), timed_out, refused, frontend)
    assert issubclass(config.http, FastLaneProtocol) and config.http.frontend is frontend
    configure(config, ConnectionLimits(), timed_out, refused)
    assert issubclass(config.http, FastLaneProtocol) and config.http.frontend is None


@pytest.mark.parametrize("fast", [True, False], ids=["fast lane", "asgi"])
async def test_a_requests_latency_in_the_server_counts_from_the_front_ends_read(
    entries: list[ModelEntry], fast: bool
) -> None:
    """What happens between the front-end's read of a request and its queue (decoding, waiting behind other
    requests for the front-end; here a 0.3-s pause) is the request's latency in the server, not its queue's."""
    async with serving(entries, fast=fast, delay_s=0.3) as served:
        (reply,), _ = await exchange(served.port, CASES["v2 JSON"][0])
        assert status(reply) == 200
        latency = served.metrics.latency.labels(model="textcls")._sum.get()
        queued = served.metrics.queue_wait.labels(model="textcls")._sum.get()
    assert 0.3 <= latency < 10 and queued < 0.3
