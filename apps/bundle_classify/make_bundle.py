"""A small classification MONAI Bundle in the model zoo's layout, and sample images for it (nothing downloaded).

    <out>/tiny_shapes/configs/inference.json   the zoo's 2D classification chain: LoadImaged, EnsureChannelFirstd,
                                               ScaleIntensityd, Resized; SimpleInferer; Activationsd(sigmoid)
    <out>/tiny_shapes/configs/metadata.json    network_data_format: an RGB image in, 4 class scores out
                                               (spatial_shape [1, 4], as the zoo writes them), class names in
                                               channel_def (the zoo's classification_template's classes)
    <out>/tiny_shapes/models/model.ts          MONAI's DenseNet (2D, tiny, fixed random weights: seed 0)
    <out>/shapes/*.png                         four 64x64 RGB pictures: a circle, a triangle, a rectangle, nothing

The weights are not trained: the bundle shows where each step runs and that every backend gives the same scores,
not a classifier to trust. ``apps/bundle_classify`` runs it; ``monai-triton repo build`` serves it.

    .venv/bin/python apps/bundle_classify/make_bundle.py --out data/bundles
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

NAME = "tiny_shapes"
CLASSES = ("background", "circle", "triangle", "rectangle")
SIZE = 64
NETWORK: dict[str, Any] = {
    "_target_": "DenseNet",
    "spatial_dims": 2,
    "in_channels": 3,
    "out_channels": len(CLASSES),
    "init_features": 8,
    "growth_rate": 8,
    "block_config": [2, 2],
}
CONFIG: dict[str, Any] = {
    "imports": ["$import torch"],
    "bundle_root": ".",
    "device": "$torch.device('cpu')",
    "network_def": NETWORK,
    "network": "$torch.jit.load(@bundle_root + '/models/model.ts').to(@device).eval()",
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
}


def metadata() -> dict[str, Any]:
    return {
        "version": "0.1.0",
        "name": NAME,
        "task": "shape classification (demo; untrained weights)",
        "network_data_format": {
            "inputs": {
                "image": {"type": "image", "format": "RGB", "num_channels": 3, "spatial_shape": [SIZE, SIZE],
                          "dtype": "float32", "value_range": [0, 1], "is_patch_data": False,
                          "channel_def": {"0": "R", "1": "G", "2": "B"}},
            },
            "outputs": {
                "pred": {"type": "probabilities", "format": "classes", "num_channels": len(CLASSES),
                         "spatial_shape": [1, len(CLASSES)], "dtype": "float32", "value_range": [0, 1],
                         "is_patch_data": False, "channel_def": {str(i): c for i, c in enumerate(CLASSES)}},
            },
        },
    }  # fmt: skip


def make_bundle(out: Path) -> Path:
    """Write the bundle folder ``out/tiny_shapes``; returns it."""
    import torch
    from monai.networks.nets import DenseNet

    folder = out / NAME
    (folder / "configs").mkdir(parents=True, exist_ok=True)
    (folder / "models").mkdir(exist_ok=True)
    (folder / "configs" / "inference.json").write_text(json.dumps(CONFIG, indent=2) + "\n", encoding="utf-8")
    (folder / "configs" / "metadata.json").write_text(json.dumps(metadata(), indent=2) + "\n", encoding="utf-8")
    torch.manual_seed(0)
    network = DenseNet(**{k: v for k, v in NETWORK.items() if k != "_target_"}).eval()
    torch.jit.script(network).save(str(folder / "models" / "model.ts"))
    return folder


def make_images(out: Path) -> Path:
    """Four RGB PNG pictures, one per class, in ``out/shapes``; returns the folder."""
    from PIL import Image, ImageDraw

    folder = out / "shapes"
    folder.mkdir(parents=True, exist_ok=True)
    draw_shape = {
        "circle": lambda d: d.ellipse((12, 12, 52, 52), fill=(230, 80, 40)),
        "triangle": lambda d: d.polygon([(32, 8), (56, 54), (8, 54)], fill=(40, 160, 220)),
        "rectangle": lambda d: d.rectangle((10, 20, 54, 44), fill=(60, 200, 90)),
        "background": lambda d: None,
    }
    noise = np.random.default_rng(0)
    for name, draw in draw_shape.items():
        picture = Image.fromarray(noise.integers(0, 40, (SIZE, SIZE, 3), dtype=np.uint8))
        draw(ImageDraw.Draw(picture))
        picture.save(folder / f"{name}.png")
    return folder


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("data/bundles"), help="folder to write the bundle into")
    out = parser.parse_args(argv).out
    print(f"wrote {make_bundle(out)} and {make_images(out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
