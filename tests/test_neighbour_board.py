"""The board where a process's autotuned models publish how they run, for each other's joint plans."""

from __future__ import annotations

from batchpilot.runtime.autotune_model import LatencyFit, TuningParams
from batchpilot.runtime.batching.neighbour_board import FRESH_S, NeighbourBoard
from batchpilot.runtime.one_core_planner import Neighbour


def described(name: str) -> Neighbour:
    return Neighbour(name, TuningParams(8, 0.002), LatencyFit(1e-3, 2e-3), 8, 0.3e-3, 1e-3, 0.045, 0.030, 0.3)


def test_each_model_reads_the_others_fresh_descriptions() -> None:
    board = NeighbourBoard()
    board.publish("b", described("b"), 0.0)
    board.publish("a", described("a"), 1.0)
    board.publish("c", described("c"), 2.0)
    assert [n.name for n in board.others("a", 2.0)] == ["b", "c"]
    assert [n.name for n in board.others("a", FRESH_S + 0.5)] == ["c"]  # b went quiet: no longer planned beside
    board.publish("c", None, 3.0)  # c's load is no longer a closed loop on one core: withdrawn
    assert board.others("a", 3.0) == [described("b")]


def test_a_trial_in_force_is_seen_by_the_others_until_it_ends() -> None:
    board = NeighbourBoard()
    board.publish("a", None, 0.0, trying=True)  # a trial before anything is calibrated counts too
    assert board.others_trying("b", 1.0) and not board.others_trying("a", 1.0)
    assert not board.others_trying("b", FRESH_S + 0.5)  # a model that went quiet holds no one back
    board.publish("a", described("a"), 2.0)
    assert not board.others_trying("b", 2.0)
