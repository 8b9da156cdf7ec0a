"""NLP: one variable-length token sequence per item.

Sequences of similar length are grouped around the oldest request within a padding-waste budget; a batch is
padded to its longest sequence (never beyond it) with an attention mask as the model's second argument, and
per-token outputs (first per-item dim variable) are cut back to each request's own length. A KServe v1
instance is one sequence, queued on its own so it can join others of its length.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from batchpilot.runtime.batching.policy import BatchPolicy, LengthGroupPolicy
from batchpilot.runtime.batching.request import Slice
from batchpilot.runtime.errors import InvalidRequest
from batchpilot.runtime.kinds.base import StackedKind, Take, TokenCount
from batchpilot.runtime.tensors import Decoded, RawInput
from batchpilot.spec.model import ModelSpec

#: Tokens per warm-up sequence.
WARM_UP_LENGTH = 16


class NlpKind(StackedKind):
    name: ClassVar[str] = "nlp"

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        # Outputs whose first per-item dim is variable follow the sequence: un-pad them per request.
        self.per_token = {t.name for t in spec.outputs if t.shape[:1] == [-1]}

    def check_input(self, raw: RawInput) -> None:
        if raw.shape[1] > self.spec.sequence.max_length:
            raise InvalidRequest(
                f"input {raw.name!r}: sequence length {raw.shape[1]} exceeds max_length {self.spec.sequence.max_length}"
            )

    def batch_policy(self) -> BatchPolicy:
        return LengthGroupPolicy(self.spec.sequence.max_padding_waste)

    def request_length(self, inputs: dict[str, np.ndarray]) -> int:
        return int(next(iter(inputs.values())).shape[1])

    def collate(self, parts: Sequence[dict[str, np.ndarray]], tokens: TokenCount) -> list[np.ndarray]:
        return self.collate_into(parts, tokens, lambda i, shape, dtype: np.empty(shape, dtype))

    def collate_into(self, parts: Sequence[dict[str, np.ndarray]], tokens: TokenCount, take: Take) -> list[np.ndarray]:
        name = self.spec.inputs[0].name
        rows = [p[name] for p in parts]
        total = sum(r.shape[0] for r in rows)
        longest = max(r.shape[1] for r in rows)
        ids = take(0, (total, longest), np.dtype(np.int64))
        ids.fill(self.spec.sequence.pad_value)
        mask = take(1, (total, longest), np.dtype(np.int64))
        mask.fill(0)
        row = 0
        for r in rows:
            ids[row : row + r.shape[0], : r.shape[1]] = r
            mask[row : row + r.shape[0], : r.shape[1]] = 1
            row += r.shape[0]
        tokens.tokens_useful += sum(r.size for r in rows)
        tokens.tokens_computed += ids.size
        return [ids, mask]

    def trim(self, name: str, piece: np.ndarray, slice_: Slice) -> np.ndarray:
        return piece[:, : slice_.request.length] if name in self.per_token else piece

    def v1_groups(self, per_input: dict[str, list[Any]]) -> list[list[Decoded]]:
        name, datatype = self.spec.inputs[0].name, self.spec.inputs[0].datatype
        groups: list[list[Decoded]] = []
        for seq in per_input[name]:
            if not isinstance(seq, list):
                raise InvalidRequest(f"input {name!r}: each instance must be a list of token ids")
            groups.append([(RawInput(name, datatype, (1, len(seq))), [seq])])
        return groups

    def example_inputs(self, batch: int) -> list[np.ndarray]:
        ids = np.ones((batch, WARM_UP_LENGTH), dtype=np.int64)
        return [ids, np.ones_like(ids)]
