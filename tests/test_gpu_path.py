"""The GPU path (run by tools/gpu-check.sh on a machine with CUDA; skipped elsewhere): pinned staging, a copy
and a compute stream per model, two batches in flight, outputs back once per batch."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry

from batchpilot.runtime.batching.batcher import Batcher
from batchpilot.runtime.batching.executor import Executor
from batchpilot.runtime.metrics import RuntimeMetrics
from test_batcher import Doubler, TokenSum, cv_spec, nlp_spec, vec

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _gpu(module: torch.nn.Module) -> torch.nn.Module:
    return module.to(torch.device("cuda"))


def test_gpu_executor_defaults() -> None:
    executor = Executor(cv_spec(), _gpu(Doubler()), torch.device("cuda"))
    assert executor.pipeline_depth == 2 and executor.staging and executor.pin
    assert executor._copy_stream is not None and executor._compute_stream is not None
    assert executor._copy_stream != executor._compute_stream


async def test_gpu_answers_every_request_right_with_two_batches_in_flight() -> None:
    spec = cv_spec(max_queue_delay_microseconds=500)
    batcher = Batcher(spec, Executor(spec, _gpu(Doubler()), torch.device("cuda")), RuntimeMetrics(CollectorRegistry()))
    futures = [batcher.submit(vec(float(i), n=1 + i % 3, width=256)) for i in range(400)]
    results = await asyncio.gather(*futures)
    for i, out in enumerate(results):
        assert isinstance(out["y"], np.ndarray)
        np.testing.assert_array_equal(out["y"], np.full((1 + i % 3, 256), 2.0 * i, dtype=np.float32))
    stats = batcher.stats.to_json("double")
    assert stats["inference_stats"]["success"]["count"] == 400 and stats["execution_count"] < 400
    await batcher.drain()


async def test_gpu_isolates_a_failing_request() -> None:
    spec = cv_spec(max_queue_delay_microseconds=20_000)
    batcher = Batcher(spec, Executor(spec, _gpu(Doubler()), torch.device("cuda")), RuntimeMetrics(CollectorRegistry()))
    results = await asyncio.gather(*(batcher.submit(vec(v)) for v in (1.0, -1.0, 3.0)), return_exceptions=True)
    assert isinstance(results[1], Exception)
    np.testing.assert_array_equal(results[2]["y"], np.full((1, 4), 6.0, dtype=np.float32))
    await batcher.drain()


async def test_gpu_nlp_padding_and_per_token_outputs() -> None:
    spec = nlp_spec()
    batcher = Batcher(spec, Executor(spec, _gpu(TokenSum()), torch.device("cuda")), RuntimeMetrics(CollectorRegistry()))
    seqs = [np.arange(1, 1 + n, dtype=np.int64)[None] for n in (3, 4, 3, 4, 5, 7)]
    outs = await asyncio.gather(*(batcher.submit({"ids": s}) for s in seqs))
    for s, out in zip(seqs, outs, strict=True):
        assert float(out["total"][0, 0]) == float(s.sum())
        np.testing.assert_array_equal(out["per_token"], s.astype(np.float32))
    await batcher.drain()
