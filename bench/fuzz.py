"""Long fuzz run of the request decoders: the properties of tests/test_hardening_fuzz.py with a big budget.

In-process: v2 REST, v1 REST and gRPC decoding + validation raise only client errors, within the
allocation limit. With --live (default on): the same fuzzed REST bodies and gRPC bytes against a real
server, which must never answer 5xx / INTERNAL / UNKNOWN and must still serve afterwards.

    python bench/fuzz.py --examples 20000          # ~10-20 min on 2 cores
    python bench/fuzz.py --structure --examples 20000   # hostile JSON / protobuf structure
                                                        # (tests/test_structure_fuzz.py), with good traffic alongside
A failing example is printed by hypothesis (shrunk) and the script exits non-zero.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import test_hardening_fuzz as fuzz  # noqa: E402 - the properties and strategies live with the CI tests
import test_structure_fuzz as structure  # noqa: E402
from batchpilot.runtime.demo_models import write_demo_repository  # noqa: E402
from test_hardening_server import server_process  # noqa: E402


def run(
    label: str, examples: int, check: Callable[..., None], **strategies: st.SearchStrategy
) -> tuple[str, int, float]:
    """Run one property for `examples` examples (hypothesis stops early if it exhausts the space)."""
    tried = 0

    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(**strategies)
    def prop(**values: Any) -> None:
        nonlocal tried
        tried += 1
        check(**values)

    start = time.monotonic()
    prop()
    print(f"  {label}: {tried} inputs, all refused as the client's fault or served", flush=True)
    return label, tried, time.monotonic() - start


def live(examples: int) -> list[tuple[str, int, float]]:
    rows: list[tuple[str, int, float]] = []
    with tempfile.TemporaryDirectory(prefix="batchpilot-fuzz-") as tmp:
        repository = Path(tmp) / "models"
        write_demo_repository(repository)
        with server_process(repository, Path(tmp) / "server.log") as served:
            rows.append(
                run(
                    "live REST",
                    examples,
                    lambda case: fuzz.check_live_rest(served.http, case),
                    case=fuzz.live_requests(),
                )
            )
            with grpc.insecure_channel(f"127.0.0.1:{served.grpc}") as channel:
                calls = fuzz.grpc_calls(channel)
                rows.append(
                    run(
                        "live gRPC",
                        examples,
                        lambda method, data: fuzz.check_live_grpc(calls, method, data),
                        method=st.sampled_from(fuzz.GRPC_METHODS),
                        data=fuzz.grpc_bytes(),
                    )
                )
            fuzz.assert_still_serving((served.http, served.grpc), repository)
            assert served.stop() == 0
    return rows


def structure_run(examples: int, with_live: bool) -> list[tuple[str, int, float]]:
    """The structure-level properties: grammar-generated hostile JSON in-process, then live (REST next to
    good traffic, and hostile protobuf on gRPC)."""
    tracemalloc.start()
    rows = [
        run(
            "structure decode",
            examples,
            lambda body, model: structure.check_in_process(body, model),
            body=structure.hostile_bodies(),
            model=st.sampled_from(sorted(fuzz.SPECS)),
        )
    ]
    tracemalloc.stop()
    if not with_live:
        return rows
    with tempfile.TemporaryDirectory(prefix="batchpilot-fuzz-") as tmp:
        repository = Path(tmp) / "models"
        write_demo_repository(repository)
        with server_process(repository, Path(tmp) / "server.log") as served:
            start = time.monotonic()
            structure.STRUCTURE_LIVE = settings(structure.STRUCTURE_LIVE, derandomize=False)
            statuses, kinds, good = structure.live_structure_fuzz(served.http, examples)
            bad = {s: n for s, n in statuses.items() if s >= 500}
            print(
                f"  live structure REST: {sum(statuses.values())} bodies {dict(statuses)}; {len(kinds)} kinds: "
                f"{dict(kinds.most_common())}; good traffic {dict(good.statuses)}",
                flush=True,
            )
            assert not bad and set(good.statuses) == {200}, (bad, good.statuses)
            rows.append(("live structure", sum(statuses.values()), time.monotonic() - start))
            with grpc.insecure_channel(f"127.0.0.1:{served.grpc}") as channel:
                call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
                rows.append(
                    run(
                        "live gRPC structure",
                        examples,
                        lambda case: fuzz.check_live_grpc({"ModelInfer": call}, "ModelInfer", case[0]),
                        case=structure.hostile_protobuf(),
                    )
                )
            fuzz.assert_still_serving((served.http, served.grpc), repository)
            assert served.stop() == 0
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=20_000, help="inputs per property")
    parser.add_argument("--no-live", action="store_true", help="skip the live server part")
    parser.add_argument(
        "--structure",
        action="store_true",
        help="run the structure-level fuzzer (hostile JSON / protobuf structure), not the content one",
    )
    args = parser.parse_args()
    if args.structure:
        return report(structure_run(args.examples, not args.no_live))
    tracemalloc.start()
    models = st.sampled_from(sorted(fuzz.SPECS))
    rows = [
        run(
            "v2 REST decode",
            args.examples,
            lambda model, body: fuzz.only_client_errors(lambda: fuzz.decode_v2(model, body)),
            model=models,
            body=fuzz.v2_bodies(),
        ),
        run(
            "v1 REST decode",
            args.examples,
            lambda model, body: fuzz.only_client_errors(lambda: fuzz.decode_v1(model, body)),
            model=models,
            body=fuzz.v1_bodies,
        ),
        run(
            "gRPC decode",
            args.examples,
            lambda request: fuzz.only_client_errors(lambda: fuzz.decode_grpc(request)),
            request=fuzz.infer_requests(),
        ),
    ]
    tracemalloc.stop()
    if not args.no_live:
        rows += live(args.examples)
    return report(rows)


def report(rows: list[tuple[str, int, float]]) -> int:
    print(f"\n{'property':20s} {'inputs':>8s} {'seconds':>8s}")
    for label, tried, seconds in rows:
        print(f"{label:20s} {tried:8d} {seconds:8.1f}")
    print(f"{'total':20s} {sum(r[1] for r in rows):8d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
