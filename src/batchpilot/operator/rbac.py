"""The operator's RBAC needs: exactly what its code and kopf call. The chart's ClusterRole must grant
these rules (a test compares them); tests/operator checks them against the requests of a kmock run:
the operator's calls there are exactly these rules. (Namespace patterns such as `-n 'team-*'` would also
need namespaces list/watch; the CLI takes one plain namespace or all of them.)"""

from __future__ import annotations

from typing import TypedDict

from batchpilot.spec import batchedmodel as bm
from batchpilot.spec.contracts import ISVC_GROUP, ISVC_PLURAL


class PolicyRule(TypedDict):
    apiGroups: list[str]
    resources: list[str]
    verbs: list[str]


OPERATOR_RULES: list[PolicyRule] = [
    # The custom resource: watched by kopf, which also patches its finalizer and annotations.
    {"apiGroups": [bm.API_GROUP], "resources": [bm.PLURAL], "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": [bm.API_GROUP], "resources": [f"{bm.PLURAL}/status"], "verbs": ["patch"]},
    # The children.
    {
        "apiGroups": [ISVC_GROUP],
        "resources": [ISVC_PLURAL],
        "verbs": ["get", "list", "watch", "create", "patch", "delete"],
    },
    # Events about BatchedModels (kopf.event).
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    # kopf watches CRDs so that the InferenceService handlers start once KServe is installed
    # after the operator.
    {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": ["list", "watch"]},
]
