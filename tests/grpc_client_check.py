"""Run in its own process (tritonclient's gRPC protos clash with KServe's): infer concurrently over gRPC
and write the outputs to an .npz file for the test to compare."""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import tritonclient.grpc as grpcclient

url, model, name, datatype, inputs_path, out_path = sys.argv[1:7]
arrays = list(np.load(inputs_path).values())


def infer(array: np.ndarray) -> dict[str, np.ndarray]:
    client = grpcclient.InferenceServerClient(url)
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    result = client.infer(model, [tensor])
    return {o.name: result.as_numpy(o.name) for o in result.get_response().outputs}


with ThreadPoolExecutor(16) as pool:
    results = list(pool.map(infer, arrays))
client = grpcclient.InferenceServerClient(url)
config = client.get_model_config(model).config
assert config.max_batch_size >= 16, config
assert client.is_model_ready(model)
stats = client.get_inference_statistics(model).model_stats[0]
assert stats.inference_count >= len(arrays), stats
np.savez(out_path, **{f"{i}:{k}": v for i, r in enumerate(results) for k, v in r.items()})
print("ok")
