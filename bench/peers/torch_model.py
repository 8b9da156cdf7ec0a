"""What every peer server shares: its command line, the TorchScript model run on one thread, v2 JSON glue.

Runs inside each peer's own virtual environment (torch and numpy only), imported by the
`<peer>_server.py` next to it, so every peer does exactly the same work per batch.
"""

from __future__ import annotations

import argparse
import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

#: Output names of the demo models (src/batchpilot/runtime/demo_models.py), per model kind.
OUTPUTS: dict[str, list[str]] = {"cv": ["logits"], "nlp": ["logits", "token_scores"]}
DTYPES: dict[str, Any] = {"FP32": np.float32, "INT64": np.int64}


@dataclass
class PeerArgs:
    model_path: str
    name: str
    kind: str  # "cv" or "nlp"
    port: int
    grpc_port: int
    metrics_port: int
    max_batch_size: int
    max_wait_ms: float


def parse_args(argv: list[str] | None = None) -> PeerArgs:
    parser = argparse.ArgumentParser(description="serve one demo TorchScript model with a peer server")
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--kind", choices=sorted(OUTPUTS), required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--grpc-port", type=int, default=0, help="for peers that also open gRPC")
    parser.add_argument("--metrics-port", type=int, default=0, help="for peers with a separate metrics server")
    parser.add_argument("--max-batch-size", type=int, default=16)
    parser.add_argument("--max-wait-ms", type=float, default=3.0)
    return PeerArgs(**vars(parser.parse_args(argv)))


class TorchScriptBatch:
    """The model on one torch thread: a batch along dim 0 in, one array per output out."""

    def __init__(self, path: str, kind: str) -> None:
        torch.set_num_threads(1)
        self.module = torch.jit.load(path).eval()
        self.kind = kind
        self.outputs = OUTPUTS[kind]

    def __call__(self, batch: np.ndarray) -> list[np.ndarray]:
        x = torch.from_numpy(np.ascontiguousarray(batch))
        with torch.inference_mode():
            # NLP: every request has the same fixed length, so the attention mask is all ones.
            result = self.module(x, torch.ones_like(x)) if self.kind == "nlp" else (self.module(x),)
        return [r.numpy() for r in result]


def v2_input_array(item: dict[str, Any]) -> np.ndarray:
    """One v2 JSON input (`{"name", "datatype", "shape", "data"}`) as an array (for peers without a v2 codec)."""
    return np.asarray(item["data"], dtype=DTYPES[item["datatype"]]).reshape(item["shape"])


def v2_outputs(names: list[str], arrays: list[np.ndarray]) -> list[dict[str, Any]]:
    """v2 JSON outputs of one request (for peers without a v2 codec)."""
    return [
        {"name": n, "datatype": "FP32", "shape": list(a.shape), "data": a.reshape(-1).tolist()}
        for n, a in zip(names, arrays, strict=False)
    ]


def run_v2_batch(run: TorchScriptBatch, requests: list[np.ndarray]) -> list[list[dict[str, Any]]]:
    """Several requests' inputs as one model call; each request's v2 JSON outputs (for peers without a v2 codec)."""
    results = run(np.concatenate(requests))
    bounds = np.cumsum([0, *(len(r) for r in requests)])
    return [v2_outputs(run.outputs, [a[lo:hi] for a in results]) for lo, hi in itertools.pairwise(bounds)]
