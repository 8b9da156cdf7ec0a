"""The floor of Python gRPC: what grpcio alone costs per ModelInfer, beside what the served path costs.

On one core, served/raw >= 0.9 leaves at most ~0.1 ms of CPU per request outside the model thread. This
benchmark asks whether gRPC can fit in that: bare servers that answer perf_analyzer's ModelInfer with canned
bytes (captured from the real server, so the client sees the same messages) are driven like the real one
(perf_analyzer gRPC, 32 clients, server pinned to one core, load on the other), and their whole process's
CPU per request is the floor under any gRPC front-end written on grpcio:

- grpc.aio on uvloop (the runtime's server), the request left as bytes;
- grpc.aio, the request parsed and a response message serialized (what any servicer does);
- grpc's thread-pool server, request parsed, 8 threads;
- the same with 64 threads, each handing its request to an asyncio loop that answers in batches of 16
  (what a thread-pool front-end over the runtime's batcher would cost).

The real server's row is BatchPilot serving resnet-mini (static 16 / 2 ms): its CPU beyond the model thread.

Usage: .venv/bin/python bench/grpc_floor.py [--seconds 4] [--repeat 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pickle
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import SERVER_CPU, pinned, static_specs, table, tree_cpu_seconds
from cpu_per_request import grpc_run, model_stats, thread_cpu

from batchpilot.runtime.demo_models import write_demo_repository
from batchpilot.runtime.repository import SPECS_ENV
from batchpilot.testing.processes import child_process, free_port, ready_url, serve_command

SERVICE = "inference.GRPCInferenceService"
MODEL = "resnet-mini"
MODES = {
    "aio-bytes": "grpc.aio (uvloop), bytes in, canned bytes out",
    "aio-parse": "grpc.aio (uvloop), parse + serialize",
    "sync-parse": "grpc thread pool (8), parse + serialize",
    "sync-handoff": "grpc thread pool (64), parse, batched on an event loop",
}


# -- the bare servers (run as `--serve MODE PORT CANNED`) ------------------------------------------------------
def _infer_handler(mode: str, canned: dict[str, bytes], count: list[int]) -> Callable[[bytes], Any]:
    """A function of the request bytes giving the response bytes, or (sync-handoff) a coroutine of them."""
    from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb

    response = pb.ModelInferResponse.FromString(canned["ModelInfer"])
    if mode == "aio-bytes":

        def answer(request: bytes) -> bytes:
            count[0] += 1
            return canned["ModelInfer"]

        return answer

    def parsed(request: bytes) -> bytes:
        count[0] += 1
        pb.ModelInferRequest.FromString(request)
        return response.SerializeToString()

    return parsed


def _through_loop() -> Callable[[bytes], bytes]:
    """A round trip from a pool thread through one event loop, which releases waiters in batches of 16 (or after
    2 ms), as the runtime's batcher would: the thread-pool server's hand-off to the batcher."""
    import uvloop

    loop = uvloop.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    waiting: list[tuple[asyncio.Future[bytes], bytes]] = []

    def release() -> None:
        for future, answer in waiting:
            if not future.done():
                future.set_result(answer)
        waiting.clear()

    async def submit(answer: bytes) -> bytes:
        future = loop.create_future()
        waiting.append((future, answer))
        if len(waiting) >= 16:
            release()
        elif len(waiting) == 1:
            loop.call_later(0.002, release)
        return await future

    return lambda answer: asyncio.run_coroutine_threadsafe(submit(answer), loop).result()


def serve_bare(mode: str, port: int, canned_path: Path) -> None:
    canned: dict[str, bytes] = pickle.loads(canned_path.read_bytes())
    count = [0]
    infer = _infer_handler(mode, canned, count)
    stats = lambda request, context: f"{count[0]} {time.process_time()}".encode()  # noqa: E731
    if mode.startswith("sync"):
        hand_off = _through_loop() if mode == "sync-handoff" else lambda answer: answer
        methods = {name: _sync(_fixed(payload)) for name, payload in canned.items()}
        methods["ModelInfer"] = _sync(lambda request: hand_off(infer(request)))
        threaded = grpc.server(futures.ThreadPoolExecutor(max_workers=64 if mode == "sync-handoff" else 8))
        _add_handlers(threaded, methods, stats)
        threaded.add_insecure_port(f"127.0.0.1:{port}")
        threaded.start()
        threaded.wait_for_termination()
        return

    def unary(answer: Callable[[bytes], bytes]) -> Callable[..., Any]:
        async def handler(request: bytes, context: Any) -> bytes:
            return answer(request)

        return handler

    async def main() -> None:
        server = grpc.aio.server()
        methods = {name: unary(_fixed(payload)) for name, payload in canned.items()}
        methods["ModelInfer"] = unary(infer)
        _add_handlers(server, methods, unary(lambda request: stats(request, None)))
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        await server.wait_for_termination()

    import uvloop

    uvloop.run(main())


def _fixed(payload: bytes) -> Callable[[bytes], bytes]:
    return lambda request: payload


def _sync(answer: Callable[[bytes], bytes]) -> Callable[[bytes, Any], bytes]:
    return lambda request, context: answer(request)


def _add_handlers(server: Any, methods: dict[str, Callable[..., Any]], stats: Callable[..., Any]) -> None:
    """Bytes in, bytes out (no (de)serializers): the methods under Triton's service, and bare.Bare/Stats."""
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                SERVICE, {name: grpc.unary_unary_rpc_method_handler(h) for name, h in methods.items()}
            ),
            grpc.method_handlers_generic_handler("bare.Bare", {"Stats": grpc.unary_unary_rpc_method_handler(stats)}),
        )
    )


# -- the driver ------------------------------------------------------------------------------------------------
def _call(channel: grpc.Channel, method: str, payload: bytes) -> bytes:
    return channel.unary_unary(method)(payload, timeout=10)


def capture(port: int) -> dict[str, bytes]:
    """The real server's answers to what perf_analyzer asks of a model, as bytes."""
    from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb

    from batchpilot.runtime.protocol import batchpilot_triton_pb2 as tpb

    image = np.random.default_rng(0).standard_normal((1, 3, 64, 64), dtype=np.float32)
    tensor = pb.ModelInferRequest.InferInputTensor(name="image", datatype="FP32", shape=[1, 3, 64, 64])
    requests = {
        "ServerLive": pb.ServerLiveRequest(),
        "ServerReady": pb.ServerReadyRequest(),
        "ModelReady": pb.ModelReadyRequest(name=MODEL),
        "ServerMetadata": pb.ServerMetadataRequest(),
        "ModelMetadata": pb.ModelMetadataRequest(name=MODEL),
        "ModelConfig": tpb.ModelConfigRequest(name=MODEL),
        "ModelStatistics": tpb.ModelStatisticsRequest(name=MODEL),
        "ModelInfer": pb.ModelInferRequest(model_name=MODEL, inputs=[tensor], raw_input_contents=[image.tobytes()]),
    }
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        return {name: _call(channel, f"/{SERVICE}/{name}", r.SerializeToString()) for name, r in requests.items()}


def measure_real(repo: Path, seconds: float, repeat: int) -> tuple[dict[str, bytes], list[list[object]]]:
    http, port = free_port(), free_port()
    command = pinned(SERVER_CPU, serve_command(repo, http, port, "--torch-threads", "1"))
    rows: list[list[object]] = []
    with child_process(command, ready_url(http), env={SPECS_ENV: static_specs()}) as proc:
        canned = capture(port)
        grpc_run(MODEL, port, 32, 1.0)
        for run in range(repeat):
            threads0, cpu0, (n0, *_) = thread_cpu(proc.pid), tree_cpu_seconds(proc.pid), model_stats(http, MODEL)
            start = time.perf_counter()
            grpc_run(MODEL, port, 32, seconds)
            threads1, cpu1, (n1, *_) = thread_cpu(proc.pid), tree_cpu_seconds(proc.pid), model_stats(http, MODEL)
            n = max(1, n1 - n0)
            model_thread = max((threads1[t] - threads0.get(t, 0.0) for t in threads1 if t != proc.pid), default=0.0)
            label = "BatchPilot gRPC, resnet-mini 16 / 2 ms (beyond the model thread)"
            rows.append(
                [
                    label,
                    run + 1,
                    round(n / (time.perf_counter() - start)),
                    f"{(cpu1 - cpu0 - model_thread) * 1e3 / n:.3f}",
                ]
            )
    return canned, rows


def measure_bare(mode: str, canned_path: Path, seconds: float, repeat: int) -> list[list[object]]:
    port = free_port()
    command = pinned(SERVER_CPU, [sys.executable, __file__, "--serve", mode, str(port), str(canned_path)])
    proc = subprocess.Popen(command)
    rows: list[list[object]] = []
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            grpc.channel_ready_future(channel).result(timeout=30)
            grpc_run(MODEL, port, 32, 1.0)
            for run in range(repeat):
                n0, cpu0 = map(float, _call(channel, "/bare.Bare/Stats", b"").split())
                start = time.perf_counter()
                grpc_run(MODEL, port, 32, seconds)
                n1, cpu1 = map(float, _call(channel, "/bare.Bare/Stats", b"").split())
                n = max(1.0, n1 - n0)
                rows.append(
                    [MODES[mode], run + 1, round(n / (time.perf_counter() - start)), f"{(cpu1 - cpu0) * 1e3 / n:.3f}"]
                )
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return rows


def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] == "--serve":
        serve_bare(sys.argv[2], int(sys.argv[3]), Path(sys.argv[4]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bp-grpc-floor-") as tmp:
        repo = Path(tmp) / "models"
        write_demo_repository(repo)
        canned, rows = measure_real(repo, args.seconds, args.repeat)
        canned_path = Path(tmp) / "canned.pkl"
        canned_path.write_bytes(pickle.dumps(canned))
        for mode in MODES:
            rows += measure_bare(mode, canned_path, args.seconds, args.repeat)
            print(f"  {rows[-1]}", flush=True)
    print(table(["server", "run", "req/s", "CPU ms per request"], rows))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PERF_ANALYZER", str(Path(__file__).resolve().parents[1] / ".tools/bin/perf_analyzer"))
    sys.exit(main())
