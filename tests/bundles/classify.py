"""A 2D classification bundle in the model zoo's layout, and the bundle run by MONAI alone as the reference.

``classify_bundle(folder)`` is shaped like the zoo's ``breast_density_classification``: ``LoadImaged``,
``EnsureChannelFirstd(channel_dim=2)``, ``ScaleIntensityd``, ``Resized``; a ``SimpleInferer``; ``Activationsd``
with ``sigmoid``; its metadata declares the output as the zoo does (``type "image"``, ``num_channels 4``,
``spatial_shape [1, 4]``, ``channel_def`` A-D). The network is MONAI's ``DenseNet`` (torchvision does not run
here), tiny, with random weights. ``channels=1`` makes the grey-scale form a single-frame DICOM (MG) needs.

``monai_alone(bundle, files)`` runs the bundle's own ``evaluating`` item with ``monai.bundle.ConfigWorkflow``:
MONAI reads every file with the bundle's ``LoadImaged`` and runs pre-processing, network, inferer and
post-processing as the config says. Nothing of this project takes part.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from monai.networks.nets import DenseNet

CLASSES = ("A", "B", "C", "D")
SIZE = 32

DENSENET_DEF = {
    "_target_": "DenseNet",
    "spatial_dims": 2,
    "in_channels": 3,
    "out_channels": len(CLASSES),
    "init_features": 4,
    "growth_rate": 4,
    "block_config": [1, 1],
    "bn_size": 2,
}

CLASSIFY_CONFIG: dict[str, Any] = {
    "imports": ["$import torch"],
    "bundle_root": ".",
    "device": "$torch.device('cpu')",
    "network_def": DENSENET_DEF,
    "network": "$torch.jit.load(@bundle_root + '/models/model.ts').eval()",
    "preprocessing": {
        "_target_": "Compose",
        "transforms": [
            {"_target_": "LoadImaged", "keys": "image"},
            {"_target_": "EnsureChannelFirstd", "keys": "image", "channel_dim": 2},
            {"_target_": "ScaleIntensityd", "keys": "image", "minv": 0.0, "maxv": 1.0},
            {"_target_": "Resized", "keys": "image", "spatial_size": [SIZE, SIZE]},
        ],
    },
    "inferer": {"_target_": "SimpleInferer"},
    "postprocessing": {
        "_target_": "Compose",
        "transforms": [{"_target_": "Activationsd", "keys": "pred", "sigmoid": True}],
    },
    # MONAI alone (the zoo runs an ignite evaluator; this is the same chain without ignite): one score row per file
    "input_files": [],
    "evaluating": (
        "$[@postprocessing({'pred': @inferer(@preprocessing({'image': f})['image'][None].to(@device), @network)})"
        "['pred'] for f in @input_files]"
    ),
}


def classify_metadata(name: str = "tiny_density", channels: int = 3, **output: Any) -> dict[str, Any]:
    """The zoo's breast density ``network_data_format`` (output ``type "image"``, ``spatial_shape [1, 4]``)."""
    pred = {
        "type": "image",
        "format": "labels",
        "dtype": "float32",
        "value_range": [0, 1],
        "num_channels": len(CLASSES),
        "spatial_shape": [1, len(CLASSES)],
        "is_patch_data": False,
        "channel_def": {str(i): c for i, c in enumerate(CLASSES)},
        **output,
    }
    return {
        "schema": "https://github.com/Project-MONAI/MONAI-extra-test-data/releases/download/0.8.1/meta_schema_20220324.json",
        "version": "0.1.0",
        "name": name,
        "task": "test classification",
        "network_data_format": {
            "inputs": {
                "image": {
                    "type": "image",
                    "format": "magnitude",
                    "modality": "Mammogram",
                    "num_channels": channels,
                    "spatial_shape": [SIZE, SIZE],
                    "dtype": "float32",
                    "value_range": [0, 1],
                    "is_patch_data": False,
                    "channel_def": {"0": "image"},
                }
            },
            "outputs": {"pred": pred},
        },
    }


def classify_config(channels: int = 3) -> dict[str, Any]:
    return {**CLASSIFY_CONFIG, "network_def": {**DENSENET_DEF, "in_channels": channels}}


def densenet(definition: dict[str, Any], seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return DenseNet(**{k: v for k, v in definition.items() if k != "_target_"}).eval()


def classify_bundle(
    folder: Path, *, channels: int = 3, name: str = "tiny_density", seed: int = 0, **output: Any
) -> Path:
    """The bundle folder with ``models/model.ts`` (random weights from ``seed``); ``output`` changes the metadata."""
    config = classify_config(channels)
    (folder / "configs").mkdir(parents=True, exist_ok=True)
    (folder / "models").mkdir(exist_ok=True)
    (folder / "configs" / "inference.json").write_text(json.dumps(config, indent=1))
    (folder / "configs" / "metadata.json").write_text(json.dumps(classify_metadata(name, channels, **output), indent=1))
    torch.jit.script(densenet(config["network_def"], seed)).save(str(folder / "models" / "model.ts"))
    return folder


def png_images(folder: Path, count: int = 3, size: tuple[int, int] = (40, 36), seed: int = 3) -> list[Path]:
    """RGB PNG files of different content (so the scores differ between them)."""
    from PIL import Image as PilImage

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(count):
        pixels = rng.integers(0, 255, (*size, 3), dtype=np.uint8)
        pixels[: size[0] // (i + 2)] = 255 - 60 * i  # a bright band of a different height in each
        path = folder / f"image_{i}.png"
        PilImage.fromarray(pixels).save(path)
        paths.append(path)
    return paths


def monai_alone(bundle: Path, files: list[Path]) -> list[np.ndarray]:
    """The bundle run by ``monai.bundle.ConfigWorkflow`` on ``files``: one score vector per file."""
    from monai.bundle import ConfigWorkflow

    workflow = ConfigWorkflow(
        config_file=str(bundle / "configs" / "inference.json"),
        meta_file=str(bundle / "configs" / "metadata.json"),
        workflow_type=None,
        run_id="evaluating",
        bundle_root=str(bundle),
        input_files=[str(f) for f in files],
    )
    workflow.initialize()
    with torch.no_grad():
        rows = workflow.run()
    if len(rows) == 1 and isinstance(rows[0], list):  # ConfigWorkflow.run: the run item's value in a list
        rows = rows[0]
    return [np.asarray(row.detach().cpu().numpy(), dtype=np.float64).reshape(-1) for row in rows]
