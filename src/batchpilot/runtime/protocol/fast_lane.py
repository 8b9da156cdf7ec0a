"""The fast lane: inference requests answered by the HTTP protocol itself, without uvicorn's ASGI cycle.

For every request uvicorn builds a scope, a `RequestResponseCycle`, receive/send message dicts, and validates
the response headers: about as much CPU as a trivial model's whole answer. `FastLaneProtocol` is uvicorn's
httptools protocol that, when a request's headers are complete and it is a POST to an inference route
(`RestFrontend.inference_route`), takes it itself: the body is gathered from the parser, and once complete
the handler runs as one task (`RestFrontend.respond`: the same handling, validation and error answers as the
ASGI path) and the response leaves in one write. Everything else (other methods and paths, upgrades) goes
through uvicorn's path untouched.

A `FastRequest` stands where a cycle would, for uvicorn's own connection logic and limits.py's: it is
`self.cycle` while it is the newest request, and waits in `self.pipeline` behind an unanswered request, so
pipelined requests of both lanes are answered in order, reading pauses while one is queued, and graceful
shutdown (`keep_alive = False` on the newest request, waiting for connections and `self.tasks`) applies
unchanged. As on uvicorn's path: `Expect: 100-continue` is answered when the request's turn comes, a body
past `max_body_bytes` gets its 413 as soon as its size is known (the rest is read and dropped), and a client
that disconnects gets nothing (its handler finishes; the answer is dropped).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import urllib.parse
from typing import Any, ClassVar

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from batchpilot.runtime.batching.request import RECEIVED
from batchpilot.runtime.protocol.rest import Handler, Headers, Response, RestFrontend

log = logging.getLogger("batchpilot.fast_lane")

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_READ_BUFFER_BYTES = 256 * 1024
_read_buffers = threading.local()


def _read_buffer() -> memoryview:
    """This thread's buffer that sockets are read into: one for every connection of its event loop, since a read
    is parsed (and every part the parser hands on is copied out) before the loop reads another socket."""
    buffer: memoryview | None = getattr(_read_buffers, "buffer", None)
    if buffer is None:
        buffer = _read_buffers.buffer = memoryview(bytearray(_READ_BUFFER_BYTES))
    return buffer


class FastRequest:
    """One request on the fast lane, with the attributes the protocol reads of a cycle."""

    __slots__ = (
        "body_complete",
        "chunks",
        "close_after_body",
        "disconnected",
        "expect_100",
        "handler",
        "headers",
        "keep_alive",
        "path",
        "received",
        "response_complete",
        "response_started",
        "size",
        "started",
        "too_large",
    )

    def __init__(
        self, handler: Handler, path: str, headers: Headers, keep_alive: bool, expect_100: bool, too_large: bool
    ) -> None:
        self.handler = handler
        self.path = path
        self.headers = headers
        self.keep_alive = keep_alive
        self.expect_100 = expect_100
        self.too_large = too_large
        self.received = time.perf_counter()  # its head was read (its latency in the server counts from here)
        self.chunks: list[bytes] = []
        self.size = 0
        self.body_complete = False
        self.started = False  # its turn came (nothing unanswered before it on the connection)
        self.response_started = False
        self.response_complete = False
        self.disconnected = False
        self.close_after_body = False  # answered (413) before its body was read: close once it is


def _declared_length(headers: Headers) -> int:
    for name, value in headers:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return 0
    return 0


class FastLaneProtocol(HttpToolsProtocol, asyncio.BufferedProtocol):
    """uvicorn's httptools protocol with the fast lane for inference requests (off while `frontend` is None).

    It reads as a BufferedProtocol: the loop receives into a reused buffer that the parser reads, instead of
    allocating a bytes object per read that the parser then copies the body out of (a 49 KB tensor was copied
    twice)."""

    frontend: ClassVar[RestFrontend | None] = None
    _active: FastRequest | None = None  # the fast request being answered
    _head_cache: ClassVar[tuple[object, bytes]] = (None, b"")  # (uvicorn's default headers, their bytes)

    # -- parser callbacks -------------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        if self.frontend is None:
            return super().on_message_begin()
        # uvicorn's per-request state but its scope, which only its own lane needs (built in _uvicorn_lane)
        self.url = b""
        self.expect_100_continue = False
        self.headers = []

    def _uvicorn_lane(self) -> None:
        if self.frontend is not None:  # the scope on_message_begin left out, around this request's parts
            url, headers, expect_100 = self.url, self.headers, self.expect_100_continue
            super().on_message_begin()
            self.url, self.headers, self.expect_100_continue = url, headers, expect_100
            self.scope["headers"] = headers
        super().on_headers_complete()

    def on_headers_complete(self) -> None:
        frontend = self.frontend
        parser = self.parser
        if (
            frontend is None
            or parser.get_method() != b"POST"
            or parser.should_upgrade()
            or self.limit_concurrency is not None
        ):
            return self._uvicorn_lane()
        path = httptools.parse_url(self.url).path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)
        path = self.root_path + path
        handler = frontend.inference_route("POST", path)
        if handler is None:
            return self._uvicorn_lane()
        keep_alive = parser.get_http_version() != "1.0" and parser.should_keep_alive()
        too_large = _declared_length(self.headers) > frontend.max_body_bytes
        request = FastRequest(handler, path, self.headers, keep_alive, self.expect_100_continue, too_large)
        previous = self.cycle
        self.cycle = request  # type: ignore[assignment]
        if previous is None or previous.response_complete:
            self._start(request)
        else:  # pipelined behind an unanswered request: its turn comes in on_response_complete
            self.flow.pause_reading()
            self.pipeline.appendleft((request, None))  # type: ignore[arg-type]

    def on_body(self, body: bytes) -> None:
        request = self.cycle
        if type(request) is not FastRequest:
            return super().on_body(body)
        request.size += len(body)
        if request.response_complete:  # answered already (413): the rest of the body is read and dropped
            if request.close_after_body and request.size > 4 * self._max_body():
                self.transport.close()  # as uvicorn's path: it stops reading past 4x the limit
            return
        if request.size <= self._max_body():
            request.chunks.append(body)
            return
        request.too_large = True
        request.chunks = []
        if request.started:
            self._refuse_too_large(request)

    def on_message_complete(self) -> None:
        request = self.cycle
        if type(request) is not FastRequest:
            return super().on_message_complete()
        if request.response_complete:
            if request.close_after_body:
                self.transport.close()
            return
        request.body_complete = True
        if request.started and not request.too_large:
            self._run(request)

    # -- the connection -----------------------------------------------------------------------------------
    def get_buffer(self, sizehint: int) -> memoryview:
        return _read_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(_read_buffer()[:nbytes])  # type: ignore[arg-type]  # the parser takes any buffer

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        if type(cycle) is FastRequest:
            self._start(cycle)
        else:
            super()._start_asgi_task(cycle, app)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timeout_keep_alive_task is not None:
            self.timeout_keep_alive_task.cancel()
            self.timeout_keep_alive_task = None
        for request in (self._active, self.cycle):
            if type(request) is FastRequest:
                request.disconnected = True  # its answer, if one comes, is dropped
        if type(self.cycle) is FastRequest:
            self.cycle = None  # uvicorn's part below is for its own cycles
        self._active = None
        super().connection_lost(exc)

    # -- the keep-alive timeout ----------------------------------------------------------------------------
    # uvicorn arms a timer when a response ends and cancels it on the next read: a timer made and cancelled per
    # request. Here one timer stays armed while the connection is in use; when it fires, it looks at when the
    # connection last went idle, and closes it, arms itself again for the rest, or (busy) waits to be re-armed.
    _idle_from: float | None = None  # loop time the last response ended; None while a request is under way

    def _unset_keepalive_if_required(self) -> None:  # uvicorn calls it on every read
        self._idle_from = None

    def on_response_complete(self) -> None:
        """uvicorn's, with the idle timer above."""
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self._idle_from = None
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            return
        self._idle_from = self.loop.time()
        if self.timeout_keep_alive_task is None:
            self._arm_idle_timer(self._idle_from + self.timeout_keep_alive)

    def _arm_idle_timer(self, at: float) -> None:
        self.timeout_keep_alive_task = self.loop.call_at(at, self._idle_timer_fired)

    def _idle_timer_fired(self) -> None:
        self.timeout_keep_alive_task = None
        if self._idle_from is None:
            return  # in use: the end of its response arms the timer again
        due = self._idle_from + self.timeout_keep_alive
        if self.loop.time() < due:
            self._arm_idle_timer(due)
        else:
            self.timeout_keep_alive_handler()

    # -- answering ----------------------------------------------------------------------------------------
    def _max_body(self) -> int:
        assert self.frontend is not None
        return self.frontend.max_body_bytes

    def _start(self, request: FastRequest) -> None:
        """The request's turn: answer it if it can be, else let its body come."""
        request.started = True
        self._active = request
        if request.too_large:
            self._refuse_too_large(request)
        elif request.body_complete:
            self._run(request)
        else:
            if request.expect_100 and not self.transport.is_closing():
                self.transport.write(_CONTINUE)
            self.flow.resume_reading()

    def _refuse_too_large(self, request: FastRequest) -> None:
        frontend = self.frontend
        assert frontend is not None
        if not request.body_complete:
            if request.expect_100:
                request.keep_alive = False  # told before "100 Continue": the client may never send the body
            else:
                # A client still sending would get a reset for its answer: the body is read first (up to 4x).
                request.close_after_body = not request.keep_alive
        self._answer(request, frontend.error_response(frontend.too_large(), "POST", request.path, request.headers))

    def _run(self, request: FastRequest) -> None:
        chunks = request.chunks
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        request.chunks = []
        task = self.loop.create_task(self._serve(request, body))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)  # uvicorn's shutdown waits for these

    async def _serve(self, request: FastRequest, body: bytes) -> None:
        frontend = self.frontend
        assert frontend is not None
        RECEIVED.set(request.received)  # (in this task's own context)
        response = await frontend.respond(request.handler, "POST", request.path, request.headers, body)
        if self.flow.write_paused and not request.disconnected:
            await self.flow.drain()  # as uvicorn's send: a client that does not read gets no more
        self._answer(request, response)

    def _answer(self, request: FastRequest, response: Response) -> None:
        """Write `response` (status line, headers, body: one write), then pass the turn on as uvicorn does."""
        request.response_started = request.response_complete = True
        if self._active is request:
            self._active = None
        if request.disconnected or self.transport.is_closing():
            return
        status, body, headers = response
        try:
            head = self._head(status, headers, len(body), request.keep_alive)
        except Exception:  # a bug of ours (an unknown status): no half-written response
            log.exception("cannot write the response to POST %s", request.path)
            self.transport.close()
            return
        self.transport.writelines((head, body))
        if not request.keep_alive and not request.close_after_body:
            self.transport.close()
        self.on_response_complete()

    def _head(self, status: int, headers: dict[str, str], length: int, keep_alive: bool) -> bytes:
        """The status line and headers as uvicorn writes them: its default headers (date, server) first."""
        defaults, encoded = self._head_cache
        if defaults is not self.server_state.default_headers:
            defaults = self.server_state.default_headers
            encoded = b"".join(name + b": " + value + b"\r\n" for name, value in defaults)
            type(self)._head_cache = (defaults, encoded)
        parts = [STATUS_LINE[status], encoded]
        for name, value in headers.items():
            parts.append(f"{name}: {value}\r\n".encode())
        parts.append(b"content-length: %d\r\n" % length)
        if not keep_alive:
            parts.append(b"connection: close\r\n")
        parts.append(b"\r\n")
        return b"".join(parts)
