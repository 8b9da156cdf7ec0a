"""Slow and idle clients are timed out and counted; connections are capped; good clients are served.

A real `batchpilot serve` on loopback with short limits, raw sockets: HTTP clients that connect and say
nothing, trickle their headers or their body a byte at a time, or hold a kept-alive connection idle, and
gRPC connections that never finish the HTTP/2 handshake. Each must be closed by the server within its
limit (and not long before it), the HTTP ones counted in batchpilot_connections_timed_out_total{reason},
while good HTTP and gRPC clients next to them get every answer in bounded time, and the server's file
descriptors return to their baseline.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
import pytest
from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb

from test_hardening_server import GRPC_INFER, grpc_token_request, server_process

HEADER_S, BODY_S, IDLE_S = 2.0, 3.0, 2.0
LIMITS = ["--header-timeout", str(HEADER_S), "--body-timeout", str(BODY_S), "--keep-alive-timeout", str(IDLE_S)]
#: How late a close may come on a busy 2-core machine (the timers run on the event loop that also serves).
SLACK_S = 3.0
TRICKLE_S = 0.5  # one byte every half second: far slower than any real client, never silent long
SILENT, HEADER_TRICKLE, BODY_TRICKLE, IDLE_KEPT_ALIVE = 60, 60, 60, 20  # 200 slow or idle HTTP sockets
GRPC_SILENT = 40  # and 40 on the gRPC port that never finish the HTTP/2 handshake
GOOD_BODY = json.dumps(
    {"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, 8], "data": list(range(1, 9))}]}
).encode()


def good_request(port: int) -> bytes:
    return (
        f"POST /v2/models/textcls/infer HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(GOOD_BODY)}\r\n\r\n"
    ).encode() + GOOD_BODY


def metric(port: int, name: str, reason: str | None = None) -> float:
    """A counter's value from the server's /metrics (with that `reason` label, if given); 0 when absent."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    labels = f'{{reason="{reason}"}}' if reason is not None else ""
    found = re.search(rf"^{name}_total{re.escape(labels)} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


@dataclass
class SlowClient:
    kind: str
    limit_s: float
    port: int = 0  # another port than the HTTP one (gRPC)
    started: float = 0.0  # when the limit began to run for this client
    closed_after_s: float | None = None
    reply: bytes = b""


@dataclass
class GoodTally:
    statuses: dict[int, int] = field(default_factory=dict)
    seconds: list[float] = field(default_factory=list)
    grpc_ok: int = 0


async def read_until_closed(reader: asyncio.StreamReader, client: SlowClient, timeout_s: float) -> None:
    """Read what the server sends until it closes (or resets) the connection; give up after `timeout_s`."""
    try:
        while chunk := await asyncio.wait_for(reader.read(65536), timeout=timeout_s):
            client.reply += chunk
    except asyncio.TimeoutError:
        return  # never closed: closed_after_s stays None
    except ConnectionError:
        pass  # a reset is a close too
    client.closed_after_s = time.perf_counter() - client.started


async def slow_client(port: int, client: SlowClient, wait_s: float) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", client.port or port)
    client.started = time.perf_counter()

    async def trickle(data: bytes) -> None:
        for byte in data:
            await asyncio.sleep(TRICKLE_S)
            if writer.is_closing():
                return
            try:
                writer.write(bytes([byte]))
                await writer.drain()
            except ConnectionError:
                return

    feeder = None
    if client.kind == "header trickle":
        writer.write(b"POST /v2/models/textcls/infer HTTP/1.1\r\nhost: x\r\n")
        feeder = asyncio.create_task(trickle(b"x-slow: " + b"a" * 200))
    elif client.kind == "body trickle":
        writer.write(b"POST /v2/models/textcls/infer HTTP/1.1\r\nhost: x\r\ncontent-length: 100000\r\n\r\n")
        await writer.drain()
        client.started = time.perf_counter()  # the body deadline runs from the end of the headers
        feeder = asyncio.create_task(trickle(b"[" * 1000))
    elif client.kind == "idle kept alive":
        writer.write(b"GET /v2/health/ready HTTP/1.1\r\nhost: x\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(re.search(rb"content-length: (\d+)", head, re.IGNORECASE).group(1))
        await reader.readexactly(length)
        client.started = time.perf_counter()  # idle from the end of the response
    await read_until_closed(reader, client, wait_s)
    if feeder is not None:
        feeder.cancel()
    writer.close()


async def good_client(port: int, tally: GoodTally, until: float) -> None:
    """Sequential good requests, a new connection every 5 (new connections must get through too)."""
    while time.perf_counter() < until:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for _ in range(5):
                start = time.perf_counter()
                writer.write(good_request(port))
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(re.search(rb"content-length: (\d+)", head, re.IGNORECASE).group(1))
                await reader.readexactly(length)
                status = int(head.split(b" ", 2)[1])
                tally.statuses[status] = tally.statuses.get(status, 0) + 1
                tally.seconds.append(time.perf_counter() - start)
                await asyncio.sleep(0.02)
        finally:
            writer.close()


async def flood(port: int, grpc_port: int) -> tuple[list[SlowClient], GoodTally]:
    clients = (
        [SlowClient("silent", HEADER_S) for _ in range(SILENT)]
        + [SlowClient("gRPC silent", HEADER_S, grpc_port) for _ in range(GRPC_SILENT)]
        + [SlowClient("header trickle", HEADER_S) for _ in range(HEADER_TRICKLE)]
        + [SlowClient("body trickle", BODY_S) for _ in range(BODY_TRICKLE)]
        + [SlowClient("idle kept alive", IDLE_S) for _ in range(IDLE_KEPT_ALIVE)]
    )
    tally = GoodTally()
    wait_s = max(HEADER_S, BODY_S, IDLE_S) + SLACK_S + 5  # past this a client counts as never closed
    until = time.perf_counter() + max(HEADER_S, BODY_S, IDLE_S) + 2
    await asyncio.gather(
        *(slow_client(port, c, wait_s) for c in clients),
        good_client(port, tally, until),
        good_grpc_client(grpc_port, tally, until),
    )
    return clients, tally


async def good_grpc_client(port: int, tally: GoodTally, until: float) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(
            GRPC_INFER,
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelInferResponse.FromString,
        )
        while time.perf_counter() < until:
            start = time.perf_counter()
            response = await call(grpc_token_request(np.arange(1, 9, dtype=np.int64).reshape(1, 8)), timeout=30)
            tally.grpc_ok += len(response.outputs) == 2
            tally.seconds.append(time.perf_counter() - start)
            await asyncio.sleep(0.02)


def test_slow_and_idle_clients_are_closed_in_time_while_good_ones_are_served(
    demo_repository: Path, tmp_path: Path
) -> None:
    with server_process(demo_repository, tmp_path / "server.log", *LIMITS) as served:
        port = served.http
        urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=30).read()
        time.sleep(0.5)
        fds_before = served.open_fds()
        clients, good = asyncio.run(flood(port, served.grpc))
        late = [
            (c.kind, c.closed_after_s)
            for c in clients
            if c.closed_after_s is None or c.closed_after_s > c.limit_s + SLACK_S
        ]
        early = [
            (c.kind, c.closed_after_s)
            for c in clients
            if c.closed_after_s is not None and c.closed_after_s < c.limit_s - 0.3
        ]
        timed_out = {r: metric(port, "batchpilot_connections_timed_out", r) for r in ("header", "body", "idle")}
        deadline = time.monotonic() + 10
        while served.open_fds() > fds_before + 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        fds_after = served.open_fds()
        by_kind = {k: [c.closed_after_s for c in clients if c.kind == k] for k in {c.kind for c in clients}}
        summary = {k: f"{min(v):.2f}-{max(v):.2f} s" for k, v in by_kind.items() if None not in v}
        p50, p99 = np.percentile(good.seconds, [50, 99])
        print(
            f"\nslow/idle flood of {len(clients)} sockets: closed after {summary}; counted {timed_out}; good traffic "
            f"HTTP {good.statuses} gRPC {good.grpc_ok} OK, p50 {p50 * 1e3:.0f} ms p99 {p99 * 1e3:.0f} ms "
            f"max {max(good.seconds) * 1e3:.0f} ms; "
            f"fds {fds_before} -> {fds_after}"
        )
        assert not late, late[:5]
        assert not early, early[:5]
        slow = [c for c in clients if c.kind in ("silent", "header trickle", "body trickle")]
        assert all(c.reply.startswith(b"HTTP/1.1 408") for c in slow), [c.reply[:60] for c in slow][:3]
        assert all(c.reply == b"" for c in clients if c.kind == "idle kept alive")
        assert timed_out["header"] >= SILENT + HEADER_TRICKLE and timed_out["body"] >= BODY_TRICKLE, timed_out
        assert timed_out["idle"] >= IDLE_KEPT_ALIVE, timed_out
        assert set(good.statuses) == {200} and sum(good.statuses.values()) >= 20, good.statuses
        assert good.grpc_ok >= 20, good.grpc_ok
        assert p99 < 2.0, (p50, p99)
        assert fds_after <= fds_before + 2, (fds_before, fds_after)
        assert served.stop() == 0


def test_connections_past_the_cap_are_refused_and_huge_headers_end_the_connection(
    demo_repository: Path, tmp_path: Path
) -> None:
    cap = 20

    async def scenario(port: int) -> tuple[list[bytes], int]:
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(cap)]
        await asyncio.sleep(0.3)
        extra_replies = []
        for _ in range(10):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            extra_replies.append(await asyncio.wait_for(reader.read(), timeout=10))  # answered and closed at once
            writer.close()
        for _, writer in held:
            writer.close()
        await asyncio.sleep(0.5)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)  # room again: served
        writer.write(good_request(port))
        status = int((await reader.readuntil(b"\r\n\r\n")).split(b" ", 2)[1])
        writer.close()
        return extra_replies, status

    async def huge_headers(port: int) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /v2/health/ready HTTP/1.1\r\nhost: x\r\n" + b"x-big: " + b"a" * 200_000 + b"\r\n\r\n")
        try:
            return await asyncio.wait_for(reader.read(), timeout=10)
        except ConnectionError:
            return b"reset"
        finally:
            writer.close()

    async def grpc_past_the_cap(port: int) -> bytes:
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(cap)]
        await asyncio.sleep(0.3)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            return await asyncio.wait_for(reader.read(), timeout=5)  # closed at once, not after the handshake timeout
        except ConnectionError:
            return b""
        finally:
            writer.close()
            for _, w in held:
                w.close()

    with server_process(demo_repository, tmp_path / "server.log", "--max-connections", str(cap)) as served:
        replies, status = asyncio.run(scenario(served.http))
        assert all(r.startswith(b"HTTP/1.1 503") and b"too many open connections" in r for r in replies), replies[:2]
        assert status == 200
        assert metric(served.http, "batchpilot_connections_refused", "max_connections") >= 10
        assert asyncio.run(grpc_past_the_cap(served.grpc)) == b""
        reply = asyncio.run(huge_headers(served.http))
        assert reply.startswith(b"HTTP/1.1 400") or reply == b"reset", reply[:100]
        assert metric(served.http, "batchpilot_connections_refused", "header_too_large") == 1
        assert served.stop() == 0


def test_serve_flags_and_defaults() -> None:
    from batchpilot.cli import build_parser
    from batchpilot.runtime.protocol.limits import ConnectionLimits

    args = build_parser().parse_args(["serve", "--model-repository", "x"])
    assert (
        args.header_timeout,
        args.body_timeout,
        args.keep_alive_timeout,
        args.max_connections,
        args.max_header_bytes,
    ) == (10.0, 60.0, 65.0, 0, 65536)
    assert ConnectionLimits() == ConnectionLimits(10.0, 60.0, 65.0, 0, 65536)
    assert 16 <= ConnectionLimits().resolved_max_connections() <= 10_000
    assert ConnectionLimits(max_connections=7).resolved_max_connections() == 7
    for wrong in ({"header_timeout_s": 0}, {"body_timeout_s": -1}, {"max_connections": -1}):
        with pytest.raises(ValueError, match="must be"):
            ConnectionLimits(**wrong)  # type: ignore[arg-type]
