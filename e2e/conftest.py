"""Fixtures of the end-to-end tests.

- `cluster`: a real control plane on 127.0.0.1 (etcd, kube-apiserver, kube-controller-manager,
  kube-scheduler, kwok and KServe's controller manager with its webhooks), built from Go modules by
  `make controlplane`; one per test session, the same code as `batchpilot cluster`.
- The kmock flow (test_flow.py) reuses the operator tests' emulator (tests/operator/kmockkit.py) and the
  chart tests' Helm rendering (tests/chart/chartkit.py).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parents[1] / "tests"
for helpers in (TESTS / "operator", TESTS / "chart"):
    if str(helpers) not in sys.path:
        sys.path.insert(0, str(helpers))

from clusterkit import (  # noqa: E402
    CHART_NAMESPACE,
    OperatorProcess,
    ServiceProxy,
    StartOperator,
    install_chart,
    operator,
    service_account_kubeconfig,
)

from batchpilot.devcluster import LocalCluster  # noqa: E402
from batchpilot.devcluster.kserve import KServe  # noqa: E402

TOOLS_BIN = Path(__file__).resolve().parents[1] / ".tools" / "bin"


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    local = LocalCluster(tmp_path_factory.mktemp("cluster"), TOOLS_BIN)
    try:
        seconds = local.start()
        seconds += KServe(local).start()
        print(f"\nlocal cluster ready in {seconds:.1f} s (logs: {local.logs})")
        yield local
    finally:
        local.stop()


@pytest.fixture(scope="session")
def chart_objects(cluster: LocalCluster) -> list[dict[str, Any]]:
    """The chart installed as a user would (helm template | kubectl apply --server-side); its objects."""
    return install_chart(cluster)


@pytest.fixture(scope="session")
def operator_kubeconfig(
    cluster: LocalCluster, chart_objects: list[dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A kubeconfig with a token the API server issued for the chart's operator ServiceAccount."""
    deployment = next(o for o in chart_objects if o["kind"] == "Deployment")
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    return service_account_kubeconfig(
        cluster, CHART_NAMESPACE, account, tmp_path_factory.mktemp("operator") / "kubeconfig"
    )


@pytest.fixture(scope="session")
def service_proxy() -> Iterator[ServiceProxy]:
    with ServiceProxy() as proxy:
        yield proxy


@pytest.fixture()
def start_operator(
    chart_objects: list[dict[str, Any]], operator_kubeconfig: Path, service_proxy: ServiceProxy, tmp_path: Path
) -> StartOperator:
    """`with start_operator("x.log") as op:` runs the chart's operator with its ServiceAccount's token (or
    `kubeconfig=`), logging to tmp_path/x.log, until the block ends."""

    def start(log: str = "operator.log", kubeconfig: Path | None = None) -> AbstractContextManager[OperatorProcess]:
        return operator(chart_objects, kubeconfig or operator_kubeconfig, service_proxy, tmp_path / log)

    return start
