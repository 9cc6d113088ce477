"""Bundles in the model zoo's layout, written by the tests themselves (nothing can be downloaded here).

``unet_bundle(folder, form)``: a 3D UNet segmentation bundle like the zoo's spleen CT one (orientation,
resampling, intensity window; ``SlidingWindowInferer`` in gaussian mode; softmax, ``Invertd``, argmax,
``SaveImaged``), in the three forms a user has: ``ts`` (``models/model.ts``), ``pt`` (``network_def`` +
``models/model.pt``) and ``archive`` (one ``.ts`` with the configs embedded by ``monai.bundle.ckpt_export``).
``rgb_bundle(folder)``: a 2D RGB bundle with a ``SimpleInferer`` (as the zoo's endoscopy and pathology ones).
The images that go with them carry the metadata the App SDK's loaders give.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from monai.deploy.core import Image
from monai.networks.nets import UNet

UNET_DEF = {
    "_target_": "UNet",
    "spatial_dims": 3,
    "in_channels": 1,
    "out_channels": 3,
    "channels": [4, 8],
    "strides": [2],
    "num_res_units": 1,
}
RGB_DEF = {**UNET_DEF, "spatial_dims": 2, "in_channels": 3, "out_channels": 2}

UNET_CONFIG: dict[str, Any] = {
    "imports": ["$import torch"],
    "bundle_root": ".",
    "device": "$torch.device('cpu')",
    "network_def": UNET_DEF,
    "network": "$@network_def.to(@device)",
    "preprocessing": {
        "_target_": "Compose",
        "transforms": [
            {"_target_": "LoadImaged", "keys": "image"},
            {"_target_": "EnsureChannelFirstd", "keys": "image"},
            {"_target_": "Orientationd", "keys": "image", "axcodes": "RAS", "labels": None},
            {"_target_": "Spacingd", "keys": "image", "pixdim": [1.5, 1.5, 2.0], "mode": "bilinear"},
            {
                "_target_": "ScaleIntensityRanged",
                "keys": "image",
                "a_min": -57,
                "a_max": 164,
                "b_min": 0.0,
                "b_max": 1.0,
                "clip": True,
            },
            {"_target_": "EnsureTyped", "keys": "image"},
        ],
    },
    "inferer": {
        "_target_": "SlidingWindowInferer",
        "roi_size": [16, 16, 16],
        "sw_batch_size": 4,
        "overlap": 0.5,
        "mode": "gaussian",
        "sigma_scale": 0.125,
        "padding_mode": "constant",
    },
    "postprocessing": {
        "_target_": "Compose",
        "transforms": [
            {"_target_": "Activationsd", "keys": "pred", "softmax": True},
            {
                "_target_": "Invertd",
                "keys": "pred",
                "transform": "@preprocessing",
                "orig_keys": "image",
                "meta_key_postfix": "meta_dict",
                "nearest_interp": False,
                "to_tensor": True,
            },
            {"_target_": "AsDiscreted", "keys": "pred", "argmax": True},
            {"_target_": "SaveImaged", "keys": "pred", "output_dir": "$@bundle_root + '/eval'", "resample": False},
        ],
    },
}

RGB_CONFIG: dict[str, Any] = {
    "imports": ["$import torch"],
    "network_def": RGB_DEF,
    "preprocessing": {
        "_target_": "Compose",
        "transforms": [
            {"_target_": "LoadImaged", "keys": "image", "image_only": False},
            {"_target_": "EnsureChannelFirstd", "keys": "image", "channel_dim": -1},
            {"_target_": "ScaleIntensityd", "keys": "image"},
            {"_target_": "EnsureTyped", "keys": "image", "dtype": "$torch.float32"},
        ],
    },
    "inferer": {"_target_": "SimpleInferer"},
    "postprocessing": {
        "_target_": "Compose",
        "transforms": [
            {"_target_": "Activationsd", "keys": "pred", "softmax": True},
            {"_target_": "AsDiscreted", "keys": "pred", "argmax": True},
        ],
    },
}


def metadata(name: str, channels_in: int, channels_out: int, spatial: int) -> dict[str, Any]:
    """A zoo-style ``metadata.json`` with ``network_data_format``."""
    shape = ["16*n"] * spatial
    return {
        "schema": "https://github.com/Project-MONAI/MONAI-extra-test-data/releases/download/0.8.1/meta_schema_20220324.json",
        "version": "0.1.0",
        "name": name,
        "task": "test segmentation",
        "network_data_format": {
            "inputs": {
                "image": {
                    "type": "image",
                    "format": "magnitude",
                    "modality": "CT",
                    "num_channels": channels_in,
                    "spatial_shape": shape,
                    "dtype": "float32",
                    "value_range": [0, 1],
                    "is_patch_data": spatial == 3,
                    "channel_def": {"0": "image"},
                }
            },
            "outputs": {
                "pred": {
                    "type": "image",
                    "format": "segmentation",
                    "num_channels": channels_out,
                    "spatial_shape": shape,
                    "dtype": "float32",
                    "value_range": [0, 1],
                    "is_patch_data": spatial == 3,
                    "channel_def": {str(i): f"label{i}" for i in range(channels_out)},
                }
            },
        },
    }


def network(definition: dict[str, Any], seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    args = {k: v for k, v in definition.items() if k != "_target_"}
    return UNet(**args).eval()


def write_bundle(
    folder: Path, config: dict[str, Any], meta: dict[str, Any], *, form: str = "ts", seed: int = 0
) -> Path:
    """Write a bundle folder (``ts`` or ``pt``), or a single ``.ts`` (``archive``); returns what to give the reader.

    ``seed`` initialises the network's weights (folds of one bundle differ only in it)."""
    (folder / "configs").mkdir(parents=True, exist_ok=True)
    (folder / "models").mkdir(exist_ok=True)
    (folder / "configs" / "inference.json").write_text(json.dumps(config, indent=1))
    (folder / "configs" / "metadata.json").write_text(json.dumps(meta, indent=1))
    net = network(config["network_def"], seed)
    torch.save(net.state_dict(), folder / "models" / "model.pt")
    if form == "pt":
        return folder
    if form == "ts":
        torch.jit.script(net).save(str(folder / "models" / "model.ts"))
        (folder / "models" / "model.pt").unlink()
        return folder
    from monai.bundle import ckpt_export

    target = folder.parent / f"{folder.name}.ts"
    ckpt_export(
        net_id="network_def",
        filepath=str(target),
        ckpt_file=str(folder / "models" / "model.pt"),
        meta_file=str(folder / "configs" / "metadata.json"),
        config_file=str(folder / "configs" / "inference.json"),
        bundle_root=str(folder),
    )
    return target


def unet_bundle(folder: Path, form: str = "ts", **changes: Any) -> Path:
    return write_bundle(folder, {**UNET_CONFIG, **changes}, metadata("tiny_spleen", 1, 3, 3), form=form)


#: Folds of one bundle, for ensembles: the 3D UNet bundle with ``tests/operators/test_ensemble.py``'s network (no
#: residual units), so that seed ``n`` gives that file's ``unet(n)``, and a post-processing linear in the prediction
#: (``Invertd`` with bilinear interpolation only: every channel's score, back on the input's grid), so that the
#: post-processed mean of the folds is the mean of each fold post-processed alone (read it from an ``np.ndarray``
#: port: an ``Image`` port takes labels). ``LABELS_POST`` is the usual one (softmax, ``Invertd``, argmax).
FOLD_CONFIG: dict[str, Any] = {
    **UNET_CONFIG,
    "network_def": {**UNET_DEF, "num_res_units": 0},
    "postprocessing": {
        "_target_": "Compose",
        "transforms": [t for t in UNET_CONFIG["postprocessing"]["transforms"] if t["_target_"] == "Invertd"],
    },
}
LABELS_POST = UNET_CONFIG["postprocessing"]


def resampled(pixdim: list[float]) -> dict[str, Any]:
    """``UNET_CONFIG``'s pre-processing with another ``Spacingd`` (item ``preprocessing#transforms#3#pixdim``)."""
    transforms = [dict(t) for t in UNET_CONFIG["preprocessing"]["transforms"]]
    transforms[3]["pixdim"] = pixdim
    return {**UNET_CONFIG["preprocessing"], "transforms": transforms}


def fold_bundle(folder: Path, seed: int, channels: int = 3, **changes: Any) -> Path:
    """One fold: ``FOLD_CONFIG`` (with ``changes``) and weights from ``seed``; ``channels`` output channels."""
    config = {**FOLD_CONFIG, **changes}
    config["network_def"] = {**config["network_def"], "out_channels": channels}
    return write_bundle(folder, config, metadata("tiny_folds", 1, channels, 3), seed=seed)


def rgb_bundle(folder: Path, form: str = "ts") -> Path:
    return write_bundle(folder, RGB_CONFIG, metadata("tiny_endoscopy", 3, 2, 2), form=form)


def ct_image(shape: tuple[int, int, int] = (20, 26, 30), seed: int = 1) -> Image:
    """A CT-like ``(D, H, W)`` image with the metadata ``DICOMSeriesToVolumeOperator`` gives."""
    rng = np.random.default_rng(seed)
    data = (rng.standard_normal(shape) * 60 + 50).astype(np.float32)
    data[:, : shape[1] // 2] += 80  # structure, so the labels are not all one class
    affine = np.array([[-1.2, 0, 0, 10.0], [0, -1.2, 0, 20.0], [0, 0, 2.5, -5.0], [0, 0, 0, 1]])
    return Image(
        data,
        metadata={
            "SeriesInstanceUID": "1.2.3.4",
            "nifti_affine_transform": affine,
            "row_pixel_spacing": 1.2,
            "col_pixel_spacing": 1.2,
            "depth_pixel_spacing": 2.5,
        },
    )


def rgb_image(shape: tuple[int, int] = (48, 40), seed: int = 2) -> Image:
    """An RGB ``(W, H, 3)`` frame, channel last, as a video or PNG loader hands it on."""
    rng = np.random.default_rng(seed)
    data = rng.uniform(0, 255, (*shape, 3)).astype(np.float32)
    data[: shape[0] // 2] *= 0.3
    return Image(data, metadata={"original_channel_dim": -1, "spatial_shape": np.asarray(shape)})


@contextmanager
def private_bundle_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A cache of Triton models built from bundles (``MONAI_TRITON_CACHE``) of its own for the with-block: a test
    module's bundles neither reuse nor leave entries in the user's or another module's cache."""
    folder = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MONAI_TRITON_CACHE", str(folder))
        yield folder
