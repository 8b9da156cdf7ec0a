"""Stock KServe ModelServer (no in-process batching): one request, one model call, as KServe's docs show.

Usage (in the kserve venv): python bench/peers/kserve_server.py --model-path model.pt --name N --kind cv --port P
"""

from __future__ import annotations

import kserve
from kserve import InferOutput, InferRequest, InferResponse
from torch_model import PeerArgs, TorchScriptBatch, parse_args


class PeerModel(kserve.Model):
    def __init__(self, args: PeerArgs) -> None:
        super().__init__(args.name)
        self.args = args
        self.run: TorchScriptBatch | None = None

    def load(self) -> bool:
        self.run = TorchScriptBatch(self.args.model_path, self.args.kind)
        self.ready = True
        return self.ready

    async def predict(self, payload: InferRequest, headers=None, response_headers=None) -> InferResponse:
        assert self.run is not None
        outputs = []
        for name, array in zip(self.run.outputs, self.run(payload.inputs[0].as_numpy()), strict=False):
            output = InferOutput(name=name, shape=list(array.shape), datatype="FP32")
            output.set_data_from_numpy(array, binary_data=False)
            outputs.append(output)
        return InferResponse(model_name=self.name, infer_outputs=outputs, response_id=payload.id or "")


if __name__ == "__main__":
    args = parse_args()
    model = PeerModel(args)
    model.load()
    kserve.ModelServer(http_port=args.port, grpc_port=args.grpc_port or 8081).start([model])
