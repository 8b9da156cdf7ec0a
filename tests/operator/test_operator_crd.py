"""The generated CRD: in sync with the spec types, valid for Kubernetes, and enforcing the same rules as
pydantic (schema via jsonschema, cross-field rules via a real CEL evaluator)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pydantic
import pytest
import yaml

from batchpilot.operator import crdgen
from batchpilot.spec import BatchedModelSpec

INVALID = sorted((Path(__file__).resolve().parents[2] / "examples" / "invalid").glob("*.yaml"))


def test_committed_crd_matches_generator() -> None:
    assert crdgen.CRD_PATH.read_text() == crdgen.render(), "crds/ is stale: run `python -m batchpilot.operator.crdgen`"


def test_crd_passes_kubernetes_validate_strict(crd: dict[str, Any]) -> None:
    for version in ("1.30", "1.33"):
        kubernetes_validate.validate(crd, version, strict=True)


def test_crd_shape(crd: dict[str, Any]) -> None:
    spec = crd["spec"]
    assert spec["names"]["shortNames"] == ["bm"] and spec["scope"] == "Namespaced"
    (version,) = spec["versions"]
    assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert {"Ready", "Models", "URL", "Age"} <= set(columns)


def test_every_pydantic_cross_field_rule_has_a_cel_twin() -> None:
    """A validator added to the spec types without a CEL rule would let the API server accept what
    the operator rejects: list every class with a model validator and demand rules for it."""
    seen: set[type] = set()

    def walk(cls: type[pydantic.BaseModel]) -> None:
        if cls in seen:
            return
        seen.add(cls)
        for field in cls.model_fields.values():
            for arg in _classes(field.annotation):
                walk(arg)

    walk(BatchedModelSpec)
    with_validators = {c for c in seen if c.__pydantic_decorators__.model_validators}
    covered = {c for c in with_validators if any(issubclass(c, base) for base in crdgen.CEL_RULES)}
    assert with_validators == covered, f"no CEL rules for {with_validators - covered}"


def _classes(annotation: Any) -> list[type[pydantic.BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return [annotation]
    return [c for arg in getattr(annotation, "__args__", ()) for c in _classes(arg)]


def test_examples_are_valid(examples: dict[str, dict[str, Any]], validate_cr: Any) -> None:
    assert {"cv.yaml", "nlp.yaml", "both.yaml"} <= set(examples)
    for name, manifest in examples.items():
        assert validate_cr(manifest) == [], name
        BatchedModelSpec.model_validate(manifest["spec"])


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_invalid_examples_rejected_readably(path: Path, validate_cr: Any) -> None:
    text = path.read_text()
    expected = text.splitlines()[0].removeprefix("# expect: ")
    errors = validate_cr(yaml.safe_load(text))
    assert errors and any(expected in e for e in errors), errors
    with pytest.raises(pydantic.ValidationError):  # and the operator's own check agrees
        BatchedModelSpec.model_validate(yaml.safe_load(text)["spec"])


def _mutations() -> list[tuple[str, str, Any]]:
    """(id, dotted path into the nlp+cv example's spec, value): each either breaks a rule or not."""
    return [
        ("preferred-equal-max", "models.0.batching.preferredBatchSize", [16]),
        ("preferred-zero", "models.0.batching.preferredBatchSize", [0]),
        ("preferred-over-max", "models.0.batching.preferredBatchSize", [17]),
        ("priority-ok", "models.0.batching", {"priorityLevels": 3, "defaultPriorityLevel": 3}),
        ("priority-over", "models.0.batching", {"priorityLevels": 2, "defaultPriorityLevel": 3}),
        ("bounds-equal", "models.1.autotune.bounds", {"minBatchSize": 8, "maxBatchSize": 8}),
        ("bounds-default-max", "models.1.autotune.bounds", {"minBatchSize": 65}),
        (
            "delay-bounds-reversed",
            "models.1.autotune.bounds",
            {"minQueueDelayMicroseconds": 10, "maxQueueDelayMicroseconds": 5},
        ),
        ("dim-zero", "models.0.inputs.0.shape", [3, 0, 64]),
        ("dim-minus-two", "models.0.outputs.0.shape", [-2]),
        ("dim-variable", "models.0.outputs.0.shape", [-1]),
        ("duplicate-input", "models.0.inputs", [{"name": "x", "datatype": "FP32", "shape": [1]}] * 2),
        ("duplicate-output", "models.0.outputs", [{"name": "y", "datatype": "FP32", "shape": [1]}] * 2),
        ("nlp-float-tokens", "models.1.inputs.0.datatype", "FP32"),
        ("nlp-int32-tokens", "models.1.inputs.0.datatype", "INT32"),
        ("nlp-fixed-length", "models.1.inputs.0.shape", [128]),
        ("duplicate-model", "models.1.name", "cnn"),
        ("name-dotted", "models.1.name", "bert.v2"),
        ("name-dot-dot", "models.1.name", "bert..v2"),  # KServe refuses '..' in the storage mount path
        ("replicas-equal", "replicas", {"min": 2, "max": 2}),
        ("replicas-reversed", "replicas", {"min": 2}),  # max defaults to 1
    ]


@pytest.mark.parametrize(("path", "value"), [m[1:] for m in _mutations()], ids=[m[0] for m in _mutations()])
def test_cel_rules_agree_with_pydantic(examples: dict[str, Any], validate_cr: Any, path: str, value: Any) -> None:
    manifest = copy.deepcopy(examples["both.yaml"])
    *parents, leaf = path.split(".")
    node = manifest["spec"]
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[int(leaf) if isinstance(node, list) else leaf] = value
    try:
        BatchedModelSpec.model_validate(manifest["spec"])
        pydantic_ok = True
    except pydantic.ValidationError:
        pydantic_ok = False
    errors = validate_cr(manifest)
    assert (errors == []) == pydantic_ok, errors or "CEL accepted what pydantic rejects"
