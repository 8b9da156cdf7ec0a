"""The server's own p99 beside the client's, and the CPU each server process took, per closed-loop level.

One `batchpilot serve` pinned to one core (one torch thread, both demo models loaded, one of them driven), wrk on
the other core, levels of N keep-alive connections in turn (after a 2-s warm-up at 8). After each level it reads
`GET /v2/models/{m}/batching`: the recent window's p99 (the server's latency, from the front-end's read of each
request to its batch's end) and the parameters in force; and the CPU seconds each process of the server's tree
took during the level (the serving process, the autotuner's plan worker). A static setting (`--setting 16/3`, max
batch size / delay in ms) or the autotuner (`--setting auto`, with its decision log in `--log`).

What it answers: how much of the client's latency the server sees (docs/bench/autotune-history.md, run AA: 80.7 ms
against wrk's 83.0 at 64 clients), and what the tuner's own work costs the requests served (the same setting static
and autotuned, side by side in two runs).

Usage:
  .venv/bin/python bench/server_p99.py --model textcls --setting 32/10 --levels 32,64,64
  .venv/bin/python bench/server_p99.py --model textcls --setting auto --levels 1,2,4,8,16,32,64 --log /tmp/at.log
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from common import bench_lock, process, process_cpu_seconds, static_specs, workloads, wrk
from peers_bench import batchpilot_command, batchpilot_specs

from batchpilot.runtime.demo import batch_counts
from batchpilot.runtime.demo_models import build_demo_modules, write_demo_repository
from batchpilot.runtime.repository import SPECS_ENV
from batchpilot.testing.processes import free_port, get_json


def model_specs(setting: str) -> str:
    """BATCHPILOT_MODEL_SPECS for the demo models: `auto` (their autotuned specs) or `N/MS` (static, every model)."""
    if setting == "auto":
        return batchpilot_specs(autotune=True)
    size, delay_ms = setting.split("/")
    return static_specs((int(size), float(delay_ms)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet-mini", choices=sorted(build_demo_modules()))
    parser.add_argument("--setting", default="auto", help="auto, or MAX_BATCH/DELAY_MS for a static setting")
    parser.add_argument("--levels", default="32,64", help="connections per level, comma-separated")
    parser.add_argument("--seconds", type=int, default=10, help="per level")
    parser.add_argument("--encoding", default="json", choices=("json", "binary"))
    parser.add_argument("--log", type=Path, help="keep the server's log (the autotuner's decisions) here")
    args = parser.parse_args()
    work = next(w for w in workloads()[args.encoding] if w.model == args.model)
    with bench_lock(), tempfile.TemporaryDirectory(prefix="bp-p99-") as name:
        tmp = Path(name)
        repo = tmp / "models"
        write_demo_repository(repo)
        port = free_port()
        ready = f"http://127.0.0.1:{port}/v2/health/ready"
        env = {SPECS_ENV: model_specs(args.setting)}
        with process(batchpilot_command(repo, port), ready, env=env, log=args.log or tmp / "server.log") as server:
            url = f"http://127.0.0.1:{port}/v2/models/{args.model}"
            wrk(f"{url}/infer", work.body, work.headers, connections=8, duration_s=2, workdir=tmp)
            print(f"{args.model}, {args.setting}, {args.encoding} bodies, {args.seconds} s a level")
            print(
                "| clients | wrk req/s | wrk p50 ms | wrk p99 ms | server p99 ms | in force | mean batch "
                "| CPU s by process |"
            )
            print("|---|---|---|---|---|---|---|---|")
            for connections in (int(c) for c in args.levels.split(",")):
                before, counts = process_cpu_seconds(server.pid), batch_counts(port, args.model)
                r = wrk(
                    f"{url}/infer",
                    work.body,
                    work.headers,
                    connections=connections,
                    duration_s=args.seconds,
                    workdir=tmp,
                )
                after, items_batches = process_cpu_seconds(server.pid), batch_counts(port, args.model)
                batches = items_batches[1] - counts[1]
                mean_batch = (items_batches[0] - counts[0]) / batches if batches else 0.0
                state = get_json(f"{url}/batching", timeout_s=10)
                used = ", ".join(f"{after[pid] - before.get(pid, 0.0):.2f}" for pid in sorted(after))
                in_force = f"{state['max_batch_size']} / {state['max_queue_delay_microseconds'] / 1000:g} ms"
                print(
                    f"| {connections} | {r.requests_per_s:,.1f} | {r.p50_ms:.1f} | {r.p99_ms:.1f} | "
                    f"{state['recent']['p99_ms']} | {in_force} | {mean_batch:.1f} | {used} |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
