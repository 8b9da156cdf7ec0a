"""The serving tuner's log of SLO breaks its autotuner leaves as they are (`break-unanswered`)."""

from __future__ import annotations

import json
import logging
from dataclasses import replace

import pytest

from batchpilot.runtime.autotune_model import LatencyFit, Measurement
from batchpilot.runtime.autotuner import Decision, TuningParams
from batchpilot.runtime.batching.tuning import UNANSWERED_LOG_S, AutoTuner
from batchpilot.runtime.plan_jobs import PlanJob, Solved
from batchpilot.spec.model import ModelSpec

HERE = TuningParams(16, 0.002)


def autotuned_spec() -> ModelSpec:
    return ModelSpec.model_validate(
        {
            "name": "double",
            "type": "cv",
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1]}],
            "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1]}],
            "batching": {"max_batch_size": 16, "max_queue_delay_microseconds": 2000},
            "autotune": {"enabled": True, "latency_slo_p99_ms": 50},
        }
    )


def breaking(p99_s: float) -> Measurement:
    return Measurement(
        params=HERE, duration_s=1.5, completed=1800, items_per_s=1200.0, arrival_rate=1015.0, company_share=1.0,
        mean_s=0.2, mean_se=0.01, mean_wait_s=0.18, p99_s=p99_s, utilization=0.9, largest_batch=16, in_server=1038,
    )  # fmt: skip


def test_a_break_left_as_it_is_is_logged_with_its_reason_at_most_once_a_second(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [0.0]
    tuner = AutoTuner(autotuned_spec(), HERE, clock=lambda: now[0])
    reasons = iter(["a backlog draining"] * 3 + ["re-planned this epoch", None])

    def step(at: float) -> Decision | None:
        why = next(reasons)
        tuner.autotuner._unanswer = None if why is None else (why, breaking(float("inf") if at > 1 else 0.9))
        return None

    monkeypatch.setattr(tuner.autotuner, "step", step)
    with caplog.at_level(logging.INFO, logger="batchpilot.tuning"):
        for t in (0.0, 0.5 * UNANSWERED_LOG_S, 1.1 * UNANSWERED_LOG_S, 1.2 * UNANSWERED_LOG_S, 1.3 * UNANSWERED_LOG_S):
            now[0] = t
            assert tuner.step() is None
    lines = [json.loads(r.getMessage()) for r in caplog.records if "break-unanswered" in r.getMessage()]
    assert [(x["why"], x["p99_ms"]) for x in lines] == [
        ("a backlog draining", 900.0),
        ("a backlog draining", None),  # (an infinite p99 as null: the line stays JSON)
        ("re-planned this epoch", None),
    ]
    assert lines[0] | {"event": 0} == {
        "event": 0, "model": "double", "why": "a backlog draining", "max_batch_size": 16, "max_queue_delay_us": 2000,
        "p99_ms": 900.0, "items_per_s": 1200.0, "arrival_rate": 1015.0, "in_server": 1038,
    }  # fmt: skip


def test_a_break_a_plan_s_answer_leaves_as_it_is_is_logged(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A break's plan is answered between two steps; when it finds nothing and nothing is left to back off to, the
    break stays as it is, and the next step (which clears the reason) would never show it: the answer's own line does,
    with the arrivals a full queue refused."""
    tuner = AutoTuner(autotuned_spec(), HERE, clock=lambda: 5.0)
    job = PlanJob("open", LatencyFit(1e-3, 1e-3), (HERE,), 0.045, 0.0, 2000, arrival_rate=1015.0)

    def solved(answered: PlanJob, answer: Solved | None, now: float) -> None:
        assert answered is job and answer is None
        tuner.autotuner._unanswer = ("nothing to back off to", replace(breaking(0.9), refused_rate=300.0))

    monkeypatch.setattr(tuner.autotuner, "plan_solved", solved)
    with caplog.at_level(logging.INFO, logger="batchpilot.tuning"):
        tuner._plan_answered(job, None)
    lines = [json.loads(r.getMessage()) for r in caplog.records if "break-unanswered" in r.getMessage()]
    assert [(x["why"], x["refused_rate"]) for x in lines] == [("nothing to back off to", 300.0)]
