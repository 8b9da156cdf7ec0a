"""Loading a model repository: both formats, isolation of bad models, and no unpickling ever."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from batchpilot.runtime.repository import SPECS_ENV, SUBPATHS_ENV, load_repository, specs_from_env, subpaths_from_env

CPU = torch.device("cpu")


class Affine(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


def config(name: str, fmt: str = "torchscript") -> dict:
    return {
        "name": name,
        "type": "cv",
        "format": fmt,
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [4]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [2]}],
    }


def write(folder: Path, cfg: dict, weights: bytes | None = None, module: torch.nn.Module | None = None) -> None:
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg))
    filename = "model.pt2" if cfg.get("format") == "torch_export" else "model.pt"
    if module is not None and cfg.get("format") == "torch_export":
        batch = torch.export.Dim("batch", min=1, max=1024)
        program = torch.export.export(module, (torch.zeros(2, 4),), dynamic_shapes=({0: batch},))
        torch.export.save(program, str(folder / filename))
    elif module is not None:
        torch.jit.save(torch.jit.script(module), str(folder / filename))
    else:
        (folder / filename).write_bytes(weights or b"")


class Exploit:
    """Unpickling this runs a command: a loader that unpickles would leave the marker file behind."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def test_torchscript_and_torch_export_load_and_agree(tmp_path: Path) -> None:
    torch.manual_seed(0)
    module = Affine().eval()
    write(tmp_path / "ts", config("ts"), module=module)
    write(tmp_path / "ex", config("ex", "torch_export"), module=module)
    entries = {e.name: e for e in load_repository(tmp_path, CPU)}
    assert entries["ts"].error is None and entries["ex"].error is None
    x = torch.randn(5, 4)
    with torch.inference_mode():
        np.testing.assert_allclose(entries["ts"].module(x).numpy(), module(x).numpy(), rtol=1e-6)
        np.testing.assert_allclose(entries["ex"].module(x).numpy(), module(x).numpy(), rtol=1e-6)


def test_a_malicious_pickle_is_refused_and_never_executed(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    write(tmp_path / "evil", config("evil"), weights=pickle.dumps(Exploit(marker)))
    write(tmp_path / "zipped", config("zipped"), weights=b"")
    torch.save({"weights": Exploit(marker)}, tmp_path / "zipped" / "model.pt")  # a torch.save pickle archive
    write(tmp_path / "good", config("good"), module=Affine())
    entries = {e.name: e for e in load_repository(tmp_path, CPU)}
    assert entries["evil"].module is None and "could not be loaded as torchscript" in entries["evil"].error
    assert entries["zipped"].module is None and entries["zipped"].error
    assert not marker.exists()
    assert entries["good"].error is None  # the bad ones took nothing else down


def test_broken_models_are_reported_alone(tmp_path: Path) -> None:
    write(tmp_path / "good", config("good"), module=Affine())
    write(tmp_path / "noweights", config("noweights"))
    (tmp_path / "noweights" / "model.pt").unlink()
    write(tmp_path / "badconfig", {"name": "badconfig", "type": "audio"}, module=Affine())
    wrong = config("wrongshape")
    wrong["inputs"][0]["shape"] = [7]
    write(tmp_path / "wrongshape", wrong, module=Affine())
    entries = {e.name: e for e in load_repository(tmp_path, CPU)}
    assert entries["good"].error is None
    assert "is missing" in entries["noweights"].error
    assert "config.yaml is invalid" in entries["badconfig"].error
    assert "failed its warm-up call" in entries["wrongshape"].error


def test_specs_from_the_environment_override_config_files(tmp_path: Path) -> None:
    write(tmp_path / "m", config("m"), module=Affine())
    override = config("m")
    override["batching"] = {"maxBatchSize": 3}
    import json

    specs = specs_from_env({SPECS_ENV: json.dumps([override])})
    entries = load_repository(tmp_path, CPU, specs)
    assert entries[0].spec.batching.max_batch_size == 3


def test_a_whole_volume_mounted_per_model_is_searched_at_its_subpath(tmp_path: Path) -> None:
    """KServe mounts the root of `pvc://store/models/m` at <repo>/m: the files are at <repo>/m/models/m."""
    write(tmp_path / "m" / "models" / "m", config("m"), module=Affine())
    write(tmp_path / "m" / "models" / "other", config("other"), module=Affine())  # the rest of the volume
    import json

    subpaths = subpaths_from_env({SUBPATHS_ENV: json.dumps({"m": "models/m", "evil": "../../etc"})})
    assert subpaths == {"m": "models/m"}  # a path climbing out of the model's folder is ignored
    (entry,) = load_repository(tmp_path, CPU, subpaths=subpaths)
    assert entry.name == "m" and entry.error is None and entry.spec is not None and entry.spec.name == "m"
    # Storage that honours the path (files at <repo>/m itself) works with the same hint.
    write(tmp_path / "n", config("n"), module=Affine())
    entries = {e.name: e for e in load_repository(tmp_path, CPU, subpaths={"m": "models/m", "n": "models/n"})}
    assert entries["n"].error is None


def test_a_missing_repository_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="is not a directory"):
        load_repository(tmp_path / "absent", CPU)
