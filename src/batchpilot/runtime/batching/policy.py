"""Which waiting requests make up the next batch. One policy per model type.

`StackPolicy` (CV) puts only requests with identical per-item shapes together, so their tensors stack.
`LengthGroupPolicy` (NLP) groups sequences of similar length around the oldest request, so that padding
(only ever within the batch) wastes at most `max_padding_waste` of the computed token slots.
"""

from __future__ import annotations

from typing import Protocol

from batchpilot.runtime.batching.queue import BatchQueue
from batchpilot.runtime.batching.request import Pending, Slice


class BatchPolicy(Protocol):
    def tune(self, max_padding_waste: float | None) -> None:
        """The tuner's padding budget (None: keep the one in force)."""

    def ready_items(self, queue: BatchQueue, head: Pending) -> int:
        """Items that could join a batch started by `head` (an upper bound is fine)."""

    def take(self, queue: BatchQueue, max_items: int, fifo: bool) -> list[Slice]:
        """Remove and return the next batch's slices (at least the head's first item)."""


def _take_slice(queue: BatchQueue, request: Pending, room: int) -> Slice:
    count = min(room, request.waiting)
    piece = Slice(request, request.taken, request.taken + count)
    queue.consume(request, count)
    return piece


class StackPolicy:
    """Same-shape requests in queue order (priority first, then FIFO)."""

    def tune(self, max_padding_waste: float | None) -> None:
        pass  # same shapes never pad

    def ready_items(self, queue: BatchQueue, head: Pending) -> int:
        return queue.items_by_key[head.key]

    def take(self, queue: BatchQueue, max_items: int, fifo: bool) -> list[Slice]:
        head = queue.head()
        assert head is not None
        chosen: list[Pending] = []
        room = max_items
        for request in queue:
            if request.key != head.key:
                if fifo:
                    break  # preserve_ordering: never let a later request overtake
                continue
            chosen.append(request)
            room -= request.waiting
            if room <= 0:
                break
        room = max_items
        slices = []
        for request in chosen:
            piece = _take_slice(queue, request, room)
            slices.append(piece)
            room -= piece.size
        return slices


class LengthGroupPolicy:
    """Sequences of close length around the oldest request, within a padding-waste budget."""

    def __init__(self, max_padding_waste: float) -> None:
        self.min_efficiency = 1.0 - max_padding_waste

    def tune(self, max_padding_waste: float | None) -> None:
        if max_padding_waste is not None:
            self.min_efficiency = 1.0 - max_padding_waste

    def ready_items(self, queue: BatchQueue, head: Pending) -> int:
        return queue.items

    def take(self, queue: BatchQueue, max_items: int, fifo: bool) -> list[Slice]:
        head = queue.head()
        assert head is not None
        candidates = list(queue)
        if not fifo:
            # Closest lengths first; ties keep queue order (sort is stable).
            candidates.sort(key=lambda r: abs(r.length - head.length))
        items = useful = longest = 0
        chosen: list[tuple[Pending, int]] = []
        for request in candidates:
            count = min(request.waiting, max_items - items)
            new_longest = max(longest, request.length)
            new_items, new_useful = items + count, useful + count * request.length
            if chosen and new_useful < self.min_efficiency * new_items * new_longest:
                if fifo:
                    break
                continue
            chosen.append((request, count))
            items, useful, longest = new_items, new_useful, new_longest
            if items >= max_items:
                break
        return [_take_slice(queue, request, count) for request, count in chosen]
