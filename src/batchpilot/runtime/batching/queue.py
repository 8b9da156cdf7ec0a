"""The batch queue: FIFO per priority level, plus a last level for requests whose timeout action is DELAY."""

from __future__ import annotations

from collections import Counter, deque
from typing import Hashable, Iterator

from batchpilot.runtime.batching.request import Pending


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
