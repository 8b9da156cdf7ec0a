"""The batcher on a real event loop with small torch modules: release rules, grouping, isolation, queue policy."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry

from batchpilot.runtime.batching.batcher import Batcher
from batchpilot.runtime.batching.device_turns import MAX_TURN_S, DeviceTurns
from batchpilot.runtime.batching.executor import Executor
from batchpilot.runtime.batching.observers import BatchObserver, Observers
from batchpilot.runtime.errors import DeadlineExceeded, ModelFailed, Unavailable
from batchpilot.runtime.metrics import RuntimeMetrics
from batchpilot.spec.model import ModelSpec


class Doubler(torch.nn.Module):
    """Records every batch it sees; fails on any item containing a negative value."""

    def __init__(self, delay_s: float = 0.0) -> None:
        super().__init__()
        self.batches: list[int] = []
        self.delay_s = delay_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.batches.append(x.shape[0])
        if self.delay_s:
            import time

            time.sleep(self.delay_s)
        if (x < 0).any():
            raise ValueError("negative input")
        return x * 2


class TokenSum(torch.nn.Module):
    """NLP-shaped: returns the per-sequence sum of real tokens and per-token ids+mask."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, int]] = []

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.shapes.append(tuple(ids.shape))
        return (ids * mask).sum(1, keepdim=True).float(), (ids * mask).float()


def cv_spec(**batching) -> ModelSpec:
    return ModelSpec.model_validate(
        {
            "name": "double",
            "type": "cv",
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1]}],
            "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1]}],
            "batching": {"max_batch_size": 8, "max_queue_delay_microseconds": 20_000, **batching},
        }
    )


def nlp_spec(**sequence) -> ModelSpec:
    return ModelSpec.model_validate(
        {
            "name": "tokens",
            "type": "nlp",
            "inputs": [{"name": "ids", "datatype": "INT64", "shape": [-1]}],
            "outputs": [
                {"name": "total", "datatype": "FP32", "shape": [1]},
                {"name": "per_token", "datatype": "FP32", "shape": [-1]},
            ],
            "batching": {"max_batch_size": 8, "max_queue_delay_microseconds": 20_000},
            "sequence": {"max_length": 64, "max_padding_waste": 0.25, **sequence},
        }
    )


def make(spec: ModelSpec, module: torch.nn.Module) -> Batcher:
    return Batcher(spec, Executor(spec, module, torch.device("cpu")), RuntimeMetrics(CollectorRegistry()))


def vec(value: float, n: int = 1, width: int = 4) -> dict[str, np.ndarray]:
    return {"x": np.full((n, width), value, dtype=np.float32)}


def released(batcher: Batcher, reason: str) -> float:
    return batcher.metrics.release.labels(model=batcher.spec.name, reason=reason)._value.get()


async def test_full_batch_released_at_once_and_window_counts_from_first_request() -> None:
    module = Doubler()
    batcher = make(cv_spec(max_queue_delay_microseconds=5_000_000), module)
    futures = [batcher.submit(vec(i)) for i in range(8)]
    results = await asyncio.wait_for(asyncio.gather(*futures), 2.0)  # far less than the 5 s window
    assert module.batches == [8]
    assert released(batcher, "full") == 1
    for i, out in enumerate(results):
        np.testing.assert_array_equal(out["y"], np.full((1, 4), 2.0 * i, dtype=np.float32))


async def test_delay_release_and_preferred_size() -> None:
    module = Doubler()
    batcher = make(cv_spec(max_queue_delay_microseconds=30_000, preferred_batch_size=[2, 4]), module)
    await asyncio.gather(*(batcher.submit(vec(1)) for _ in range(4)))
    assert module.batches == [4] and released(batcher, "preferred") == 1
    loop = asyncio.get_running_loop()
    start = loop.time()
    await batcher.submit(vec(1))
    waited = loop.time() - start
    assert module.batches[-1] == 1 and released(batcher, "delay") == 1
    assert 0.025 <= waited < 0.5  # the window (30 ms) was honoured, not skipped


async def test_oversized_request_is_split_and_reassembled() -> None:
    module = Doubler()
    spec = cv_spec(max_batch_size=4, max_queue_delay_microseconds=0)
    batcher = make(spec, module)
    x = np.arange(10 * 4, dtype=np.float32).reshape(10, 4)
    out = await batcher.submit({"x": x})
    assert module.batches == [4, 4, 2]
    np.testing.assert_array_equal(out["y"], x * 2)


async def test_different_shapes_never_share_a_batch() -> None:
    module = Doubler()
    batcher = make(cv_spec(), module)
    futures = [batcher.submit(vec(1, width=w)) for w in (3, 5, 3, 5, 3)]
    outs = await asyncio.gather(*futures)
    assert sorted(module.batches) == [2, 3]
    assert [o["y"].shape[1] for o in outs] == [3, 5, 3, 5, 3]


async def test_bad_request_fails_alone_by_bisection() -> None:
    module = Doubler()
    batcher = make(cv_spec(), module)
    futures = [batcher.submit(vec(-1 if i == 5 else i)) for i in range(8)]
    results = await asyncio.gather(*futures, return_exceptions=True)
    assert isinstance(results[5], ModelFailed) and "negative input" in results[5].message
    for i, r in enumerate(results):
        if i != 5:
            np.testing.assert_array_equal(r["y"], np.full((1, 4), 2.0 * i, dtype=np.float32))


async def test_nlp_groups_by_length_and_unpads() -> None:
    module = TokenSum()
    batcher = make(nlp_spec(), module)
    lengths = [10, 40, 11, 41, 12, 39]
    futures = [batcher.submit({"ids": np.arange(1, n + 1, dtype=np.int64)[None]}) for n in lengths]
    outs = await asyncio.gather(*futures)
    assert sorted(module.shapes) == [(3, 12), (3, 41)]  # two groups, padded only to their own longest
    for n, out in zip(lengths, outs, strict=False):
        assert out["total"][0, 0] == n * (n + 1) / 2
        np.testing.assert_array_equal(out["per_token"][0], np.arange(1, n + 1, dtype=np.float32))
    efficiency = batcher.metrics.padding_efficiency.labels(model="tokens")._value.get()
    assert 0.75 <= efficiency <= 1.0


async def test_priority_levels_serve_the_highest_first() -> None:
    module = Doubler(delay_s=0.05)
    batcher = make(
        cv_spec(max_batch_size=1, max_queue_delay_microseconds=0, priority_levels=2, default_priority_level=2), module
    )
    order: list[str] = []
    first = batcher.submit(vec(0))  # occupies the model
    await asyncio.sleep(0.01)
    low = batcher.submit(vec(1))
    high = batcher.submit(vec(2), priority=1)
    low.add_done_callback(lambda _: order.append("low"))
    high.add_done_callback(lambda _: order.append("high"))
    await asyncio.gather(first, low, high)
    assert order == ["high", "low"]


async def test_timeout_reject_fires_while_the_model_is_busy() -> None:
    module = Doubler(delay_s=0.3)
    batcher = make(cv_spec(max_batch_size=1, max_queue_delay_microseconds=0), module)
    busy = batcher.submit(vec(0))
    await asyncio.sleep(0.01)
    loop = asyncio.get_running_loop()
    start = loop.time()
    late = batcher.submit(vec(1), timeout_us=50_000)
    with pytest.raises(DeadlineExceeded):
        await late
    assert loop.time() - start < 0.2  # failed at its deadline, not after the 300 ms batch
    await busy
    assert module.batches == [1]  # the expired request never ran


async def test_timeout_delay_demotes_instead_of_failing() -> None:
    module = Doubler(delay_s=0.1)
    spec = cv_spec(
        max_batch_size=1,
        max_queue_delay_microseconds=0,
        default_queue_policy={"timeout_action": "DELAY", "default_timeout_microseconds": 20_000},
    )
    batcher = make(spec, module)
    outs = await asyncio.gather(*(batcher.submit(vec(i)) for i in range(3)))
    assert [float(o["y"][0, 0]) for o in outs] == [0.0, 2.0, 4.0]


async def test_request_timeout_may_only_lower_the_default() -> None:
    batcher = make(cv_spec(default_queue_policy={"default_timeout_microseconds": 1000}), Doubler())
    assert batcher.queue.timeout_s(500) == pytest.approx(0.0005)
    assert batcher.queue.timeout_s(5_000_000) == pytest.approx(0.001)


async def test_full_queue_refuses_at_once_with_retry_after() -> None:
    module = Doubler(delay_s=0.2)
    batcher = make(
        cv_spec(max_batch_size=1, max_queue_delay_microseconds=0, default_queue_policy={"max_queue_size": 2}), module
    )
    accepted = [batcher.submit(vec(0))]
    await asyncio.sleep(0.01)  # the first one runs; two may wait
    accepted += [batcher.submit(vec(1)), batcher.submit(vec(2))]
    told = Refusals()
    batcher.observers = Observers([*batcher.observers.observers, told])
    with pytest.raises(Unavailable) as refused:
        batcher.submit(vec(3))
    assert "queue full" in refused.value.message and "retry-after" in refused.value.headers()
    assert told.items == [1]  # (the autotuner counts it as an arrival its queue could not take)
    assert len(await asyncio.gather(*accepted)) == 3


class Refusals(BatchObserver):
    def __init__(self) -> None:
        self.items: list[int] = []

    def refused(self, n_items: int) -> None:
        self.items.append(n_items)


async def test_preserve_ordering_keeps_fifo_across_shapes() -> None:
    module = Doubler()
    batcher = make(cv_spec(preserve_ordering=True, max_queue_delay_microseconds=10_000), module)
    done: list[int] = []
    futures = [batcher.submit(vec(i, width=3 if i % 2 else 4)) for i in range(6)]
    for i, f in enumerate(futures):
        f.add_done_callback(lambda _, i=i: done.append(i))
    await asyncio.gather(*futures)
    assert done == list(range(6))


async def test_drain_answers_everything_accepted_then_refuses() -> None:
    module = Doubler(delay_s=0.02)
    batcher = make(cv_spec(max_batch_size=2), module)
    futures = [batcher.submit(vec(i)) for i in range(7)]
    await batcher.drain()
    assert all(f.done() and not f.exception() for f in futures)
    with pytest.raises(Unavailable):
        batcher.submit(vec(9))


class Hangs(torch.nn.Module):
    """Blocks until released: a model that hangs."""

    def __init__(self) -> None:
        super().__init__()
        import threading

        self.release = threading.Event()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.release.wait(10)
        return x


async def test_watchdog_fails_a_hung_batch_and_marks_the_model_unready() -> None:
    module = Hangs()
    spec = cv_spec(max_batch_size=2, max_queue_delay_microseconds=0)
    batcher = Batcher(
        spec, Executor(spec, module, torch.device("cpu")), RuntimeMetrics(CollectorRegistry()), hang_timeout_s=0.2
    )
    loop = asyncio.get_running_loop()
    start = loop.time()
    running = batcher.submit(vec(1))
    await asyncio.sleep(0.05)
    queued = batcher.submit(vec(2))
    for future in (running, queued):
        with pytest.raises(Unavailable, match="hangs"):
            await future
    assert loop.time() - start < 1.0  # the event loop stayed responsive
    assert batcher.hung
    with pytest.raises(Unavailable):
        batcher.submit(vec(3))
    module.release.set()
    deadline = loop.time() + 5
    while batcher.hung and loop.time() < deadline:
        await asyncio.sleep(0.01)
    assert not batcher.hung  # it came back: serving again
    out = await batcher.submit(vec(4))
    assert out["y"][0, 0] == 4.0


class RunsOutOfMemory(torch.nn.Module):
    """Raises CUDA's out-of-memory error (simulated on the CPU) for batches above 4 items."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.batches.append(x.shape[0])
        if x.shape[0] > 4:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return x * 2


async def test_out_of_memory_splits_the_batch_and_lowers_the_ceiling() -> None:
    module = RunsOutOfMemory()
    batcher = make(cv_spec(max_batch_size=8, max_queue_delay_microseconds=50_000), module)
    outs = await asyncio.gather(*(batcher.submit(vec(i)) for i in range(8)))
    assert [float(o["y"][0, 0]) for o in outs] == [2.0 * i for i in range(8)]  # nobody failed
    assert module.batches[0] == 8 and all(b <= 4 for b in module.batches[1:])
    await asyncio.sleep(0)  # the ceiling is set from the executor thread via the loop
    assert batcher.params.max_batch_size == 4
    await asyncio.gather(*(batcher.submit(vec(i)) for i in range(8)))
    assert max(module.batches[-2:]) <= 4  # later batches respect the ceiling


def sharing(spec: ModelSpec, name: str, module: torch.nn.Module, turns: DeviceTurns | None) -> Batcher:
    spec = spec.model_copy(update={"name": name})
    return Batcher(spec, Executor(spec, module, torch.device("cpu")), RuntimeMetrics(CollectorRegistry()), turns=turns)


async def submit_while_the_other_runs(turns: DeviceTurns | None) -> list[int]:
    """Model a runs a 0.15-s batch; meanwhile five requests reach model b (delay 0) 10 ms apart. Returns b's
    batch sizes."""
    slow, fast = Doubler(delay_s=0.15), Doubler()
    a = sharing(cv_spec(max_queue_delay_microseconds=0), "a", slow, turns)
    b = sharing(cv_spec(max_queue_delay_microseconds=0), "b", fast, turns)
    running = a.submit(vec(1))
    await asyncio.sleep(0.03)
    waiting = []
    for i in range(5):
        waiting.append(b.submit(vec(i)))
        await asyncio.sleep(0.01)
    outs = await asyncio.wait_for(asyncio.gather(running, *waiting), 2.0)
    assert [o["y"][0, 0] for o in outs] == [2.0, 0.0, 2.0, 4.0, 6.0, 8.0]
    return fast.batches


async def test_models_sharing_the_cpu_take_turns_and_gather_while_another_runs() -> None:
    """With turns, b's batch forms when a's is over and takes all five; without, b's requests leave one by one
    beside a's batch (each of them time-slicing the core with it)."""
    assert await submit_while_the_other_runs(DeviceTurns()) == [5]
    assert (await submit_while_the_other_runs(None))[0] == 1


async def test_a_hung_models_turn_stops_binding_the_others() -> None:
    turns = DeviceTurns()
    stuck = Hangs()
    a = sharing(cv_spec(max_queue_delay_microseconds=0), "a", stuck, turns)
    b = sharing(cv_spec(max_queue_delay_microseconds=0), "b", Doubler(), turns)
    loop = asyncio.get_running_loop()
    hung = a.submit(vec(1))
    await asyncio.sleep(0.05)
    start = loop.time()
    out = await asyncio.wait_for(b.submit(vec(3)), 5.0)
    assert out["y"][0, 0] == 6.0 and MAX_TURN_S - 0.1 <= loop.time() - start < MAX_TURN_S + 1.0
    stuck.release.set()
    await hung
