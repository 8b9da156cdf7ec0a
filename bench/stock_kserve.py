"""A stock KServe ModelServer serving one TorchScript model, the way KServe's docs show (no batching).

Usage: python bench/stock_kserve.py --model_path model.pt --model_name NAME --output_name y --http_port 8085
"""

from __future__ import annotations

import argparse

import kserve
import torch
from kserve import InferOutput, InferRequest, InferResponse


class TorchScriptModel(kserve.Model):
    def __init__(self, name: str, path: str, output_name: str) -> None:
        super().__init__(name)
        self.path = path
        self.output_name = output_name
        self.module: torch.jit.ScriptModule | None = None

    def load(self) -> bool:
        self.module = torch.jit.load(self.path).eval()
        self.ready = True
        return self.ready

    async def predict(self, payload: InferRequest, headers=None, response_headers=None) -> InferResponse:
        x = torch.from_numpy(payload.inputs[0].as_numpy())
        with torch.inference_mode():
            y = self.module(x).numpy()
        output = InferOutput(name=self.output_name, shape=list(y.shape), datatype="FP32")
        output.set_data_from_numpy(y, binary_data=False)
        return InferResponse(model_name=self.name, infer_outputs=[output], response_id=payload.id or "")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(parents=[kserve.model_server.parser], conflict_handler="resolve")
    parser.add_argument("--model_path", required=True)
    parser.add_argument("--output_name", default="y")
    args, _ = parser.parse_known_args()
    torch.set_num_threads(1)
    model = TorchScriptModel(args.model_name, args.model_path, args.output_name)
    model.load()
    kserve.ModelServer().start([model])
