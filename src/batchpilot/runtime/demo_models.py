"""The two built-in demo models, built with torch on the spot (random weights, nothing downloaded).

Both are sized like small real models on a CPU: one item costs a millisecond or more, and batching
them pays (a batch of 16 runs several times more items per second than single items).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
import yaml
from torch import nn

from batchpilot.spec.model import ModelSpec

IMAGE_SIZE = 64
NUM_CLASSES = 10
VOCAB_SIZE = 8000
MAX_LENGTH = 256
TEXT_CLASSES = 4


class ImageClassifier(nn.Module):
    """A small CNN classifier: FP32 images [B, 3, 64, 64] to logits [B, 10]."""

    def __init__(self) -> None:
        super().__init__()
        # A patchifying stem brings 64x64 down to 16x16 at once; the small feature maps after it make
        # single images run inefficiently, which is what batching recovers (as on a GPU).
        layers: list[nn.Module] = [nn.Conv2d(3, 64, 4, stride=4), nn.ReLU()]
        for cin, cout, stride in [(64, 64, 1), (64, 128, 2), (128, 128, 1), (128, 256, 2), (256, 256, 1)]:
            layers += [nn.Conv2d(cin, cout, 3, stride=stride, padding=1), nn.ReLU()]
        self.features = nn.Sequential(*layers)
        # A VGG-style dense head over the flattened 4x4 map: its weights (~19 MB) are read once per
        # call, so single images are memory-bound on them.
        self.head = nn.Sequential(
            nn.Flatten(),
            nn.Linear(256 * 4 * 4, 1024),
            nn.ReLU(),
            nn.Linear(1024, 512),
            nn.ReLU(),
            nn.Linear(512, NUM_CLASSES),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class EncoderLayer(nn.Module):
    def __init__(self, dim: int, heads: int, ff: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.ff = nn.Sequential(nn.Linear(dim, ff), nn.GELU(), nn.Linear(ff, dim))

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        b, length, dim = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, length, 3, self.heads, dim // self.heads).unbind(2)
        # keep: [B, 1, 1, L] boolean, True on real tokens; padded keys get no attention.
        attn = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=keep)
        x = x + self.out(attn.transpose(1, 2).reshape(b, length, dim))
        return x + self.ff(self.norm2(x))


class TextClassifier(nn.Module):
    """A small transformer encoder: token ids [B, L] + mask to class logits [B, 4] and per-token scores [B, L]."""

    def __init__(self, dim: int = 128, heads: int = 4, layers: int = 2, ff: int = 512) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB_SIZE, dim)
        self.position = nn.Embedding(MAX_LENGTH, dim)
        self.layers = nn.ModuleList([EncoderLayer(dim, heads, ff) for _ in range(layers)])
        self.norm = nn.LayerNorm(dim)
        # A wide classifier MLP on the pooled vector (~18 MB of weights, read once per call).
        self.classify = nn.Sequential(
            nn.Linear(dim, 2048), nn.GELU(), nn.Linear(2048, 2048), nn.GELU(), nn.Linear(2048, TEXT_CLASSES)
        )
        self.score = nn.Linear(dim, 1)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.embed(input_ids) + self.position(positions)[None]
        keep = attention_mask.to(torch.bool)[:, None, None, :]
        for layer in self.layers:
            x = layer(x, keep)
        x = self.norm(x)
        weights = attention_mask.to(x.dtype)[:, :, None]
        pooled = (x * weights).sum(1) / weights.sum(1).clamp(min=1.0)
        return self.classify(pooled), self.score(x).squeeze(-1)


def image_spec(name: str = "resnet-mini") -> ModelSpec:
    return ModelSpec.model_validate(
        {
            "name": name,
            "type": "cv",
            "format": "torchscript",
            "inputs": [{"name": "image", "datatype": "FP32", "shape": [3, IMAGE_SIZE, IMAGE_SIZE]}],
            "outputs": [{"name": "logits", "datatype": "FP32", "shape": [NUM_CLASSES]}],
            "batching": {"max_batch_size": 16, "max_queue_delay_microseconds": 2000},
            "autotune": {
                "enabled": True,
                "latency_slo_p99_ms": 50,
                "bounds": {"min_batch_size": 1, "max_batch_size": 64, "max_queue_delay_microseconds": 10000},
            },
        }
    )


def text_spec(name: str = "textcls") -> ModelSpec:
    return ModelSpec.model_validate(
        {
            "name": name,
            "type": "nlp",
            "format": "torchscript",
            "inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [-1]}],
            "outputs": [
                {"name": "logits", "datatype": "FP32", "shape": [TEXT_CLASSES]},
                {"name": "token_scores", "datatype": "FP32", "shape": [-1]},
            ],
            "batching": {"max_batch_size": 16, "max_queue_delay_microseconds": 2000},
            "autotune": {
                "enabled": True,
                "latency_slo_p99_ms": 50,
                "bounds": {"min_batch_size": 1, "max_batch_size": 64, "max_queue_delay_microseconds": 10000},
            },
            "sequence": {"max_length": MAX_LENGTH, "pad_value": 0, "max_padding_waste": 0.25},
        }
    )


def build_demo_modules(seed: int = 0) -> dict[str, tuple[ModelSpec, nn.Module]]:
    torch.manual_seed(seed)
    return {
        "resnet-mini": (image_spec(), ImageClassifier().eval()),
        "textcls": (text_spec(), TextClassifier().eval()),
    }


def write_model(repository: Path, spec: ModelSpec, module: nn.Module) -> Path:
    """Save one model as TorchScript plus its config.yaml into `repository/<name>/`."""
    folder = repository / spec.name
    folder.mkdir(parents=True, exist_ok=True)
    torch.jit.save(torch.jit.script(module), str(folder / "model.pt"))
    (folder / "config.yaml").write_text(yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False))
    return folder


def write_demo_repository(repository: Path, seed: int = 0) -> list[ModelSpec]:
    """`batchpilot demo-models DIR`: both demo models as a model repository."""
    repository.mkdir(parents=True, exist_ok=True)
    specs = []
    for spec, module in build_demo_modules(seed).values():
        write_model(repository, spec, module)
        specs.append(spec)
    return specs
