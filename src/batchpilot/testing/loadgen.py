"""A small closed-loop HTTP/1.1 load generator (keep-alive, one connection per client).

It sends prebuilt request bodies, so the client costs little next to the server; the demo and the
benchmarks use it to drive BatchPilot and its peers the same way.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field

import numpy as np


@dataclass
class LoadResult:
    duration_s: float
    latencies_s: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)

    @property
    def ok(self) -> int:
        return self.statuses.get(200, 0)

    @property
    def errors(self) -> int:
        return sum(n for s, n in self.statuses.items() if s != 200)

    @property
    def throughput(self) -> float:
        return self.ok / self.duration_s if self.duration_s else 0.0

    def percentile_ms(self, q: float) -> float:
        return float(np.percentile(self.latencies_s, q)) * 1e3 if self.latencies_s else float("nan")


def build_request(host: str, path: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def _read_response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    if length:
        await reader.readexactly(length)
    return status


async def run_load(
    host: str, port: int, requests: list[bytes], *, concurrency: int, duration_s: float, seed: int = 0
) -> LoadResult:
    """`concurrency` clients send requests (picked at random from `requests`) back to back."""
    deadline = time.perf_counter() + duration_s
    result = LoadResult(duration_s)
    rng = random.Random(seed)

    async def client() -> None:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            while time.perf_counter() < deadline:
                start = time.perf_counter()
                writer.write(requests[rng.randrange(len(requests))])
                status = await _read_response(reader)
                result.statuses[status] = result.statuses.get(status, 0) + 1
                if status == 200:
                    result.latencies_s.append(time.perf_counter() - start)
        finally:
            writer.close()

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    result.duration_s = time.perf_counter() - started
    return result
