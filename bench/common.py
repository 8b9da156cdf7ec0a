"""Shared plumbing of the benchmarks: pinned server processes, wrk runs, raw model throughput, tables."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import torch

from batchpilot.runtime.demo import free_port, wait_ready

ROOT = Path(__file__).resolve().parent.parent
SERVER_CPU = "0"  # the server gets one core...
CLIENT_CPU = "1"  # ...and the load generator the other


def pinned(cpu: str, command: Sequence[str]) -> list[str]:
    return ["taskset", "-c", cpu, *command] if os.cpu_count() and os.cpu_count() > 1 else list(command)


@contextmanager
def process(command: Sequence[str], ready_url: str, env: dict[str, str] | None = None,
            log: Path | None = None) -> Iterator[subprocess.Popen]:
    out = open(log, "wb") if log else subprocess.DEVNULL
    proc = subprocess.Popen(list(command), stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    try:
        wait_ready(ready_url, timeout_s=180, proc=proc)
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        if log:
            out.close()


@contextmanager
def batchpilot_server(repository: Path, *extra: str, env: dict[str, str] | None = None) -> Iterator[tuple[int, int]]:
    http, grpc = free_port(), free_port()
    command = pinned(SERVER_CPU, [sys.executable, "-m", "batchpilot", "--log-level", "WARNING", "serve",
                                  "--model-repository", str(repository), "--http-port", str(http),
                                  "--grpc-port", str(grpc), "--host", "127.0.0.1", "--torch-threads", "1", *extra])
    with process(command, f"http://127.0.0.1:{http}/v2/health/ready", env):
        yield http, grpc


@contextmanager
def stock_kserve_server(model_path: Path, name: str, output: str) -> Iterator[int]:
    http, grpc = free_port(), free_port()
    command = pinned(SERVER_CPU, [sys.executable, str(ROOT / "bench" / "stock_kserve.py"), "--model_path",
                                  str(model_path), "--model_name", name, "--output_name", output,
                                  "--http_port", str(http), "--grpc_port", str(grpc)])
    with process(command, f"http://127.0.0.1:{http}/v2/models/{name}/ready"):
        yield http


@dataclass
class WrkResult:
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int


def _ms(text: str) -> float:
    value, unit = re.fullmatch(r"([0-9.]+)(us|ms|s)", text).groups()
    return float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]


def wrk(url: str, body: bytes, headers: dict[str, str], *, connections: int, duration_s: int, workdir: Path) -> WrkResult:
    """POST the same body over `connections` keep-alive connections; one wrk thread on the client core."""
    body_path = workdir / "body.bin"
    body_path.write_bytes(body)
    script = workdir / "post.lua"
    lines = ['wrk.method = "POST"', f'local f = io.open("{body_path}", "rb")', "wrk.body = f:read('*all')", "f:close()"]
    lines += [f'wrk.headers["{k}"] = "{v}"' for k, v in headers.items()]
    script.write_text("\n".join(lines) + "\n")
    done = subprocess.run(
        pinned(CLIENT_CPU, ["wrk", "-t1", f"-c{connections}", f"-d{duration_s}s", "--latency", "-s", str(script), url]),
        capture_output=True, text=True, timeout=duration_s + 60, check=True,
    )
    out = done.stdout
    rps = float(re.search(r"Requests/sec:\s+([0-9.]+)", out).group(1))
    p50 = _ms(re.search(r"\n\s+50%\s+(\S+)", out).group(1))
    p99 = _ms(re.search(r"\n\s+99%\s+(\S+)", out).group(1))
    errors = int(m.group(1)) if (m := re.search(r"Non-2xx or 3xx responses: (\d+)", out)) else 0
    errors += sum(int(n) for n in re.findall(r"(?:connect|read|write|timeout) (\d+)", out))
    return WrkResult(rps, p50, p99, errors)


def raw_throughput(module: torch.nn.Module, make_args, batch_sizes: Sequence[int], seconds: float = 1.5) -> dict[int, float]:
    """Items per second of the model alone (one thread, like the server), per batch size."""
    rates = {}
    with torch.inference_mode():
        for batch in batch_sizes:
            args = make_args(batch)
            for _ in range(3):
                module(*args)
            count, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                module(*args)
                count += 1
            rates[batch] = batch * count / (time.perf_counter() - start)
    return rates


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table (it reads fine in a terminal too)."""
    def cell(v: object) -> str:
        return f"{v:,.1f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def v2_json_body(name: str, datatype: str, shape: list[int], data: list) -> bytes:
    return json.dumps({"inputs": [{"name": name, "datatype": datatype, "shape": shape, "data": data}]}).encode()
