"""KServe's own controller manager beside the local control plane, as a cluster would run it.

From the KServe source pinned by tools/controlplane/kserve (in the Go module cache, linked at
`.tools/kserve`): its CRDs, its `inferenceservice-config` ConfigMap (deployment mode switched to Standard,
i.e. raw Deployments), and its webhook configurations, pointed at https://127.0.0.1:PORT with the local
CA instead of an in-cluster Service. The manager itself (`.tools/bin/kserve-manager`) runs outside the
cluster from the kubeconfig, its webhook server on a certificate that CA signed.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from batchpilot.devcluster.cluster import LocalCluster
from batchpilot.devcluster.process import ClusterError, Component, free_port, wait_until

NAMESPACE = "kserve"
CONFIG_MAP = "inferenceservice-config"


def kserve_source(bin_dir: Path) -> Path:
    """The pinned KServe module's source tree (`make controlplane` links it beside the binaries)."""
    source = (bin_dir.parent / "kserve").resolve()
    if not (source / "config" / "crd" / "full").is_dir():
        raise ClusterError(f"KServe's source is not at {source} (run `make controlplane`)")
    return source


def kserve_crds(source: Path) -> list[dict[str, Any]]:
    """Every whole CustomResourceDefinition under config/crd/full (kustomize patches, which lack a spec, skipped)."""
    crds = []
    for path in sorted((source / "config" / "crd" / "full").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if (
                isinstance(doc, dict)
                and doc.get("kind") == "CustomResourceDefinition"
                and (doc.get("spec") or {}).get("group")
            ):
                crds.append(doc)
    return crds


def standard_mode_config(source: Path) -> dict[str, Any]:
    """KServe's ConfigMap as shipped, but deploying raw Deployments (Standard mode) by default."""
    config_map: dict[str, Any] = yaml.safe_load((source / "config" / "configmap" / "inferenceservice.yaml").read_text())
    deploy = json.loads(config_map["data"]["deploy"])
    deploy["defaultDeploymentMode"] = "Standard"
    config_map["data"]["deploy"] = json.dumps(deploy)
    config_map["metadata"]["namespace"] = NAMESPACE
    return config_map


def local_webhooks(source: Path, port: int, ca_pem: bytes) -> list[dict[str, Any]]:
    """KServe's webhook configurations with each in-cluster Service reference replaced by 127.0.0.1:port."""
    ca_bundle = base64.b64encode(ca_pem).decode()
    configs = []
    for doc in yaml.safe_load_all((source / "config" / "webhook" / "manifests.yaml").read_text()):
        if not doc:
            continue
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca_bundle}
            hook["admissionReviewVersions"] = ["v1", "v1beta1"]
        doc["metadata"].pop("creationTimestamp", None)
        configs.append(doc)
    return configs


class KServe:
    """Installs KServe's CRDs, ConfigMap and webhooks into `cluster` and runs its controller manager."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.source = kserve_source(cluster.bin_dir)
        self.webhook_port, self.probe_port, self.metrics_port = free_port(), free_port(), free_port()
        self.workdir = cluster.workdir / "kserve"

    def start(self, timeout_s: float = 180.0) -> float:
        t0 = time.monotonic()
        self.workdir.mkdir(parents=True, exist_ok=True)
        crds = kserve_crds(self.source)
        self.kubectl_apply(crds)
        self.cluster.wait_established([c["metadata"]["name"] for c in crds])
        self.kubectl_apply(
            [
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
                standard_mode_config(self.source),
            ]
        )
        manager = self._start_manager()

        def healthy() -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.probe_port}/readyz", timeout=2) as r:
                return bool(r.status == 200)

        wait_until(manager, healthy, timeout_s, "serving its webhooks")
        assert self.cluster.ca is not None
        self.kubectl_apply(local_webhooks(self.source, self.webhook_port, self.cluster.ca.pem))
        return time.monotonic() - t0

    def kubectl_apply(self, objects: list[dict[str, Any]]) -> None:
        manifest = self.workdir / "apply.yaml"
        manifest.write_text(yaml.safe_dump_all(objects, sort_keys=False))
        self.cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(manifest))

    def _start_manager(self) -> Component:
        assert self.cluster.ca is not None
        # controller-runtime reads the webhook server's pair from $TMPDIR/k8s-webhook-server/serving-certs.
        certs = self.workdir / "tmp" / "k8s-webhook-server" / "serving-certs"
        certs.mkdir(parents=True, exist_ok=True)
        pair = self.cluster.ca.serving_pair("kserve-webhook")
        pair.cert.replace(certs / "tls.crt")
        pair.key.replace(certs / "tls.key")
        component = Component(
            "kserve-manager",
            [
                str(self.cluster.bin_dir / "kserve-manager"),
                f"--webhook-port={self.webhook_port}",
                f"--metrics-addr=127.0.0.1:{self.metrics_port}",
                f"--health-probe-addr=127.0.0.1:{self.probe_port}",
                "--leader-elect=false",
            ],
            self.cluster.logs / "kserve-manager.log",
            env={
                "KUBECONFIG": str(self.cluster.kubeconfig),
                "POD_NAMESPACE": NAMESPACE,
                "TMPDIR": str(self.workdir / "tmp"),
            },
        )
        self.cluster.components[component.name] = component
        component.start()
        return component
