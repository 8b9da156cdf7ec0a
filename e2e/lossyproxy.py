"""A TLS-terminating loopback proxy in front of the API server that can lose a response on purpose.

Clients (the operator: its kubernetes client and kopf's aiohttp) connect to 127.0.0.1:PORT with a serving
certificate signed by the cluster's CA; each client connection gets its own TLS connection to the real API
server, and HTTP/1.1 requests go through one at a time, responses streamed back as their bytes arrive (a
watch is a chunked response that never ends). `lose_next(method, path_regex)` arms it: the next request that
matches is forwarded, the API server's complete answer is read (so the write is applied), and then the
client connection is closed without a byte of it, as when a connection is cut right after a write.
"""

from __future__ import annotations

import contextlib
import re
import socket
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urlsplit

_MAX_LINE = 65536
_MAX_HEADERS = 200


@dataclass(frozen=True)
class Lost:
    """A response the proxy read from the API server and did not pass on."""

    method: str
    path: str
    status: int
    body: bytes


@dataclass
class _Armed:
    method: str
    path: re.Pattern[str]


class _Closed(Exception):
    """One side of a connection is gone."""


def _line(stream: BinaryIO) -> bytes:
    line = stream.readline(_MAX_LINE + 1)
    if not line:
        raise _Closed
    if len(line) > _MAX_LINE or not line.endswith(b"\n"):
        raise _Closed
    return line


def _head(stream: BinaryIO) -> tuple[bytes, dict[str, str]]:
    """The start line and header block (raw bytes, through the blank line), and the headers by lower name."""
    raw = _line(stream)
    while raw in (b"\r\n", b"\n"):  # stray CRLF between messages
        raw = _line(stream)
    headers: dict[str, str] = {}
    for _ in range(_MAX_HEADERS):
        line = _line(stream)
        raw += line
        if line in (b"\r\n", b"\n"):
            return raw, headers
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    raise _Closed


def _body(stream: BinaryIO, headers: dict[str, str], sink: BinaryIO | None, until_close: bool) -> bytes:
    """Pass a message body through to `sink` as it arrives (raw: chunk framing kept); its raw bytes too
    when `sink` is None (buffered)."""
    kept = bytearray()

    def out(data: bytes) -> None:
        if sink is None:
            kept.extend(data)
        else:
            sink.write(data)
            sink.flush()

    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            size_line = _line(stream)
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                out(size_line)
                while True:  # trailers, then the blank line
                    trailer = _line(stream)
                    out(trailer)
                    if trailer in (b"\r\n", b"\n"):
                        return bytes(kept)
            data = stream.read(size + 2)  # the chunk and its CRLF
            if len(data) < size + 2:
                raise _Closed
            out(size_line + data)
    length = headers.get("content-length")
    if length is not None:
        left = int(length)
        while left:
            data = stream.read1(min(left, 65536)) if hasattr(stream, "read1") else stream.read(min(left, 65536))
            if not data:
                raise _Closed
            left -= len(data)
            out(data)
        return bytes(kept)
    if until_close:  # a response without framing ends when the server closes
        while data := (stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536)):
            out(data)
    return bytes(kept)


class LossyProxy:
    """Use as a context manager; `server` is its https:// URL."""

    def __init__(self, upstream: str, ca_path: Path, cert_path: Path, key_path: Path) -> None:
        target = urlsplit(upstream)
        self._upstream = (target.hostname or "127.0.0.1", target.port or 443)
        self._client_tls = ssl.create_default_context(cafile=str(ca_path))
        self._client_tls.set_alpn_protocols(["http/1.1"])
        self._server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._server_tls.load_cert_chain(str(cert_path), str(key_path))
        self._server_tls.set_alpn_protocols(["http/1.1"])
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.server = f"https://127.0.0.1:{self.port}"
        self._lock = threading.Lock()
        self._armed: list[_Armed] = []
        self._sockets: set[socket.socket] = set()
        self._closing = False
        self.lost: list[Lost] = []
        self.requests: list[tuple[str, str]] = []  # (method, path) of each request forwarded, in order
        self._thread = threading.Thread(target=self._accept, name="lossy-proxy", daemon=True)

    # -- public -----------------------------------------------------------------------------------------------

    def __enter__(self) -> LossyProxy:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        with self._lock:
            self._closing = True
            sockets = list(self._sockets)
        self._listener.close()
        for sock in sockets:
            _close(sock)
        self._thread.join(timeout=5)

    def lose_next(self, method: str, path: str) -> None:
        """Lose the response of the next request with `method` whose path (no query) fully matches `path`."""
        with self._lock:
            self._armed.append(_Armed(method.upper(), re.compile(path)))

    @property
    def armed(self) -> int:
        with self._lock:
            return len(self._armed)

    def count(self, method: str, path: str) -> int:
        """How many requests with `method` and a path fully matching `path` went through (lost ones too)."""
        pattern = re.compile(path)
        with self._lock:
            return sum(1 for m, p in self.requests if m == method.upper() and pattern.fullmatch(p))

    # -- plumbing ---------------------------------------------------------------------------------------------

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), name="lossy-proxy-conn", daemon=True).start()

    def _track(self, sock: socket.socket) -> bool:
        with self._lock:
            if self._closing:
                return False
            self._sockets.add(sock)
            return True

    def _take_armed(self, method: str, path: str) -> bool:
        with self._lock:
            self.requests.append((method, path))
            for armed in self._armed:
                if armed.method == method and armed.path.fullmatch(path):
                    self._armed.remove(armed)
                    return True
            return False

    def _serve(self, raw_client: socket.socket) -> None:
        client: socket.socket | None = None
        upstream: socket.socket | None = None
        try:
            if not self._track(raw_client):
                return
            raw_client.settimeout(30)
            client = self._server_tls.wrap_socket(raw_client, server_side=True)
            client.settimeout(None)
            self._track(client)
            upstream = self._client_tls.wrap_socket(
                socket.create_connection(self._upstream, timeout=30), server_hostname=self._upstream[0]
            )
            upstream.settimeout(None)
            self._track(upstream)
            from_client, to_client = client.makefile("rb"), client.makefile("wb")
            from_upstream, to_upstream = upstream.makefile("rb"), upstream.makefile("wb")
            while True:
                head, headers = _head(from_client)
                method, target = head.split(b" ", 2)[:2]
                path = urlsplit(target.decode("latin-1")).path
                lose = self._take_armed(method.decode("latin-1").upper(), path)
                to_upstream.write(head)
                _body(from_client, headers, to_upstream, until_close=False)
                to_upstream.flush()
                status_head, response_headers = _head(from_upstream)
                status = int(status_head.split(b" ", 2)[1])
                bodiless = method == b"HEAD" or status in (204, 304) or 100 <= status < 200
                if lose:
                    body = b"" if bodiless else _body(from_upstream, response_headers, None, until_close=True)
                    with self._lock:
                        self.lost.append(Lost(method.decode("latin-1"), path, status, body))
                    return  # the finally below cuts both connections: the client never sees the answer
                to_client.write(status_head)
                to_client.flush()
                if not bodiless:
                    _body(from_upstream, response_headers, to_client, until_close=True)
                if "close" in (headers.get("connection", "") + response_headers.get("connection", "")).lower():
                    return
        except (_Closed, OSError, ValueError, IndexError):
            return
        finally:
            for sock in (client, raw_client, upstream):
                if sock is not None:
                    _close(sock)
                    with self._lock:
                        self._sockets.discard(sock)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # the plain socket's shutdown: another thread may be reading through TLS
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
