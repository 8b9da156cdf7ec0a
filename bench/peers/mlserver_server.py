"""Seldon MLServer with adaptive batching (`max_batch_size`, `max_batch_time` in the model settings).

MLServer merges queued requests along dim 0 before `predict` and splits the response again. The
runtime class is imported by MLServer's inference worker process, so this folder goes on PYTHONPATH.
Usage (in the mlserver venv): python bench/peers/mlserver_server.py --model-path model.pt --name N --kind cv --port P
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from mlserver import MLModel, MLServer
from mlserver.codecs import NumpyCodec
from mlserver.settings import ModelParameters, ModelSettings, Settings
from mlserver.types import InferenceRequest, InferenceResponse
from mlserver.utils import install_uvloop_event_loop
from torch_model import TorchScriptBatch, parse_args


class TorchScriptRuntime(MLModel):
    """The model behind MLServer's adaptive batcher (runs in MLServer's inference worker process)."""

    async def load(self) -> bool:
        params = self.settings.parameters
        self.run = TorchScriptBatch(params.uri, params.extra["kind"])
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        arrays = self.run(NumpyCodec.decode_input(payload.inputs[0]))
        return InferenceResponse(
            model_name=self.name,
            id=payload.id,
            outputs=[
                NumpyCodec.encode_output(name, array) for name, array in zip(self.run.outputs, arrays, strict=False)
            ],
        )


if __name__ == "__main__":
    args = parse_args()
    here = str(Path(__file__).resolve().parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    sys.path.insert(0, here)
    settings = Settings(
        host="127.0.0.1", http_port=args.port, grpc_port=args.grpc_port or 8081, metrics_port=args.metrics_port or 8082
    )
    model = ModelSettings(
        name=args.name,
        implementation=TorchScriptRuntime.__module__ + ".TorchScriptRuntime",
        max_batch_size=args.max_batch_size,
        max_batch_time=args.max_wait_ms / 1e3,
        parameters=ModelParameters(uri=args.model_path, extra={"kind": args.kind}),
    )

    async def serve() -> None:  # as `mlserver start` does: the server is built inside the running loop
        await MLServer(settings).start([model])

    install_uvloop_event_loop()
    asyncio.run(serve())
