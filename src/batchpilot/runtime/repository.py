"""The model repository: one folder per model with `config.yaml` and the weights.

Only TorchScript archives (`model.pt`) and `torch.export` programs (`model.pt2`) are accepted; nothing is
ever unpickled. A model that fails to load is reported on its own and never stops the others.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml
from pydantic import TypeAdapter, ValidationError

from batchpilot.runtime.kinds import kind_for
from batchpilot.spec.contracts import SPECS_ENV, SUBPATHS_ENV, WEIGHT_FILES
from batchpilot.spec.model import ModelSpec

log = logging.getLogger("batchpilot.repository")


class ModelLoadError(Exception):
    pass


@dataclass
class ModelEntry:
    """A model found in the repository: its spec and module, or why it could not be loaded."""

    name: str
    spec: ModelSpec | None = None
    module: Callable[..., object] | None = None
    error: str | None = None


def specs_from_env(environ: os._Environ[str] | dict[str, str] = os.environ) -> dict[str, ModelSpec]:
    raw = environ.get(SPECS_ENV)
    if not raw:
        return {}
    specs = TypeAdapter(list[ModelSpec]).validate_python(json.loads(raw))
    return {s.name: s for s in specs}


def subpaths_from_env(environ: os._Environ[str] | dict[str, str] = os.environ) -> dict[str, str]:
    """{model: path inside its folder} from the operator (see batchpilot.spec.contracts.SUBPATHS_ENV)."""
    raw = environ.get(SUBPATHS_ENV)
    if not raw:
        return {}
    subpaths = TypeAdapter(dict[str, str]).validate_python(json.loads(raw))
    return {name: path for name, path in subpaths.items() if ".." not in Path(path).parts}


def model_folder(root: Path, name: str, subpath: str | None) -> Path:
    """The model's folder: `root/name/subpath` when it holds the files (a whole volume mounted at
    `root/name`), else `root/name` (the storage put the files there itself)."""
    folder = root / name
    if subpath:
        inner = folder / subpath
        if any((inner / f).is_file() for f in (*WEIGHT_FILES.values(), "config.yaml")):
            return inner
    return folder


def read_spec(folder: Path, name: str | None = None) -> ModelSpec:
    path = folder / "config.yaml"
    if not path.exists():
        raise ModelLoadError(f"{path} is missing")
    try:
        data = yaml.safe_load(path.read_text()) or {}
        data.setdefault("name", name or folder.name)
        return ModelSpec.model_validate(data)
    except (yaml.YAMLError, ValidationError) as exc:
        raise ModelLoadError(f"{path} is invalid: {exc}") from None


def load_module(spec: ModelSpec, folder: Path, device: torch.device) -> Callable[..., object]:
    path = folder / WEIGHT_FILES[spec.format]
    if not path.exists():
        raise ModelLoadError(f"{path} is missing (format {spec.format} expects {path.name})")
    try:
        if spec.format == "torchscript":
            module = torch.jit.load(str(path), map_location=device)
            module.eval()
            return module
        program = torch.export.load(str(path))
        return program.module().to(device)
    except Exception as exc:  # corrupt file, pickle instead of an archive, wrong format...
        raise ModelLoadError(f"{path} could not be loaded as {spec.format}: {exc}") from None


def example_inputs(spec: ModelSpec, batch: int, device: torch.device) -> list[torch.Tensor]:
    """Inputs of the right shape and type (the model kind's), for warm-up and self-checks."""
    return [torch.from_numpy(a).to(device) for a in kind_for(spec).example_inputs(batch)]


def warm_up(spec: ModelSpec, module: Callable[..., object], device: torch.device, sizes: tuple[int, ...]) -> None:
    """Run the model a few times so the first requests don't pay for JIT specialisation."""
    try:
        with torch.inference_mode():
            for batch in sizes:
                for _ in range(2):
                    module(*example_inputs(spec, batch, device))
    except Exception as exc:
        raise ModelLoadError(f"model {spec.name!r} failed its warm-up call: {exc}") from None


def load_repository(
    root: Path,
    device: torch.device,
    overrides: dict[str, ModelSpec] | None = None,
    subpaths: dict[str, str] | None = None,
) -> list[ModelEntry]:
    overrides, subpaths = overrides or {}, subpaths or {}
    if not root.is_dir():
        raise ModelLoadError(f"model repository {root} is not a directory")
    names = sorted({p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")} | set(overrides))
    entries = []
    for name in names:
        entry = ModelEntry(name)
        folder = model_folder(root, name, subpaths.get(name))
        try:
            entry.spec = overrides.get(name) or read_spec(folder, name)
            entry.module = load_module(entry.spec, folder, device)
            warm_up(entry.spec, entry.module, device, (1, min(8, entry.spec.advertised_max_batch_size)))
            log.info("loaded model %s (%s, %s) on %s", name, entry.spec.type, entry.spec.format, device)
        except ModelLoadError as exc:
            entry.error = str(exc)
            entry.module = None
            log.error("model %s not loaded: %s", name, exc)
        entries.append(entry)
    return entries
