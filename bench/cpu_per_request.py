"""Server CPU per request, per path: what the serving stack costs around the model.

One server (pinned to one core, one torch thread, static batching 16 / 2 ms) takes a fixed load on each
path in turn; around each run the whole server process tree's CPU seconds and the model's statistics
(requests answered, and the model's own compute: `compute_infer` of every execution) are read, so

    CPU per request = CPU seconds / requests        beyond the model = (CPU seconds - compute_infer) / requests

Both are ratios of one run, so they hold on a shared machine (they do not need the core to itself), and two
runs of this script (before / after a change) compare directly. With `--profile DIR` each path also gets a
py-spy profile of the server (`DIR/<path>.txt`: the top functions by own and by inclusive samples).

Usage: .venv/bin/python bench/cpu_per_request.py [--seconds 4] [--profile DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import CLIENT_CPU, SERVER_CPU, pinned, static_specs, table, tree_cpu_seconds, wrk
from models import write_bench_models

from batchpilot.runtime.demo_models import write_demo_repository
from batchpilot.runtime.repository import SPECS_ENV
from batchpilot.testing.processes import child_process, free_port, ready_url, serve_command
from batchpilot.testing.requests import v2_binary_body


def model_stats(port: int, model: str) -> tuple[int, int, int, int]:
    """(successful requests, model compute_infer ns over every execution, items, executions)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/{model}/stats") as r:
        s = json.loads(r.read())["model_stats"][0]
    infer = sum(row["compute_infer"]["ns"] for row in s["batch_stats"])
    return s["inference_stats"]["success"]["count"], infer, s["inference_count"], s["execution_count"]


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds of each thread of the server process."""
    tick = os.sysconf("SC_CLK_TCK")
    found = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        found[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
    return found


def wrk_run(url: str, body: bytes, headers: dict[str, str], connections: int, seconds: float, work: Path) -> None:
    result = wrk(url, body, headers, connections=connections, duration_s=max(1, round(seconds)), workdir=work)
    if result.errors:
        raise RuntimeError(f"{result.errors} errors under load from {url}")


def grpc_run(model: str, port: int, connections: int, seconds: float) -> None:
    from batchpilot.testing.perfa import PerfAnalyzerError, run_perf_analyzer

    window = str(int(seconds * 1000 / 3))
    try:
        run_perf_analyzer(
            model,
            f"127.0.0.1:{port}",
            "grpc",
            [connections, connections, 1],
            ["-p", window, "-s", "50", "--max-trials", "3"],
            require_stable=False,
        )
    except PerfAnalyzerError as exc:  # it ran the load all the same; only its own figures are missing
        print(f"  perf_analyzer: {str(exc).splitlines()[0][:100]}", flush=True)


def make_run(
    model: str, path: str | None, body: bytes, headers: dict[str, str], http: int, grpc_port: int, c: int, work: Path
):
    """The load of one path, for a given number of seconds."""
    if path is None:
        return lambda seconds: grpc_run(model, grpc_port, c, seconds)
    return lambda seconds: wrk_run(f"http://127.0.0.1:{http}{path}", body, headers, c, seconds, work)


def profile_summary(raw: Path, top: int = 12) -> str:
    """py-spy's collapsed stacks as two top lists: own samples and inclusive samples per function."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        # "function (file:line)" -> "function (file)": one entry per function
        frames = [f.rsplit(":", 1)[0] + ")" if f.endswith(")") and ":" in f else f for f in stack.split(";")[1:]]
        total += count
        if frames:
            own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    lines = [f"samples: {total}", "", "own:"]
    lines += [f"  {100 * n / max(total, 1):5.1f}%  {f}" for f, n in own.most_common(top)]
    lines += ["", "inclusive:"]
    lines += [f"  {100 * n / max(total, 1):5.1f}%  {f}" for f, n in inclusive.most_common(top * 2)]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--profile", type=Path, help="write a py-spy profile summary per path here")
    parser.add_argument("--json", type=Path, help="write the rows as JSON here")
    parser.add_argument("--only", default="", help="comma-separated labels to run (default: all)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    image = rng.standard_normal((1, 3, 64, 64), dtype=np.float32)
    values = np.round(image.astype(np.float64), 3)  # 3 decimals, compact: ~78 KB of JSON (as bench/peers_bench.py)
    image_json = json.dumps(
        {"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 3, 64, 64], "data": values.ravel().tolist()}]},
        separators=(",", ":"),
    ).encode()
    v1_json = json.dumps({"instances": values.tolist()}, separators=(",", ":")).encode()
    binary_body, binary_headers = v2_binary_body("image", "FP32", image, ["logits"])
    tokens = rng.integers(1, 1000, size=(1, 36), dtype=np.int64)  # the runtime benchmark's 36-token sequence
    text_body, text_headers = v2_binary_body("input_ids", "INT64", tokens, ["logits", "token_scores"])
    trivial = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [0.5, 1.5, 2.5, 3.5]}]})
    json_headers = {"Content-Type": "application/json"}
    cases = [
        ("REST v2 binary", "resnet-mini", "/v2/models/resnet-mini/infer", binary_body, binary_headers),
        ("REST v2 JSON", "resnet-mini", "/v2/models/resnet-mini/infer", image_json, json_headers),
        ("REST v1 JSON", "resnet-mini", "/v1/models/resnet-mini:predict", v1_json, json_headers),
        ("gRPC raw", "resnet-mini", None, b"", {}),
        ("textcls REST v2 binary", "textcls", "/v2/models/textcls/infer", text_body, text_headers),
        ("trivial REST v2 JSON", "trivial", "/v2/models/trivial/infer", trivial.encode(), json_headers),
    ]
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    rows, results = [], []
    with tempfile.TemporaryDirectory(prefix="bp-cpu-") as tmp:
        work = Path(tmp)
        repo = work / "models"
        write_demo_repository(repo)
        write_bench_models(repo)
        http, grpc_port = free_port(), free_port()
        command = pinned(SERVER_CPU, serve_command(repo, http, grpc_port, "--torch-threads", "1"))
        with child_process(command, ready_url(http), env={SPECS_ENV: static_specs()}) as proc:
            for label, model, path, body, headers in cases:
                if only and label not in only:
                    continue
                warm = min(1.0, args.seconds / 4)
                run = make_run(model, path, body, headers, http, grpc_port, args.connections, work)
                run(warm)
                spy = None
                if args.profile:
                    args.profile.mkdir(parents=True, exist_ok=True)
                    raw = work / "spy.txt"
                    spy = subprocess.Popen(
                        [
                            *pinned(CLIENT_CPU, [str(Path(sys.executable).parent / "py-spy")]),
                            *("record", "-p", str(proc.pid), "-r", "250", "--gil", "-f", "raw", "-o", str(raw)),
                            *("-d", str(int(args.seconds) + 1)),
                        ],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                    time.sleep(0.5)
                threads0 = thread_cpu(proc.pid)
                cpu0, (n0, infer0, i0, e0), t0 = (
                    tree_cpu_seconds(proc.pid),
                    model_stats(http, model),
                    time.perf_counter(),
                )
                run(args.seconds)
                cpu1, (n1, infer1, i1, e1), t1 = (
                    tree_cpu_seconds(proc.pid),
                    model_stats(http, model),
                    time.perf_counter(),
                )
                mean_batch = (i1 - i0) / max(1, e1 - e0)
                threads1 = thread_cpu(proc.pid)
                # The model runs in its own thread (one torch thread): the busiest thread but the event loop's.
                deltas = {tid: threads1[tid] - threads0.get(tid, 0.0) for tid in threads1 if tid != proc.pid}
                model_cpu = max(deltas.values(), default=0.0)
                loop_cpu = threads1.get(proc.pid, 0.0) - threads0.get(proc.pid, 0.0)
                if spy is not None:
                    spy.wait()
                    slug = label.lower().replace(" ", "-")
                    (args.profile / f"{slug}.txt").write_text(profile_summary(raw) + "\n")
                n = max(1, n1 - n0)
                cpu_ms = (cpu1 - cpu0) * 1e3 / n
                infer_ms = (infer1 - infer0) / 1e6 / n
                model_thread_ms = model_cpu * 1e3 / n
                loop_ms = loop_cpu * 1e3 / n
                result = {
                    "path": label,
                    "requests": n,
                    "req_per_s": n / (t1 - t0),
                    "cpu_ms_per_request": cpu_ms,
                    "model_ms_per_request": infer_ms,
                    "beyond_model_ms": cpu_ms - infer_ms,
                    "model_thread_ms_per_request": model_thread_ms,
                    "beyond_model_thread_ms": cpu_ms - model_thread_ms,
                    "event_loop_ms_per_request": loop_ms,
                    "cpu_s_per_1000": cpu_ms,
                    "mean_batch": mean_batch,
                }
                results.append(result)
                rows.append(
                    [
                        label,
                        n,
                        n / (t1 - t0),
                        f"{cpu_ms:.3f}",
                        f"{infer_ms:.3f}",
                        f"{cpu_ms - infer_ms:.3f}",
                        f"{model_thread_ms:.3f}",
                        f"{cpu_ms - model_thread_ms:.3f}",
                        f"{loop_ms:.3f}",
                        f"{mean_batch:.1f}",
                    ]
                )
                print(f"  {rows[-1]}", flush=True)
    print(
        table(
            [
                "path",
                "requests",
                "req/s",
                "CPU ms/req (= CPU s/1000 req)",
                "model infer ms/req (wall)",
                "beyond (wall)",
                "model thread CPU ms/req",
                "beyond the model thread",
                "event loop CPU ms/req",
                "mean batch",
            ],
            rows,
        )
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PERF_ANALYZER", str(Path(__file__).resolve().parents[1] / ".tools/bin/perf_analyzer"))
    sys.exit(main())
