"""The local control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok."""

from __future__ import annotations

import base64
import json
import secrets
import ssl
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from batchpilot.devcluster.pki import CertificateAuthority, write_signing_keypair
from batchpilot.devcluster.process import ClusterError, Component, free_port, wait_until

__all__ = ["FAKE_NODE", "ClusterError", "LocalCluster"]

#: The fake node kwok manages: room for every test pod, and GPUs for GPU models.
FAKE_NODE = "kwok-node-0"
_KWOK_ANNOTATION = "kwok.x-k8s.io/node"
_SERVICE_CIDR = "10.0.0.0/24"  # allocation only: no proxy exists, nothing is ever sent there
_BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "kubectl")


@dataclass(frozen=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    kwok: int

    @classmethod
    def pick(cls) -> Ports:
        return cls(*(free_port() for _ in range(6)))


class LocalCluster:
    """Start with `start()` (or as a context manager); `kubeconfig` is then usable by any client."""

    def __init__(self, workdir: Path, bin_dir: Path, *, gpus_per_node: int = 4) -> None:
        self.workdir = workdir.resolve()
        self.bin_dir = bin_dir.resolve()
        self.logs = self.workdir / "logs"
        self.pki = self.workdir / "pki"
        self.kubeconfig = self.workdir / "kubeconfig"
        self.gpus_per_node = gpus_per_node
        self.token = secrets.token_hex(16)
        self.ports = Ports.pick()
        self.components: dict[str, Component] = {}
        self.ca: CertificateAuthority | None = None
        missing = [b for b in _BINARIES if not (self.bin_dir / b).exists()]
        if missing:
            raise ClusterError(f"missing in {self.bin_dir}: {', '.join(missing)} (run `make controlplane`)")

    # -- public -----------------------------------------------------------------------------------------------

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def start(self, timeout_s: float = 180.0) -> float:
        """Start everything and wait until a pod could run; returns the seconds it took."""
        t0 = time.monotonic()
        self._prepare()
        self._start_etcd(timeout_s)
        self._start_apiserver(timeout_s)
        self._write_kubeconfig(self.kubeconfig, self.token)
        self._start("kube-controller-manager", self._controller_manager_argv())
        self._start("kube-scheduler", self._scheduler_argv())
        self._start("kwok", self._kwok_argv())
        self._create_fake_node()
        self._wait_settled(timeout_s - (time.monotonic() - t0))
        return time.monotonic() - t0

    def stop(self) -> None:
        for component in reversed(list(self.components.values())):
            component.stop()

    def restart_apiserver(self, down_s: float = 1.0, timeout_s: float = 120.0) -> None:
        """Stop the API server (clients see connections refused, watches break), then bring it back."""
        self.components["kube-apiserver"].stop()
        time.sleep(down_s)
        self._start_apiserver(timeout_s)

    def api(self, method: str, path: str, body: Any = None, token: str | None = None) -> Any:
        """One authenticated API call (admin unless `token`); returns the decoded JSON answer."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.server + path,
            data=data,
            method=method,
            headers={"Authorization": f"Bearer {token or self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, context=self._ssl(), timeout=10) as response:
            return json.loads(response.read() or b"null")

    def kubectl(self, *args: str, kubeconfig: Path | None = None, stdin: str | None = None) -> str:
        """Run the real kubectl against this cluster; its stdout, or ClusterError with its stderr."""
        done = subprocess.run(
            [str(self.bin_dir / "kubectl"), f"--kubeconfig={kubeconfig or self.kubeconfig}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise ClusterError(
                f"kubectl {' '.join(args)}: {(done.stderr.strip() + chr(10) + done.stdout.strip()).strip()}"
            )
        return done.stdout

    def wait_established(self, names: list[str], timeout_s: float = 60.0) -> None:
        """Wait until the API server serves each CustomResourceDefinition (Established=True)."""
        pending = set(names)
        deadline = time.monotonic() + timeout_s
        while pending and time.monotonic() < deadline:
            for name in sorted(pending):
                crd = self.api("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
                if any(
                    c["type"] == "Established" and c["status"] == "True"
                    for c in (crd.get("status") or {}).get("conditions") or []
                ):
                    pending.discard(name)
            time.sleep(0.1)
        if pending:
            raise ClusterError(f"CRDs not Established within {timeout_s:.0f} s: {', '.join(sorted(pending))}")

    def write_kubeconfig(self, path: Path, token: str, namespace: str = "default") -> Path:
        """A kubeconfig for this cluster that authenticates with `token` (e.g. a ServiceAccount's)."""
        self._write_kubeconfig(path, token, namespace)
        return path

    # -- start-up ---------------------------------------------------------------------------------------------

    def _prepare(self) -> None:
        for d in (self.workdir, self.logs, self.pki, self.workdir / "etcd"):
            d.mkdir(parents=True, exist_ok=True)
        self.ca = CertificateAuthority(self.pki)
        self.ca.serving_pair("apiserver", ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"))
        write_signing_keypair(self.pki / "sa.key", self.pki / "sa.pub")
        # One static admin token (group system:masters); everything else authenticates as a ServiceAccount.
        (self.pki / "tokens.csv").write_text(f"{self.token},admin,admin,system:masters\n")
        (self.pki / "tokens.csv").chmod(0o600)

    def _start(self, name: str, argv: list[str]) -> Component:
        component = Component(name, argv, self.logs / f"{name}.log")
        self.components[name] = component
        component.start()
        return component

    def _start_etcd(self, timeout_s: float) -> None:
        p = self.ports
        etcd = self._start(
            "etcd",
            [
                str(self.bin_dir / "etcd"),
                "--name=default",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{p.etcd_client}",
                f"--advertise-client-urls=http://127.0.0.1:{p.etcd_client}",
                f"--listen-peer-urls=http://127.0.0.1:{p.etcd_peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{p.etcd_peer}",
                f"--initial-cluster=default=http://127.0.0.1:{p.etcd_peer}",
                "--unsafe-no-fsync",
                "--quota-backend-bytes=4294967296",
                "--log-level=warn",
            ],
        )

        def healthy() -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{p.etcd_client}/health", timeout=2) as r:
                return bool(json.loads(r.read()).get("health") == "true")

        wait_until(etcd, healthy, timeout_s, "healthy")

    def _start_apiserver(self, timeout_s: float) -> None:
        p, pki = self.ports, self.pki
        apiserver = self._start(
            "kube-apiserver",
            [
                str(self.bin_dir / "kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{p.etcd_client}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={p.apiserver}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--cert-dir={pki}",
                f"--token-auth-file={pki / 'tokens.csv'}",
                "--authorization-mode=Node,RBAC",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                f"--service-cluster-ip-range={_SERVICE_CIDR}",
                "--allow-privileged=true",
                "--enable-priority-and-fairness=false",
                "--profiling=false",
                "--v=1",
            ],
        )
        wait_until(apiserver, lambda: self._get_text("/readyz") == "ok", timeout_s, "ready (/readyz)")

    def _controller_manager_argv(self) -> list[str]:
        return [
            str(self.bin_dir / "kube-controller-manager"),
            f"--kubeconfig={self.kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.ports.controller_manager}",
            f"--service-account-private-key-file={self.pki / 'sa.key'}",
            f"--root-ca-file={self.ca_path}",
            "--controllers=*",
            # kwok renews its node's lease from a process that shares 2 busy cores with everything else; a late
            # renewal must not make the node lifecycle controller mark every pod on it NotReady for good
            # (kwok only readies Pending pods).
            "--node-monitor-grace-period=5m",
            "--use-service-account-credentials=false",
            "--profiling=false",
            "--v=1",
        ]

    def _scheduler_argv(self) -> list[str]:
        return [
            str(self.bin_dir / "kube-scheduler"),
            f"--kubeconfig={self.kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.ports.scheduler}",
            "--profiling=false",
            "--v=1",
        ]

    def _kwok_argv(self) -> list[str]:
        # kwok's own "fast" stages (its kustomize/stage/fast): nodes turn Ready and keep a lease, pods bound
        # to them turn Running and Ready at once, deleted pods go away.
        stages = self.bin_dir.parent / "kwok" / "kustomize" / "stage"
        files = [
            f
            for d in ("node/fast", "node/heartbeat-with-lease", "pod/fast")
            for f in sorted((stages / d).glob("*.yaml"))
            if f.name != "kustomization.yaml"
        ]
        if not files:
            raise ClusterError(f"kwok's stages are not under {stages} (run `make controlplane`)")
        config = self.workdir / "kwok.yaml"
        config.write_text("\n---\n".join(f.read_text() for f in files))
        return [
            str(self.bin_dir / "kwok"),
            f"--config={config}",
            f"--kubeconfig={self.kubeconfig}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={_KWOK_ANNOTATION}=fake",
            "--node-ip=127.0.0.1",
            "--cidr=10.0.1.0/24",
            f"--server-address=127.0.0.1:{self.ports.kwok}",
        ]

    def _create_fake_node(self) -> None:
        capacity = {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": str(self.gpus_per_node)}
        self.api(
            "POST",
            "/api/v1/nodes",
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": FAKE_NODE,
                    "annotations": {_KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
                    "labels": {
                        "type": "kwok",
                        "kubernetes.io/hostname": FAKE_NODE,
                        "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": "amd64",
                    },
                },
                "spec": {},
                "status": {"capacity": capacity, "allocatable": capacity},
            },
        )

    def _wait_settled(self, timeout_s: float) -> None:
        """Ready when kwok's node is Ready and the controller manager has made the default ServiceAccount."""

        def node_ready() -> bool:
            node = self.api("GET", f"/api/v1/nodes/{FAKE_NODE}")
            return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", []))

        def default_service_account() -> bool:
            return bool(self.api("GET", "/api/v1/namespaces/default/serviceaccounts/default"))

        wait_until(self.components["kwok"], node_ready, max(timeout_s, 10), "marking its node Ready")
        wait_until(
            self.components["kube-controller-manager"],
            default_service_account,
            max(timeout_s, 10),
            "creating the default ServiceAccount",
        )

    # -- plumbing ---------------------------------------------------------------------------------------------

    @property
    def ca_path(self) -> Path:
        assert self.ca is not None, "start() first"
        return self.ca.cert_path

    def _ssl(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_path))

    def _get_text(self, path: str) -> str:
        request = urllib.request.Request(self.server + path, headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(request, context=self._ssl(), timeout=5) as response:
            return str(response.read().decode())

    def _write_kubeconfig(self, path: Path, token: str, namespace: str = "default") -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "batchpilot-local",
            "clusters": [
                {
                    "name": "batchpilot-local",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority-data": base64.b64encode(self.ca_path.read_bytes()).decode(),
                    },
                }
            ],
            "users": [{"name": "user", "user": {"token": token}}],
            "contexts": [
                {
                    "name": "batchpilot-local",
                    "context": {"cluster": "batchpilot-local", "user": "user", "namespace": namespace},
                }
            ],
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        path.chmod(0o600)
