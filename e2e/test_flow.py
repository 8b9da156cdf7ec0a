"""The whole flow with real parts, on loopback: chart -> operator -> InferenceService -> runtime -> status.

- The Helm chart, rendered by the real Helm engine, gives the BatchedModel CRD and the ClusterServingRuntime;
  both are "installed" into kmock's Kubernetes API emulator, which serves BatchedModels and KServe's
  InferenceServices (declared from the two CRDs).
- The real operator runs in a child process as the chart's Deployment runs it (`batchpilot operator
  --all-namespaces --standalone --liveness=...`, on loopback), finding the emulator through KUBECONFIG;
  its liveness probe must pass before anything else happens.
- A BatchedModel for the two demo models is created with the kubernetes client, as kubectl would.
- KServe is played by the test: it runs the container of the ClusterServingRuntime the InferenceService
  names (the chart's command and arguments, the InferenceService's environment, so the operator's
  BATCHPILOT_MODEL_SPECS configures the runtime), on a model repository from `batchpilot demo-models`
  laid out as the InferenceService's storageUris say, waits for the chart's readiness probe, then marks
  the InferenceService Ready with its URL.
- Traffic from tritonclient; the operator must then report Ready, the URL and what the live runtime
  says about each model's batching. Deleting the BatchedModel must leave nothing behind.

Logs of the operator and the runtime are left in the test's tmp_path. `pytest -s` shows the BatchedModel.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python
import kubernetes
import numpy as np
import pytest
import tritonclient.http as triton
import yaml
from chartkit import CHART_DIR, KSERVE_CRDS, only, render
from kmockkit import crd_resource, threaded_apiserver, wait_for, watched_resources, write_kubeconfig
from kubernetes.client import ApiClient, CoreV1Api, CustomObjectsApi
from kubernetes.client.rest import ApiException

from batchpilot.runtime.demo_models import IMAGE_SIZE, NUM_CLASSES, TEXT_CLASSES, VOCAB_SIZE
from batchpilot.testing.processes import child_process, free_port, get_json

pytestmark = pytest.mark.timeout(120)

BM = ("batchpilot.io", "v1alpha1", "batchedmodels")
ISVC = ("serving.kserve.io", "v1beta1", "inferenceservices")
RUNTIMES = ("serving.kserve.io", "v1alpha1", "clusterservingruntimes")
NAME, NAMESPACE = "demo", "default"
MODEL_ROOT = "/mnt/models"  # where KServe's storage initializer puts the storageUris; the chart serves it
BIN = Path(sys.executable).parent  # the console scripts installed with this Python (batchpilot)

# As a user would write it: examples/both.yaml, for the two demo models (`batchpilot demo-models`).
MANIFEST = f"""
apiVersion: batchpilot.io/v1alpha1
kind: BatchedModel
metadata:
  name: {NAME}
  namespace: {NAMESPACE}
spec:
  resources: {{cpu: "2", memory: 4Gi}}
  replicas: {{min: 1, max: 1}}
  models:
    - name: resnet-mini
      type: cv
      storageUri: pvc://model-store/resnet-mini
      inputs: [{{name: image, datatype: FP32, shape: [3, {IMAGE_SIZE}, {IMAGE_SIZE}]}}]
      outputs: [{{name: logits, datatype: FP32, shape: [{NUM_CLASSES}]}}]
      batching: {{maxBatchSize: 8, maxQueueDelayMicroseconds: 3000}}   # fixed (the folder's config says 16)
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


def _get(api: CustomObjectsApi, kind: tuple[str, str, str], name: str) -> dict[str, Any] | None:
    """`kubectl get` of one object; None when it does not exist."""
    try:
        return api.get_namespaced_custom_object(*kind[:2], NAMESPACE, kind[2], name)  # type: ignore[no-any-return]
    except ApiException as error:
        if error.status == 404:
            return None
        raise


def _condition(obj: dict[str, Any] | None, type_: str) -> str | None:
    return next((c["status"] for c in (obj or {}).get("status", {}).get("conditions", []) if c["type"] == type_), None)


@dataclass(frozen=True)
class Chart:
    """What the real Helm engine makes of charts/batchpilot with default values."""

    crd: dict[str, Any]  # from the chart's crds/
    serving_runtime: dict[str, Any]  # the ClusterServingRuntime
    operator: dict[str, Any]  # the operator's Deployment


@pytest.fixture(scope="module")
def chart() -> Chart:
    loaded = helm_python.Chart.load(str(CHART_DIR))
    crds = [yaml.safe_load(c["data"]) for c in loaded.crds]
    assert [c["spec"]["names"]["kind"] for c in crds] == ["BatchedModel"]
    manifests = render(loaded, {})
    return Chart(crds[0], only(manifests, "ClusterServingRuntime"), only(manifests, "Deployment"))


def _kserve_crd(name: str) -> dict[str, Any]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # these files are large
    return yaml.load((KSERVE_CRDS / f"serving.kserve.io_{name}.yaml").read_text(), Loader=loader)  # type: ignore[no-any-return]


@contextlib.contextmanager
def _operator(deployment: dict[str, Any], kubeconfig: Path, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The operator as the chart's Deployment runs it (`batchpilot operator --all-namespaces --standalone
    --liveness=...`), on loopback and refreshing every second, until its liveness probe passes."""
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    port = next(
        p["containerPort"] for p in container["ports"] if p["name"] == container["livenessProbe"]["httpGet"]["port"]
    )
    liveness = f"http://127.0.0.1:{free_port()}{container['livenessProbe']['httpGet']['path']}"
    args = [a.replace(f"http://0.0.0.0:{port}", liveness.rsplit("/", 1)[0]) for a in container["args"]]
    assert f"--liveness={liveness}" in args, args
    command = [str(BIN / container["command"][0]), *args, "--refresh-interval", "1"]
    with child_process(command, liveness, env={"KUBECONFIG": str(kubeconfig)}, log_path=log) as proc:
        assert isinstance(get_json(liveness), dict)  # kopf's probe results
        yield proc


@contextlib.contextmanager
def _predictor(api: CustomObjectsApi, isvc: dict[str, Any], repository: Path, log: Path) -> Iterator[str]:
    """What KServe does for the InferenceService: run its ServingRuntime's container on the downloaded
    models, with the InferenceService's environment, until the runtime's readiness probe passes. Yields its URL."""
    model = isvc["spec"]["predictor"]["model"]
    runtime = api.get_cluster_custom_object(*RUNTIMES[:2], RUNTIMES[2], model["runtime"])
    assert model["modelFormat"]["name"] in {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
    # The storage initializer puts each storageUri at its mountPath; the demo repository has that layout.
    mounts = {s["mountPath"] for s in isvc["spec"]["predictor"]["storageUris"]}
    assert mounts == {f"{MODEL_ROOT}/{p.name}" for p in repository.iterdir()}, mounts

    container = runtime["spec"]["containers"][0]
    http, grpc = free_port(), free_port()
    local = {"--model-repository": str(repository), "--http-port": str(http), "--grpc-port": str(grpc)}
    args = container["args"]
    assert set(local) <= set(args), args
    command = [
        str(BIN / container["command"][0]),
        *(local.get(flag, arg) for flag, arg in zip(["", *args], args, strict=False)),
        "--host",
        "127.0.0.1",
    ]
    env = {e["name"]: e["value"] for e in container.get("env", []) + model.get("env", [])}
    ready = f"http://127.0.0.1:{http}{container['readinessProbe']['httpGet']['path']}"
    with child_process(command, ready, env=env, log_path=log):
        yield f"http://127.0.0.1:{http}"


def _drive(url: str, model: str, requests: int, seed: int) -> int:
    """`requests` single-item inferences from one client; returns how many answered as they should."""
    client = triton.InferenceServerClient(url.removeprefix("http://"))
    rng = np.random.default_rng(seed)
    ok = 0
    for _ in range(requests):
        if model == "resnet-mini":
            array = rng.standard_normal((1, 3, IMAGE_SIZE, IMAGE_SIZE), dtype=np.float32)
            tensor, classes = triton.InferInput("image", list(array.shape), "FP32"), NUM_CLASSES
        else:
            array = rng.integers(1, VOCAB_SIZE, size=(1, int(rng.integers(8, 65))), dtype=np.int64)
            tensor, classes = triton.InferInput("input_ids", list(array.shape), "INT64"), TEXT_CLASSES
        tensor.set_data_from_numpy(array)
        result = client.infer(model, [tensor], outputs=[triton.InferRequestedOutput("logits")])
        ok += result.as_numpy("logits").shape == (1, classes)
    client.close()
    return ok


def _matches_runtime(bm: dict[str, Any] | None, url: str) -> dict[str, Any] | None:
    """The BatchedModel once its status.models says what the runtime's GET /v2/models/{m}/batching says now."""
    entries = {m["name"]: m for m in (bm or {}).get("status", {}).get("models", [])}
    for name in ("resnet-mini", "textcls"):
        live, entry = get_json(f"{url}/v2/models/{name}/batching"), entries.get(name, {})
        if (entry.get("maxBatchSize"), entry.get("recentP99Ms")) != (live["max_batch_size"], live["recent"]["p99_ms"]):
            return None
    return bm


def _kubectl_yaml(bm: dict[str, Any]) -> str:
    meta = {
        k: bm["metadata"][k] for k in ("name", "namespace", "uid", "generation", "finalizers") if k in bm["metadata"]
    }
    return yaml.safe_dump(
        {
            "apiVersion": bm["apiVersion"],
            "kind": bm["kind"],
            "metadata": meta,
            "spec": bm["spec"],
            "status": bm["status"],
        },
        sort_keys=False,
    )


@pytest.fixture()
def demo_models(tmp_path: Path) -> Iterator[Callable[[], Path]]:
    """`batchpilot demo-models DIR` started at once, in the background; call the value to wait for DIR."""
    folder = tmp_path / "models"
    build = subprocess.Popen([str(BIN / "batchpilot"), "demo-models", str(folder)], stdout=subprocess.DEVNULL)

    def built() -> Path:
        assert build.wait(timeout=60) == 0, "batchpilot demo-models failed"
        return folder

    try:
        yield built
    finally:
        build.kill()
        build.wait()


def test_flow(chart: Chart, demo_models: Callable[[], Path], tmp_path: Path) -> None:
    resources = {
        **crd_resource(chart.crd),
        **crd_resource(_kserve_crd("inferenceservices")),
        **crd_resource(_kserve_crd("clusterservingruntimes")),
    }

    with threaded_apiserver(resources) as (server, url):
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", url)
        client: ApiClient = kubernetes.config.new_client_from_config(config_file=str(kubeconfig))
        api = CustomObjectsApi(client)
        # `helm install`: the CRD, and the ClusterServingRuntime KServe will look up by name.
        kubernetes.client.ApiextensionsV1Api(client).create_custom_resource_definition(chart.crd)
        api.create_cluster_custom_object(*RUNTIMES[:2], RUNTIMES[2], chart.serving_runtime)

        with _operator(chart.operator, kubeconfig, tmp_path / "operator.log") as operator:
            # kmock can lose events between a watch's listing and its subscription: create after both began.
            wait_for(
                lambda: {r.plural for r in watched_resources(server)} >= {BM[2], ISVC[2]}, "the operator's watches"
            )
            api.create_namespaced_custom_object(*BM[:2], NAMESPACE, BM[2], yaml.safe_load(MANIFEST))

            isvc = wait_for(lambda: _get(api, ISVC, NAME), "the InferenceService")
            owner = _get(api, BM, NAME)
            assert owner is not None and isvc["metadata"]["ownerReferences"][0]["uid"] == owner["metadata"]["uid"]

            with _predictor(api, isvc, demo_models(), tmp_path / "runtime.log") as runtime_url:
                # The runtime runs the operator's specs, not the folder's config.yaml (maxBatchSize 16).
                assert get_json(f"{runtime_url}/v2/models/resnet-mini/batching")["max_batch_size"] == 8
                # KServe's controller reports the InferenceService Ready, with its URL.
                api.patch_namespaced_custom_object_status(
                    *ISVC[:2],
                    NAMESPACE,
                    ISVC[2],
                    NAME,
                    {"status": {"url": runtime_url, "conditions": [{"type": "Ready", "status": "True"}]}},
                )

                with ThreadPoolExecutor(8) as pool:
                    answered = list(
                        pool.map(lambda i: _drive(runtime_url, ("resnet-mini", "textcls")[i % 2], 30, i), range(8))
                    )
                assert answered == [30] * 8

                bm = wait_for(
                    lambda: _matches_runtime(_get(api, BM, NAME), runtime_url),
                    "status.models to show what the runtime reports",
                )
                assert _condition(bm, "Ready") == "True" and _condition(bm, "Degraded") == "False"
                assert bm["status"]["url"] == runtime_url and bm["status"]["modelNames"] == "resnet-mini,textcls"
                cnn, text = bm["status"]["models"]
                assert (cnn["maxBatchSize"], cnn["maxQueueDelayMicroseconds"], cnn["autotune"]) == (8, 3000, False)
                assert (text["autotune"], text["latencySloP99Ms"]) == (True, 80.0)
                assert 1 <= text["maxBatchSize"] <= 32
                assert all(m["recentP99Ms"] > 0 and m["recentThroughputRps"] > 0 for m in (cnn, text))

                api.delete_namespaced_custom_object(*BM[:2], NAMESPACE, BM[2], NAME)
                wait_for(
                    lambda: (
                        not api.list_cluster_custom_object(*BM[:2], BM[2])["items"]
                        and not api.list_cluster_custom_object(*ISVC[:2], ISVC[2])["items"]
                    ),
                    "the BatchedModel and its InferenceService gone",
                )
            events = CoreV1Api(client)
            wait_for(
                lambda: (
                    {"Created", "Ready", "Deleted"} <= {e.reason for e in events.list_namespaced_event(NAMESPACE).items}
                ),
                "the operator's events: Created, Ready, Deleted",
            )
        client.close()
    assert operator.returncode == 0, f"the operator did not stop cleanly on SIGTERM ({operator.returncode})"
    # Structured logs: every line the operator wrote is a JSON object.
    lines = (tmp_path / "operator.log").read_text().splitlines()
    assert lines and all(isinstance(json.loads(line), dict) for line in lines)

    print(
        "\n$ kubectl get batchedmodel demo -o yaml   # before the delete; kopf's annotations left out\n"
        + _kubectl_yaml(bm)
    )
