"""Whose turn it is on a shared device: pure bookkeeping, no event loop."""

from __future__ import annotations

from batchpilot.runtime.batching.device_turns import MAX_TURN_S, DeviceTurns


def test_the_turn_goes_round_to_whoever_waits_first() -> None:
    turns, woken = DeviceTurns(), []
    assert turns.take("a", 0.0) is None and turns.holder == "a"
    assert turns.take("b", 0.01) == MAX_TURN_S  # held by a: b may go regardless from then on
    turns.wait("b", lambda: woken.append("b"))
    assert turns.take("c", 0.02) is not None
    turns.wait("c", lambda: woken.append("c"))
    turns.give("a", 0.05)
    assert turns.holder == "b" and woken == ["b"]
    assert turns.take("a", 0.06) is not None  # a wants another batch: behind c
    turns.wait("a", lambda: woken.append("a"))
    assert turns.take("b", 0.06) is None  # handed to b
    turns.give("b", 0.1)
    turns.give("c", 0.2)
    assert woken == ["b", "c", "a"] and turns.holder == "a"
    turns.give("a", 0.3)
    assert turns.holder is None and turns.take("b", 0.4) is None


def test_a_turn_held_too_long_stops_binding_and_its_late_return_changes_nothing() -> None:
    turns = DeviceTurns()
    turns.take("hung", 0.0)
    assert turns.take("b", MAX_TURN_S - 0.01) is not None
    assert turns.take("b", MAX_TURN_S) is None and turns.holder == "b"
    turns.give("hung", MAX_TURN_S + 5)  # the hung call returned: it no longer holds the turn
    assert turns.holder == "b"
