"""Train the sample app's GM/WM segmentation UNet on the ICBM152 T1 template, on CPU, in a few minutes.

The only labelled volume is the atlas itself, so the reported Dice is measured on the training volume (full
volume, sliding window, exactly as the app infers); it shows the pipeline works, not that it generalises.
The figures of the committed model are in ``README.md`` under "Model".

Usage (from the repository root)::

    .venv/bin/python apps/brain_tissue_seg/train.py            # -> model_repository/brain_tissue_seg/1/model.pt
    .venv/bin/python apps/brain_tissue_seg/train.py --steps 50 --out /tmp/model.pt   # quick smoke run
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from monai.data import save_net_with_metadata, set_track_meta
from monai.inferers import sliding_window_inference
from monai.losses import DiceCELoss
from monai.transforms import (
    Compose,
    RandCropByPosNegLabeld,
    RandFlipd,
    RandGaussianNoised,
    RandScaleIntensityd,
    RandShiftIntensityd,
)
from monai.transforms.utils import map_binary_to_indices
from monai.utils import set_determinism

try:  # imported as part of a package (tests) or run as a script from its folder (MONAI Deploy style)
    from . import atlas
    from .network import CHANNELS, NUM_RES_UNITS, SIZE_DIVISOR, STRIDES, build_network
    from .transforms import LABELS, NUM_CLASSES, ROI_SIZE, post_transforms, pre_transforms
except ImportError:
    import atlas
    from network import CHANNELS, NUM_RES_UNITS, SIZE_DIVISOR, STRIDES, build_network
    from transforms import LABELS, NUM_CLASSES, ROI_SIZE, post_transforms, pre_transforms

logger = logging.getLogger("brain_tissue_seg.train")

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO_ROOT / "model_repository" / "brain_tissue_seg" / "1" / "model.pt"
#: Sliding-window settings of the final evaluation; the MONAI Deploy ``MonaiSegInferenceOperator`` defaults.
SW_OVERLAP = 0.25
SW_BATCH_SIZE = 4
MODEL_VERSION = "0.1.0"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options; defaults are the settings of the committed model."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="TorchScript file to write (default: %(default)s)"
    )
    parser.add_argument("--steps", type=int, default=600, help="optimiser steps (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    parser.add_argument(
        "--crop", type=int, default=64, help="cubic training crop side, a multiple of 8 (default: %(default)s)"
    )
    parser.add_argument("--batch", type=int, default=2, help="crops per step (default: %(default)s)")
    parser.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.crop % SIZE_DIVISOR or not SIZE_DIVISOR <= args.crop <= min(ROI_SIZE):
        parser.error(f"--crop must be a multiple of {SIZE_DIVISOR} between {SIZE_DIVISOR} and {min(ROI_SIZE)}")
    if args.steps < 1 or args.batch < 1:
        parser.error("--steps and --batch must be positive")
    return args


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (MONAI's transforms get their own state in ``augmentation``)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    set_determinism(seed=seed)


def load_training_data() -> dict[str, Any]:
    """The pre-processed T1 and its labels as (1, X, Y, Z) tensors, plus crop-centre indices.

    The indices are computed once: letting the crop transform search 8.7 M voxels every step costs more
    than the step itself.
    """
    t1 = np.asarray(atlas.load_t1().dataobj, dtype=np.float32)[None]
    labels = np.asarray(atlas.load_labels().dataobj, dtype=np.uint8)[None]
    image = pre_transforms()(t1)
    label = torch.as_tensor(labels, dtype=torch.float32)
    fg, bg = map_binary_to_indices(label[0] > 0)
    logger.info(
        "T1 %s, labels %s: %d GM, %d WM voxels",
        tuple(t1.shape),
        tuple(labels.shape),
        (labels == 1).sum(),
        (labels == 2).sum(),
    )
    return {"image": torch.as_tensor(image), "label": label, "fg": fg, "bg": bg}


def augmentation(crop: int, batch: int, seed: int) -> Compose:
    """Random crops (3 of 4 centred in the brain), flips on every axis, and intensity scale/shift/noise.

    Intensity changes act on the normalised image, as the app sees it, and stand in for scanner contrast.
    """
    keys = ["image", "label"]
    aug = Compose(
        [
            RandCropByPosNegLabeld(
                keys,
                label_key="label",
                spatial_size=(crop,) * 3,
                pos=3,
                neg=1,
                num_samples=batch,
                fg_indices_key="fg",
                bg_indices_key="bg",
            ),
            RandFlipd(keys, prob=0.5, spatial_axis=0),
            RandFlipd(keys, prob=0.5, spatial_axis=1),
            RandFlipd(keys, prob=0.5, spatial_axis=2),
            RandScaleIntensityd("image", factors=0.15, prob=0.5),
            RandShiftIntensityd("image", offsets=0.15, prob=0.5),
            RandGaussianNoised("image", prob=0.3, std=0.05),
        ]
    )
    aug.set_random_state(seed=seed)
    return aug


def sample_batch(data: dict[str, Any], aug: Compose) -> tuple[torch.Tensor, torch.Tensor]:
    """One augmented batch: images (B, 1, c, c, c) and labels (B, 1, c, c, c)."""
    crops = aug(data)
    images = torch.stack([torch.as_tensor(c["image"]) for c in crops])
    labels = torch.stack([torch.as_tensor(c["label"]) for c in crops])
    return images, labels


def train(net: torch.nn.Module, data: dict[str, Any], args: argparse.Namespace) -> float:
    """Optimise ``net`` in place (Adam, cosine decay, Dice + cross-entropy); returns the last smoothed loss."""
    aug = augmentation(args.crop, args.batch, args.seed)
    loss_fn = DiceCELoss(to_onehot_y=True, softmax=True)
    optimiser = torch.optim.Adam(net.parameters(), lr=args.lr)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimiser, max_lr=args.lr, total_steps=args.steps, pct_start=0.05)
    net.train()
    smoothed, start = float("nan"), time.monotonic()
    for step in range(1, args.steps + 1):
        images, labels = sample_batch(data, aug)
        optimiser.zero_grad(set_to_none=True)
        loss = loss_fn(net(images), labels)
        loss.backward()
        optimiser.step()
        schedule.step()
        smoothed = loss.item() if step == 1 else 0.95 * smoothed + 0.05 * loss.item()
        if step % 50 == 0 or step == args.steps:
            logger.info("step %d/%d loss %.4f (%.0f s)", step, args.steps, smoothed, time.monotonic() - start)
    return smoothed


def evaluate(net: torch.nn.Module, data: dict[str, Any]) -> dict[str, float]:
    """Dice per tissue on the FULL volume, inferred window by window as the app does."""
    with torch.inference_mode():
        logits = sliding_window_inference(
            data["image"][None], roi_size=ROI_SIZE, sw_batch_size=SW_BATCH_SIZE, predictor=net, overlap=SW_OVERLAP
        )
    pred = np.asarray(post_transforms()(logits[0]))[0]
    ref = data["label"][0].numpy().astype(np.uint8)
    return {name: atlas.dice(pred, ref, label) for label, name in LABELS.items()}


def network_data_format() -> dict[str, Any]:
    """MONAI bundle ``network_data_format``: what the TorchScript takes and returns."""
    spatial = [f"{SIZE_DIVISOR}*n"] * 3
    return {
        "inputs": {
            "image": {
                "type": "image",
                "format": "magnitude",
                "modality": "MR",
                "num_channels": 1,
                "spatial_shape": spatial,
                "dtype": "float32",
                "value_range": [],
                "is_patch_data": True,
                "channel_def": {"0": "T1"},
            }
        },
        "outputs": {
            "pred": {
                "type": "image",
                "format": "segmentation",
                "num_channels": NUM_CLASSES,
                "spatial_shape": spatial,
                "dtype": "float32",
                "value_range": [0, 1, 2],
                "is_patch_data": True,
                "channel_def": {"0": "background", **{str(k): v for k, v in LABELS.items()}},
            }
        },
    }


def metadata(args: argparse.Namespace, scores: dict[str, float], wall_s: float) -> dict[str, Any]:
    """Everything a reader of ``model.pt`` needs: I/O format, provenance, licence and training figures."""
    return {
        "name": "brain_tissue_seg",
        "version": MODEL_VERSION,
        "description": (
            "Grey/white matter segmentation of a skull-stripped 1 mm T1 MRI (0 background, 1 grey matter, "
            "2 white matter). Input: the T1 z-scored over its non-zero voxels (transforms.pre_transforms); "
            f"infer with a sliding window of {list(ROI_SIZE)}, overlap {SW_OVERLAP}; argmax over the 3 channels. "
            "Trained on the single MNI ICBM152 2009a template only: a demonstration model, not for clinical use."
        ),
        "authors": ["monai_triton_ops developers"],
        "license": (
            "Weights derived from the MNI ICBM152 2009 templates, which may be used, copied and distributed for "
            "any purpose, without fee, provided the copyright notice is kept: " + atlas.ATLAS_COPYRIGHT
        ),
        "copyright": atlas.ATLAS_COPYRIGHT,
        "intended_use": "demonstration and testing of the MONAI Deploy / Triton pipeline; not for clinical use",
        "network_data_format": network_data_format(),
        "inference": {"roi_size": list(ROI_SIZE), "overlap": SW_OVERLAP, "sw_batch_size": SW_BATCH_SIZE},
        "network": {
            "class": "monai.networks.nets.UNet",
            "channels": list(CHANNELS),
            "strides": list(STRIDES),
            "num_res_units": NUM_RES_UNITS,
            "norm": "instance",
        },
        "training": {
            "data": "MNI ICBM152 2009a T1 template (nilearn), labels = argmax{1-gm-wm, gm, wm} inside the head",
            "steps": args.steps,
            "seed": args.seed,
            "crop": args.crop,
            "batch": args.batch,
            "lr": args.lr,
            "loss": "DiceCELoss",
            "optimizer": "Adam + OneCycleLR",
            "wall_time_s": round(wall_s, 1),
            "dice_full_volume": {name: round(score, 4) for name, score in scores.items()},
        },
    }


def save_model(net: torch.jit.ScriptModule, out: Path, meta: dict[str, Any]) -> int:
    """Write the TorchScript with metadata to ``out`` atomically; returns its size in bytes.

    ``save_net_with_metadata`` appends ``.ts`` to a prefix, so it writes a temporary file in the target folder,
    which is then renamed over ``out``: readers never see a half-written model.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    prefix = out.parent / f"_tmp_{out.stem}_{os.getpid()}"
    written = Path(f"{prefix}.ts")
    try:
        save_net_with_metadata(net, str(prefix), meta_values=meta)
        written.replace(out)
    finally:
        written.unlink(missing_ok=True)
    return out.stat().st_size


def main(argv: Sequence[str] | None = None) -> int:
    """Train, evaluate on the full volume, save; prints the figures to record in README.md."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    start = time.monotonic()
    torch.set_num_threads(2)
    seed_everything(args.seed)
    set_track_meta(False)  # plain tensors: the metadata is not needed and slows every transform
    data = load_training_data()
    net = build_network(in_channels=1, out_channels=NUM_CLASSES)
    train(net, data, args)
    scripted = torch.jit.script(net.eval())
    scores = evaluate(scripted, data)  # the scripted module is the one that gets saved
    wall_s = time.monotonic() - start
    size = save_model(scripted, args.out, metadata(args, scores, wall_s))
    dice_text = ", ".join(f"{name} {score:.4f}" for name, score in scores.items())
    print(f"Dice on the full volume: {dice_text}")
    print(f"saved {args.out} ({size} bytes = {size / 1e6:.2f} MB); wall time {wall_s:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
