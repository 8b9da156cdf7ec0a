"""`batchpilot operator` and `batchpilot crd`, registered by batchpilot/cli.py through `add_operator_parser`."""

from __future__ import annotations

import argparse
import sys


def _run(args: argparse.Namespace) -> int:
    from batchpilot.operator.main import run_operator  # kopf is imported only when the operator runs

    run_operator(
        args.namespace,
        all_namespaces=args.namespace is None,
        liveness_endpoint=args.liveness,
        standalone=args.standalone,
        refresh_interval_s=args.refresh_interval,
        json_logs=args.log_format == "json",
    )
    return 0


def _print_crd(args: argparse.Namespace) -> int:
    from batchpilot.operator.crdgen import render

    sys.stdout.write(render())
    return 0


def add_operator_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the `operator` and `crd` subcommands; each sets `func(args) -> exit code`."""
    op = subparsers.add_parser(
        "operator",
        help="run the Kubernetes operator (BatchedModel -> KServe InferenceService)",
        description="Reconcile BatchedModel resources into KServe InferenceServices. Finds the cluster "
        "from the in-cluster service account or KUBECONFIG, as kubectl does.",
    )
    scope = op.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", help="serve only this namespace")
    scope.add_argument(
        "-A",
        "--all-namespaces",
        action="store_true",
        help="serve every namespace (the default when --namespace is not given)",
    )
    op.add_argument(
        "--liveness", metavar="URL", default=None, help="serve a health endpoint, e.g. http://0.0.0.0:8080/healthz"
    )
    op.add_argument(
        "--standalone", action="store_true", help="skip kopf's peering (no leader hand-over between operator replicas)"
    )
    op.add_argument(
        "--refresh-interval",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="how often status.models is re-read from the runtime (default 30)",
    )
    op.add_argument("--log-format", choices=["json", "text"], default="json", help="log line format")
    op.set_defaults(func=_run)

    crd = subparsers.add_parser("crd", help="print the BatchedModel CustomResourceDefinition (YAML)")
    crd.set_defaults(func=_print_crd)
