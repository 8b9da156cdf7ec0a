"""The plan worker: plans solved in a separate, lower-priority process come back on the event loop."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from batchpilot.runtime.autotune_model import LatencyFit, TuningParams
from batchpilot.runtime.batch_planner import candidate_grid
from batchpilot.runtime.plan_jobs import PlanJob, Solved, solve
from batchpilot.runtime.plan_worker import WORKER_NICE, PlanWorker
from batchpilot.testing.loadgen import run_load
from batchpilot.testing.processes import get_json, serving
from batchpilot.testing.requests import demo_requests

GRID = tuple(candidate_grid(1, 32, 0.0, 0.004))
FIT = LatencyFit(0.4e-3, 1.2e-3)


def _worker_nice() -> int:
    return os.nice(0)


def test_a_plan_solved_in_the_worker_equals_the_inline_plan() -> None:
    jobs = [
        PlanJob("open", FIT, GRID, 0.05, 0.1, 2000, arrival_rate=1500.0),
        PlanJob("closed", FIT, GRID, 0.05, 0.1, 1500, clients=32, think_s=0.002),
        PlanJob(
            "one-core",
            FIT,
            GRID,
            0.05,
            0.1,
            1500,
            clients=16,
            think_s=0.004,
            frontend_s=0.2e-3,
            incumbent=TuningParams(8, 0.002),
        ),
    ]

    async def main() -> tuple[list[tuple[PlanJob, Solved | None]], int]:
        worker = PlanWorker()
        answers: list[tuple[PlanJob, Solved | None]] = []
        done = asyncio.Event()

        def answered(job: PlanJob, solved: Solved | None) -> None:
            asyncio.get_running_loop()  # called on the loop, not in the pool's thread
            answers.append((job, solved))
            if len(answers) == len(jobs):
                done.set()

        try:
            for job in jobs:
                worker.submit(job, answered)
            await asyncio.wait_for(done.wait(), 120)
            pool = worker._executor()
            nice = await asyncio.wrap_future(pool.submit(_worker_nice))
        finally:
            worker.close()
        return answers, nice

    answers, nice = asyncio.run(main())
    assert [job for job, _ in answers] == jobs
    for job, solved in answers:
        assert solved is not None and solved == solve(job)
    assert nice == min(19, os.nice(0) + WORKER_NICE)  # the worker runs at a lower priority


def test_a_served_model_is_planned_by_the_worker_process(demo_repository: Path, tmp_path: Path) -> None:
    """The real server under closed-loop load: the autotuner's plan is solved in the worker (a child of
    the server at a lower priority), its report reaches `/batching`, and every request is answered meanwhile."""
    log = tmp_path / "server.log"
    with serving(demo_repository, "--torch-threads", "1", log_path=log, log_level="INFO") as (http, _):
        requests = demo_requests("resnet-mini", f"127.0.0.1:{http}")
        url = f"http://127.0.0.1:{http}/v2/models/resnet-mini/batching"
        plan, statuses = None, {}
        for _ in range(12):  # up to 36 s: warm-up, a probe for a second batch size, then a plan
            result = asyncio.run(run_load("127.0.0.1", http, requests, concurrency=16, duration_s=3.0))
            for status, n in result.statuses.items():
                statuses[status] = statuses.get(status, 0) + n
            plan = get_json(url)["autotune"]["plan"]
            if plan is not None:
                break
        assert plan is not None, log.read_text()[-3000:]
        assert plan["load"] in ("closed-loop", "open-loop") and plan["predicted_items_per_s"] > 0
        assert set(statuses) == {200}
        workers = _children_nice(_server_pid(http))
    assert WORKER_NICE in workers, workers
    assert "plan worker" not in log.read_text()  # neither unavailable nor failed


def _server_pid(port: int) -> int:
    """The pid listening on loopback `port` (from /proc/net/tcp and the fds of our children)."""
    inode = None
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == port and fields[3] == "0A":
            inode = fields[9]
    assert inode is not None
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            continue
        if f"socket:[{inode}]" in links:
            return int(pid)
    raise AssertionError(f"nobody listens on {port}")


def _children_nice(pid: int) -> list[int]:
    """The nice values of `pid`'s child processes (field 19 of /proc/<child>/stat)."""
    out = []
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        stat = Path(f"/proc/{child}/stat").read_text()
        out.append(int(stat.rsplit(")", 1)[1].split()[16]))
    return out
