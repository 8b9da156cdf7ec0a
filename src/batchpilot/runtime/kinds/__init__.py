"""Model kinds: what `ModelSpec.type` names, one module each, chosen here by name.

Adding a kind is one new module (a class following `base.ModelKind`, usually a `StackedKind` that overrides
what differs) and one line in `KINDS` (or a `register()` call); the spec's `type` field then names it.
"""

from __future__ import annotations

from collections.abc import Callable

from batchpilot.runtime.kinds.base import ModelKind, StackedKind
from batchpilot.runtime.kinds.cv import CvKind
from batchpilot.runtime.kinds.nlp import NlpKind
from batchpilot.spec.model import ModelSpec

KINDS: dict[str, Callable[[ModelSpec], ModelKind]] = {
    CvKind.name: CvKind,
    NlpKind.name: NlpKind,
}


def register(name: str, kind: Callable[[ModelSpec], ModelKind]) -> None:
    """Make `kind` the kind of specs whose `type` is `name`."""
    KINDS[name] = kind


def kind_for(spec: ModelSpec) -> ModelKind:
    """The kind of `spec`'s model (by its `type`)."""
    try:
        return KINDS[spec.type](spec)
    except KeyError:
        raise ValueError(f"model {spec.name!r}: unknown model type {spec.type!r} (known: {sorted(KINDS)})") from None


__all__ = ["KINDS", "CvKind", "ModelKind", "NlpKind", "StackedKind", "kind_for", "register"]
