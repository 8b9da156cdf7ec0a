"""A request waiting in (or running through) a batcher, and the slices batches are made of."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from contextvars import ContextVar
from dataclasses import dataclass, field

import numpy as np

from batchpilot.runtime.errors import RequestError

Outputs = dict[str, np.ndarray]

#: time.perf_counter() when the front-end read the request being handled (set by the front-end in the
#: request's own task). The time from there to the queue (decoding, and waiting for the front-end behind other
#: requests) is part of the request's latency in the server, which a busy single-core server makes large.
RECEIVED: ContextVar[float | None] = ContextVar("batchpilot_received", default=None)


@dataclass(eq=False, slots=True)
class Pending:
    """One request. Its `n` items may be split over several batches and are re-assembled in order."""

    inputs: dict[str, np.ndarray]  # in the model's input order, each [n, ...]
    n: int
    key: Hashable  # requests with different keys never share a batch (per-item shapes)
    length: int  # tokens per item for NLP models, 0 otherwise
    level: int  # queue level, 0 = highest priority
    arrival: float  # loop time at submission: schedules the window (uvloop's clock ticks in ms)
    seq: int
    future: asyncio.Future[Outputs]
    deadline: float | None = None  # loop time after which the queue timeout fires
    taken: int = 0  # items handed to batches so far
    finished: int = 0  # items answered so far
    arrival_mono: float = 0.0  # time.perf_counter() at submission: measures latency finer than the loop clock
    received_mono: float = 0.0  # time.perf_counter() when the front-end read it (`RECEIVED`; else arrival_mono)
    dispatched_mono: float | None = None  # time.perf_counter() when its first items left the queue
    parts: list[tuple[int, Outputs]] = field(default_factory=list)
    expired: bool = False
    timer: asyncio.TimerHandle | None = None

    @property
    def front_s(self) -> float:
        """From the front-end's read to the queue: decoding, and waiting for the front-end behind others."""
        return self.arrival_mono - self.received_mono

    @property
    def waiting(self) -> int:
        return self.n - self.taken

    def fail(self, error: RequestError) -> None:
        if not self.future.done():
            self.future.set_exception(error)

    def add_part(self, start: int, outputs: Outputs) -> None:
        """Store the answer for items [start, start+k); resolve once every item is answered."""
        if self.future.done():
            return
        self.parts.append((start, outputs))
        self.finished += next(iter(outputs.values())).shape[0]
        if self.finished < self.n:
            return
        if len(self.parts) == 1:
            result = self.parts[0][1]
        else:
            self.parts.sort(key=lambda part: part[0])
            result = {name: np.concatenate([p[name] for _, p in self.parts]) for name in self.parts[0][1]}
        self.future.set_result(result)


@dataclass(frozen=True, slots=True)
class Slice:
    """Items [start, stop) of one request, placed in a batch."""

    request: Pending
    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start

    def arrays(self) -> dict[str, np.ndarray]:
        if self.start == 0 and self.stop == self.request.n:
            return self.request.inputs
        return {name: a[self.start : self.stop] for name, a in self.request.inputs.items()}
