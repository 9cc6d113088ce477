"""Pre- and post-processing shared by ``train.py`` and the app, so that the two can never drift apart.

Both work on channel-first ARRAYS (no dictionaries, no file loading): the app gets its volume from the
DICOM or NIfTI loader, training from ``atlas.load_t1()``, and each wraps it as a (1, X, Y, Z) tensor first.
"""

from __future__ import annotations

import torch
from monai.transforms import AsDiscrete, CastToType, Compose, EnsureType, NormalizeIntensity

#: Sliding-window patch size used at inference (and the largest training crop); a multiple of 8, as the
#: UNet in ``network.py`` halves the grid three times.
ROI_SIZE: tuple[int, int, int] = (96, 96, 96)
#: Foreground labels of the output map (0 is background).
LABELS: dict[int, str] = {1: "grey matter", 2: "white matter"}
#: Output channels of the network: background, grey matter, white matter.
NUM_CLASSES = 3


def pre_transforms() -> Compose:
    """Raw T1 (1, X, Y, Z), any real dtype -> float32 z-scored over the non-zero (in-head) voxels.

    Only non-zero voxels are normalised, so the skull-stripped background stays exactly 0 and the
    intensity scale of the scanner (or of the DICOM rescale) does not matter.
    """
    return Compose(
        [
            EnsureType(data_type="tensor", dtype=torch.float32),
            NormalizeIntensity(nonzero=True, channel_wise=True),
            CastToType(dtype=torch.float32),
        ]
    )


def post_transforms() -> Compose:
    """Logits (NUM_CLASSES, X, Y, Z) -> uint8 label map (1, X, Y, Z) with values 0, 1 and 2."""
    return Compose([AsDiscrete(argmax=True), CastToType(dtype=torch.uint8)])
