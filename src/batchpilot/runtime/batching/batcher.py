"""One batcher per hosted model: the queue, the release decision and the hand-off to the executor.

Everything here runs on the server's event loop except `Executor.run`, which runs in the model's own
thread. One batch executes at a time; while it runs, arrivals queue up and the next batch's window
keeps counting, so the next batch is released the moment the model is free (or its window closes).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from batchpilot.spec.model import ModelSpec

from batchpilot.runtime.autotuner import Autotuner, Decision, TuningParams
from batchpilot.runtime.errors import DeadlineExceeded, InternalError, InvalidRequest, RequestError, Unavailable
from batchpilot.runtime.metrics import RuntimeMetrics
from batchpilot.runtime.stats import ModelStats
from batchpilot.runtime.batching.executor import BatchTimings, Executor
from batchpilot.runtime.batching.policy import BatchPolicy, LengthGroupPolicy, StackPolicy
from batchpilot.runtime.batching.queue import BatchQueue
from batchpilot.runtime.batching.request import Outputs, Pending, Slice
from batchpilot.runtime.batching.window import RecentWindow

log = logging.getLogger("batchpilot.batcher")
TUNE_INTERVAL_S = 0.25
NS = 1e9


class Batcher:
    def __init__(
        self, spec: ModelSpec, executor: Executor, metrics: RuntimeMetrics, *, batching: bool = True,
        hang_timeout_s: float = 60.0,
    ) -> None:
        self.spec = spec
        self.executor = executor
        self.metrics = metrics
        self.stats = ModelStats()
        b = spec.batching
        self.queue = BatchQueue(b.priority_levels)
        self.policy: BatchPolicy = (
            LengthGroupPolicy(spec.sequence.max_padding_waste) if spec.type == "nlp" else StackPolicy()
        )
        self.batching = batching
        self.max_request_items = spec.advertised_max_batch_size
        self.recent = RecentWindow()
        static = TuningParams(b.max_batch_size, b.max_queue_delay_microseconds / 1e6)
        self.autotuner: Autotuner | None = None
        if batching and spec.autotune.enabled:
            self.autotuner = Autotuner(spec.autotune, _clamp(static, spec))
        self._params = static if batching else TuningParams(1, 0.0)
        self._thread = ThreadPoolExecutor(1, thread_name_prefix=f"model-{spec.name}")
        self.executor.on_out_of_memory = self._on_out_of_memory
        self._seq = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Future[None] | None = None
        self._busy = False
        self._draining = False
        self._tasks: list[asyncio.Task[None]] = []
        self._compute_ewma_s = 0.0
        # Watchdog: a batch running longer than this means the model hangs (a thread can't be killed).
        self.hang_timeout_s = hang_timeout_s
        self.hung = False
        self._m = {name: metric.labels(model=spec.name) for name, metric in self._labelled_metrics().items()}
        self._publish_params()
        self._m["slo"].set(spec.autotune.latency_slo_p99_ms / 1e3)

    def _labelled_metrics(self) -> dict[str, Any]:
        m = self.metrics
        return {
            "queue_wait": m.queue_wait, "compute": m.compute, "latency": m.latency, "batch_size": m.batch_size,
            "depth": m.queue_depth, "max_batch": m.max_batch_size, "max_delay": m.max_queue_delay,
            "slo": m.latency_slo, "changes": m.autotune_changes, "feasible": m.slo_feasible,
            "padding": m.padding_efficiency, "tok_useful": m.tokens_useful, "tok_computed": m.tokens_computed,
        }

    # -- parameters ---------------------------------------------------------------------------------
    @property
    def params(self) -> TuningParams:
        return self._params

    def set_params(self, params: TuningParams) -> None:
        self._params = params
        self._publish_params()

    def _publish_params(self) -> None:
        self._m["max_batch"].set(self._params.max_batch_size)
        self._m["max_delay"].set(self._params.max_queue_delay_s)

    def _on_out_of_memory(self, size: int) -> None:
        """Called from the executor thread: never form a batch this large again."""
        ceiling = max(1, size // 2)
        log.warning("model %s ran out of memory at batch %d; ceiling now %d", self.spec.name, size, ceiling)
        if self.autotuner is not None:
            self._loop.call_soon_threadsafe(self.autotuner.lower_ceiling, ceiling, time.monotonic())
        self._loop.call_soon_threadsafe(
            self.set_params, TuningParams(min(ceiling, self._params.max_batch_size), self._params.max_queue_delay_s)
        )

    # -- lifecycle ------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._loop is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._tasks.append(self._loop.create_task(self._run(), name=f"batcher-{self.spec.name}"))
        if self.autotuner is not None:
            self._tasks.append(self._loop.create_task(self._tune(), name=f"autotune-{self.spec.name}"))

    async def drain(self) -> None:
        """Refuse new requests, answer every accepted one, then stop."""
        self._draining = True
        self._poke()
        while self.queue or self._busy:
            await asyncio.sleep(0.01)
        for task in self._tasks:
            task.cancel()
        self._thread.shutdown(wait=True)

    @property
    def draining(self) -> bool:
        return self._draining

    # -- intake ---------------------------------------------------------------------------------------
    def submit(
        self, inputs: dict[str, np.ndarray], *, priority: int = 0, timeout_us: int | None = None
    ) -> asyncio.Future[Outputs]:
        """Queue a validated request; the future resolves to its outputs or a RequestError."""
        if self._loop is None:
            self.start()
        if self._draining:
            raise Unavailable(f"model {self.spec.name!r} is shutting down")
        if self.hung:
            raise Unavailable(f"model {self.spec.name!r} is unavailable: its last batch hangs", retry_after_s=5.0)
        policy = self.spec.batching.default_queue_policy
        if policy.max_queue_size and len(self.queue) >= policy.max_queue_size:
            raise Unavailable(
                f"model {self.spec.name!r}: queue full ({len(self.queue)} requests waiting)",
                retry_after_s=1.0 + self._compute_ewma_s * len(self.queue) / max(1, self._params.max_batch_size),
            )
        first = next(iter(inputs.values()))
        now = self._loop.time()
        request = Pending(
            inputs=inputs, n=first.shape[0], key=tuple(a.shape[1:] for a in inputs.values()),
            length=first.shape[1] if self.spec.type == "nlp" else 0, level=self._level(priority),
            arrival=now, arrival_mono=time.perf_counter(), seq=next(self._seq), future=self._loop.create_future(),
        )
        timeout_s = self._timeout_s(timeout_us)
        if timeout_s:
            request.deadline = now + timeout_s
            request.timer = self._loop.call_at(request.deadline, self._expire, request)
        self.queue.push(request)
        self._m["depth"].set(len(self.queue))
        if self.autotuner is not None:
            self.autotuner.record_arrival(request.n, time.monotonic())
        if not self._busy:
            self._poke()
        return request.future

    def _level(self, priority: int) -> int:
        b = self.spec.batching
        if priority < 0 or priority > b.priority_levels:
            raise InvalidRequest(f"priority {priority} outside 0..{b.priority_levels} (1 is highest, 0 = default)")
        if b.priority_levels == 0:
            return 0
        level = priority or b.default_priority_level or b.priority_levels
        return level - 1

    def _timeout_s(self, timeout_us: int | None) -> float:
        policy = self.spec.batching.default_queue_policy
        default = policy.default_timeout_microseconds
        if timeout_us is not None:
            if timeout_us < 0:
                raise InvalidRequest("timeout must be a non-negative number of microseconds")
            if policy.allow_timeout_override and timeout_us and (not default or timeout_us < default):
                return timeout_us / 1e6
        return default / 1e6

    def _expire(self, request: Pending) -> None:
        """The request's queue timeout fired: REJECT fails it now (even mid-batch); DELAY demotes it."""
        request.timer = None
        if request.future.done():
            return
        if self.spec.batching.default_queue_policy.timeout_action == "DELAY":
            if request.taken == 0 and request.level != self.queue.delayed_level:
                self.queue.move(request, self.queue.delayed_level)
            return
        request.expired = True
        self._dropped(request)
        if request.waiting:
            if request.taken:
                self.queue.consume(request, request.waiting)
            else:
                self.queue.remove(request)
            self._m["depth"].set(len(self.queue))
        request.fail(DeadlineExceeded(f"model {self.spec.name!r}: request timeout expired after queueing"))
        self._count_outcome(request, "timeout")

    # -- the release loop -----------------------------------------------------------------------------
    def _poke(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    async def _sleep_until(self, when: float | None) -> None:
        self._wake = self._loop.create_future()
        handle = self._loop.call_at(when, self._poke) if when is not None else None
        try:
            await self._wake
        finally:
            if handle is not None:
                handle.cancel()

    async def _run(self) -> None:
        while True:
            if self._busy or not self.queue:
                await self._sleep_until(None)
                continue
            reason, wake_at = self._release_reason(self._loop.time())
            if reason is None:
                await self._sleep_until(wake_at)
                continue
            slices = self.policy.take(self.queue, self._params.max_batch_size, self.spec.batching.preserve_ordering)
            self._m["depth"].set(len(self.queue))
            self.metrics.release.labels(model=self.spec.name, reason=reason).inc()
            if log.isEnabledFor(logging.DEBUG):
                log.debug("model %s: released %d items in %d slices (%s), %d requests still queued",
                          self.spec.name, sum(s.size for s in slices), len(slices), reason, len(self.queue))
            self._busy = True
            self._loop.create_task(self._execute(slices))

    def _release_reason(self, now: float) -> tuple[str | None, float | None]:
        """Why the next batch should leave now, or when to look again."""
        head = self.queue.head()
        assert head is not None
        if self._draining:
            return "drained", None
        params = self._params
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
            latest_start = head.deadline - self._compute_ewma_s
            if now >= latest_start:
                return "deadline", None
            return None, min(window_end, latest_start)
        return None, window_end

    async def _execute(self, slices: list[Slice]) -> None:
        start = time.perf_counter()
        for s in slices:
            if s.request.dispatched_mono is None:
                s.request.dispatched_mono = start
        running = self._loop.run_in_executor(self._thread, self.executor.run, slices)
        try:
            try:
                results, timings = await asyncio.wait_for(asyncio.shield(running), self.hang_timeout_s)
            except asyncio.TimeoutError:
                self._on_hang(slices)
                results, timings = await running  # the thread is stuck until the model returns
                log.warning("model %s returned after hanging; serving again", self.spec.name)
                self.hung = False
                self.metrics.model_ready.labels(model=self.spec.name).set(1)
                return
        except Exception as exc:  # a bug in collation, not the model: fail the batch, keep serving
            log.exception("batch of model %s failed outside the model", self.spec.name)
            results, timings = [InternalError(f"internal error: {type(exc).__name__}")] * len(slices), BatchTimings()
        finally:
            self._busy = False
            self._poke()
        self._account_batch(slices, timings)
        now = self._loop.time()
        for s, result in zip(slices, results):
            request = s.request
            if request.expired or request.future.done():
                continue
            if isinstance(result, RequestError):
                request.fail(result)
                self._finish(request, now, "error" if result.status >= 500 else "invalid", timings)
            else:
                request.add_part(s.start, result)
                if request.future.done():
                    self._finish(request, now, "success", timings)

    def _on_hang(self, slices: list[Slice]) -> None:
        """Fail the hung batch and everything queued behind it; refuse new work until the model returns."""
        self.hung = True
        self.metrics.model_ready.labels(model=self.spec.name).set(0)
        log.error("model %s: batch of %d items still running after %.1f s; marking it unavailable",
                  self.spec.name, sum(s.size for s in slices), self.hang_timeout_s)
        error = Unavailable(f"model {self.spec.name!r} hangs: batch still running after {self.hang_timeout_s:.1f} s",
                            retry_after_s=5.0)
        stuck = {s.request for s in slices} | set(self.queue)
        for request in list(self.queue):
            self.queue.remove(request)
        for request in stuck:
            if not request.future.done():
                self._dropped(request)
                request.fail(error)
                self._count_outcome(request, "error")
        self._m["depth"].set(0)

    def _account_batch(self, slices: list[Slice], timings: BatchTimings) -> None:
        for size, t_in, t_infer, t_out in timings.executions:
            self.stats.record_execution(size, int(t_in * NS), int(t_infer * NS), int(t_out * NS))
            self._m["batch_size"].observe(size)
            compute = t_in + t_infer + t_out
            self._m["compute"].observe(compute)
            self._compute_ewma_s = 0.8 * self._compute_ewma_s + 0.2 * compute if self._compute_ewma_s else compute
            if self.autotuner is not None:
                self.autotuner.record_batch(size, compute, time.monotonic())
        if timings.tokens_computed:
            self._m["tok_useful"].inc(timings.tokens_useful)
            self._m["tok_computed"].inc(timings.tokens_computed)
            self._m["padding"].set(timings.tokens_useful / timings.tokens_computed)

    def _finish(self, request: Pending, now: float, outcome: str, timings: BatchTimings) -> None:
        if request.timer is not None:
            request.timer.cancel()
        end = time.perf_counter()
        total = end - request.arrival_mono
        queued = (request.dispatched_mono or end) - request.arrival_mono
        if outcome == "success":
            self.stats.record_success(
                int(queued * NS), int(timings.input_s * NS), int(timings.infer_s * NS),
                int(timings.output_s * NS), int(total * NS),
            )
            self._m["queue_wait"].observe(queued)
            self._m["latency"].observe(total)
            self.recent.add(now, total, request.n)
            if self.autotuner is not None:
                self.autotuner.record_request(total, queued, time.monotonic())
        else:
            self.stats.record_failure(int(total * NS))
        self._count_outcome(request, outcome)

    def _dropped(self, request: Pending) -> None:
        """An admitted request leaves without an answer: the autotuner must stop counting it as in flight."""
        if self.autotuner is not None:
            self.autotuner.record_drop(request.n - request.finished, time.monotonic())

    def _count_outcome(self, request: Pending, outcome: str) -> None:
        self.metrics.requests.labels(model=self.spec.name, outcome=outcome).inc()

    # -- autotuning -------------------------------------------------------------------------------------
    async def _tune(self) -> None:
        assert self.autotuner is not None
        while True:
            await asyncio.sleep(TUNE_INTERVAL_S)
            decision = self.autotuner.step(time.monotonic())
            snapshot = self.autotuner.snapshot(time.monotonic())
            self._m["feasible"].set(1 if snapshot.get("slo_feasible", True) else 0)
            if decision is not None:
                self._apply(decision)

    def _apply(self, decision: Decision) -> None:
        old = self._params
        self.set_params(decision.params)
        if decision.changed:
            self._m["changes"].inc()
        log.info(json.dumps({
            "event": "autotune", "model": self.spec.name, "reason": decision.reason,
            "max_batch_size": [old.max_batch_size, decision.params.max_batch_size],
            "max_queue_delay_us": [round(old.max_queue_delay_s * 1e6), round(decision.params.max_queue_delay_s * 1e6)],
            **{k: v for k, v in decision.detail.items() if isinstance(v, (int, float, str, bool))},
        }))

    def batching_state(self) -> dict[str, Any]:
        """What `GET /v2/models/{m}/batching` returns (shape documented in docs/design.md)."""
        p = self._params
        state: dict[str, Any] = {
            "model": self.spec.name,
            "batching": self.batching,
            "max_batch_size": p.max_batch_size,
            "max_queue_delay_microseconds": round(p.max_queue_delay_s * 1e6),
            "queue_depth": len(self.queue),
            "autotune": {"enabled": self.autotuner is not None, "latency_slo_p99_ms": self.spec.autotune.latency_slo_p99_ms},
            "recent": self.recent.summary(self._loop.time() if self._loop else 0.0),
        }
        if self.autotuner is not None:
            snap = self.autotuner.snapshot(time.monotonic())
            state["autotune"].update(
                slo_feasible=snap.get("slo_feasible"), latency_model=snap.get("latency_model"),
                changes=snap.get("changes"),
            )
        return state


def _clamp(params: TuningParams, spec: ModelSpec) -> TuningParams:
    b = spec.autotune.bounds
    return TuningParams(
        min(max(params.max_batch_size, b.min_batch_size), b.max_batch_size),
        min(max(params.max_queue_delay_s, b.min_queue_delay_microseconds / 1e6), b.max_queue_delay_microseconds / 1e6),
    )
