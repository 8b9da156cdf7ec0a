"""Ray Serve with `@serve.batch` (max_batch_size, batch_wait_timeout_s), as Ray's batching guide shows.

`max_ongoing_requests` is raised to twice the batch size: Ray's default (5) caps a replica below one
full batch (Ray issue 43288). The request is v2 JSON; Ray has no codec of its own, so it parses the
body with Starlette's `request.json()` as Ray's docs do.
Usage (in the ray venv): python bench/peers/ray_server.py --model-path model.pt --name N --kind cv --port P
"""

from __future__ import annotations

import signal
from typing import Any

import numpy as np
import ray
from ray import serve
from starlette.requests import Request
from torch_model import PeerArgs, TorchScriptBatch, parse_args, run_v2_batch, v2_input_array


def build(args: PeerArgs) -> Any:
    @serve.deployment(max_ongoing_requests=2 * args.max_batch_size)
    class Peer:
        def __init__(self) -> None:
            self.run = TorchScriptBatch(args.model_path, args.kind)

        @serve.batch(max_batch_size=args.max_batch_size, batch_wait_timeout_s=args.max_wait_ms / 1e3)
        async def infer(self, arrays: list[np.ndarray]) -> list[list[dict[str, Any]]]:
            return run_v2_batch(self.run, arrays)

        async def __call__(self, request: Request) -> dict[str, Any] | str:
            if request.method == "GET":
                return "ready"
            doc = await request.json()
            return {"model_name": args.name, "outputs": await self.infer(v2_input_array(doc["inputs"][0]))}

    return Peer.bind()


if __name__ == "__main__":
    args = parse_args()
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    serve.run(build(args), name=args.name, route_prefix="/")
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    serve.shutdown()
    ray.shutdown()
