"""One send per HTTP response: uvicorn writes a response's status line and headers, then its body, as two
writes on the socket (two syscalls, a fifth of the CPU a small request costs). `OneSendTransport` stands
between one request's uvicorn cycle and the connection's transport: it holds the headers until the body's
first write and hands both to the transport together (`writelines`: one syscall, no copy of the body).

Nothing else changes: whatever is written before the response starts (`100 Continue`) goes out at once,
and held headers go out before anything else happens to the connection (a close, the end of a response
with no body write such as a HEAD, any later write).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


class OneSendTransport:
    """The transport as one uvicorn `RequestResponseCycle` sees it (see the module's docstring)."""

    __slots__ = ("_cycle", "_held", "_on_response", "_started", "_transport")

    def __init__(self, transport: asyncio.Transport, cycle: Any) -> None:
        self._transport = transport
        self._cycle = cycle
        self._held: bytes | None = None
        self._started = False
        self._on_response: Callable[[], None] = cycle.on_response
        cycle.on_response = self._response_complete

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._started and self._cycle.response_started:
            # The first write once the response started is its status line and headers.
            self._started = True
            self._held = bytes(data)
            return
        held = self._held
        if held is None:
            self._transport.write(data)
            return
        self._held = None
        self._transport.writelines((held, data))

    def flush(self) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def _response_complete(self) -> None:
        self.flush()
        self._on_response()

    def __getattr__(self, name: str) -> Any:  # is_closing, get_extra_info, abort, ...: the transport's own
        return getattr(self._transport, name)
