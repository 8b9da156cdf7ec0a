"""Where the autotuners' plans are solved: one low-priority worker process shared by every batcher.

A plan is 0.1-0.5 s of pure-Python simulation. On the event loop it stalls every request in flight for
that long (measured: a 50 ms SLO broken by the plan alone); in a thread it would still hold the GIL
against the loop. A separate process at a lower CPU priority (`WORKER_NICE`) takes a small share of a
busy core: the plan's CPU is spread over a few seconds instead of stalling anyone, and its answer comes
back to the loop.

The server starts the process with its autotuned models (spawned: the server's torch threads are not
forked); it is started again if it dies. `BATCHPILOT_PLAN_WORKER=inline` solves plans on the loop instead.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import multiprocessing
import os
from collections.abc import Callable

from batchpilot.runtime.plan_jobs import PlanJob, Solved, solve

log = logging.getLogger("batchpilot.tuning")

#: A plan not answered within this long is given up (the tuner goes on as if it had found nothing).
PLAN_TIMEOUT_S = 20.0
#: The worker's start (spawn and imports) waited for before the server is ready.
STARTUP_TIMEOUT_S = 30.0


#: The worker's nice value. At 19 (the lowest priority) a saturated one-core server left it so little CPU
#: that plans came back 14-17 s late or not at all (measured live: closed loops of 4-16 clients); at 5 it
#: gets about a seventh of a core that two serving threads keep busy.
WORKER_NICE = 5


def _lower_priority() -> None:
    with contextlib.suppress(OSError):  # not allowed: the plan still runs, at the serving threads' priority
        os.nice(WORKER_NICE)


class PlanWorker:
    """Solves `PlanJob`s in a worker process; answers are delivered on the caller's event loop."""

    def __init__(self) -> None:
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None

    def submit(self, job: PlanJob, done: Callable[[PlanJob, Solved | None], None]) -> None:
        """Solve `job`; `done(job, answer)` is called on the running loop (answer None: it failed)."""
        loop = asyncio.get_running_loop()
        try:
            future = self._executor().submit(solve, job)
        except (concurrent.futures.BrokenExecutor, RuntimeError, OSError) as exc:
            log.warning("plan worker unavailable (%s): solving on the event loop", exc)
            self._pool = None
            done(job, solve(job))
            return

        def answered(f: concurrent.futures.Future[Solved]) -> None:
            try:
                solved: Solved | None = f.result()
            except Exception as exc:  # the worker died (killed, out of memory): start a new one next time
                log.warning("plan worker failed: %s", exc)
                self._pool, solved = None, None
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile (the server stopped)
                loop.call_soon_threadsafe(done, job, solved)

        future.add_done_callback(answered)

    async def start(self, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        """Start the process and wait until it answers (a server starts it before it is ready, so that the
        spawn and its imports, about a second of CPU, do not compete with the first requests)."""
        try:
            await asyncio.wait_for(asyncio.wrap_future(self._executor().submit(os.getpid)), timeout_s)
        except (TimeoutError, concurrent.futures.BrokenExecutor, OSError) as exc:
            log.warning("plan worker not up (%s): it is started again with the first plan", exc)
            self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def _executor(self) -> concurrent.futures.ProcessPoolExecutor:
        if self._pool is None:
            context = multiprocessing.get_context("spawn")
            self._pool = concurrent.futures.ProcessPoolExecutor(1, mp_context=context, initializer=_lower_priority)
        return self._pool


def shared_worker() -> PlanWorker | None:
    """The process-wide worker (None: plans are solved inline, `BATCHPILOT_PLAN_WORKER=inline`)."""
    global _shared
    if os.environ.get("BATCHPILOT_PLAN_WORKER", "process") == "inline":
        return None
    if _shared is None:
        _shared = PlanWorker()
    return _shared


_shared: PlanWorker | None = None
