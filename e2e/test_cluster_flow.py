"""The whole flow on a real control plane, KServe's controller included.

chart (helm template | kubectl apply) -> operator (the chart Deployment's command, the chart
ServiceAccount's token: RBAC enforced) -> BatchedModel (kubectl apply) -> InferenceService (through KServe's
webhooks) -> KServe's Deployment -> pods Running on kwok's node -> InferenceService Ready -> BatchedModel
Ready. The runtime is then started locally from the generated `kserve-container` (its command, args and
env) on the models laid out where its volume mounts say, tritonclient calls it over HTTP and gRPC, and the
operator copies the runtime's batching parameters into the BatchedModel's status, reading the in-cluster
URL KServe reported (through a loopback stand-in for cluster DNS and kube-proxy).
Then: a spec change bumps the generation and patches the child; deleting the BatchedModel removes the
InferenceService and everything KServe made for it.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton_http
import yaml
from clusterkit import BIN, ServiceProxy, StartOperator, alive, condition, create_claim, get, maybe_get, wait_isvc_ready
from kmockkit import wait_for

from batchpilot.devcluster import LocalCluster
from batchpilot.devcluster.cluster import FAKE_NODE
from batchpilot.devcluster.process import ClusterError, free_port
from batchpilot.runtime.demo_models import IMAGE_SIZE, NUM_CLASSES, TEXT_CLASSES, VOCAB_SIZE
from batchpilot.testing.processes import child_process, get_json

pytestmark = pytest.mark.timeout(420)

NAME, NAMESPACE = "demo", "default"
MANIFEST = f"""
apiVersion: batchpilot.io/v1alpha1
kind: BatchedModel
metadata: {{name: {NAME}, namespace: {NAMESPACE}}}
spec:
  resources: {{cpu: "2", memory: 4Gi}}
  replicas: {{min: 1, max: 1}}
  models:
    - name: resnet-mini
      type: cv
      storageUri: pvc://model-store/resnet-mini
      inputs: [{{name: image, datatype: FP32, shape: [3, {IMAGE_SIZE}, {IMAGE_SIZE}]}}]
      outputs: [{{name: logits, datatype: FP32, shape: [{NUM_CLASSES}]}}]
      batching: {{maxBatchSize: 8, maxQueueDelayMicroseconds: 3000}}
    - name: textcls
      type: nlp
      storageUri: pvc://model-store/textcls
      inputs: [{{name: input_ids, datatype: INT64, shape: [-1]}}]
      outputs:
        - {{name: logits, datatype: FP32, shape: [{TEXT_CLASSES}]}}
        - {{name: token_scores, datatype: FP32, shape: [-1]}}
      sequence: {{maxLength: 256}}
      autotune: {{enabled: true, latencySloP99Ms: 80, bounds: {{maxBatchSize: 32}}}}
"""


def test_operator_token_is_not_cluster_admin(cluster: LocalCluster, operator_kubeconfig: Path) -> None:
    """RBAC is enforced: the chart's ServiceAccount may do what OPERATOR_RULES grant, and nothing else."""

    def can(*what: str) -> bool:
        try:
            return cluster.kubectl("auth", "can-i", *what, kubeconfig=operator_kubeconfig).strip() == "yes"
        except ClusterError as refused:  # kubectl says "no" and exits 1
            assert str(refused).endswith("no"), refused
            return False

    assert can("patch", "batchedmodels.batchpilot.io/status", "-n", NAMESPACE)
    assert can("create", "inferenceservices.serving.kserve.io", "-n", NAMESPACE)
    assert can("create", "events", "-n", NAMESPACE)
    assert not can("list", "secrets", "-n", NAMESPACE)
    assert not can("create", "deployments.apps", "-n", NAMESPACE)
    assert not can("delete", "nodes")


def _model_store(root: Path) -> Path:
    """The PVC `model-store` as a local folder: `batchpilot demo-models` writes resnet-mini/ and textcls/."""
    store = root / "model-store"
    subprocess.run([str(BIN / "batchpilot"), "demo-models", str(store)], check=True, stdout=subprocess.DEVNULL)
    return store


def _lay_out(predictor_pod: dict[str, Any], store: Path, root: Path) -> dict[str, str]:
    """Put each model where the generated pod spec mounts it: KServe mounts `pvc://model-store/<sub>` at the
    container path (subPath <sub>); here that is a copy of store/<sub>. Returns container path -> local path."""
    spec = predictor_pod["spec"]
    claims = {
        v["name"]: v["persistentVolumeClaim"]["claimName"]
        for v in spec.get("volumes", [])
        if "persistentVolumeClaim" in v
    }
    container = next(c for c in spec["containers"] if c["name"] == "kserve-container")
    layout = {}
    for mount in container.get("volumeMounts", []):
        if mount["name"] not in claims:
            continue
        assert claims[mount["name"]] == "model-store", claims
        local = root / mount["mountPath"].lstrip("/")
        shutil.copytree(store / mount.get("subPath", ""), local, dirs_exist_ok=True)
        layout[mount["mountPath"]] = str(local)
    return layout


@contextlib.contextmanager
def _runtime_from(container: dict[str, Any], layout: dict[str, str], log: Path) -> Iterator[tuple[int, int]]:
    """The generated kserve-container as a local process: its command, args and env; ports on loopback; the
    model repository argument pointing at the local copy of what its volume mounts hold."""
    args: list[str] = list(container.get("args", []))
    repo_flag = args.index("--model-repository")
    repository = args[repo_flag + 1]
    mounted = {path for path in layout if path.startswith(repository.rstrip("/") + "/")}
    assert mounted, f"nothing is mounted under the runtime's --model-repository {repository}: {layout}"
    local_repo = Path(next(iter(layout.values()))).parent
    http, grpc = free_port(), free_port()
    local = {"--model-repository": str(local_repo), "--http-port": str(http), "--grpc-port": str(grpc)}
    argv = [
        str(BIN / container["command"][0]),
        *container["command"][1:],
        *(local.get(flag, arg) for flag, arg in zip(["", *args], args, strict=False)),
        "--host",
        "127.0.0.1",
    ]
    env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    probe = container["readinessProbe"]["httpGet"]["path"]
    with child_process(argv, f"http://127.0.0.1:{http}{probe}", env=env, log_path=log):
        yield http, grpc


def _infer_http(port: int, model: str, seed: int) -> tuple[int, ...]:
    client = triton_http.InferenceServerClient(f"127.0.0.1:{port}")
    rng = np.random.default_rng(seed)
    if model == "resnet-mini":
        array = rng.standard_normal((2, 3, IMAGE_SIZE, IMAGE_SIZE), dtype=np.float32)
        tensor = triton_http.InferInput("image", list(array.shape), "FP32")
    else:
        array = rng.integers(1, VOCAB_SIZE, size=(2, 12), dtype=np.int64)
        tensor = triton_http.InferInput("input_ids", list(array.shape), "INT64")
    tensor.set_data_from_numpy(array)
    shape = tuple(client.infer(model, [tensor]).as_numpy("logits").shape)
    client.close()
    return shape


# tritonclient.grpc runs in a child process: its protos and KServe's clash in one process.
_GRPC_CLIENT = """
import sys, numpy as np, tritonclient.grpc as g
c = g.InferenceServerClient(sys.argv[1])
x = np.random.default_rng(0).integers(1, int(sys.argv[2]), size=(1, 9), dtype=np.int64)
t = g.InferInput("input_ids", list(x.shape), "INT64"); t.set_data_from_numpy(x)
print(c.infer("textcls", [t]).as_numpy("logits").shape)
"""


def test_flow(
    cluster: LocalCluster, start_operator: StartOperator, service_proxy: ServiceProxy, tmp_path: Path
) -> None:
    if maybe_get(cluster, "pvc", "model-store", "-n", NAMESPACE) is None:
        create_claim(cluster, "model-store", NAMESPACE)  # the PVC the manifest's pvc:// URIs name
    with start_operator("operator.log") as op:
        cluster.kubectl("apply", "-f", "-", stdin=MANIFEST)

        # The operator's InferenceService, accepted by KServe's webhooks and owned by the BatchedModel.
        isvc = wait_for(lambda: maybe_get(cluster, "inferenceservice", NAME, "-n", NAMESPACE), "the InferenceService")
        bm = get(cluster, "batchedmodel", NAME, "-n", NAMESPACE)
        assert isvc["metadata"]["ownerReferences"][0]["uid"] == bm["metadata"]["uid"]

        # KServe's controller: a Deployment (Standard mode) whose pods kwok runs; the InferenceService Ready.
        deployment = wait_for(
            lambda: maybe_get(cluster, "deployment", f"{NAME}-predictor", "-n", NAMESPACE),
            "KServe's predictor Deployment",
            timeout_s=90,
        )
        assert deployment["metadata"]["ownerReferences"][0]["kind"] == "InferenceService"
        pod = wait_for(lambda: _ready_pod(cluster, NAME), "a Ready predictor pod on kwok's node", timeout_s=120)
        assert pod["spec"]["nodeName"] == FAKE_NODE
        isvc = wait_isvc_ready(cluster, NAME, NAMESPACE)
        internal = (isvc["status"].get("address") or {}).get("url") or isvc["status"]["url"]

        container = next(c for c in pod["spec"]["containers"] if c["name"] == "kserve-container")
        store = _model_store(tmp_path)
        layout = _lay_out(pod, store, tmp_path / "pod")
        with _runtime_from(container, layout, tmp_path / "runtime.log") as (http, grpc):
            service_proxy.routes[urllib.parse.urlsplit(internal).hostname or ""] = http
            # The runtime serves the operator's specs (maxBatchSize 8), not the folders' config.yaml (16).
            assert get_json(f"http://127.0.0.1:{http}/v2/models/resnet-mini/batching")["max_batch_size"] == 8
            assert [_infer_http(http, m, i) for i, m in enumerate(["resnet-mini", "textcls"] * 4)] == [
                (2, NUM_CLASSES),
                (2, TEXT_CLASSES),
            ] * 4
            grpc_out = subprocess.run(
                [str(BIN / "python"), "-c", _GRPC_CLIENT, f"127.0.0.1:{grpc}", str(VOCAB_SIZE)],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert grpc_out.stdout.strip() == f"(1, {TEXT_CLASSES})", grpc_out.stderr

            # Steady traffic meanwhile, as a served model has: the runtime's recent p99 covers a sliding window.
            with _steady_traffic(http):
                bm = wait_for(
                    lambda: _status_models_match(cluster, http), "status.models to match the runtime", timeout_s=120
                )
            assert condition(bm, "Ready")["status"] == "True" and condition(bm, "Degraded")["status"] == "False"
            assert bm["status"]["url"] == isvc["status"]["url"]
            table = cluster.kubectl("get", "bm", NAME, "-n", NAMESPACE, "-o", "wide")
            header, row = table.splitlines()[:2]
            assert header.split()[:4] == ["NAME", "READY", "MODELS", "URL"], header
            assert row.split()[:4] == [NAME, "True", "resnet-mini,textcls", isvc["status"]["url"]], row

        events = get(cluster, "events", "-n", NAMESPACE, "--field-selector", f"involvedObject.name={NAME}")["items"]
        reasons = {e["reason"] for e in events if e["involvedObject"]["kind"] == "BatchedModel"}
        assert {"Created", "Ready"} <= reasons, reasons

        # A spec change: generation 2, the child patched (new specs in its env), KServe rolls the Deployment.
        cluster.kubectl(
            "patch",
            "bm",
            NAME,
            "-n",
            NAMESPACE,
            "--type=json",
            "-p",
            json.dumps([{"op": "replace", "path": "/spec/models/0/batching/maxBatchSize", "value": 4}]),
        )
        bm = wait_for(
            lambda: (
                (b := get(cluster, "bm", NAME, "-n", NAMESPACE)) and b["status"].get("observedGeneration") == 2 and b
            ),
            "observedGeneration 2",
        )
        assert bm["metadata"]["generation"] == 2

        def specs_env(obj: dict[str, Any], path: list[str]) -> list[dict[str, Any]]:
            for key in path:
                obj = obj[key]
            env = {e["name"]: e.get("value") for e in obj.get("env", [])}
            return json.loads(env.get("BATCHPILOT_MODEL_SPECS") or "[]")  # type: ignore[no-any-return]

        wait_for(
            lambda: (
                specs_env(get(cluster, "isvc", NAME, "-n", NAMESPACE), ["spec", "predictor", "model"])[0]["batching"][
                    "maxBatchSize"
                ]
                == 4
            ),
            "the InferenceService patched",
        )
        wait_for(
            lambda: (
                next(
                    (
                        json.loads(e["value"])[0]["batching"]["maxBatchSize"]
                        for c in get(cluster, "deployment", f"{NAME}-predictor", "-n", NAMESPACE)["spec"]["template"][
                            "spec"
                        ]["containers"]
                        if c["name"] == "kserve-container"
                        for e in c.get("env", [])
                        if e["name"] == "BATCHPILOT_MODEL_SPECS"
                    ),
                    None,
                )
                == 4
            ),
            "KServe to roll the new specs into its Deployment",
            timeout_s=90,
        )
        assert len(get(cluster, "isvc", "-n", NAMESPACE)["items"]) == 1

        cluster.kubectl("delete", "bm", NAME, "-n", NAMESPACE, "--wait=true", "--timeout=90s")
        wait_for(lambda: maybe_get(cluster, "isvc", NAME, "-n", NAMESPACE) is None, "the InferenceService gone")
        wait_for(
            lambda: maybe_get(cluster, "deployment", f"{NAME}-predictor", "-n", NAMESPACE) is None,
            "KServe's Deployment garbage-collected",
            timeout_s=90,
        )
        assert alive(op)


@contextlib.contextmanager
def _steady_traffic(http: int) -> Iterator[None]:
    """One request every ~50 ms to each model, from a thread, until the block ends."""
    stop = threading.Event()

    def drive() -> None:
        i = 0
        while not stop.wait(0.05):
            _infer_http(http, ("resnet-mini", "textcls")[i % 2], i)
            i += 1

    worker = threading.Thread(target=drive, daemon=True)
    worker.start()
    try:
        yield
    finally:
        stop.set()
        worker.join(timeout=10)


def _ready_pod(cluster: LocalCluster, isvc: str) -> dict[str, Any] | None:
    pods = get(cluster, "pods", "-n", NAMESPACE, "-l", f"serving.kserve.io/inferenceservice={isvc}")["items"]
    ready = [
        p for p in pods if condition(p, "Ready").get("status") == "True" and not p["metadata"].get("deletionTimestamp")
    ]
    return ready[0] if ready else None


def _status_models_match(cluster: LocalCluster, http: int) -> dict[str, Any] | None:
    bm = get(cluster, "bm", NAME, "-n", NAMESPACE)
    entries = {m["name"]: m for m in bm.get("status", {}).get("models", [])}
    for name in ("resnet-mini", "textcls"):
        live = get_json(f"http://127.0.0.1:{http}/v2/models/{name}/batching")
        if entries.get(name, {}).get("maxBatchSize") != live["max_batch_size"]:
            return None
    return bm if all(m.get("recentP99Ms", 0) > 0 for m in entries.values()) else None


def test_kubectl_yaml_is_readable(cluster: LocalCluster) -> None:
    """`kubectl get crd` round-trips the CRD (what `kubectl explain` and editors use)."""
    explained = cluster.kubectl("explain", "batchedmodel.spec.models.batching")
    assert "maxBatchSize" in explained and "maxQueueDelayMicroseconds" in explained
    yaml.safe_load(cluster.kubectl("get", "crd", "batchedmodels.batchpilot.io", "-o", "yaml"))
