"""Computer vision: fixed-shape tensors (images) stacked along dim 0; requests batch when their shapes agree."""

from __future__ import annotations

from typing import ClassVar

from batchpilot.runtime.kinds.base import StackedKind


class CvKind(StackedKind):
    name: ClassVar[str] = "cv"
