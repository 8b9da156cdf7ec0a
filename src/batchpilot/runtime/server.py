"""The BatchPilot runtime: KServe's ModelServer hosting every model of a repository, one batcher each.

REST (KServe's uvicorn server, with the hub's front-end in front of KServe's app) and gRPC (KServe's
servicer with inference answered by the hub, plus Triton's extension RPCs) share one event loop.
SIGTERM drains: new requests are refused, every accepted one is answered, then the servers stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import kserve
import torch
from kserve.protocol.rest.server import RESTServer

from batchpilot.runtime.batching.batcher import Batcher
from batchpilot.runtime.batching.device_turns import DeviceTurns, available_cores
from batchpilot.runtime.batching.executor import Executor
from batchpilot.runtime.collector import FullCollectionTimer, freeze_startup_objects
from batchpilot.runtime.gpu import export_gpu_metrics
from batchpilot.runtime.heap import DEFAULT_INTERVAL_S as DEFAULT_TRIM_INTERVAL_S
from batchpilot.runtime.heap import trim_heap_periodically
from batchpilot.runtime.hub import HostedModel, ModelHub
from batchpilot.runtime.metrics import RuntimeMetrics
from batchpilot.runtime.plan_worker import shared_worker
from batchpilot.runtime.protocol import limits as connection_limits
from batchpilot.runtime.protocol.grpc_frontend import BatchPilotServicer, add_servicer
from batchpilot.runtime.protocol.limits import ConnectionLimits
from batchpilot.runtime.protocol.rest import RestFrontend
from batchpilot.runtime.protocol.triton_grpc import triton_extension_handler
from batchpilot.runtime.repository import ModelEntry, load_repository, specs_from_env, subpaths_from_env

log = logging.getLogger("batchpilot.server")
GRPC_MAX_MESSAGE = 64 * 1024 * 1024


@dataclass
class ServerOptions:
    model_repository: Path
    http_port: int = 8080
    grpc_port: int = 8081
    host: str = "0.0.0.0"
    batching: bool = True
    torch_threads: int | None = None
    max_body_bytes: int = 64 * 1024 * 1024
    grace_period_s: int = 30
    hang_timeout_s: float = 60.0
    heap_trim_interval_s: float = DEFAULT_TRIM_INTERVAL_S  # 0: never trim
    connection_limits: ConnectionLimits = field(default_factory=ConnectionLimits)


def pick_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


class KServeModel(kserve.Model):
    """KServe's view of a hosted model (readiness and the model registry)."""

    def __init__(self, hosted: HostedModel) -> None:
        self.hosted = hosted
        super().__init__(hosted.name)

    @property
    def ready(self) -> bool:
        """Always the hub's live answer (KServe's own /v1 readiness routes read this)."""
        return self.hosted.ready

    @ready.setter
    def ready(self, value: bool) -> None:
        pass  # readiness is derived, never set

    def load(self) -> bool:
        return self.ready


def build_hub(
    entries: list[ModelEntry], device: torch.device, metrics: RuntimeMetrics, options: ServerOptions
) -> ModelHub:
    hub = ModelHub(metrics)
    turns = DeviceTurns() if device.type == "cpu" and torch.get_num_threads() >= available_cores() else None
    for entry in entries:
        batcher = None
        if entry.module is not None and entry.spec is not None:
            executor = Executor(entry.spec, entry.module, device)
            batcher = Batcher(
                entry.spec,
                executor,
                metrics,
                batching=options.batching,
                hang_timeout_s=options.hang_timeout_s,
                turns=turns,
            )
        hub.add(HostedModel(entry.name, entry.spec, batcher, entry.error))
    return hub


class BatchPilotServer(kserve.ModelServer):
    def __init__(self, options: ServerOptions, metrics: RuntimeMetrics | None = None) -> None:
        super().__init__(
            http_port=options.http_port,
            grpc_port=options.grpc_port,
            workers=1,
            enable_grpc=False,
            grace_period=options.grace_period_s,
            enable_latency_logging=False,
        )
        self.options = options
        self.metrics = metrics or RuntimeMetrics()
        if options.torch_threads:
            torch.set_num_threads(options.torch_threads)
        self.device = pick_device()
        entries = load_repository(options.model_repository, self.device, specs_from_env(), subpaths_from_env())
        self.hub = build_hub(entries, self.device, self.metrics, options)
        for hosted in self.hub.models.values():
            self.register_model(KServeModel(hosted))
        self._grpc: grpc.aio.Server | None = None
        self._rest: RESTServer | None = None
        self._stopping = False

    # -- servers ------------------------------------------------------------------------------------
    def _make_rest(self) -> RESTServer:
        rest = RESTServer(
            "kserve.model_server:app",
            self.dataplane,
            self.model_repository_extension,
            self.options.http_port,
            grace_period=self.options.grace_period_s,
        )
        rest.create_application()
        from kserve.model_server import app as kserve_app

        frontend = RestFrontend(self.hub, kserve_app, max_body_bytes=self.options.max_body_bytes)
        rest.config.app = frontend
        rest.config.host = self.options.host
        logging.getLogger("uvicorn.access").disabled = True  # a log line per request costs ~20%
        rest.config.proxy_headers = False
        metrics = self.metrics
        connection_limits.configure(
            rest.config,
            self.options.connection_limits,
            metrics.connections_timed_out,
            metrics.connections_refused,
            fast_lane=frontend,
        )
        rest.create_application = lambda: None  # done above; serve() must not add routes twice
        # We own SIGTERM/SIGINT (drain first); uvicorn must not capture them.
        rest._server.capture_signals = contextlib.nullcontext
        return rest

    async def _start_grpc(self) -> grpc.aio.Server:
        server = grpc.aio.server(
            options=[
                ("grpc.max_send_message_length", GRPC_MAX_MESSAGE),
                ("grpc.max_receive_message_length", GRPC_MAX_MESSAGE),
                *connection_limits.grpc_options(self.options.connection_limits),
            ]
        )
        servicer = BatchPilotServicer(self.hub, self.dataplane, self.model_repository_extension)
        add_servicer(servicer, server)
        server.add_generic_rpc_handlers((triton_extension_handler(self.hub.triton_config, self.hub.triton_stats),))
        server.add_insecure_port(f"{self.options.host}:{self.options.grpc_port}")
        await server.start()
        return server

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        for hosted in self.hub.models.values():
            if hosted.batcher is not None:
                hosted.batcher.start()
        tuned = any(m.batcher is not None and m.batcher.tuner.adaptive for m in self.hub.models.values())
        if tuned and (worker := shared_worker()) is not None:
            await worker.start()
        self._grpc = await self._start_grpc()
        self._rest = self._make_rest()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, loop, sig)
        side_tasks = []
        if self.device.type == "cuda":
            side_tasks.append(loop.create_task(export_gpu_metrics(self.metrics)))
        if self.options.heap_trim_interval_s > 0:
            side_tasks.append(loop.create_task(trim_heap_periodically(self.metrics, self.options.heap_trim_interval_s)))
        ready = [n for n, m in self.hub.models.items() if m.ready]
        frozen = freeze_startup_objects()  # (everything built so far lives as long as the server)
        self.metrics.gc_frozen.set(frozen)
        gc_timer = FullCollectionTimer(self.metrics.gc_full_pause)
        gc_timer.install()
        log.info(
            "serving %s on http :%d, grpc :%d (%s; %d startup objects out of the collector's full passes)",
            ready,
            self.options.http_port,
            self.options.grpc_port,
            self.device,
            frozen,
        )
        try:
            await self._rest.start()
        finally:
            gc_timer.remove()
            for task in side_tasks:
                task.cancel()
            if self._grpc is not None:
                await self._grpc.stop(grace=5)
            if (worker := shared_worker()) is not None:
                worker.close()

    def _on_signal(self, loop: asyncio.AbstractEventLoop, sig: signal.Signals) -> None:
        loop.create_task(self.shutdown(sig))

    async def shutdown(self, sig: int | None = None) -> None:
        """Refuse new work, answer everything accepted, then stop both servers."""
        if self._stopping:
            return
        self._stopping = True
        log.info("draining on signal %s", sig)
        batchers = [m.batcher for m in self.hub.models.values() if m.batcher is not None]
        for m in self.hub.models.values():
            self.metrics.model_ready.labels(model=m.name).set(0)
        await asyncio.gather(*(b.drain() for b in batchers))
        await self._until_quiet()
        log.info("drained; stopping servers")
        if self._grpc is not None:
            await self._grpc.stop(grace=5)
            self._grpc = None
        if self._rest is not None:
            self._rest._server.should_exit = True

    async def _until_quiet(self, quiet_s: float = 0.3, max_s: float = 3.0) -> None:
        """Keep refusing (503 / UNAVAILABLE "shutting down") until no request has come for `quiet_s`: a gRPC
        call that reaches a stopping server is cancelled, and its client cannot tell whether it ran."""
        deadline = time.monotonic() + max_s
        while time.monotonic() < deadline and time.monotonic() - self.hub.last_request_at < quiet_s:
            await asyncio.sleep(0.05)

    def run(self) -> None:
        try:
            import uvloop

            uvloop.run(self.serve())
        except ImportError:
            asyncio.run(self.serve())


def default_torch_threads() -> int:
    """Leave one core to the event loop (HTTP parsing, batching) when there are several."""
    return max(1, (os.cpu_count() or 2) - 1)
