"""Where the autotuned models of one process tell each other how they run, so that each plans beside the
others (`one_core_planner.Neighbour`). On one core a tuner that planned alone would take the core's time for
its own items/s and break another model's SLO; with the board, each plan simulates the others' closed loops at
their settings in force and holds their SLOs too."""

from __future__ import annotations

from batchpilot.runtime.one_core_planner import Neighbour

#: A description older than this is no longer read (its model went idle or stopped planning one-core).
FRESH_S = 10.0


class NeighbourBoard:
    """The latest description each model published, with when."""

    def __init__(self) -> None:
        self._latest: dict[str, tuple[Neighbour, float]] = {}
        self._trying: dict[str, float] = {}  # models with a trial in force, and when they said so

    def publish(self, name: str, described: Neighbour | None, now: float, *, trying: bool = False) -> None:
        """`described`: the model as it runs now; None withdraws it (not a closed loop on one core).
        `trying`: it has a trial in force (the others then hold theirs)."""
        if described is None:
            self._latest.pop(name, None)
        else:
            self._latest[name] = (described, now)
        if trying:
            self._trying[name] = now
        else:
            self._trying.pop(name, None)

    def others(self, name: str, now: float) -> list[Neighbour]:
        """Every other model's fresh description, in name order."""
        return [n for key, (n, at) in sorted(self._latest.items()) if key != name and now - at <= FRESH_S]

    def others_trying(self, name: str, now: float) -> bool:
        """Does another model have a trial in force (said so within FRESH_S)?"""
        return any(key != name and now - at <= FRESH_S for key, at in self._trying.items())


_SHARED = NeighbourBoard()


def shared_board() -> NeighbourBoard:
    """The process's board: the models of a server share its core."""
    return _SHARED
