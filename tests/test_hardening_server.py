"""A real `batchpilot serve` process under overload, SIGTERM mid-load, and hostile logging conditions.

Each test starts its own server (a small queue, or DEBUG logs) with `server_process`, which, unlike
`demo.serving`, exposes the process: its pid for RSS, and its exit status. `bench/soak.py` reuses it.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
import pytest
from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb

from batchpilot.runtime.demo_models import VOCAB_SIZE, text_spec
from batchpilot.runtime.protocol.limits import SHUTDOWN_BODY_S
from batchpilot.testing.loadgen import build_request
from batchpilot.testing.processes import child_process, free_port, ready_url, serve_command, wait_ready
from batchpilot.testing.requests import v2_binary_body
from reference import assert_close, expected

GRACE_S = 30  # ServerOptions.grace_period_s: the process must be gone within it after SIGTERM


@dataclass
class Served:
    proc: subprocess.Popen
    http: int
    grpc: int
    log: Path

    def rss_mib(self) -> float:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) / 1024

    def open_fds(self) -> int:
        """The server's open file descriptors: its connections and its own files."""
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def stop(self) -> int:
        """SIGTERM; the exit status (raises if it outlives the grace period)."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=GRACE_S)


@contextmanager
def server_process(
    repository: Path, log: Path, *extra: str, env: dict[str, str] | None = None, log_level: str = "WARNING"
) -> Iterator[Served]:
    http, grpc_port = free_port(), free_port()
    command = serve_command(repository, http, grpc_port, "--torch-threads", "1", *extra, log_level=log_level)
    with child_process(command, ready_url(http), env=env, log_path=log) as proc:
        yield Served(proc, http, grpc_port, log)


# -- a minimal HTTP/1.1 client that keeps what the tests count: status, headers, timing ------------------
@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes
    seconds: float

    def outputs(self) -> dict[str, np.ndarray]:
        """The outputs of a binary-extension v2 response."""
        length = int(self.headers["inference-header-content-length"])
        arrays, offset = {}, length
        for o in json.loads(self.body[:length])["outputs"]:
            size = o["parameters"]["binary_data_size"]
            arrays[o["name"]] = np.frombuffer(self.body[offset : offset + size], dtype=np.float32).reshape(o["shape"])
            offset += size
        return arrays

    def output_shapes(self) -> dict[str, list[int]]:
        return {name: list(a.shape) for name, a in self.outputs().items()}


async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> Reply:
    start = time.perf_counter()
    writer.write(request)
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    body = await reader.readexactly(int(headers.get("content-length", 0)))
    return Reply(int(lines[0].split(" ", 2)[1]), headers, body, time.perf_counter() - start)


def token_request(port: int, array: np.ndarray) -> bytes:
    body, headers = v2_binary_body("input_ids", "INT64", array, ["logits", "token_scores"])
    return build_request(f"127.0.0.1:{port}", "/v2/models/textcls/infer", body, headers)


def correct_shapes(reply: Reply, length: int) -> bool:
    return reply.output_shapes() == {"logits": [1, 4], "token_scores": [1, length]}


def tokens(length: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, VOCAB_SIZE, size=(1, length), dtype=np.int64)


def grpc_token_request(array: np.ndarray) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="textcls")
    request.inputs.add(name="input_ids", datatype="INT64", shape=list(array.shape))
    request.raw_input_contents.append(array.tobytes())
    return request


GRPC_INFER = "/inference.GRPCInferenceService/ModelInfer"


# -- overload -----------------------------------------------------------------------------------------
QUEUE = 4
FLOOD_HTTP_CLIENTS = 80  # ~10x what the model keeps up with (a batch of 4 running + 4 queued)
FLOOD_GRPC_CLIENTS = 8
FLOOD_S = 4.0
#: Pause after a refusal. Flooding clients that retry at once measure the client's own event loop; with
#: this pause 80 clients offer ~300 req/s, about 10x what the model serves on one thread here (~30 req/s).
REFUSED_PAUSE_S = 0.25


def small_queue_env() -> dict[str, str]:
    """textcls with a queue of 4 and a fixed batch size of 4 (the autotuner off: the capacity stays put)."""
    spec = text_spec().model_dump(by_alias=True, mode="json")
    spec["batching"].update(maxBatchSize=4, maxQueueDelayMicroseconds=0)
    spec["batching"]["defaultQueuePolicy"]["maxQueueSize"] = QUEUE
    spec["autotune"]["enabled"] = False
    return {"BATCHPILOT_MODEL_SPECS": json.dumps([spec])}


@dataclass
class Flood:
    http: list[Reply] = field(default_factory=list)
    grpc_codes: dict[grpc.StatusCode, int] = field(default_factory=dict)
    grpc_retry_after: set[str] = field(default_factory=set)
    rss_mib: list[float] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)


async def flood(served: Served, duration_s: float) -> Flood:
    result = Flood()
    deadline = time.perf_counter() + duration_s
    array = tokens(192, seed=3)  # long sequences: a batch costs tens of ms on one thread
    request = token_request(served.http, array)

    async def http_client() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", served.http)
        try:
            while time.perf_counter() < deadline:
                reply = await exchange(reader, writer, request)
                result.http.append(reply)
                if reply.status == 200 and not correct_shapes(reply, array.shape[1]):
                    result.wrong.append(str(reply.output_shapes()))
                if reply.status == 503:
                    await asyncio.sleep(REFUSED_PAUSE_S)
        finally:
            writer.close()

    async def grpc_client(channel: grpc.aio.Channel) -> None:
        call = channel.unary_unary(
            GRPC_INFER,
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelInferResponse.FromString,
        )
        while time.perf_counter() < deadline:
            try:
                await call(grpc_token_request(array), timeout=30)
                code = grpc.StatusCode.OK
            except grpc.aio.AioRpcError as err:
                code = err.code()
                result.grpc_retry_after.update(v for k, v in (err.trailing_metadata() or ()) if k == "retry-after")
            result.grpc_codes[code] = result.grpc_codes.get(code, 0) + 1
            if code == grpc.StatusCode.UNAVAILABLE:
                await asyncio.sleep(REFUSED_PAUSE_S)

    async def sample_rss() -> None:
        while time.perf_counter() < deadline:
            result.rss_mib.append(served.rss_mib())
            await asyncio.sleep(0.2)

    async with grpc.aio.insecure_channel(f"127.0.0.1:{served.grpc}") as channel:
        await asyncio.gather(
            *(http_client() for _ in range(FLOOD_HTTP_CLIENTS)),
            *(grpc_client(channel) for _ in range(FLOOD_GRPC_CLIENTS)),
            sample_rss(),
        )
    return result


def test_overload_refuses_fast_stays_bounded_and_recovers(demo_repository: Path, tmp_path: Path) -> None:
    with server_process(demo_repository, tmp_path / "server.log", env=small_queue_env()) as served:
        asyncio.run(flood(served, 1.0))  # warm-up: allocator pools and JIT paths reach their steady size
        rss_before = served.rss_mib()
        result = asyncio.run(flood(served, FLOOD_S))
        rss_after = served.rss_mib()

        statuses = {s: sum(1 for r in result.http if r.status == s) for s in {r.status for r in result.http}}
        assert set(statuses) <= {200, 503}, statuses
        assert statuses.get(503, 0) > 0 and statuses.get(200, 0) > 0, statuses
        assert not result.wrong, result.wrong[:3]
        refused = [r for r in result.http if r.status == 503]
        assert all(int(r.headers["retry-after"]) >= 1 for r in refused)
        refusal_p50, refusal_p90, refusal_p99 = np.percentile([r.seconds for r in refused], [50, 90, 99])
        service_p50 = float(np.percentile([r.seconds for r in result.http if r.status == 200], 50))
        # A refusal never waits for the model: most take a small fraction of serving one. The far tail is
        # bounded loosely: on a 2-core box, stalls of ~0.1 s (CPU contention between the model thread, the
        # event loop and this client) catch a whole burst of refusals at once.
        assert refusal_p50 < 0.25 * service_p50 and refusal_p90 < service_p50, (refusal_p50, refusal_p90, service_p50)
        assert refusal_p99 < 0.5, refusal_p99
        assert set(result.grpc_codes) <= {grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE}, result.grpc_codes
        assert result.grpc_codes.get(grpc.StatusCode.UNAVAILABLE, 0) > 0, result.grpc_codes
        assert result.grpc_retry_after and all(int(v) >= 1 for v in result.grpc_retry_after)
        # Refused requests leave nothing behind: memory at ~10x the sustainable load stays put.
        assert max(result.rss_mib) - rss_before < 100, (rss_before, max(result.rss_mib))

        # Recovery, by itself: one client at a time is served in full again, with the right answers.
        wait_ready(f"http://127.0.0.1:{served.http}/v2/health/ready", timeout_s=10)
        arrays = [tokens(16 + i, seed=i) for i in range(10)]
        recovered = asyncio.run(sequential(served.http, arrays))
        assert [r.status for r in recovered] == [200] * 10
        for reply, array in zip(recovered, arrays, strict=False):
            assert_close(reply.outputs(), expected(demo_repository, "textcls", array))
        print(
            f"\noverload: {len(result.http)} HTTP requests {statuses}, gRPC {result.grpc_codes}; refusal p50 "
            f"{refusal_p50 * 1e3:.1f} ms, p90 {refusal_p90 * 1e3:.1f} ms, p99 {refusal_p99 * 1e3:.1f} ms "
            f"vs service p50 {service_p50 * 1e3:.1f} ms; RSS {rss_before:.0f} -> "
            f"peak {max(result.rss_mib):.0f} -> {rss_after:.0f} MiB"
        )


async def sequential(port: int, arrays: list[np.ndarray]) -> list[Reply]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        return [await exchange(reader, writer, token_request(port, a)) for a in arrays]
    finally:
        writer.close()


# -- SIGTERM under load ---------------------------------------------------------------------------------
@dataclass
class Tally:
    """Every request, counted once: answered (by status), refused (never accepted), or lost."""

    ok: int = 0
    refused: int = 0  # 503 while draining, or no connection to send it on
    lost: int = 0  # sent, and the connection ended without an answer
    wrong: list[str] = field(default_factory=list)  # answered, but not 200 with the right shapes
    in_flight_at_signal: int = 0
    answered_after_signal: int = 0  # accepted before SIGTERM, answered (200) after it


async def load_through_sigterm(served: Served, clients: int, before_s: float) -> Tally:
    tally = Tally()
    signalled = asyncio.Event()
    in_flight = 0
    arrays = [tokens(int(n), seed=i) for i, n in enumerate(np.random.default_rng(0).integers(32, 200, 16))]

    async def client(k: int) -> None:
        nonlocal in_flight
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", served.http)
        except OSError:
            tally.refused += 1
            return
        i = k
        try:
            # A well-behaved client: after a 503 (the server said it is going away) it stops sending.
            while True:
                array = arrays[i % len(arrays)]
                i += 1
                sent_before_signal = not signalled.is_set()
                in_flight += 1
                try:
                    reply = await exchange(reader, writer, token_request(served.http, array))
                except (asyncio.IncompleteReadError, ConnectionError):
                    tally.lost += 1
                    return
                finally:
                    in_flight -= 1
                if reply.status == 503:
                    tally.refused += 1
                    return
                if reply.status != 200 or not correct_shapes(reply, array.shape[1]):
                    tally.wrong.append(f"{reply.status} {reply.body[:200]!r}")
                    continue
                tally.ok += 1
                tally.answered_after_signal += sent_before_signal and signalled.is_set()
                if reply.headers.get("connection") == "close":
                    return  # the server is closing this connection; a new one would find no listener
        finally:
            writer.close()

    async def terminate() -> None:
        await asyncio.sleep(before_s)  # load builds up: a queue forms behind the running batch
        tally.in_flight_at_signal = in_flight
        served.proc.send_signal(signal.SIGTERM)
        signalled.set()

    await asyncio.gather(*(client(k) for k in range(clients)), terminate())
    return tally


def test_sigterm_under_load_answers_every_accepted_request(demo_repository: Path, tmp_path: Path) -> None:
    with server_process(demo_repository, tmp_path / "server.log") as served:
        tally = asyncio.run(load_through_sigterm(served, clients=24, before_s=2.0))
        started = time.monotonic()
        code = served.proc.wait(timeout=GRACE_S)
        print(f"\nSIGTERM under load: {tally}; exit {code} {time.monotonic() - started:.1f} s after the load ended")
    assert tally.lost == 0, tally
    assert not tally.wrong, tally.wrong[:3]
    assert tally.ok > 0 and tally.in_flight_at_signal > 0 and tally.answered_after_signal > 0, tally
    assert code == 0, served.log.read_text()[-3000:]


# -- no payloads in logs ----------------------------------------------------------------------------------
SECRET_IDS = [4231, 1327, 4231, 1327, 5813, 3191]  # a token sequence that appears nowhere else
SECRET_FLOAT = 0.8765432
SECRET_TEXT = "zq-secret-payload"
LEAKS = [re.compile(r"4231\D{1,4}1327"), re.compile(r"0\.87654"), re.compile(SECRET_TEXT), re.compile("ZQRAWBYTES")]


def http_post(port: int, path: str, doc: object | bytes) -> int:
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


def test_no_request_payload_in_logs_at_debug_level(demo_repository: Path, tmp_path: Path) -> None:
    def ids(values: list[int], datatype: str = "INT64") -> dict:
        return {"inputs": [{"name": "input_ids", "datatype": datatype, "shape": [1, len(values)], "data": values}]}

    with server_process(demo_repository, tmp_path / "server.log", log_level="DEBUG") as served:
        port = served.http
        sent = [
            (http_post(port, "/v2/models/textcls/infer", ids(SECRET_IDS)), 200),
            (http_post(port, "/v2/models/textcls/infer", ids(SECRET_IDS, "INT32")), 400),  # fails validation
            (http_post(port, "/v2/models/textcls/infer", ids([*SECRET_IDS, 99991])), 422),  # the model raises
            (http_post(port, "/v2/models/textcls/infer", ids([*SECRET_IDS, 1.5])), 400),  # fails conversion
            (http_post(port, "/v1/models/resnet-mini:predict", {"instances": [[[[SECRET_FLOAT] * 64] * 64] * 2]}), 400),
            (http_post(port, "/v2/models/textcls/infer", f'{{"inputs": ["{SECRET_TEXT}"'.encode()), 400),  # not JSON
        ]
        assert [got for got, _ in sent] == [want for _, want in sent]
        with grpc.insecure_channel(f"127.0.0.1:{served.grpc}") as channel:
            call = channel.unary_unary(GRPC_INFER, request_serializer=pb.ModelInferRequest.SerializeToString)
            request = grpc_token_request(np.array([SECRET_IDS], dtype=np.int64))
            request.raw_input_contents[0] = b"ZQRAWBYTES" * 3  # wrong size for the shape: refused
            with pytest.raises(grpc.RpcError):
                call(request, timeout=30)
        assert served.stop() == 0
    log = served.log.read_text(errors="replace")
    assert " DEBUG " in log and "failed on one request" in log  # the level took, and the failure was logged
    leaked = [(p.pattern, line[:200]) for line in log.splitlines() for p in LEAKS if p.search(line)]
    assert not leaked, leaked[:5]


# -- SIGTERM under mixed REST + gRPC load, with a slow client ------------------------------------------------
@dataclass
class MixedTally:
    """`Tally` per protocol, and what became of a client trickling its body when the signal came."""

    http: Tally = field(default_factory=Tally)
    grpc: Tally = field(default_factory=Tally)
    grpc_codes: dict[str, int] = field(default_factory=dict)
    slow_reply: bytes = b""
    slow_closed: bool = False
    slow_closed_after_signal_s: float = 0.0
    signalled_at: float = 0.0


#: gRPC answers that mean "not accepted": refused while draining, or no server left to connect to.
REFUSALS = ("shutting down", "not ready", "connection refused", "failed to connect", "connect failed")


async def mixed_load_through_sigterm(
    served: Served, http_clients: int, grpc_clients: int, before_s: float
) -> MixedTally:
    tally = MixedTally()
    signalled = asyncio.Event()
    in_flight = {"grpc": 0}
    arrays = [tokens(int(n), seed=i) for i, n in enumerate(np.random.default_rng(1).integers(32, 200, 16))]

    async def grpc_client(channel: grpc.aio.Channel, k: int) -> None:
        call = channel.unary_unary(
            GRPC_INFER,
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelInferResponse.FromString,
        )
        i = k
        while True:  # a well-behaved client: it stops at the first refusal
            array = arrays[i % len(arrays)]
            i += 1
            sent_before_signal = not signalled.is_set()
            in_flight["grpc"] += 1
            try:
                response = await call(grpc_token_request(array), timeout=60)
            except grpc.aio.AioRpcError as err:
                name = err.code().name
                tally.grpc_codes[name] = tally.grpc_codes.get(name, 0) + 1
                details = (err.details() or "").lower()
                if err.code() == grpc.StatusCode.UNAVAILABLE and any(r in details for r in REFUSALS):
                    tally.grpc.refused += 1
                else:
                    tally.grpc.lost += 1
                    tally.grpc.wrong.append(f"{name}: {err.details()}")
                return
            finally:
                in_flight["grpc"] -= 1
            shapes = {o.name: list(o.shape) for o in response.outputs}
            if shapes != {"logits": [1, 4], "token_scores": [1, array.shape[1]]}:
                tally.grpc.wrong.append(str(shapes))
                continue
            tally.grpc_codes["OK"] = tally.grpc_codes.get("OK", 0) + 1
            tally.grpc.ok += 1
            tally.grpc.answered_after_signal += sent_before_signal and signalled.is_set()

    async def slow_client() -> None:
        """Headers sent, then the body a byte at a time: not accepted yet when the signal comes."""
        reader, writer = await asyncio.open_connection("127.0.0.1", served.http)
        writer.write(b"POST /v2/models/textcls/infer HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n")
        try:
            while not reader.at_eof():
                writer.write(b" ")
                await writer.drain()
                try:
                    tally.slow_reply += await asyncio.wait_for(reader.read(4096), timeout=0.5)
                except asyncio.TimeoutError:
                    continue
        except ConnectionError:
            pass
        tally.slow_closed = True
        tally.slow_closed_after_signal_s = time.monotonic() - tally.signalled_at
        writer.close()

    async def terminate() -> None:
        await asyncio.sleep(before_s)
        tally.grpc.in_flight_at_signal = in_flight["grpc"]
        tally.signalled_at = time.monotonic()
        served.proc.send_signal(signal.SIGTERM)
        signalled.set()

    async with grpc.aio.insecure_channel(f"127.0.0.1:{served.grpc}") as channel:
        http_part = asyncio.create_task(load_through_sigterm(served, clients=http_clients, before_s=before_s))
        await asyncio.gather(*(grpc_client(channel, k) for k in range(grpc_clients)), slow_client(), terminate())
        tally.http = await http_part
    return tally


def test_sigterm_under_mixed_rest_and_grpc_load_loses_nothing(demo_repository: Path, tmp_path: Path) -> None:
    """Both protocols under load and a client trickling its body when SIGTERM comes: every request accepted
    on either protocol is answered, counted per protocol; the slow client is closed within the shutdown
    budget for bodies (not the 60 s body timeout), so the process exits 0 well within the grace period."""
    with server_process(demo_repository, tmp_path / "server.log") as served:  # default limits: 60 s body timeout
        tally = asyncio.run(mixed_load_through_sigterm(served, http_clients=16, grpc_clients=16, before_s=2.0))
        started = time.monotonic()
        code = served.proc.wait(timeout=GRACE_S)
        exit_s = time.monotonic() - started
    print(
        f"\nSIGTERM under mixed load: HTTP {tally.http}; gRPC {tally.grpc} codes {tally.grpc_codes}; "
        f"slow client closed {tally.slow_closed_after_signal_s:.1f} s after the signal with {tally.slow_reply[:40]!r}; "
        f"exit {code} {exit_s:.1f} s after that"
    )
    for protocol in (tally.http, tally.grpc):
        assert protocol.lost == 0 and not protocol.wrong, protocol
        assert protocol.ok > 0 and protocol.refused > 0, protocol
    assert tally.grpc.in_flight_at_signal > 0 and tally.grpc.answered_after_signal > 0, tally.grpc
    assert tally.http.answered_after_signal > 0, tally.http
    assert tally.slow_closed and tally.slow_closed_after_signal_s < SHUTDOWN_BODY_S + 7, tally  # not 60 s
    assert tally.slow_reply == b"" or tally.slow_reply.startswith(b"HTTP/1.1 408"), tally.slow_reply
    assert code == 0, served.log.read_text()[-3000:]
