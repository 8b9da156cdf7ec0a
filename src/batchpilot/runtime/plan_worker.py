"""Where the autotuners' plans are solved: one low-priority worker process shared by every batcher.

A plan is 10-200 ms of pure-Python simulation. On the event loop it stalls every request in flight for
that long (measured: a 50 ms SLO broken by the plan alone); in a thread it would still hold the GIL
against the loop. A separate process at the lowest CPU priority (nice 19) runs on the CPU the serving
threads leave idle, so a plan costs the requests next to nothing; its answer comes back to the loop.

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


def _lowest_priority() -> None:
    with contextlib.suppress(OSError):  # not allowed: the plan still runs, at the serving threads' priority
        os.nice(19)


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

    def start(self) -> None:
        """Start the process now (a server starts it with its models, not in the middle of traffic)."""
        self._executor().submit(os.getpid)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def _executor(self) -> concurrent.futures.ProcessPoolExecutor:
        if self._pool is None:
            context = multiprocessing.get_context("spawn")
            self._pool = concurrent.futures.ProcessPoolExecutor(1, mp_context=context, initializer=_lowest_priority)
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
