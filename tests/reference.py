"""Inputs for the demo models and their expected outputs, computed by running the model directly."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
import torch

from batchpilot.runtime.demo_models import IMAGE_SIZE, VOCAB_SIZE

#: Request body limit of the shared test server (tests/conftest.py).
MAX_BODY = 16 * 1024 * 1024


def cv_inputs(count: int, seed: int = 1) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [
        rng.standard_normal((int(rng.integers(1, 4)), 3, IMAGE_SIZE, IMAGE_SIZE), dtype=np.float32)
        for _ in range(count)
    ]


def nlp_inputs(count: int, seed: int = 2) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, VOCAB_SIZE, size=(1, int(rng.integers(4, 60))), dtype=np.int64) for _ in range(count)]


@cache
def _load(path: Path) -> torch.jit.ScriptModule:
    return torch.jit.load(str(path))


def expected(repository: Path, model: str, array: np.ndarray) -> dict[str, np.ndarray]:
    """The model run alone, unbatched and unpadded, on exactly this request."""
    module = _load(repository / model / "model.pt")
    with torch.inference_mode():
        x = torch.from_numpy(array)
        if model == "textcls":
            logits, scores = module(x, torch.ones_like(x))
            return {"logits": logits.numpy(), "token_scores": scores.numpy()}
        return {"logits": module(x).numpy()}


def assert_close(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert set(got) == set(want)
    for name in want:
        assert got[name].shape == want[name].shape, name
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4, err_msg=name)
