"""The `batchpilot` command: serve, demo-models, demo (and the operator's subcommands)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path


def _serve(args: argparse.Namespace) -> int:
    from batchpilot.runtime.heap import cap_kernel_cache, keep_freed_blocks

    try:
        kernels = cap_kernel_cache(args.kernel_cache)  # before torch builds a kernel
    except ValueError as exc:
        print(f"batchpilot serve: {exc}", file=sys.stderr)
        return 2
    log = logging.getLogger("batchpilot.server")
    log.info("oneDNN keeps at most %d built kernels", kernels)
    log.info("freed heap blocks kept between trims: %s", keep_freed_blocks())

    from batchpilot.runtime.protocol.limits import ConnectionLimits
    from batchpilot.runtime.server import BatchPilotServer, ServerOptions, default_torch_threads

    try:
        limits = ConnectionLimits(
            header_timeout_s=args.header_timeout,
            body_timeout_s=args.body_timeout,
            keep_alive_timeout_s=args.keep_alive_timeout,
            max_connections=args.max_connections,
            max_header_bytes=args.max_header_bytes,
        )
    except ValueError as exc:
        print(f"batchpilot serve: {exc}", file=sys.stderr)
        return 2
    options = ServerOptions(
        model_repository=Path(args.model_repository),
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        host=args.host,
        batching=not args.no_batching,
        torch_threads=args.torch_threads or default_torch_threads(),
        max_body_bytes=args.max_body_bytes,
        hang_timeout_s=args.model_hang_timeout,
        heap_trim_interval_s=args.heap_trim_interval,
        connection_limits=limits,
    )
    BatchPilotServer(options).run()
    return 0


def _demo_models(args: argparse.Namespace) -> int:
    from batchpilot.runtime.demo_models import write_demo_repository

    for spec in write_demo_repository(Path(args.directory)):
        print(f"wrote {Path(args.directory) / spec.name} ({spec.type}, {spec.format})")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from batchpilot.runtime.demo import run_demo

    return run_demo(duration_s=args.duration, concurrency=args.concurrency)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="batchpilot", description=__doc__)
    parser.add_argument("--log-level", default="INFO")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="serve a model repository (KServe v1/v2 REST and gRPC)")
    serve.add_argument("--model-repository", required=True)
    serve.add_argument("--http-port", type=int, default=8080)
    serve.add_argument("--grpc-port", type=int, default=8081)
    serve.add_argument("--host", default="0.0.0.0")
    serve.add_argument("--no-batching", action="store_true", help="run every model at batch size 1")
    serve.add_argument("--torch-threads", type=int, default=0, help="intra-op threads (default: cores - 1)")
    serve.add_argument("--max-body-bytes", type=int, default=64 * 1024 * 1024)
    serve.add_argument(
        "--model-hang-timeout",
        type=float,
        default=60.0,
        help="seconds a batch may run before the model is declared hung and marked unready",
    )
    serve.add_argument(
        "--heap-trim-interval",
        type=float,
        default=10.0,
        help="seconds between giving freed heap memory back to the OS (glibc malloc_trim; 0: never). Models "
        "that see many input shapes otherwise grow the server's RSS with every new one",
    )
    serve.add_argument(
        "--kernel-cache",
        type=int,
        default=None,
        metavar="N",
        help="the most oneDNN kernels (one per input shape) kept built (default: $ONEDNN_PRIMITIVE_CACHE_CAPACITY, "
        "else oneDNN's own 1,024); fewer bound the memory they pin, and evicted shapes are built again",
    )
    limits = serve.add_argument_group("connection limits (HTTP)")
    limits.add_argument(
        "--header-timeout",
        type=float,
        default=10.0,
        help="seconds a client has to send a request's line and headers (from connecting, or from the "
        "first byte of the next request on a kept-alive connection)",
    )
    limits.add_argument(
        "--body-timeout",
        type=float,
        default=60.0,
        help="seconds a client has to send a request's whole body, from the end of its headers",
    )
    limits.add_argument(
        "--keep-alive-timeout",
        type=float,
        default=65.0,
        help="seconds an idle kept-alive connection is held between requests",
    )
    limits.add_argument(
        "--max-connections",
        type=int,
        default=0,
        help="open HTTP connections at most; one more is answered 503 and closed "
        "(default 0: half the file descriptor limit, at most 10000)",
    )
    limits.add_argument(
        "--max-header-bytes", type=int, default=64 * 1024, help="bytes of request line and headers at most"
    )
    serve.set_defaults(func=_serve)

    demo_models = sub.add_parser("demo-models", help="write the two demo models into DIR as a model repository")
    demo_models.add_argument("directory")
    demo_models.set_defaults(func=_demo_models)

    demo = sub.add_parser("demo", help="serve the demo models locally and show what batching does")
    demo.add_argument("--duration", type=float, default=8.0, help="seconds of load per phase")
    demo.add_argument("--concurrency", type=int, default=32)
    demo.set_defaults(func=_demo)

    from batchpilot.devcluster.cli import add_cluster_parser
    from batchpilot.operator.cli import add_operator_parser

    add_operator_parser(sub)
    add_cluster_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # kserve parses sys.argv when imported: give it nothing of ours to misread.
    sys.argv = sys.argv[:1]
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
