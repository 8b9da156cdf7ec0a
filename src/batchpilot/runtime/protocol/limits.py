"""Bounds on HTTP connections: slow or idle clients are timed out and counted, connections are capped.

uvicorn alone bounds only the idle time *between* requests (`timeout_keep_alive`): a client that connects
and sends nothing, or trickles its headers or its body a byte at a time, holds its connection (a file
descriptor, buffers, a parser) for as long as it likes. `bounded_http_protocol` is uvicorn's httptools
protocol with deadlines where they act, on the connection itself (so every path, KServe's fallback app
included, is covered):

- header: the request line and headers must be complete within `header_timeout_s` of the connection
  opening (a new connection) or of the first byte of the next request (a kept-alive one);
- body: the body must be complete within `body_timeout_s` of the end of the headers (a total deadline,
  not an inactivity timer, which a byte every few seconds would keep alive);
- idle: a kept-alive connection with no new request within `keep_alive_timeout_s` is closed (uvicorn's
  own timer, now counted);
- at most `max_connections` open connections: one past it is answered 503 and closed at once, so the
  process keeps file descriptors for the connections it serves (and for gRPC and the model files);
- headers of more than `max_header_bytes` end the connection (400) instead of growing a buffer;
- on shutdown, a request whose body is still arriving has at most `SHUTDOWN_BODY_S` more to finish it
  (it is not accepted yet), so a client trickling its body cannot hold the drain for the body timeout.

gRPC gets the same bounds from grpc C-core's own options (`grpc_options`). A timed-out request that has
not been answered gets a 408 before the close. Every timeout is counted in
batchpilot_connections_timed_out_total{reason=header|body|idle}, every refusal in
batchpilot_connections_refused_total{reason=max_connections|header_too_large}.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter

from batchpilot.runtime.protocol.one_send import OneSendTransport

if TYPE_CHECKING:
    from batchpilot.runtime.protocol.rest import RestFrontend

log = logging.getLogger("batchpilot.limits")

#: Why the server closed a connection (label `reason`): too slow or idle, or past a limit.
TIMEOUT_REASONS = ("header", "body", "idle")
REFUSAL_REASONS = ("max_connections", "header_too_large")


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    #: As KServe sets it: longer than the 60 s idle timeout of common load balancers, so that they, not we,
    #: close an idle upstream connection (closing first races with a request they are sending on it).
    keep_alive_timeout_s: float = 65.0
    max_connections: int = 0  # 0: derived from the file descriptor limit (see resolved_max_connections)
    max_header_bytes: int = 64 * 1024

    def __post_init__(self) -> None:
        for name in ("header_timeout_s", "body_timeout_s", "keep_alive_timeout_s", "max_header_bytes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, not {getattr(self, name)!r}")
        if self.max_connections < 0:
            raise ValueError(f"max_connections must be 0 (automatic) or positive, not {self.max_connections!r}")

    def resolved_max_connections(self) -> int:
        """`max_connections`, or when 0: half the soft file descriptor limit (the other half is left to gRPC,
        the model files and logs), at most 10 000 and at least 16."""
        if self.max_connections > 0:
            return self.max_connections
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return 10_000
        return max(16, min(10_000, soft // 2))


def _response(status: bytes, message: str) -> bytes:
    body = b'{"error": "' + message.encode() + b'"}'
    return (
        b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\nconnection: close\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )


#: On shutdown, the most time a request whose body is still arriving gets to finish it.
SHUTDOWN_BODY_S = 5.0

_TIMEOUT_MESSAGES = {
    "header": "request headers not received within the header timeout",
    "body": "request body not received within the body timeout",
}


def bounded_http_protocol(
    limits: ConnectionLimits, timed_out: Counter, refused: Counter, fast_lane: RestFrontend | None = None
) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol with the deadlines and caps of `limits`; timeouts are counted in
    `timed_out`, refusals in `refused` (Counters with the label `reason`). With `fast_lane`, its inference
    requests take the fast lane (`fast_lane.py`), under the same deadlines and caps."""
    from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

    from batchpilot.runtime.protocol.fast_lane import FastLaneProtocol

    max_connections = limits.resolved_max_connections()
    counters = {reason: timed_out.labels(reason=reason) for reason in TIMEOUT_REASONS}
    counters.update({reason: refused.labels(reason=reason) for reason in REFUSAL_REASONS})

    class BoundedHttpToolsProtocol(FastLaneProtocol):
        """HttpToolsProtocol with header/body deadlines, a connection cap and a header size cap."""

        frontend = fast_lane
        _deadline: asyncio.TimerHandle | None = None  # the armed timer: for this deadline, at this loop time
        _deadline_reason = ""
        _deadline_at = 0.0
        _wanted_reason = ""  # the deadline the parser callbacks ask for ("": none), armed by _settle
        _wanted_at = 0.0
        _header_bytes = 0

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                counters["max_connections"].inc()
                transport.write(_response(b"503 Service Unavailable", "too many open connections, retry later"))
                transport.close()
                return
            self._want("header", limits.header_timeout_s)
            self._settle()

        def connection_lost(self, exc: Exception | None) -> None:
            self._want("")
            self._settle()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            try:
                super().data_received(data)
            finally:
                self._settle()

        def _want(self, reason: str, seconds: float = 0.0) -> None:
            """Ask for the deadline `reason` (or none: "") in `seconds`; `_settle` arms it once the read is parsed,
            so a request whose headers and body come in one read arms and cancels no timer at all."""
            self._wanted_reason = reason
            self._wanted_at = self.loop.time() + seconds if reason else 0.0

        def _settle(self) -> None:
            reason, at = self._wanted_reason, self._wanted_at
            deadline = self._deadline
            if deadline is not None:
                if reason == self._deadline_reason and at == self._deadline_at:
                    return
                deadline.cancel()
                self._deadline = None
            if reason:
                self._deadline = self.loop.call_at(at, self._expire, reason)
                self._deadline_reason, self._deadline_at = reason, at

        def _expire(self, reason: str) -> None:
            self._deadline = None
            self._wanted_reason = ""
            if self.transport.is_closing():
                return
            counters[reason].inc()
            cycle = self.cycle
            # A 408 only where no response is on the wire: before any (header, with the last one complete),
            # or for a request whose body never came and which has not been answered yet.
            if (cycle is None or cycle.response_complete) if reason == "header" else not cycle.response_started:
                self.transport.write(_response(b"408 Request Timeout", _TIMEOUT_MESSAGES[reason]))
            self.transport.close()

        # -- parser callbacks -------------------------------------------------------------------------------
        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._header_bytes = 0
            if not self._wanted_reason:  # a new connection's deadline runs from its opening
                self._want("header", limits.header_timeout_s)

        def on_url(self, url: bytes) -> None:
            self._count_header_bytes(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count_header_bytes(len(name) + len(value))
            super().on_header(name, value)

        def _count_header_bytes(self, size: int) -> None:
            self._header_bytes += size
            if self._header_bytes > limits.max_header_bytes:
                counters["header_too_large"].inc()
                # Raised through the parser: uvicorn answers 400 "Invalid HTTP request" and closes.
                raise ValueError(f"request headers exceed {limits.max_header_bytes} bytes")

        def on_headers_complete(self) -> None:
            self._want("body", limits.body_timeout_s)
            previous = self.cycle
            super().on_headers_complete()
            cycle = self.cycle
            if cycle is not previous and isinstance(cycle, RequestResponseCycle):  # not a fast-lane request
                cycle.transport = OneSendTransport(self.transport, cycle)  # type: ignore[assignment]

        def on_message_complete(self) -> None:
            self._want("")
            super().on_message_complete()

        def shutdown(self) -> None:
            armed = self._deadline is not None and self._deadline_reason == "body"
            if armed and self._deadline_at - self.loop.time() > SHUTDOWN_BODY_S:
                self._want("body", SHUTDOWN_BODY_S)
                self._settle()
            super().shutdown()

        def timeout_keep_alive_handler(self) -> None:
            if not self.transport.is_closing():
                counters["idle"].inc()
            super().timeout_keep_alive_handler()

    return BoundedHttpToolsProtocol


def grpc_options(limits: ConnectionLimits) -> list[tuple[str, int]]:
    """The same bounds for the gRPC server (grpc C-core enforces them; they are not counted here): a connection
    must finish its HTTP/2 handshake within the header timeout, an idle one is sent GOAWAY after the
    keep-alive timeout (clients reconnect on their next call), and connections past the cap are closed."""
    return [
        ("grpc.server_handshake_timeout_ms", int(limits.header_timeout_s * 1000)),
        ("grpc.max_connection_idle_ms", int(limits.keep_alive_timeout_s * 1000)),
        ("grpc.max_allowed_incoming_connections", limits.resolved_max_connections()),
    ]


def configure(
    config: Any, limits: ConnectionLimits, timed_out: Counter, refused: Counter, fast_lane: RestFrontend | None = None
) -> None:
    """Apply `limits` to a uvicorn Config (before it is loaded); `fast_lane`: see `bounded_http_protocol`."""
    config.timeout_keep_alive = limits.keep_alive_timeout_s
    try:
        config.http = bounded_http_protocol(limits, timed_out, refused, fast_lane)
    except ImportError:  # no httptools: uvicorn's h11 protocol, with only its keep-alive timeout
        log.warning("httptools is not installed: header/body timeouts, the connection cap and the fast lane are off")
        config.h11_max_incomplete_event_size = limits.max_header_bytes
