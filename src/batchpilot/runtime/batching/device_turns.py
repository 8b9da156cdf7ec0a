"""Models that share the CPU take turns: one batch runs at a time, and a batch forms only when its turn comes.

Batches of two models at once on the same cores would only time-slice them (torch's threads, and the event
loop's front-end work beside them): each batch ends later, and requests that come back meanwhile miss the
batch their companions left in. Taking turns at the moment a batch *forms* (not only when it runs) lets a
model gather everything that arrived while another model's batch ran: measured with both demo models on one
core, 16 closed-loop clients each, the clients of a model otherwise settle into two alternating batches of 8
at the same setting (`docs/bench/autotune-history.md`, run E).

The turn goes round: a model that finishes its batch while another waits hands the turn over. A turn held
longer than `MAX_TURN_S` (a hung or very slow model) stops binding the others. All of this runs on the event
loop; no lock is held across threads.
"""

from __future__ import annotations

import os
from collections.abc import Callable

MAX_TURN_S = 1.0  # after this long, a turn no longer keeps the other models waiting


class DeviceTurns:
    """Whose turn it is on one device, and who waits for it (in order)."""

    def __init__(self) -> None:
        self._holder: str | None = None
        self._since = 0.0
        self._waiting: dict[str, Callable[[], None]] = {}  # name -> wake-up, first come first served

    def take(self, name: str, now: float) -> float | None:
        """Take the turn for one batch if it is free, already `name`'s (handed over) or held too long: None.
        Else the time when the turn held now stops binding (`wait` to be woken when it is handed over)."""
        if self._holder is None or self._holder == name or now - self._since >= MAX_TURN_S:
            self._waiting.pop(name, None)
            self._holder, self._since = name, now
            return None
        return self._since + MAX_TURN_S

    def wait(self, name: str, wake: Callable[[], None]) -> None:
        """`name` has a batch ready and waits for the turn; `wake` is called once it is handed over."""
        self._waiting.setdefault(name, wake)

    def give(self, name: str, now: float) -> None:
        """`name`'s batch has run: the turn goes to the first model waiting, if any."""
        if self._holder != name:
            return
        self._holder = None
        if self._waiting:
            nxt, wake = next(iter(self._waiting.items()))
            del self._waiting[nxt]
            self._holder, self._since = nxt, now
            wake()

    @property
    def holder(self) -> str | None:
        return self._holder


def available_cores() -> int:
    """CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
