"""Prebuilt v2 requests for the demo models: binary tensor bodies, load-generator requests, perf_analyzer data."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from batchpilot.runtime.demo_models import IMAGE_SIZE, VOCAB_SIZE
from batchpilot.testing.loadgen import build_request


def v2_binary_body(name: str, datatype: str, array: np.ndarray, outputs: list[str]) -> tuple[bytes, dict[str, str]]:
    """A v2 infer request in the binary tensor extension (binary outputs too)."""
    data = np.ascontiguousarray(array).tobytes()
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": name,
                    "datatype": datatype,
                    "shape": list(array.shape),
                    "parameters": {"binary_data_size": len(data)},
                }
            ],
            "outputs": [{"name": o, "parameters": {"binary_data": True}} for o in outputs],
        }
    ).encode()
    return header + data, {
        "Inference-Header-Content-Length": str(len(header)),
        "Content-Type": "application/octet-stream",
    }


def demo_requests(model: str, host: str, count: int = 64, seed: int = 0) -> list[bytes]:
    """Prebuilt HTTP requests for a demo model: single images, or single sequences of 8-64 tokens."""
    rng = np.random.default_rng(seed)
    requests = []
    for _ in range(count):
        array: np.ndarray
        if model == "resnet-mini":
            array = rng.standard_normal((1, 3, IMAGE_SIZE, IMAGE_SIZE), dtype=np.float32)
            body, headers = v2_binary_body("image", "FP32", array, ["logits"])
        else:
            array = rng.integers(1, VOCAB_SIZE, size=(1, int(rng.integers(8, 65))), dtype=np.int64)
            body, headers = v2_binary_body("input_ids", "INT64", array, ["logits", "token_scores"])
        requests.append(build_request(host, f"/v2/models/{model}/infer", body, headers))
    return requests


def perf_analyzer_token_data(path: Path, count: int = 16, seed: int = 3, lengths: tuple[int, int] = (8, 64)) -> Path:
    """perf_analyzer `--input-data` for the NLP demo model: real token ids, `lengths` (inclusive) of them per
    request (perf_analyzer's own random INT64 data would hold ids outside the vocabulary)."""
    rng = np.random.default_rng(seed)
    entries = []
    for _ in range(count):
        length = int(rng.integers(lengths[0], lengths[1] + 1))
        entries.append({"input_ids": {"content": rng.integers(1, VOCAB_SIZE, length).tolist(), "shape": [length]}})
    path.write_text(json.dumps({"data": entries}))
    return path
