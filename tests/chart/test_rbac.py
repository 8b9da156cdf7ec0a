"""The chart grants the operator exactly what its code declares it uses (batchpilot.operator.rbac.OPERATOR_RULES)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pytest
from chartkit import Manifest, only

from batchpilot.operator.rbac import OPERATOR_RULES

Grant = tuple[str, str, str]  # (apiGroup, resource, verb)

#: Cluster-scoped resources: a namespaced install's Role cannot grant them, so it leaves them out (kopf then
#: falls back to the exact namespace it was given and to the CRDs found at start-up).
CLUSTER_SCOPED_RESOURCES = {("", "namespaces"), ("apiextensions.k8s.io", "customresourcedefinitions")}


def grants(rules: Iterable[Mapping[str, Any]]) -> set[Grant]:
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


@pytest.fixture(scope="module")
def operator_grants() -> set[Grant]:
    return grants(OPERATOR_RULES)


def test_grants_are_exact_not_wildcards(manifests: list[Manifest]) -> None:
    role = only(manifests, "ClusterRole", "Role")
    assert not any("*" in grant for grant in grants(role["rules"]))


def test_cluster_role_grants_exactly_operator_rules(
    chart_defaults: list[Manifest], operator_grants: set[Grant]
) -> None:
    assert grants(only(chart_defaults, "ClusterRole")["rules"]) == operator_grants


def test_namespaced_role_grants_operator_rules_on_namespaced_resources(
    chart_full: list[Manifest], operator_grants: set[Grant]
) -> None:
    expected = {g for g in operator_grants if g[:2] not in CLUSTER_SCOPED_RESOURCES}
    assert grants(only(chart_full, "Role")["rules"]) == expected


def test_binding_refers_to_the_role_and_the_operators_service_account(manifests: list[Manifest]) -> None:
    role = only(manifests, "ClusterRole", "Role")
    binding = only(manifests, "ClusterRoleBinding", "RoleBinding")
    assert (binding["roleRef"]["kind"], binding["roleRef"]["name"]) == (role["kind"], role["metadata"]["name"])
    deployment = only(manifests, "Deployment")
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": deployment["metadata"]["namespace"]}
    ]
