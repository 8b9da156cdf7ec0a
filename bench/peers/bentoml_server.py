"""BentoML with adaptive batching: a `batchable` API (max_batch_size; BentoML tunes the wait itself).

The request is v2 JSON: its `inputs` list is the batchable argument, so BentoML concatenates the
`inputs` of queued requests into one list (batch_dim 0) and splits the returned list again.
`max_latency_ms` is set as in BentoML's adaptive-batching docs example (1000 ms): requests predicted
to miss it are shed with 503.
Usage (in the bentoml venv): python bench/peers/bentoml_server.py --model-path model.pt --name N --kind cv --port P
(re-executes itself under `bentoml serve`; the settings travel in the environment).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import bentoml
from torch_model import PeerArgs, TorchScriptBatch, parse_args, run_v2_batch, v2_input_array

ENV = "PEER_ARGS"
ARGS = PeerArgs(**json.loads(os.environ[ENV])) if ENV in os.environ else None


@bentoml.service(workers=1, traffic={"timeout": 60})
class Peer:
    def __init__(self) -> None:
        assert ARGS is not None
        self.run = TorchScriptBatch(ARGS.model_path, ARGS.kind)

    @bentoml.api(batchable=True, batch_dim=0, max_batch_size=ARGS.max_batch_size if ARGS else 16, max_latency_ms=1000)
    def infer(self, inputs: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
        return run_v2_batch(self.run, [v2_input_array(item) for item in inputs])


if __name__ == "__main__":
    args = parse_args()
    here = Path(__file__).resolve().parent
    os.environ[ENV] = json.dumps(asdict(args))
    os.environ.setdefault("BENTOML_DO_NOT_TRACK", "True")
    bentoml_cli = str(Path(sys.executable).with_name("bentoml"))
    os.execv(
        bentoml_cli,
        [
            bentoml_cli,
            "serve",
            f"{Path(__file__).stem}:Peer",
            "--working-dir",
            str(here),
            "--host",
            "127.0.0.1",
            "--port",
            str(args.port),
        ],
    )
