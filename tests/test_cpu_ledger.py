"""The process's CPU ledger: each model's executor CPU apart from the others'."""

from __future__ import annotations

import pytest

from batchpilot.runtime.autotune_model import CpuReading, Epoch, TuningParams
from batchpilot.runtime.batching.cpu_ledger import CpuLedger
from batchpilot.runtime.batching.executor import BatchTimings
from batchpilot.runtime.batching.tuning import make_tuner
from batchpilot.runtime.demo_models import image_spec


def test_each_account_sees_the_others_totals() -> None:
    ledger = CpuLedger()
    a, b, c = ledger.account(), ledger.account(), ledger.account()
    a.add(0.010, 16)
    b.add(0.004, 8)
    b.add(0.002, 4)
    assert a.others() == (pytest.approx(0.006), 12)
    assert b.others() == (pytest.approx(0.010), 16)
    assert c.others() == (pytest.approx(0.016), 28)


def test_an_epoch_splits_front_end_work_from_the_other_models_share() -> None:
    """Over 1 s: this model's executor 0.3 s on 300 items, another's 0.2 s on 200 items, and 0.1 s of
    front-end work beyond both executors: 0.2 ms per item of either, and the other model took its executor's
    0.2 s plus its items' 0.04 s of front-end: 24% of the core."""
    epoch = Epoch(TuningParams(16, 0.002), start=0.0, settled_at=0.0, slo_s=0.05)
    epoch.add_cpu(CpuReading(0.0, process_s=5.0, others_exec_s=1.0, others_items=1000))
    epoch.add_batch(300, 0.3, 0.5, cpu_s=0.3)
    epoch.add_cpu(CpuReading(1.0, process_s=5.6, others_exec_s=1.2, others_items=1200))
    m = epoch.measure(1.0)
    assert m.frontend_cpu_s == pytest.approx(0.1 / 500)
    assert m.background_cpu == pytest.approx(0.24)


def test_every_model_of_a_server_keeps_its_account() -> None:
    """Static and autotuned tuners alike report their executors' CPU, so another model's tuner can tell it apart."""
    cv = image_spec()
    static = make_tuner(cv.model_copy(update={"autotune": cv.autotune.model_copy(update={"enabled": False})}), True)
    tuned = make_tuner(cv.model_copy(update={"autotune": cv.autotune.model_copy(update={"enabled": True})}), True)
    before = tuned.cpu.others()
    timings = BatchTimings()
    timings.add(8, 0.0, 0.004, 0.0, 0.003)
    static.batch_done(timings)
    exec_s, items = tuned.cpu.others()
    assert (exec_s - before[0], items - before[1]) == (pytest.approx(0.003), 8)
