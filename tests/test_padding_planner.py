"""The padding-budget planner: its grouping is the runtime policy's, and its pick follows the costs."""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest

from batchpilot.runtime.autotune_model import LatencyFit, Measurement, TuningParams, read_workload
from batchpilot.runtime.autotuner import Autotuner, Decision
from batchpilot.runtime.batch_planner import CandidatePrediction, Plan
from batchpilot.runtime.batching.policy import LengthGroupPolicy
from batchpilot.runtime.batching.queue import BatchQueue
from batchpilot.runtime.batching.request import Pending
from batchpilot.runtime.padding_planner import group_lengths, plan_padding
from batchpilot.runtime.plan_jobs import PlanJob, Solved
from batchpilot.runtime.tuner.state import Outstanding
from batchpilot.spec.model import AutotuneSpec


def long_tailed(n: int, seed: int = 0) -> list[int]:
    """Sequence lengths 8-256, most short: a log-uniform draw."""
    rng = random.Random(seed)
    return [round(8 * 32 ** rng.random()) for _ in range(n)]


def policy_batches(lengths: list[int], waste: float, max_batch: int) -> list[tuple[int, int]]:
    """The same queue released by the runtime's LengthGroupPolicy."""
    loop = asyncio.new_event_loop()
    try:
        queue = BatchQueue(1)
        for i, length in enumerate(lengths):
            ids = np.zeros((1, length), dtype=np.int64)
            queue.push(Pending({"ids": ids}, 1, ("ids",), length, 0, float(i), i, loop.create_future()))
        policy = LengthGroupPolicy(waste)
        out = []
        while queue.items:
            slices = policy.take(queue, max_batch, fifo=False)
            out.append((sum(s.size for s in slices), max(s.request.length for s in slices)))
        return out
    finally:
        loop.close()


@pytest.mark.parametrize("waste", [0.0, 0.2, 0.5])
def test_grouping_is_the_runtime_policy(waste: float) -> None:
    lengths = long_tailed(40, seed=3)
    assert group_lengths(lengths, waste, 8) == policy_batches(lengths, waste, 8)


def test_per_token_cost_dominant_keeps_the_budget_small() -> None:
    # 1 us per token, no per-batch cost: padding is pure waste, every budget above 0 costs more.
    plan = plan_padding(long_tailed(500), LatencyFit(1e-6, 0.0), 32, 32)
    assert plan.waste == 0.0
    assert plan.tokens_per_item[0.0] < plan.tokens_per_item[0.5]


def test_per_batch_cost_dominant_groups_wider() -> None:
    # 20 ms per batch and almost nothing per token (a launch-bound GPU): fewer, fuller batches win.
    plan = plan_padding(long_tailed(500), LatencyFit(1e-9, 0.020), 32, 32)
    assert plan.waste >= 0.5
    assert plan.items_per_batch[plan.waste] > 2 * plan.items_per_batch[0.0]


def test_one_length_makes_the_budget_irrelevant() -> None:
    plan = plan_padding([64] * 100, LatencyFit(1e-6, 0.001), 16, 16)
    assert plan.waste == 0.0  # ties go to the smallest budget
    assert len(set(plan.cost_s.values())) == 1


def budget_moves(latency_s: float = 0.050) -> list[Decision]:
    """Driven directly: a closed loop of 32 clients on an NLP model whose batches cost 10 ms + 1 us per
    token slot, each request answered `latency_s` after it arrived; the budget starts at 0 (no padding allowed),
    lengths are long-tailed 8-256. The decisions that moved the budget, in 20 s at most (the first only)."""
    spec = AutotuneSpec(enabled=True, latency_slo_p99_ms=200.0)
    tuner = Autotuner(spec, TuningParams(32, 0.0, 0.0))
    lengths = long_tailed(4000, seed=1)
    t, k = 0.0, 0
    decisions = []
    while t < 20.0 and not decisions:
        batch = [lengths[(k + i) % len(lengths)] for i in range(8 + k % 9)]  # batches of 8-16 items
        k += len(batch)
        for length in batch:
            tuner.record_arrival(1, t, length=length)
        slots = len(batch) * max(batch)
        d = 0.010 + 1e-6 * slots
        t += d
        tuner.record_batch(len(batch), d, t, tokens=slots)
        for _ in batch:
            tuner.record_request(latency_s, 0.030, t)
        if k % 64 < len(batch):
            decision = tuner.step(t)
            if decision is not None and decision.params.max_padding_waste != 0.0:
                decisions.append(decision)
    return decisions


def test_the_autotuner_moves_the_budget_on_mixed_lengths() -> None:
    decisions = budget_moves()
    assert decisions, "the budget never moved"
    move = decisions[0]
    assert move.reason == "plan" and move.detail["knob"] == "padding"
    assert move.params.max_padding_waste is not None and move.params.max_padding_waste > 0.0
    before = move.detail["from"]
    assert (before["max_batch_size"], before["max_queue_delay_us"]) == (  # the budget moves alone
        move.params.max_batch_size,
        round(move.params.max_queue_delay_s * 1e6),
    )
    assert move.detail["predicted_items_per_batch"] > 8


def test_no_budget_trial_starts_from_an_epoch_over_the_slo() -> None:
    """A search's plan that finds no better size or delay tries a padding budget (`_pick_padding`), but not from an
    epoch over the SLO: the budget trades executor time per item, not the tail, and its trial is judged against a
    broken incumbent (run AH's soak: two of eight budget trials started on epochs reading p99 153 and 228 ms). The same
    tuner, the same plan: from an epoch within the SLO the budget moves, from one over it, it stays."""
    here = TuningParams(32, 0.0, 0.0)
    fit = LatencyFit(0.2e-3, 10e-3)

    def answered(p99_s: float) -> Decision | None:
        tuner = Autotuner(AutotuneSpec(enabled=True, latency_slo_p99_ms=200.0), here)
        lengths = long_tailed(2000, seed=1)
        for i, length in enumerate(lengths):
            tuner.record_arrival(1, 0.001 * i, length=length)
        for k in range(64):
            batch = lengths[16 * k : 16 * k + 8 + k % 9]
            slots = len(batch) * max(batch)
            tuner.record_batch(len(batch), 0.010 + 1e-6 * slots, 2.0 + 0.02 * k, tokens=slots)
        m = Measurement(
            params=here, duration_s=1.5, completed=1950, items_per_s=1300.0, arrival_rate=1300.0, company_share=0.9,
            mean_s=0.025, mean_se=0.001, mean_wait_s=0.012, p99_s=p99_s, utilization=0.8, largest_batch=16,
            mean_batch=12.0, peak_in_server=32, lag_ratio=1.0,
        )  # fmt: skip
        job = PlanJob("open", fit, (here,), 0.18, 0.0, 2000, arrival_rate=m.arrival_rate)
        only = CandidatePrediction(here, 1300.0, 0.04, 0.02, 12.0, 0.8, False)
        out = Outstanding(job, fit, read_workload(m), m, here, violation=False)
        return tuner._after_plan(out, Solved(Plan(only, True, 0.04, (only,)), 0.0), now=3.5)

    within = answered(0.150)
    assert within is not None and within.detail["knob"] == "padding" and within.params.max_padding_waste
    over = answered(0.250)  # (settled: the search's verdict on it)
    assert over is None or over.params == here


def test_a_budget_trial_stays_only_if_it_costs_the_executor_less_per_item() -> None:
    """Run AM's soak (textcls, open loop at 85% load): the budget 0.25 -> 0.5 was kept at 1.50 ms of executor time
    per item against the incumbent's 1.36 (its items/s follow the arrivals, its p99 within the tail's slack), and 26
    of the 40 decisions after it were SLO breaks. A budget tried alone is kept only on the gain it was tried for; a
    size or delay trial is judged as before."""
    here = TuningParams(16, 0.002, 0.25)
    tuner = Autotuner(AutotuneSpec(enabled=True, latency_slo_p99_ms=50.0), here)

    def epoch(params: TuningParams, items_per_s: float, utilization: float, p99_s: float) -> Measurement:
        return Measurement(
            params=params, duration_s=1.8, completed=int(1.8 * items_per_s), items_per_s=items_per_s,
            arrival_rate=items_per_s, company_share=0.7, mean_s=0.009, mean_se=0.0005, mean_wait_s=0.003,
            p99_s=p99_s, utilization=utilization, largest_batch=16, mean_batch=3.0, lag_ratio=1.1,
        )  # fmt: skip

    incumbent = epoch(here, 506.8, 0.688, 0.0224)  # the soak's figures, as logged
    wider = TuningParams(16, 0.002, 0.5)
    assert not tuner._confirms(epoch(wider, 491.7, 0.731, 0.0277), incumbent)  # 1.49 ms per item vs 1.36: lost
    assert tuner._confirms(epoch(wider, 491.7, 0.620, 0.0277), incumbent)  # 1.26 ms per item: the gain, kept
    # The same figures for a delay trial: the old rule (items/s within the noise, p99 within the tail's slack).
    assert tuner._confirms(epoch(TuningParams(16, 0.004, 0.25), 491.7, 0.731, 0.0277), incumbent)
