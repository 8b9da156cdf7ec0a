"""A real Kubernetes control plane on 127.0.0.1, built from Go modules (`make controlplane`).

`LocalCluster` runs etcd, kube-apiserver (RBAC, service-account token signing, the default admission
plugins), kube-controller-manager (garbage collector, deployments, replica sets, service-account tokens,
...), kube-scheduler and kwok, whose fake node (with `nvidia.com/gpu` capacity) turns the pods scheduled to
it Running and Ready. Optionally KServe's controller manager too (batchpilot.devcluster.kserve). No
container ever runs: that is what kwok stands in for. `batchpilot cluster` runs one in the foreground; the
e2e tests use the same class as a session fixture.
"""

from __future__ import annotations

from batchpilot.devcluster.cluster import ClusterError, LocalCluster

__all__ = ["ClusterError", "LocalCluster"]
