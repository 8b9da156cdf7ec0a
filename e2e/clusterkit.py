"""Helpers of the tests on the real control plane: installing the chart as a user would, running the
operator as its Deployment says with its ServiceAccount's token, and waiting on the API server."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python
import yaml
from kmockkit import wait_for

from batchpilot.devcluster import LocalCluster
from batchpilot.devcluster.process import free_port

REPO = Path(__file__).resolve().parents[1]
CHART_DIR = REPO / "charts" / "batchpilot"
RELEASE, CHART_NAMESPACE = "batchpilot", "batchpilot-system"
BIN = Path(sys.executable).parent  # the console scripts installed with this Python (batchpilot)


def render_chart(values: dict[str, Any] | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(CRDs from the chart's crds/, everything its templates render), by the real Helm engine."""
    chart = helm_python.Chart.load(str(CHART_DIR))
    rendered = chart.render(values or {}, name=RELEASE, namespace=CHART_NAMESPACE, is_install=True)
    objects = [
        doc
        for path, text in sorted(rendered.items())
        if not path.endswith("NOTES.txt")
        for doc in yaml.safe_load_all(text)
        if doc
    ]
    crds = [
        doc
        for path in sorted((CHART_DIR / "crds").glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]
    return crds, objects


def apply(cluster: LocalCluster, objects: list[dict[str, Any]], *extra: str, kubeconfig: Path | None = None) -> str:
    """`kubectl apply --server-side -f -` of `objects`, as a user pipes `helm template` into it."""
    return cluster.kubectl(
        "apply",
        "--server-side",
        "--field-manager=e2e",
        *extra,
        "-f",
        "-",
        kubeconfig=kubeconfig,
        stdin=yaml.safe_dump_all(objects, sort_keys=False),
    )


def install_chart(cluster: LocalCluster) -> list[dict[str, Any]]:
    """The chart installed: CRDs first (and Established), the namespace, then every template."""
    crds, objects = render_chart()
    apply(cluster, crds)
    cluster.wait_established([c["metadata"]["name"] for c in crds])
    cluster.kubectl("create", "namespace", CHART_NAMESPACE)
    apply(cluster, objects)
    return objects


def get(cluster: LocalCluster, *args: str) -> dict[str, Any]:
    return json.loads(cluster.kubectl("get", *args, "-o", "json"))  # type: ignore[no-any-return]


def maybe_get(cluster: LocalCluster, *args: str) -> dict[str, Any] | None:
    try:
        return get(cluster, *args)
    except Exception as error:
        if "NotFound" in str(error) or "not found" in str(error):
            return None
        raise


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    return next((c for c in ((obj or {}).get("status") or {}).get("conditions", []) if c["type"] == kind), {})


def kubeconfig_via(kubeconfig: Path, server: str, path: Path) -> Path:
    """A copy of `kubeconfig` (same credentials, same CA) whose cluster is reached at `server` instead."""
    config = yaml.safe_load(kubeconfig.read_text())
    for entry in config["clusters"]:
        entry["cluster"]["server"] = server
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path


def service_account_kubeconfig(cluster: LocalCluster, namespace: str, name: str, path: Path) -> Path:
    """A kubeconfig holding a token the API server issued for ServiceAccount namespace/name."""
    token = cluster.kubectl("create", "token", name, "-n", namespace, "--duration=2h").strip()
    return cluster.write_kubeconfig(path, token)


@dataclass
class OperatorProcess:
    proc: subprocess.Popen[bytes]
    health_url: str
    log: Path


#: `start_operator(log_name, kubeconfig=None)` (the e2e fixture): the chart's operator for a `with` block.
StartOperator = Callable[..., contextlib.AbstractContextManager["OperatorProcess"]]


@contextlib.contextmanager
def operator(
    chart_objects: list[dict[str, Any]], kubeconfig: Path, proxy: ServiceProxy, log: Path
) -> Iterator[OperatorProcess]:
    """The chart's operator (refreshing status every second, text logs) until its liveness endpoint answers."""
    deployment = next(o for o in chart_objects if o["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["args"] = [*container["args"], "--refresh-interval=1", "--log-format=text"]
    with run_operator(deployment, kubeconfig, log, env=proxy.env()) as op:
        wait_for(lambda: alive(op), "the operator's liveness endpoint", timeout_s=60)
        yield op


def alive(op: OperatorProcess) -> bool:
    assert op.proc.poll() is None, f"the operator exited ({op.proc.returncode}); see {op.log}"
    try:
        with _DIRECT.open(op.health_url, timeout=5) as answer:
            return isinstance(json.loads(answer.read()), dict)
    except OSError:
        return False


@contextlib.contextmanager
def run_operator(
    deployment: dict[str, Any], kubeconfig: Path, log: Path, env: dict[str, str] | None = None
) -> Iterator[OperatorProcess]:
    """The operator as the chart's Deployment runs it (its command, args and env), as a local process:
    the liveness endpoint moved to a free loopback port, the cluster found through `kubeconfig`."""
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    port = free_port()
    args = [
        a.replace("0.0.0.0:8080", f"127.0.0.1:{port}") if a.startswith("--liveness") else a
        for a in container.get("args", [])
    ]
    argv = [str(BIN / container["command"][0]), *container["command"][1:], *args]
    child_env = {
        **os.environ,
        **{e["name"]: e["value"] for e in container.get("env", []) if "value" in e},
        "KUBECONFIG": str(kubeconfig),
        **(env or {}),
    }
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=child_env)
    try:
        yield OperatorProcess(proc, f"http://127.0.0.1:{port}/healthz", log)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class ServiceProxy:
    """What cluster DNS and kube-proxy do for the operator's reads of in-cluster URLs, on loopback: an HTTP
    forward proxy (the operator gets `http_proxy` pointing here) that sends requests for a Service's host
    name to the local process standing in for its pods. Only GET, which is all the operator sends there."""

    def __init__(self) -> None:
        self.routes: dict[str, int] = {}
        routes = self.routes

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                target = urllib.parse.urlsplit(self.path)
                port = routes.get(target.hostname or "")
                if port is None:
                    self.send_error(502, f"no route to {target.hostname}")
                    return
                local = f"http://127.0.0.1:{port}{target.path}" + (f"?{target.query}" if target.query else "")
                try:
                    with _DIRECT.open(local, timeout=10) as answer:
                        status, body = answer.status, answer.read()
                except urllib.error.HTTPError as error:
                    status, body = error.code, error.read()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                return None

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> ServiceProxy:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def env(self) -> dict[str, str]:
        """For the operator: in-cluster http:// URLs through here, the API server (https, loopback) direct."""
        return {
            "http_proxy": self.url,
            "HTTP_PROXY": self.url,
            "no_proxy": "127.0.0.1,localhost",
            "NO_PROXY": "127.0.0.1,localhost",
        }


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def create_claim(cluster: LocalCluster, name: str, namespace: str) -> None:
    """PersistentVolumeClaim `name`, bound to a PersistentVolume made for it (the controller manager binds
    them), so that pods mounting it can be scheduled. Nothing is ever mounted: kwok runs no containers."""
    cluster.kubectl(
        "apply",
        "-f",
        "-",
        stdin=yaml.safe_dump_all(
            [
                {
                    "apiVersion": "v1",
                    "kind": "PersistentVolume",
                    "metadata": {"name": f"{namespace}-{name}"},
                    "spec": {
                        "capacity": {"storage": "10Gi"},
                        "accessModes": ["ReadOnlyMany", "ReadWriteOnce"],
                        "storageClassName": "",
                        "hostPath": {"path": f"/srv/{namespace}/{name}"},
                        "claimRef": {"namespace": namespace, "name": name},
                    },
                },
                {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "metadata": {"name": name, "namespace": namespace},
                    "spec": {
                        "accessModes": ["ReadOnlyMany"],
                        "storageClassName": "",
                        "volumeName": f"{namespace}-{name}",
                        "resources": {"requests": {"storage": "1Gi"}},
                    },
                },
            ]
        ),
    )
    wait_for(
        lambda: get(cluster, "pvc", name, "-n", namespace)["status"].get("phase") == "Bound",
        f"PersistentVolumeClaim {namespace}/{name} Bound",
        timeout_s=60,
    )


# -- BatchedModels and their InferenceServices in the tests' namespace --------------------------------------------

NAMESPACE = "default"


def batched_model_manifest(name: str, max_batch_size: int = 8) -> str:
    """A one-model BatchedModel (its model on claim model-store), as JSON for `kubectl apply -f -`."""
    return json.dumps(
        {
            "apiVersion": "batchpilot.io/v1alpha1",
            "kind": "BatchedModel",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {
                "resources": {"cpu": "1", "memory": "1Gi"},
                "models": [
                    {
                        "name": "cnn",
                        "type": "cv",
                        "storageUri": f"pvc://model-store/{name}",
                        "inputs": [{"name": "x", "datatype": "FP32", "shape": [4]}],
                        "outputs": [{"name": "y", "datatype": "FP32", "shape": [2]}],
                        "batching": {"maxBatchSize": max_batch_size},
                    }
                ],
            },
        }
    )


def isvcs(cluster: LocalCluster, name: str) -> list[dict[str, Any]]:
    """The InferenceServices named `name` (none or one: the API server keeps names unique)."""
    return [i for i in get(cluster, "isvc", "-n", NAMESPACE)["items"] if i["metadata"]["name"] == name]


def isvc_max_batch(isvc: dict[str, Any]) -> int:
    """The maxBatchSize the InferenceService hands its runtime (BATCHPILOT_MODEL_SPECS)."""
    env = {e["name"]: e["value"] for e in isvc["spec"]["predictor"]["model"]["env"]}
    return int(json.loads(env["BATCHPILOT_MODEL_SPECS"])[0]["batching"]["maxBatchSize"])


def reconciled(cluster: LocalCluster, name: str, generation: int) -> dict[str, Any] | None:
    """The BatchedModel once its status says Reconciled=True for `generation`, else None."""
    bm = maybe_get(cluster, "bm", name, "-n", NAMESPACE)
    done = condition(bm, "Reconciled")
    return bm if done.get("status") == "True" and done.get("observedGeneration") == generation else None


def event_reasons(cluster: LocalCluster, name: str) -> list[str]:
    """The reasons of the events posted about BatchedModel `name`, oldest first."""
    events = get(cluster, "events", "-n", NAMESPACE, "--field-selector", f"involvedObject.name={name}")["items"]
    return [e["reason"] for e in events if e["involvedObject"]["kind"] == "BatchedModel"]


def wait_isvc_ready(cluster: LocalCluster, name: str, namespace: str, timeout_s: float = 120) -> dict[str, Any]:
    """The InferenceService once KServe reports it Ready."""

    def ready() -> dict[str, Any] | None:
        isvc = get(cluster, "isvc", name, "-n", namespace)
        return isvc if condition(isvc, "Ready").get("status") == "True" else None

    return wait_for(ready, f"KServe to report InferenceService {namespace}/{name} Ready", timeout_s=timeout_s)
