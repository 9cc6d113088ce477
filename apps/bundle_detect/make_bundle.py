"""A small RetinaNet lung-nodule detection bundle in the model zoo's layout, and a CT volume to run it on.

Shaped like the zoo's ``lung_nodule_ct_detection`` (nothing can be downloaded here, and its backbone needs
torchvision, which does not run beside this CPU torch): MONAI's ``RetinaNet`` over a ResNet + FPN feature extractor
built from MONAI's own blocks (``scripts/backbone.py``), a ``RetinaNetDetector`` with anchors of three shapes on three
feature levels, set up by ``detector_ops`` (target keys, box selector, sliding window), a bundle-local inferer
(``scripts/detection_inferer.py``) that hands the detector the network it is given, and the zoo's post-processing
(boxes clipped to the image, to world coordinates, to centre/size form). The weights are random, with the
classification head's last layer drawn wider than RetinaNet's prior so that a few places score above the threshold.

The config also holds what running it with MONAI alone needs (``input_file``, ``initialize``, ``run``), so
``monai.bundle``'s ``ConfigWorkflow`` runs the same bundle as the reference:

    python apps/bundle_detect/make_bundle.py --out /tmp/bundles    # /tmp/bundles/tiny_lung_nodule_detection, ct.nii.gz
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

NAME = "tiny_lung_nodule_detection"

BACKBONE = '''"""A ResNet + FPN feature extractor for RetinaNet from MONAI's own blocks (torchvision-free)."""

from collections import OrderedDict

import torch
from monai.networks.blocks.feature_pyramid_network import FeaturePyramidNetwork, LastLevelMaxPool
from monai.networks.nets.resnet import ResNet


class ResNetFPN(torch.nn.Module):
    """The ResNet stem and first layers; an FPN over the ``returned_layers`` plus one pooled level."""

    def __init__(self, backbone: ResNet, returned_layers=(1, 2), out_channels: int = 8, spatial_dims: int = 3):
        super().__init__()
        self.stem = torch.nn.Sequential(backbone.conv1, backbone.bn1, backbone.act, backbone.maxpool)
        layers = [backbone.layer1, backbone.layer2, backbone.layer3, backbone.layer4]
        self.layers = torch.nn.ModuleList(layers[: max(returned_layers)])
        self.returned = [index - 1 for index in returned_layers]
        widths = [layer[-1].conv2.out_channels for layer in layers]
        self.fpn = FeaturePyramidNetwork(
            spatial_dims, [widths[i] for i in self.returned], out_channels, LastLevelMaxPool(spatial_dims)
        )
        self.out_channels = out_channels

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        x = self.stem(x)
        features: dict[str, torch.Tensor] = OrderedDict()
        for index, layer in enumerate(self.layers):
            x = layer(x)
            if index in self.returned:
                features[str(index)] = x
        return self.fpn(features)
'''

INFERER = '''"""The detector as a MONAI inferer: ``inferer(images, network)`` runs the detector with ``network``."""

import math

from monai.inferers import Inferer


class DetectionInferer(Inferer):
    """Hands the detector the network it is called with; uses the detector's sliding window (set by
    ``detector_ops``) only for images larger than the window, unless ``force_sliding_window``."""

    def __init__(self, detector, force_sliding_window: bool = False):
        super().__init__()
        self.detector = detector
        self.force_sliding_window = force_sliding_window
        window = getattr(detector.inferer, "roi_size", None)
        self.window_voxels = math.prod(window) if window is not None else None

    def __call__(self, inputs, network, *args, **kwargs):
        self.detector.network = network
        self.detector.training = network.training
        larger = self.window_voxels is not None and any(image[0].numel() >= self.window_voxels for image in inputs)
        return self.detector(inputs, *args, use_inferer=self.force_sliding_window or larger, **kwargs)
'''

CONFIG: dict[str, Any] = {
    "imports": ["$import torch"],
    "bundle_root": ".",
    "device": "$torch.device('cpu')",
    "image_key": "image",
    "spatial_dims": 3,
    "num_classes": 1,
    "size_divisible": [16, 16, 8],
    "infer_patch_size": [32, 32, 16],
    "score_thresh": 0.43,
    "anchor_generator": {
        "_target_": "monai.apps.detection.utils.anchor_utils.AnchorGeneratorWithAnchorShape",
        "feature_map_scales": [1, 2, 4],
        "base_anchor_shapes": [[6, 8, 4], [8, 6, 5], [10, 10, 6]],
    },
    "backbone": {
        "_target_": "monai.networks.nets.resnet.ResNet",
        "block": "basic",
        "layers": [1, 1, 1, 1],
        "block_inplanes": [4, 8, 16, 32],
        "spatial_dims": 3,
        "n_input_channels": 1,
        "conv1_t_stride": [2, 2, 1],
        "conv1_t_size": [7, 7, 7],
    },
    "feature_extractor": {
        "_target_": "scripts.backbone.ResNetFPN",
        "backbone": "@backbone",
        "returned_layers": [1, 2],
        "out_channels": 8,
    },
    "network_def": {
        "_target_": "RetinaNet",
        "spatial_dims": "@spatial_dims",
        "num_classes": "@num_classes",
        "num_anchors": 3,
        "feature_extractor": "@feature_extractor",
        "size_divisible": "@size_divisible",
        "use_list_output": False,
    },
    "network": "$@network_def.to(@device)",
    "detector": {
        "_target_": "RetinaNetDetector",
        "network": "@network",
        "anchor_generator": "@anchor_generator",
        "debug": False,
        "spatial_dims": "@spatial_dims",
        "num_classes": "@num_classes",
        "size_divisible": "@size_divisible",
    },
    "detector_ops": [
        "$@detector.set_target_keys(box_key='box', label_key='label')",
        "$@detector.set_box_selector_parameters(score_thresh=@score_thresh,topk_candidates_per_level=100,"
        "nms_thresh=0.22,detections_per_img=20)",
        "$@detector.set_sliding_window_inferer(roi_size=@infer_patch_size,overlap=0.25,sw_batch_size=1,"
        "mode='constant',device='cpu')",
    ],
    "preprocessing": {
        "_target_": "Compose",
        "transforms": [
            {"_target_": "LoadImaged", "keys": "@image_key"},
            {"_target_": "EnsureChannelFirstd", "keys": "@image_key"},
            {"_target_": "Orientationd", "keys": "@image_key", "axcodes": "RAS"},
            {
                "_target_": "ScaleIntensityRanged",
                "keys": "@image_key",
                "a_min": -1024.0,
                "a_max": 300.0,
                "b_min": 0.0,
                "b_max": 1.0,
                "clip": True,
            },
            {"_target_": "EnsureTyped", "keys": "@image_key"},
        ],
    },
    "inferer": {
        "_target_": "scripts.detection_inferer.DetectionInferer",
        "detector": "@detector",
        "force_sliding_window": False,
    },
    "postprocessing": {
        "_target_": "Compose",
        "transforms": [
            {
                "_target_": "ClipBoxToImaged",
                "box_keys": "box",
                "label_keys": "label",
                "box_ref_image_keys": "@image_key",
                "remove_empty": True,
            },
            {
                "_target_": "AffineBoxToWorldCoordinated",
                "box_keys": "box",
                "box_ref_image_keys": "@image_key",
                "affine_lps_to_ras": True,
            },
            {"_target_": "ConvertBoxModed", "box_keys": "box", "src_mode": "xyzxyz", "dst_mode": "cccwhd"},
            {"_target_": "DeleteItemsd", "keys": ["@image_key"]},
        ],
    },
    # Running the bundle with MONAI alone (monai.bundle ConfigWorkflow): the reference
    "input_file": "",
    "sample": "$@preprocessing({@image_key: @input_file})",
    "detections": "$@inferer(@sample[@image_key][None], @network)",
    "result": "$@postprocessing({**@detections[0], @image_key: @sample[@image_key]})",
    "initialize": [
        "$@network.load_state_dict(torch.load(@bundle_root + '/models/model.pt', weights_only=True))",
        "$@network.eval()",
        "$@detector_ops",
    ],
    "run": ["$@result"],
}

METADATA: dict[str, Any] = {
    "version": "0.1.0",
    "name": NAME,
    "task": "lung nodule detection (a tiny test model, random weights)",
    "network_data_format": {
        "inputs": {
            "image": {
                "type": "image",
                "format": "magnitude",
                "modality": "CT",
                "num_channels": 1,
                "spatial_shape": ["16*n", "16*n", "8*n"],
                "dtype": "float16",  # as the zoo's: it runs under amp on a GPU; the network takes float32 on a CPU
                "value_range": [0, 1],
                "is_patch_data": True,
                "channel_def": {"0": "image"},
            }
        },
        "outputs": {
            "pred": {
                "type": "object",
                "format": "dict",
                "dtype": "float16",
                "num_channels": 1,
                "spatial_shape": ["n", "n", "n"],
                "value_range": [-10000, 10000],
            }
        },
    },
}


def network(seed: int = 0) -> Any:
    """The bundle's RetinaNet built from ``CONFIG`` by MONAI, with random weights (``seed``)."""
    import sys

    import torch
    from monai.bundle import ConfigParser

    torch.manual_seed(seed)
    parser = ConfigParser({k: v for k, v in CONFIG.items() if k not in ("initialize", "run")})
    built = parser.get_parsed_content("network_def")
    with torch.no_grad():  # wider than RetinaNet's prior (every score near 0.01), so that a few places score high
        head = built.classification_head.cls_logits
        head.weight.normal_(0.0, 0.05, generator=torch.Generator().manual_seed(seed))
        head.bias.fill_(-2.0)
    for module in [m for m in sys.modules if m == "scripts" or m.startswith("scripts.")]:
        del sys.modules[module]  # another bundle's scripts/ must not be found as this one's
    return built.eval()


def make_bundle(out: Path, seed: int = 0, *, score_thresh: float | None = None) -> Path:
    """Write the bundle folder ``out/NAME`` (configs, scripts, models/model.pt); returns it."""
    import sys

    import torch

    folder = Path(out) / NAME
    for sub in ("configs", "models", "scripts"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    (folder / "scripts" / "__init__.py").write_text("")
    (folder / "scripts" / "backbone.py").write_text(BACKBONE)
    (folder / "scripts" / "detection_inferer.py").write_text(INFERER)
    config = dict(CONFIG) if score_thresh is None else {**CONFIG, "score_thresh": score_thresh}
    (folder / "configs" / "inference.json").write_text(json.dumps(config, indent=1))
    (folder / "configs" / "metadata.json").write_text(json.dumps(METADATA, indent=1))
    sys.path.insert(0, str(folder))
    try:
        net = network(seed)
    finally:
        sys.path.remove(str(folder))
    torch.save(net.state_dict(), folder / "models" / "model.pt")
    return folder


def ct_volume(shape: tuple[int, int, int] = (64, 64, 32), seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """A chest-CT-like volume (HU, air-filled lungs with a few round nodules) and its affine (0.7 x 0.7 x 1.25 mm)."""
    rng = np.random.default_rng(seed)
    volume = rng.normal(-800.0, 40.0, shape).astype(np.float32)
    grid = np.stack(np.meshgrid(*(np.arange(s) for s in shape), indexing="ij"), axis=-1)
    for _ in range(5):
        centre = rng.uniform(8, np.asarray(shape) - 8)
        radius = rng.uniform(2.5, 5.0)
        inside = np.linalg.norm((grid - centre) * np.array([1.0, 1.0, 1.8]), axis=-1) < radius
        volume[inside] = rng.normal(40.0, 20.0, int(inside.sum()))
    affine = np.diag([0.703125, 0.703125, 1.25, 1.0])
    affine[:3, 3] = [-22.0, -22.0, -20.0]
    return volume, affine


def write_volume(path: Path, seed: int = 3) -> Path:
    """``ct_volume`` as a NIfTI file."""
    import nibabel as nib

    volume, affine = ct_volume(seed=seed)
    nib.save(nib.Nifti1Image(volume, affine), str(path))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder to write the bundle and ct.nii.gz into")
    args = parser.parse_args()
    folder = make_bundle(args.out)
    write_volume(args.out / "ct.nii.gz")
    print(f"bundle: {folder}\nvolume: {args.out / 'ct.nii.gz'}")


if __name__ == "__main__":
    main()
