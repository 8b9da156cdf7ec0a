"""GPU served/raw benchmark: a ResNet-50-size CNN and a BERT-base-size encoder (plain torch code, random weights),
the model alone vs served by BatchPilot (REST v2 binary and gRPC), same batch size. Run by tools/gpu-check.sh on
a machine with CUDA; writes gpu-bench.md and gpu-bench.json under --out.

- raw: the model alone on the GPU, inputs already there, items/s per batch size;
- served: `batchpilot serve` (static batching: max batch 32, 2 ms), closed-loop clients in several processes at
  concurrency 64 (2x the batch), items/s and p99; served/raw compares with the raw rate at the served mean batch;
- server CPU per request over the server's process tree.

Usage: python bench/gpu_bench.py [--seconds 10] [--out DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import table, tree_cpu_seconds

from batchpilot.runtime.demo import batch_counts
from batchpilot.runtime.demo_models import TextClassifier, write_model
from batchpilot.spec.model import ModelSpec
from batchpilot.testing.loadgen import build_request, run_load
from batchpilot.testing.processes import child_process, free_port, ready_url, serve_command
from batchpilot.testing.requests import v2_binary_body

BATCHES = [1, 8, 16, 32, 64]
MAX_BATCH = 32
CONCURRENCY = 64
SEQ_LEN = 128
CLIENT_PROCESSES = 8


class Bottleneck(nn.Module):
    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = width * 4
        self.body = nn.Sequential(
            nn.Conv2d(cin, width, 1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.Conv2d(width, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        )
        self.down = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.down(x))


class ResNet50(nn.Module):
    """ResNet-50's layout (3, 4, 6, 3 bottlenecks; 25.6 M parameters): FP32 [B, 3, 224, 224] to logits [B, 1000]."""

    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = [
            nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2, padding=1),
        ]
        cin = 64
        for width, blocks, stride in [(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)]:
            for i in range(blocks):
                layers.append(Bottleneck(cin, width, stride if i == 0 else 1))
                cin = width * 4
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(2048, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1))


def specs() -> dict[str, ModelSpec]:
    batching = {"max_batch_size": MAX_BATCH, "max_queue_delay_microseconds": 2000}
    autotune = {"enabled": False}
    return {
        "resnet50": ModelSpec.model_validate(
            {
                "name": "resnet50",
                "type": "cv",
                "format": "torchscript",
                "inputs": [{"name": "image", "datatype": "FP32", "shape": [3, 224, 224]}],
                "outputs": [{"name": "logits", "datatype": "FP32", "shape": [1000]}],
                "batching": batching,
                "autotune": autotune,
            }
        ),
        "bert-base": ModelSpec.model_validate(
            {
                "name": "bert-base",
                "type": "nlp",
                "format": "torchscript",
                "inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [-1]}],
                "outputs": [
                    {"name": "logits", "datatype": "FP32", "shape": [4]},
                    {"name": "token_scores", "datatype": "FP32", "shape": [-1]},
                ],
                "batching": batching,
                "autotune": autotune,
                "sequence": {"max_length": 256, "pad_value": 0, "max_padding_waste": 0.25},
            }
        ),
    }


def modules() -> dict[str, nn.Module]:
    torch.manual_seed(0)
    # BERT-base's encoder: 12 layers, 768 wide, 12 heads, 3072 feed-forward (~85 M parameters in the layers).
    return {"resnet50": ResNet50().eval(), "bert-base": TextClassifier(dim=768, heads=12, layers=12, ff=3072).eval()}


def make_inputs(name: str, batch: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    if name == "resnet50":
        return (torch.randn(batch, 3, 224, 224, device=device),)
    ids = torch.randint(1, 8000, (batch, SEQ_LEN), device=device)
    return ids, torch.ones_like(ids)


def raw_rates(repo: Path, device: torch.device, seconds: float = 1.5) -> dict[str, dict[int, float]]:
    """Items/s of each saved (TorchScript) model alone on the GPU, inputs already there."""
    rates: dict[str, dict[int, float]] = {}
    with torch.inference_mode():
        for name in specs():
            module = torch.jit.load(str(repo / name / "model.pt"), map_location=device).eval()
            rates[name] = {}
            for batch in BATCHES:
                args = make_inputs(name, batch, device)
                for _ in range(5):
                    module(*args)
                sync(device)
                count, start = 0, time.perf_counter()
                while time.perf_counter() - start < seconds:
                    module(*args)
                    count += 1
                    if count % 8 == 0:
                        sync(device)
                sync(device)
                rates[name][batch] = batch * count / (time.perf_counter() - start)
                print(f"  raw {name} batch {batch}: {rates[name][batch]:.0f} items/s", flush=True)
    return rates


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _http_bodies(name: str, port: int) -> list[bytes]:
    rng = np.random.default_rng(0)
    out = []
    for _ in range(8):
        if name == "resnet50":
            body, headers = v2_binary_body(
                "image", "FP32", rng.standard_normal((1, 3, 224, 224), dtype=np.float32), ["logits"]
            )
        else:
            ids = rng.integers(1, 8000, size=(1, SEQ_LEN), dtype=np.int64)
            body, headers = v2_binary_body("input_ids", "INT64", ids, ["logits", "token_scores"])
        out.append(build_request(f"127.0.0.1:{port}", f"/v2/models/{name}/infer", body, headers))
    return out


def _http_client(name: str, port: int, connections: int, seconds: float, queue: mp.Queue) -> None:
    result = asyncio.run(
        run_load("127.0.0.1", port, _http_bodies(name, port), concurrency=connections, duration_s=seconds)
    )
    queue.put((result.ok, result.errors, list(result.latencies_s)))


def _grpc_client(name: str, port: int, connections: int, seconds: float, queue: mp.Queue) -> None:
    import grpc
    from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
    from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc as pbg

    rng = np.random.default_rng(1)
    if name == "resnet50":
        array = rng.standard_normal((1, 3, 224, 224), dtype=np.float32)
        tensor = pb.ModelInferRequest.InferInputTensor(name="image", datatype="FP32", shape=list(array.shape))
    else:
        array = rng.integers(1, 8000, size=(1, SEQ_LEN), dtype=np.int64)
        tensor = pb.ModelInferRequest.InferInputTensor(name="input_ids", datatype="INT64", shape=list(array.shape))
    request = pb.ModelInferRequest(model_name=name, inputs=[tensor], raw_input_contents=[array.tobytes()])
    latencies: list[float] = []
    errors = 0

    async def main() -> None:
        nonlocal errors
        options = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
            stub = pbg.GRPCInferenceServiceStub(channel)
            deadline = time.perf_counter() + seconds

            async def one() -> None:
                nonlocal errors
                while (start := time.perf_counter()) < deadline:
                    try:
                        await stub.ModelInfer(request)
                        latencies.append(time.perf_counter() - start)
                    except grpc.aio.AioRpcError:
                        errors += 1

            await asyncio.gather(*(one() for _ in range(connections)))

    asyncio.run(main())
    queue.put((len(latencies), errors, latencies))


def load(kind: str, name: str, port: int, seconds: float) -> tuple[int, int, float]:
    """(answers, errors, p99 ms) of CONCURRENCY clients spread over CLIENT_PROCESSES processes."""
    ctx = mp.get_context("spawn")
    queue: mp.Queue = ctx.Queue()
    target = _http_client if kind == "REST binary" else _grpc_client
    procs = [
        ctx.Process(target=target, args=(name, port, CONCURRENCY // CLIENT_PROCESSES, seconds, queue))
        for _ in range(CLIENT_PROCESSES)
    ]
    for p in procs:
        p.start()
    results = [queue.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join()
    latencies = np.concatenate([np.asarray(r[2]) for r in results]) if results else np.zeros(0)
    p99 = float(np.percentile(latencies, 99)) * 1e3 if latencies.size else float("nan")
    return sum(r[0] for r in results), sum(r[1] for r in results), p99


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    parser.add_argument("--smoke", action="store_true", help="on the CPU, tiny: checks the script itself")
    args = parser.parse_args()
    global BATCHES, CONCURRENCY, CLIENT_PROCESSES
    if args.smoke:
        BATCHES, CONCURRENCY, CLIENT_PROCESSES = [1, 2], 4, 2
        args.seconds = 1.0
    elif not torch.cuda.is_available():
        print("no CUDA device: nothing to measure")
        return 2
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    args.out.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.get_device_name(0) if device.type == "cuda" else "none (smoke run on the CPU)"
    rows: list[list[object]] = []
    doc: dict = {"gpu": gpu, "torch": torch.__version__, "served": [], "raw": {}}
    with tempfile.TemporaryDirectory(prefix="bp-gpu-") as tmp:
        repo = Path(tmp) / "models"
        mods = modules()
        for name, spec in specs().items():
            write_model(repo, spec, mods[name])
        del mods
        print("raw ...", flush=True)
        raw = raw_rates(repo, device, 0.3 if args.smoke else 1.5)
        doc["raw"] = raw
        if device.type == "cuda":
            torch.cuda.empty_cache()
        http, grpc_port = free_port(), free_port()
        command = serve_command(repo, http, grpc_port)
        print("served ...", flush=True)
        with child_process(command, ready_url(http), log_path=args.out / "gpu-server.log") as proc:
            for name in specs():
                for kind in ("REST binary", "gRPC"):
                    port = http if kind == "REST binary" else grpc_port
                    load(kind, name, port, 0.5 if args.smoke else 2.0)  # warm-up
                    before, cpu0 = batch_counts(http, name), tree_cpu_seconds(proc.pid)
                    t0 = time.perf_counter()
                    ok, errors, p99 = load(kind, name, port, args.seconds)
                    elapsed = time.perf_counter() - t0
                    after, cpu1 = batch_counts(http, name), tree_cpu_seconds(proc.pid)
                    items = after[0] - before[0]
                    mean_batch = items / max(1, after[1] - before[1])
                    served = ok / args.seconds
                    sizes = sorted(raw[name])
                    raw_at = float(np.interp(mean_batch, sizes, [raw[name][b] for b in sizes]))
                    cpu_ms = (cpu1 - cpu0) * 1e3 / max(1, items)
                    row = {
                        "model": name,
                        "path": kind,
                        "concurrency": CONCURRENCY,
                        "items_per_s": served,
                        "p99_ms": p99,
                        "errors": errors,
                        "mean_batch": mean_batch,
                        "raw_items_per_s_at_batch": raw_at,
                        "served_over_raw": served / raw_at,
                        "server_cpu_ms_per_request": cpu_ms,
                        "wall_s": elapsed,
                    }
                    doc["served"].append(row)
                    rows.append(
                        [
                            name,
                            kind,
                            CONCURRENCY,
                            served,
                            p99,
                            errors,
                            mean_batch,
                            raw_at,
                            f"{served / raw_at:.2f}",
                            f"{cpu_ms:.3f}",
                        ]
                    )
                    print(f"  {rows[-1]}", flush=True)
    raw_table = table(
        ["model", *[f"batch {b}" for b in BATCHES]], [[m, *[r[b] for b in BATCHES]] for m, r in raw.items()]
    )
    served_table = table(
        [
            "model",
            "path",
            "clients",
            "served items/s",
            "p99 ms",
            "errors",
            "mean batch",
            "raw items/s at that batch",
            "served/raw",
            "server CPU ms/req",
        ],
        rows,
    )
    page = "\n\n".join(
        [
            "# GPU served/raw",
            f"GPU: {doc['gpu']}, torch {doc['torch']}. Static batching {MAX_BATCH} / 2 ms, {CONCURRENCY} clients "
            f"in {CLIENT_PROCESSES} processes, {args.seconds:.0f} s per row. Command: `bench/gpu_bench.py`.",
            "## The model alone (items/s, inputs on the GPU)",
            raw_table,
            "## Served (REST v2 binary and gRPC)",
            served_table,
        ]
    )
    (args.out / "gpu-bench.md").write_text(page + "\n")
    (args.out / "gpu-bench.json").write_text(json.dumps(doc, indent=1) + "\n")
    print("\n" + page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
