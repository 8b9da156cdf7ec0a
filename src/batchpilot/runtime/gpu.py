"""GPU utilisation and memory gauges from NVML, when a GPU and the NVML bindings are present."""

from __future__ import annotations

import asyncio
import logging

from batchpilot.runtime.metrics import RuntimeMetrics

log = logging.getLogger("batchpilot.gpu")


async def export_gpu_metrics(metrics: RuntimeMetrics, interval_s: float = 5.0) -> None:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # no NVML: nothing to export
        log.info("NVML unavailable, no GPU metrics: %s", exc)
        return
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    while True:
        for i, handle in enumerate(handles):
            util = pynvml.nvmlDeviceGetUtilizationRates(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            metrics.gpu_utilization.labels(gpu=str(i)).set(util.gpu / 100.0)
            metrics.gpu_memory_used.labels(gpu=str(i)).set(memory.used)
        await asyncio.sleep(interval_s)
