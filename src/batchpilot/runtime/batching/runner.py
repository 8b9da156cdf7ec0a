"""Running a released batch: the hand-off to the model's thread, the hang watchdog and the answers.

The batcher releases a batch and awaits `BatchRunner.run`; the runner executes it in the model's own
thread, resolves each request's future (re-assembling requests split over several batches) and tells the
observers what happened. A batch that runs longer than `hang_timeout_s` means the model hangs (a thread
can't be killed): the runner fails that batch and everything queued behind it and reports the model
unhealthy until the call returns.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor

from batchpilot.runtime.batching.executor import BatchTimings, Executor
from batchpilot.runtime.batching.observers import BatchObserver, Finished
from batchpilot.runtime.batching.queue import PolicyQueue
from batchpilot.runtime.batching.request import Outputs, Pending, Slice
from batchpilot.runtime.errors import InternalError, RequestError, Unavailable

log = logging.getLogger("batchpilot.batcher")


class BatchRunner:
    def __init__(
        self, name: str, executor: Executor, queue: PolicyQueue, observers: BatchObserver, hang_timeout_s: float
    ) -> None:
        self.name = name
        self.executor = executor
        self.queue = queue
        self.observers = observers
        self.hang_timeout_s = hang_timeout_s
        self.hung = False
        self.compute_ewma_s = 0.0  # smoothed seconds per model call
        # One thread per batch in flight (two on a GPU: see Executor.pipeline_depth).
        self._thread = ThreadPoolExecutor(executor.pipeline_depth, thread_name_prefix=f"model-{name}")

    def shutdown(self) -> None:
        self._thread.shutdown(wait=True)

    async def run(self, slices: list[Slice]) -> None:
        """Execute one batch and answer its requests; returns once the model call returned."""
        loop = asyncio.get_running_loop()
        start = time.perf_counter()
        for s in slices:
            if s.request.dispatched_mono is None:
                s.request.dispatched_mono = start
        # submit + wrap_future is what run_in_executor does, less its checks that `run` is no coroutine function
        # (inspect calls, once per batch)
        running = asyncio.wrap_future(self._thread.submit(self.executor.run, slices), loop=loop)
        # The hang watchdog is a timer on the loop (not wait_for around a shield: a task and two futures more
        # per batch). When it fires, the batch and the queue are failed while the model thread goes on.
        hung = False

        def on_hang() -> None:
            nonlocal hung
            hung = True
            self._on_hang(slices)

        watchdog = loop.call_later(self.hang_timeout_s, on_hang)
        results: list[Outputs | RequestError]
        try:
            results, timings = await running
        except Exception as exc:  # a bug in collation, not the model: fail the batch, keep serving
            log.exception("batch of model %s failed outside the model", self.name)
            results, timings = [InternalError(f"internal error: {type(exc).__name__}")] * len(slices), BatchTimings()
        finally:
            watchdog.cancel()
        if hung:  # its requests were failed when the watchdog fired
            log.warning("model %s returned after hanging; serving again", self.name)
            self.hung = False
            self.observers.health(True)
            return
        self._account(timings)
        # Answer every request of the batch, then tell the observers once: one clock read and one metrics
        # update per batch, not per request.
        end = time.perf_counter()
        done: list[Finished] = []
        for s, result in zip(slices, results, strict=True):
            request = s.request
            if request.expired or request.future.done():
                continue
            if isinstance(result, RequestError):
                request.fail(result)
                done.append(self._finish(request, end, "error" if result.status >= 500 else "invalid"))
            else:
                request.add_part(s.start, result)
                if request.future.done():
                    done.append(self._finish(request, end, "success"))
        if done:
            self.observers.finished_batch(done, timings, loop.time())

    def _on_hang(self, slices: list[Slice]) -> None:
        """Fail the hung batch and everything queued behind it; refuse new work until the model returns."""
        self.hung = True
        self.observers.health(False)
        log.error(
            "model %s: batch of %d items still running after %.1f s; marking it unavailable",
            self.name,
            sum(s.size for s in slices),
            self.hang_timeout_s,
        )
        error = Unavailable(
            f"model {self.name!r} hangs: batch still running after {self.hang_timeout_s:.1f} s", retry_after_s=5.0
        )
        stuck = {s.request for s in slices} | set(self.queue.clear())
        for request in stuck:
            if not request.future.done():
                self.observers.dropped(request, "error")
                request.fail(error)

    def _account(self, timings: BatchTimings) -> None:
        for size, t_in, t_infer, t_out in timings.executions:
            self.observers.executed(size, t_in, t_infer, t_out)
            compute = t_in + t_infer + t_out
            self.compute_ewma_s = 0.8 * self.compute_ewma_s + 0.2 * compute if self.compute_ewma_s else compute
        self.observers.batch_done(timings)

    def _finish(self, request: Pending, end: float, outcome: str) -> Finished:
        if request.timer is not None:
            request.timer.cancel()
        queued = (request.dispatched_mono or end) - request.arrival_mono
        return Finished(request, outcome, queued, end - request.received_mono)
