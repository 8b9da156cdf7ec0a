"""How the autotuner's figures read in its log lines and in `GET /v2/models/{m}/batching` (rounded, in ms)."""

from __future__ import annotations

import math
from typing import Any

from batchpilot.runtime.autotune_model import (
    LatencyFit,
    Measurement,
    TuningParams,
    Workload,
    read_workload,
)
from batchpilot.runtime.batch_planner import CandidatePrediction


def fit_figures(fit: LatencyFit | None) -> dict[str, float] | None:
    """A fit as `/batching` shows it (ms)."""
    return None if fit is None else {"a_ms_per_item": round(fit.a_s * 1e3, 4), "b_ms": round(fit.b_s * 1e3, 4)}


def predicted_figures(c: CandidatePrediction, w: Workload) -> dict[str, Any]:
    """The plan's figures for the log line of its decision."""
    return {
        "load": "closed-loop" if w.closed else "open-loop",
        "clients": w.clients,
        "think_ms": round(w.think_s * 1e3, 3) if math.isfinite(w.think_s) else None,
        "predicted_items_per_s": round(c.items_per_s, 2),
        "predicted_p99_ms": in_ms(c.p99_s),
    }


def incumbent_figures(was: Measurement) -> dict[str, Any]:
    """The figures of the incumbent a trial was judged against, for the trial's log line."""
    return {
        "incumbent_p99_ms": in_ms(was.p99_s),
        "incumbent_items_per_s": round(was.items_per_s, 2),
        "incumbent_clients": read_workload(was).clients,
    }


def rounded(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def in_ms(s: float) -> float | None:
    return round(s * 1e3, 3) if math.isfinite(s) else None


def params_dict(p: TuningParams) -> dict[str, Any]:
    out: dict[str, Any] = {"max_batch_size": p.max_batch_size, "max_queue_delay_us": round(p.max_queue_delay_s * 1e6)}
    if p.max_padding_waste is not None:
        out["max_padding_waste"] = p.max_padding_waste
    return out
