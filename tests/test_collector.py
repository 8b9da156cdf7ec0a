"""The garbage collector's full passes skip what the server built to start, and each one is timed.

The freezing runs in a child process (freezing this one would keep every test's startup objects out of the
collector for the rest of the run); the served test reads a real `batchpilot serve`'s /metrics.
"""

from __future__ import annotations

import gc
import json
import re
import subprocess
import sys
import textwrap
import urllib.request

from prometheus_client import CollectorRegistry, Histogram

from batchpilot.runtime.collector import FullCollectionTimer


def test_frozen_objects_leave_the_full_passes_and_garbage_made_later_is_still_collected() -> None:
    script = textwrap.dedent(
        """
        import gc, json
        from batchpilot.runtime.collector import freeze_startup_objects
        startup = [[i] for i in range(200_000)]  # containers the collector tracks
        before = len(gc.get_objects(2)) + len(gc.get_objects(1)) + len(gc.get_objects(0))
        frozen = freeze_startup_objects()
        after = len(gc.get_objects(2)) + len(gc.get_objects(1)) + len(gc.get_objects(0))
        a, b = [], []  # a cycle made after the freeze, then dropped: still garbage to collect
        a.append(b); b.append(a)
        del a, b
        print(json.dumps({"before": before, "frozen": frozen, "after": after, "collected": gc.collect()}))
        """
    )
    out = json.loads(subprocess.run([sys.executable, "-c", script], capture_output=True, check=True).stdout)
    assert out["before"] > 200_000
    assert out["frozen"] >= 200_000  # the startup list and its items among them
    assert out["after"] < 1_000  # what a full pass walks now
    assert out["collected"] >= 2


def test_only_full_collections_are_timed() -> None:
    histogram = Histogram("pause", "", registry=CollectorRegistry())
    timer = FullCollectionTimer(histogram)
    timer.install()
    try:
        gc.collect(0)
        gc.collect(1)
        young = histogram.collect()[0]
        gc.collect(2)
        full = histogram.collect()[0]
    finally:
        timer.remove()
    assert timer not in gc.callbacks
    counts = [{s.name: s.value for s in m.samples} for m in (young, full)]
    assert [c["pause_count"] for c in counts] == [0.0, 1.0]
    assert 0.0 < counts[1]["pause_sum"] < 5.0


def test_the_server_freezes_its_startup_objects_and_times_full_collections(server) -> None:
    http, _ = server
    text = urllib.request.urlopen(f"http://127.0.0.1:{http}/metrics", timeout=30).read().decode()
    frozen = re.search(r"^batchpilot_gc_frozen_objects (\S+)$", text, re.MULTILINE)
    assert frozen is not None and float(frozen.group(1)) > 100_000  # torch, kserve, grpc and the models
    assert re.search(r"^batchpilot_gc_full_pause_seconds_count \S+$", text, re.MULTILINE)
