"""What issue 13 changed to cut the per-request cost must give the same answers and figures as before:
per-batch metrics and statistics, one send per response, staged collation and two batches in flight
(the GPU path's host side, run here on the CPU)."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry, Histogram

from batchpilot.runtime.batching.batcher import Batcher
from batchpilot.runtime.batching.executor import BatchTimings, Executor, HostStaging
from batchpilot.runtime.kinds import kind_for
from batchpilot.runtime.metrics import RuntimeMetrics, observe_many
from batchpilot.runtime.protocol.one_send import OneSendTransport
from batchpilot.runtime.stats import ModelStats
from test_batcher import Doubler, TokenSum, cv_spec, nlp_spec, vec


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for metric in registry.collect()
        for s in metric.samples
        if not s.name.endswith("_created")
    }


def test_observe_many_counts_as_observe_each() -> None:
    values = [0.0, 0.0004, 0.0005, 0.0006, 0.001, 0.02, 0.7, 3.0, 11.0, 1e9, 0.0005]
    one, many = CollectorRegistry(), CollectorRegistry()
    a = Histogram("h", "h", ["model"], buckets=(0.0005, 0.001, 0.02, 1.0, 10.0), registry=one).labels(model="m")
    b = Histogram("h", "h", ["model"], buckets=(0.0005, 0.001, 0.02, 1.0, 10.0), registry=many).labels(model="m")
    for v in values:
        a.observe(v)
    observe_many(b, values)
    observe_many(b, [])
    assert _samples(one) == pytest.approx(_samples(many))


def test_record_successes_equals_record_success_each() -> None:
    one, many = ModelStats(), ModelStats()
    for queue_ns, total_ns in [(5, 70), (7, 90), (0, 40)]:
        one.record_success(queue_ns, 10, 20, 30, total_ns)
    many.record_successes(3, 12, 10, 20, 30, 200)
    a, b = one.to_json("m"), many.to_json("m")
    a.pop("last_inference"), b.pop("last_inference")
    assert a == b


async def test_batch_metrics_match_what_the_requests_were() -> None:
    batcher = Batcher(
        cv_spec(max_queue_delay_microseconds=5_000_000),
        Executor(cv_spec(), Doubler(), torch.device("cpu")),
        RuntimeMetrics(CollectorRegistry()),
    )
    futures = [batcher.submit(vec(i)) for i in range(7)] + [batcher.submit(vec(-1))]  # the last one fails
    results = await asyncio.gather(*futures, return_exceptions=True)
    assert sum(isinstance(r, Exception) for r in results) == 1
    stats = batcher.stats.to_json("double")["inference_stats"]
    assert stats["success"]["count"] == 7 and stats["fail"]["count"] == 1 and stats["queue"]["count"] == 7
    m = batcher.metrics
    assert m.requests.labels(model="double", outcome="success")._value.get() == 7
    failed = [m.requests.labels(model="double", outcome=o)._value.get() for o in ("invalid", "error")]
    assert sum(failed) == 1
    latency = {s.name: s.value for s in m.latency.collect()[0].samples if s.labels.get("model") == "double"}
    assert latency["batchpilot_request_latency_seconds_count"] == 7
    assert batcher.recent.summary(batcher.loop.time())["throughput_rps"] > 0
    await batcher.drain()


class _Transport:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def write(self, data: bytes) -> None:
        self.calls.append(("write", bytes(data)))

    def writelines(self, chunks: Any) -> None:
        self.calls.append(("writelines", [bytes(c) for c in chunks]))

    def close(self) -> None:
        self.calls.append(("close", None))

    def is_closing(self) -> bool:
        return False


class _Cycle:
    def __init__(self) -> None:
        self.response_started = False
        self.completed = 0
        self.on_response = self._done

    def _done(self) -> None:
        self.completed += 1


def test_one_send_joins_headers_and_body_and_passes_the_rest() -> None:
    transport, cycle = _Transport(), _Cycle()
    wrapped = OneSendTransport(transport, cycle)  # type: ignore[arg-type]
    wrapped.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # before the response: at once
    cycle.response_started = True
    wrapped.write(b"HTTP/1.1 200 OK\r\n\r\n")
    assert transport.calls == [("write", b"HTTP/1.1 100 Continue\r\n\r\n")]
    wrapped.write(b"body")
    wrapped.write(b"more")
    cycle.on_response()
    assert transport.calls[1:] == [("writelines", [b"HTTP/1.1 200 OK\r\n\r\n", b"body"]), ("write", b"more")]
    assert cycle.completed == 1 and wrapped.is_closing() is False


def test_one_send_flushes_headers_without_a_body_write() -> None:
    for end in ("complete", "close"):
        transport, cycle = _Transport(), _Cycle()
        wrapped = OneSendTransport(transport, cycle)  # type: ignore[arg-type]
        cycle.response_started = True
        wrapped.write(b"HTTP/1.1 200 OK\r\n\r\n")  # e.g. a HEAD: no body write follows
        if end == "complete":
            cycle.on_response()
        else:
            wrapped.close()
        assert transport.calls[0] == ("write", b"HTTP/1.1 200 OK\r\n\r\n")


def test_staging_reuses_its_buffer_and_grows() -> None:
    staging = HostStaging(pin=False)
    a = staging.take(0, (2, 3), np.dtype(np.float32))
    b = staging.take(0, (1, 3), np.dtype(np.float32))
    assert np.shares_memory(a, b)
    c = staging.take(0, (64, 3), np.dtype(np.float32))
    assert c.shape == (64, 3) and staging.holds(c) and not staging.holds(np.zeros(3))


def test_collate_into_equals_collate() -> None:
    timings = BatchTimings()
    cv = kind_for(cv_spec())
    parts = [{"x": np.full((n, 4), n, dtype=np.float32)} for n in (1, 3, 2)]
    staging = HostStaging(pin=False)
    for want, got in zip(cv.collate(parts, timings), cv.collate_into(parts, timings, staging.take), strict=True):
        np.testing.assert_array_equal(want, got)
    nlp = kind_for(nlp_spec())
    parts = [{"ids": np.arange(1, 1 + n, dtype=np.int64)[None].repeat(2, 0)} for n in (3, 5)]
    staging.take(0, (8, 8), np.dtype(np.int64)).fill(99)  # stale content must not leak into the padding
    for want, got in zip(nlp.collate(parts, timings), nlp.collate_into(parts, timings, staging.take), strict=True):
        np.testing.assert_array_equal(want, got)


class _Identity(torch.nn.Module):
    """Hands back its input: with a reused buffer, the answer must not change under the next batch."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


@pytest.mark.parametrize("module", [Doubler(), _Identity()])
async def test_staged_pipeline_of_two_answers_every_request_right(module: torch.nn.Module) -> None:
    spec = cv_spec(max_queue_delay_microseconds=1_000)
    executor = Executor(spec, module, torch.device("cpu"), staging=True, pipeline_depth=2)
    assert executor.pipeline_depth == 2
    batcher = Batcher(spec, executor, RuntimeMetrics(CollectorRegistry()))
    factor = 2.0 if isinstance(module, Doubler) else 1.0
    futures = [batcher.submit(vec(float(i), n=1 + i % 3)) for i in range(60)]
    results = await asyncio.gather(*futures)
    for i, out in enumerate(results):
        np.testing.assert_array_equal(out["y"], np.full((1 + i % 3, 4), factor * i, dtype=np.float32))
    await batcher.drain()


async def test_staged_nlp_batches_pad_right() -> None:
    spec = nlp_spec()
    module = TokenSum()
    batcher = Batcher(
        spec, Executor(spec, module, torch.device("cpu"), staging=True), RuntimeMetrics(CollectorRegistry())
    )
    seqs = [np.arange(1, 1 + n, dtype=np.int64)[None] for n in (3, 4, 3, 4, 5)]
    outs = await asyncio.gather(*(batcher.submit({"ids": s}) for s in seqs))
    for s, out in zip(seqs, outs, strict=True):
        assert float(out["total"][0, 0]) == float(s.sum())
        np.testing.assert_array_equal(out["per_token"], s.astype(np.float32))
    await batcher.drain()


def test_preserve_ordering_keeps_one_batch_in_flight() -> None:
    spec = cv_spec(preserve_ordering=True)
    assert Executor(spec, Doubler(), torch.device("cpu"), pipeline_depth=2).pipeline_depth == 1
    assert Executor(cv_spec(), Doubler(), torch.device("cpu")).pipeline_depth == 1  # the CPU default


def _v1_answer(spec: Any, body: bytes, fast: bool) -> Any:
    """What the hub makes of a v1 body: the arrays, or the error's type and message."""
    from batchpilot.runtime.errors import RequestError
    from batchpilot.runtime.hub import ModelHub
    from batchpilot.runtime.protocol import v1_codec

    class Limits:
        max_request_items = 64

    hub = ModelHub(RuntimeMetrics(CollectorRegistry()))
    original = v1_codec._fast_instances
    if not fast:
        v1_codec._fast_instances = lambda spec, body: None  # type: ignore[assignment]
    try:
        groups = v1_codec.decode(spec, body)
        return [hub.build_inputs(spec, Limits(), g) for g in groups]
    except RequestError as exc:
        return (type(exc).__name__, exc.message)
    finally:
        v1_codec._fast_instances = original  # type: ignore[assignment]


@pytest.mark.parametrize("datatype", ["FP32", "FP16", "FP64"])
def test_v1_fast_path_answers_as_the_general_path(datatype: str) -> None:
    import json

    from batchpilot.spec.model import ModelSpec

    spec = ModelSpec.model_validate(
        {
            "name": "img",
            "type": "cv",
            "inputs": [{"name": "image", "datatype": datatype, "shape": [3, 8, 8]}],
            "outputs": [{"name": "y", "datatype": "FP32", "shape": [1]}],
            "batching": {"max_batch_size": 64},
        }
    )
    rng = np.random.default_rng(0)
    good = np.round(rng.standard_normal((2, 3, 8, 8)), 3).tolist()
    pad = " " * 4096  # past the fast path's minimum size
    bodies = [
        {"instances": good},
        {"instances": [[[[1] * 8] * 8] * 3] * 2},  # integers
        {"instances": good[:1]},
        {"instances": [good[0], good[1][:2]]},  # ragged
        {"instances": [good[0], [[[1.0, [2.0], *[0.0] * 6], *good[1][0][1:]], *good[1][1:]]]},  # nested in a leaf
        {"instances": [good[0], [[[True] * 8] * 8] * 3]},  # booleans
        {"instances": [good[0], [[[None] * 8] * 8] * 3]},
        {"instances": [[[[2**60] * 8] * 8] * 3]},  # past 2**53
        {"instances": [[[[1e300] * 8] * 8] * 3]},  # out of range for FP32 / FP16
        {"instances": [[[[70000.0] * 8] * 8] * 3]},
        {"instances": good, "extra": 1},
        {"instances": [good[0]] * 65},  # over max_batch_size
        {"instances": [[[[1.0] * 8] * 8] * 4]},  # wrong shape
        {"instances": []},
        {"instances": [[]]},
        {"instances": [{"image": good[0]}]},
    ]
    for doc in bodies:
        body = (json.dumps(doc) + pad).encode()
        fast, general = _v1_answer(spec, body, True), _v1_answer(spec, body, False)
        if isinstance(general, tuple):
            assert fast == general, doc
        else:
            assert not isinstance(fast, tuple), (doc, fast)
            for a, b in zip(fast, general, strict=True):
                for name in a:
                    assert a[name].dtype == b[name].dtype
                    np.testing.assert_array_equal(a[name], b[name])
    body = (json.dumps({"instances": good}) + pad).encode()
    assert v1_codec_fast(spec, body) is not None  # the common body does take the fast path


def v1_codec_fast(spec: Any, body: bytes) -> Any:
    from batchpilot.runtime.protocol import v1_codec

    return v1_codec._fast_instances(spec, body)
