"""A 3D bundle whose network returns a dict of two heads, through a sliding window, in the model zoo's layout.

Shaped like the zoo's multi-head bundles (``pathology_nuclei_segmentation_classification``): the network
(``scripts/heads.py``, the bundle's own class, as ``network_def`` + ``models/model.pt``) returns
``{"seg": logits, "dist": map}``; MONAI's ``SlidingWindowInferer`` stitches both; the post-processing flattens the
prediction's heads (``FlattenSubKeysd`` on ``pred``, as MONAI's engines hand a dict prediction on), then softmax
and argmax on ``seg``. The config also runs the bundle with MONAI alone (``monai.bundle.ConfigWorkflow``: items
``input_file``, ``initialize``, ``run``): the reference. ``detection_maker()`` loads the detection bundle's maker
(``apps/bundle_detect/make_bundle.py``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

NAME = "tiny_two_heads"
ROOT = Path(__file__).resolve().parents[2]

HEADS = '''"""A small 3D network with two heads: class logits and a distance-like map."""

import torch


class TwoHeads(torch.nn.Module):
    def __init__(self, in_channels: int = 1, features: int = 4, classes: int = 3):
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Conv3d(in_channels, features, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.Conv3d(features, features, 3, padding=1),
            torch.nn.ReLU(),
        )
        self.seg = torch.nn.Conv3d(features, classes, 1)
        self.dist = torch.nn.Conv3d(features, 1, 1)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        features = self.body(x)
        return {"seg": self.seg(features), "dist": torch.tanh(self.dist(features))}
'''

CONFIG: dict[str, Any] = {
    "imports": ["$import torch", "$import monai"],
    "bundle_root": ".",
    "device": "$torch.device('cpu')",
    "network_def": {"_target_": "scripts.heads.TwoHeads", "in_channels": 1, "features": 4, "classes": 3},
    "network": "$@network_def.to(@device)",
    "preprocessing": {
        "_target_": "Compose",
        "transforms": [
            {"_target_": "LoadImaged", "keys": "image"},
            {"_target_": "EnsureChannelFirstd", "keys": "image"},
            {"_target_": "ScaleIntensityd", "keys": "image"},
            {"_target_": "EnsureTyped", "keys": "image"},
        ],
    },
    "inferer": {
        "_target_": "SlidingWindowInferer",
        "roi_size": [16, 16, 16],
        "sw_batch_size": 2,
        "overlap": 0.25,
        "mode": "gaussian",
    },
    "postprocessing": {
        "_target_": "Compose",
        "transforms": [
            {"_target_": "FlattenSubKeysd", "keys": "pred", "sub_keys": ["seg", "dist"], "delete_keys": True},
            {"_target_": "Activationsd", "keys": "seg", "softmax": True},
            {"_target_": "AsDiscreted", "keys": "seg", "argmax": True},
        ],
    },
    # Running the bundle with MONAI alone (monai.bundle ConfigWorkflow): the reference
    "input_file": "",
    "sample": "$@preprocessing({'image': @input_file})",
    "prediction": "$@inferer(@sample['image'][None], @network)",
    "result": "$@postprocessing({'pred': monai.data.decollate_batch(@prediction)[0], 'image': @sample['image']})",
    "initialize": [
        "$@network.load_state_dict(torch.load(@bundle_root + '/models/model.pt', weights_only=True))",
        "$@network.eval()",
    ],
    "run": ["$@result"],
}


def metadata() -> dict[str, Any]:
    image = {"type": "image", "num_channels": 1, "spatial_shape": ["16*n"] * 3, "dtype": "float32"}
    return {
        "version": "0.1.0",
        "name": NAME,
        "task": "test: two heads through a sliding window",
        "network_data_format": {
            "inputs": {"image": {**image, "format": "magnitude", "modality": "CT", "value_range": [0, 1]}},
            "outputs": {
                "seg": {**image, "format": "segmentation", "channel_def": {"0": "labels"}},
                "dist": {**image, "format": "distance"},
            },
        },
    }


def heads_bundle(folder: Path, seed: int = 0, **changes: Any) -> Path:
    """Write the bundle (``configs/``, ``scripts/heads.py``, ``models/model.pt``); ``changes`` replace config items."""
    for sub in ("configs", "models", "scripts"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    (folder / "scripts" / "__init__.py").write_text("")
    (folder / "scripts" / "heads.py").write_text(HEADS)
    (folder / "configs" / "inference.json").write_text(json.dumps({**CONFIG, **changes}, indent=1))
    (folder / "configs" / "metadata.json").write_text(json.dumps(metadata(), indent=1))
    namespace: dict[str, Any] = {}
    exec(compile(HEADS, str(folder / "scripts" / "heads.py"), "exec"), namespace)  # noqa: S102 -- the class alone
    torch.manual_seed(seed)
    network = namespace["TwoHeads"]()
    with torch.no_grad():  # class logits that follow the image, so the labels are not one class
        network.seg.weight.mul_(8.0)
        network.seg.bias.zero_()
    torch.save(network.state_dict(), folder / "models" / "model.pt")
    return folder


def volume(path: Path, shape: tuple[int, int, int] = (28, 24, 20), seed: int = 5) -> Path:
    """A NIfTI volume with structure (a bright block), 1.5 mm voxels."""
    import nibabel as nib

    rng = np.random.default_rng(seed)
    data = rng.normal(0.0, 1.0, shape).astype(np.float32)
    data[4:16, 6:18, 5:15] += 3.0
    nib.save(nib.Nifti1Image(data, np.diag([1.5, 1.5, 1.5, 1.0])), str(path))
    return path


def run_with_monai(bundle: Path, input_file: Path) -> dict[str, Any]:
    """The bundle run by MONAI alone (``ConfigWorkflow``: ``initialize``, then ``run``): its post-processed result.

    The bundle folder goes first on ``sys.path``, as when ``python -m monai.bundle run`` runs in it.
    """
    from monai.bundle import ConfigWorkflow

    for module in [m for m in sys.modules if m == "scripts" or m.startswith("scripts.")]:
        del sys.modules[module]
    sys.path.insert(0, str(bundle))
    try:
        workflow = ConfigWorkflow(
            config_file=str(bundle / "configs" / "inference.json"),
            meta_file=str(bundle / "configs" / "metadata.json"),
            workflow_type=None,
            bundle_root=str(bundle),
            input_file=str(input_file),
        )
        workflow.initialize()
        with torch.no_grad():
            workflow.run()
        return dict(workflow.parser.get_parsed_content("result"))
    finally:
        sys.path.remove(str(bundle))


def detection_maker() -> Any:
    """``apps/bundle_detect/make_bundle.py`` (the app's and the demo's detection bundle), loaded by path."""
    import importlib.util

    path = ROOT / "apps" / "bundle_detect" / "make_bundle.py"
    spec = importlib.util.spec_from_file_location("bundle_detect_maker", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
