"""One batcher per hosted model: it forms batches.

Around it: the model kind (which requests may share a batch, runtime/kinds), the policy queue (admission,
priorities, timeouts: queue.PolicyQueue), the runner (execution, hang watchdog and answers: runner), the
tuner (the parameters in force: tuning) and the observers (statistics, metrics, recent window, and the
tuner again: observers), told of every arrival, release, execution and answer.

Everything here runs on the server's event loop except `Executor.run`, which runs in the model's own
thread. One batch executes at a time; while it runs, arrivals queue up and the next batch's window
keeps counting, so the next batch is released the moment the model is free (or its window closes). Models
that share the CPU also wait for their turn (`device_turns`) before a batch forms.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time

import numpy as np

from batchpilot.runtime.autotuner import TuningParams
from batchpilot.runtime.batching.device_turns import DeviceTurns
from batchpilot.runtime.batching.executor import Executor
from batchpilot.runtime.batching.observers import MetricsObserver, Observers, RecentObserver, StatsObserver
from batchpilot.runtime.batching.queue import PolicyQueue
from batchpilot.runtime.batching.request import RECEIVED, Outputs, Pending, Slice
from batchpilot.runtime.batching.runner import BatchRunner
from batchpilot.runtime.batching.tuning import make_tuner
from batchpilot.runtime.batching.window import RecentWindow
from batchpilot.runtime.errors import Unavailable
from batchpilot.runtime.kinds import kind_for
from batchpilot.runtime.metrics import RuntimeMetrics
from batchpilot.runtime.stats import ModelStats
from batchpilot.spec.contracts import BatchingState, RecentState
from batchpilot.spec.model import ModelSpec

log = logging.getLogger("batchpilot.batcher")
TUNE_INTERVAL_S = 0.25


class Batcher:
    def __init__(
        self,
        spec: ModelSpec,
        executor: Executor,
        metrics: RuntimeMetrics,
        *,
        batching: bool = True,
        hang_timeout_s: float = 60.0,
        turns: DeviceTurns | None = None,
    ) -> None:
        """`turns`: shared with the other models on the same device when their batches take turns."""
        self.spec = spec
        self.executor = executor
        self.metrics = metrics
        self.batching = batching
        self.kind = kind_for(spec)
        self.policy = self.kind.batch_policy()
        self.queue = PolicyQueue(spec.name, spec.batching, self._timed_out)
        self.max_request_items = spec.advertised_max_batch_size
        self.stats = ModelStats()
        self.recent = RecentWindow()
        self.tuner = make_tuner(spec, batching, executor)
        self._metrics = MetricsObserver(metrics, spec.name)
        self.observers = Observers([StatsObserver(self.stats), self._metrics, RecentObserver(self.recent), self.tuner])
        self.runner = BatchRunner(spec.name, executor, self.queue, self.observers, hang_timeout_s)
        self.executor.on_out_of_memory = self._on_out_of_memory
        self._seq = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Future[None] | None = None
        self._in_flight = 0  # batches released and not yet answered (at most executor.pipeline_depth)
        self._draining = False
        self._tasks: list[asyncio.Task[None]] = []
        self._turns = turns
        self.observers.params_changed(self.params)
        self._metrics.slo(spec.autotune.latency_slo_p99_ms / 1e3)
        self._metrics.watch_queue(self.queue)

    # -- parameters ---------------------------------------------------------------------------------
    @property
    def params(self) -> TuningParams:
        return self.tuner.params

    def _on_out_of_memory(self, size: int) -> None:
        """Called from the executor thread: never form a batch this large again."""
        ceiling = max(1, size // 2)
        log.warning("model %s ran out of memory at batch %d; ceiling now %d", self.spec.name, size, ceiling)
        self.loop.call_soon_threadsafe(self._lower_ceiling, ceiling)

    def _lower_ceiling(self, ceiling: int) -> None:
        self.observers.params_changed(self.tuner.lower_ceiling(ceiling))

    # -- lifecycle ------------------------------------------------------------------------------------
    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "the batcher has not started"
        return self._loop

    def start(self) -> None:
        if self._loop is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._tasks.append(self._loop.create_task(self._run(), name=f"batcher-{self.spec.name}"))
        if self.tuner.adaptive:
            self._tasks.append(self._loop.create_task(self._tune(), name=f"autotune-{self.spec.name}"))

    async def drain(self) -> None:
        """Refuse new requests, answer every accepted one, then stop."""
        self._draining = True
        self._poke()
        while self.queue or self._in_flight:
            await asyncio.sleep(0.01)
        for task in self._tasks:
            task.cancel()
        self.runner.shutdown()

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def hung(self) -> bool:
        """Its last batch runs past the hang timeout: it refuses work until the model returns."""
        return self.runner.hung

    # -- intake ---------------------------------------------------------------------------------------
    def submit(
        self, inputs: dict[str, np.ndarray], *, priority: int = 0, timeout_us: int | None = None
    ) -> asyncio.Future[Outputs]:
        """Queue a validated request; the future resolves to its outputs or a RequestError."""
        self.start()
        if self._draining:
            raise Unavailable(f"model {self.spec.name!r} is shutting down")
        if self.hung:
            raise Unavailable(f"model {self.spec.name!r} is unavailable: its last batch hangs", retry_after_s=5.0)
        queue, loop = self.queue, self.loop
        first = next(iter(inputs.values()))
        try:
            queue.check_room(self._seconds_per_request)
        except Unavailable:
            self.observers.refused(first.shape[0])
            raise
        now = time.perf_counter()
        received = RECEIVED.get()
        request = Pending(
            inputs=inputs,
            n=first.shape[0],
            key=self.kind.request_key(inputs),
            length=self.kind.request_length(inputs),
            level=queue.level(priority),
            arrival=loop.time(),
            arrival_mono=now,
            received_mono=now if received is None else min(received, now),
            seq=next(self._seq),
            future=loop.create_future(),
        )
        queue.enqueue(request, loop, queue.timeout_s(timeout_us))
        self.observers.arrived(request)
        if not self._busy:
            self._poke()
        return request.future

    def _seconds_per_request(self) -> float:
        """About how long one queued request takes to leave (for a full queue's Retry-After)."""
        return self.runner.compute_ewma_s / max(1, self.params.max_batch_size)

    @property
    def _busy(self) -> bool:
        """No room for another batch in flight: the next waits for the model."""
        return self._in_flight >= self.executor.pipeline_depth

    def _timed_out(self, request: Pending) -> None:
        """The queue failed a request whose timeout expired (REJECT)."""
        self.observers.dropped(request, "timeout")

    # -- the release loop -----------------------------------------------------------------------------
    def _poke(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    async def _sleep_until(self, when: float | None) -> None:
        self._wake = self.loop.create_future()
        handle = self.loop.call_at(when, self._poke) if when is not None else None
        try:
            await self._wake
        finally:
            if handle is not None:
                handle.cancel()

    async def _run(self) -> None:
        name, turns = self.spec.name, self._turns
        while True:
            if self._busy or not self.queue:
                if turns is not None and not self._in_flight:
                    turns.give(name, self.loop.time())  # handed a turn it has no batch for (the queue timed out)
                await self._sleep_until(None)
                continue
            now = self.loop.time()
            reason, wake_at = self._release_reason(now)
            if reason is None:
                await self._sleep_until(wake_at)
                continue
            if turns is not None and (expires := turns.take(name, now)) is not None:
                turns.wait(name, self._poke)  # another model's batch runs: this one forms when it is over
                await self._sleep_until(expires)
                continue
            slices = self.policy.take(self.queue, self.params.max_batch_size, self.spec.batching.preserve_ordering)
            self.observers.released(reason, slices)
            if log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "model %s: released %d items in %d slices (%s), %d requests still queued",
                    self.spec.name,
                    sum(s.size for s in slices),
                    len(slices),
                    reason,
                    len(self.queue),
                )
            self._in_flight += 1
            self.loop.create_task(self._execute(slices))

    def _release_reason(self, now: float) -> tuple[str | None, float | None]:
        """Why the next batch should leave now, or when to look again."""
        head = self.queue.head()
        assert head is not None
        if self._draining:
            return "drained", None
        params = self.params
        ready = self.policy.ready_items(self.queue, head)
        if ready >= params.max_batch_size:
            return "full", None
        preferred = [s for s in self.spec.batching.preferred_batch_size if s <= params.max_batch_size]
        if preferred and ready >= max(preferred):
            return "preferred", None
        window_end = head.arrival + params.max_queue_delay_s
        if now >= window_end:
            return "delay", None
        if head.deadline is not None:
            # Release early rather than let the oldest request miss its deadline while waiting.
            latest_start = head.deadline - self.runner.compute_ewma_s
            if now >= latest_start:
                return "deadline", None
            return None, min(window_end, latest_start)
        return None, window_end

    async def _execute(self, slices: list[Slice]) -> None:
        try:
            await self.runner.run(slices)
        finally:
            self._in_flight -= 1
            if self._turns is not None:
                self._turns.give(self.spec.name, self.loop.time())
            self._poke()

    # -- tuning -----------------------------------------------------------------------------------------
    async def _tune(self) -> None:
        while True:
            await asyncio.sleep(TUNE_INTERVAL_S)
            decision = self.tuner.step()
            self.observers.tuned(self.tuner.slo_feasible, decision is not None and decision.changed)
            if decision is not None:
                self.policy.tune(decision.params.max_padding_waste)
                self.observers.params_changed(decision.params)

    def batching_state(self) -> BatchingState:
        """What `GET /v2/models/{m}/batching` returns (shape documented in docs/design.md)."""
        p = self.params
        return BatchingState(
            model=self.spec.name,
            batching=self.batching,
            max_batch_size=p.max_batch_size,
            max_queue_delay_microseconds=round(p.max_queue_delay_s * 1e6),
            **({} if p.max_padding_waste is None else {"max_padding_waste": p.max_padding_waste}),
            queue_depth=len(self.queue),
            autotune=self.tuner.report(),
            recent=RecentState(**self.recent.summary(self._loop.time() if self._loop else 0.0)),
        )
