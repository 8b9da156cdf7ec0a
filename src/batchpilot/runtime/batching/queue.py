"""The batch queue: FIFO per priority level, plus a last level for requests whose timeout action is DELAY, and the
queue policy around it (admission, timeouts and their action)."""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from collections.abc import Callable, Hashable, Iterator

from batchpilot.runtime.batching.request import Pending
from batchpilot.runtime.errors import DeadlineExceeded, InvalidRequest, Unavailable
from batchpilot.spec.model import BatchingSpec


class BatchQueue:
    def __init__(self, priority_levels: int) -> None:
        # Level i holds priority i+1 (1 is highest); the extra last level holds delayed requests.
        self.levels: list[deque[Pending]] = [deque() for _ in range(max(1, priority_levels) + 1)]
        self.requests = 0
        self.items = 0
        self.items_by_key: Counter[Hashable] = Counter()

    @property
    def delayed_level(self) -> int:
        return len(self.levels) - 1

    def __len__(self) -> int:
        return self.requests

    def push(self, request: Pending) -> None:
        self.levels[request.level].append(request)
        self.requests += 1
        self.items += request.waiting
        self.items_by_key[request.key] += request.waiting

    def head(self) -> Pending | None:
        """The oldest request of the highest non-empty level: the one a batch must start from."""
        for level in self.levels:
            if level:
                return level[0]
        return None

    def __iter__(self) -> Iterator[Pending]:
        for level in self.levels:
            yield from level

    def remove(self, request: Pending) -> None:
        """Take a request out entirely (timeout or cancellation)."""
        self.levels[request.level].remove(request)
        self._forget(request, request.waiting)

    def move(self, request: Pending, level: int) -> None:
        self.remove(request)
        request.level = level
        self.push(request)

    def consume(self, request: Pending, count: int) -> None:
        """Account `count` items of `request` as handed to a batch; drop it once nothing waits."""
        request.taken += count
        self.items -= count
        self._count_key(request.key, -count)
        if request.waiting == 0:
            self.levels[request.level].remove(request)
            self.requests -= 1

    def _forget(self, request: Pending, waiting: int) -> None:
        self.requests -= 1
        self.items -= waiting
        self._count_key(request.key, -waiting)

    def _count_key(self, key: Hashable, delta: int) -> None:
        left = self.items_by_key[key] + delta
        if left:
            self.items_by_key[key] = left
        else:
            del self.items_by_key[key]


class PolicyQueue(BatchQueue):
    """The queue with Triton's queue policy (as Triton's PolicyQueue): admission (queue size, priority
    levels), each request's timeout, and what the timeout does (REJECT fails it, DELAY demotes it).

    `on_timeout(request)` is told of every request REJECT failed, after it left the queue.
    """

    def __init__(self, model: str, batching: BatchingSpec, on_timeout: Callable[[Pending], None]) -> None:
        super().__init__(batching.priority_levels)
        self.model = model
        self.batching = batching
        self.policy = batching.default_queue_policy
        self.on_timeout = on_timeout

    def check_room(self, seconds_per_request: Callable[[], float]) -> None:
        """Refuse at once when the queue is full; Retry-After estimates how long it takes to drain (asked only
        then: `seconds_per_request()`)."""
        if self.policy.max_queue_size and len(self) >= self.policy.max_queue_size:
            raise Unavailable(
                f"model {self.model!r}: queue full ({len(self)} requests waiting)",
                retry_after_s=1.0 + seconds_per_request() * len(self),
            )

    def level(self, priority: int) -> int:
        """The queue level of a request's priority (0 = the model's default)."""
        b = self.batching
        if priority < 0 or priority > b.priority_levels:
            raise InvalidRequest(f"priority {priority} outside 0..{b.priority_levels} (1 is highest, 0 = default)")
        if b.priority_levels == 0:
            return 0
        level = priority or b.default_priority_level or b.priority_levels
        return level - 1

    def timeout_s(self, timeout_us: int | None) -> float:
        """A request's queue timeout: the default, or the request's own when it is allowed and shorter."""
        default = self.policy.default_timeout_microseconds
        if timeout_us is not None:
            if timeout_us < 0:
                raise InvalidRequest("timeout must be a non-negative number of microseconds")
            if self.policy.allow_timeout_override and timeout_us and (not default or timeout_us < default):
                return timeout_us / 1e6
        return default / 1e6

    def enqueue(self, request: Pending, loop: asyncio.AbstractEventLoop, timeout_s: float) -> None:
        if timeout_s:
            request.deadline = request.arrival + timeout_s
            request.timer = loop.call_at(request.deadline, self._expire, request)
        self.push(request)

    def _expire(self, request: Pending) -> None:
        """The request's timeout fired: REJECT fails it now (even mid-batch); DELAY demotes it."""
        request.timer = None
        if request.future.done():
            return
        if self.policy.timeout_action == "DELAY":
            if request.taken == 0 and request.level != self.delayed_level:
                self.move(request, self.delayed_level)
            return
        request.expired = True
        if request.waiting:
            if request.taken:
                self.consume(request, request.waiting)
            else:
                self.remove(request)
        self.on_timeout(request)
        request.fail(DeadlineExceeded(f"model {self.model!r}: request timeout expired after queueing"))

    def clear(self) -> list[Pending]:
        """Take every waiting request out; return them."""
        waiting = list(self)
        for request in waiting:
            self.remove(request)
        return waiting
