"""App SDK image arrays <-> MONAI channel-first tensors, without Holoscan.

The App SDK keeps volumes in DICOM order ``(D, H, W)`` (slices first, an optional channel last),
while MONAI and the affine in the image metadata use ``(W, H, D)`` with the channel first. The
App SDK's own operators transpose with ``.T``; we do the same so that our output lines up with
its DICOM SEG writer and with ``nifti_affine_transform``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from monai.data import MetaTensor

from ..errors import InputDataError

#: Metadata keys that hold the voxel-to-RAS affine, in order of preference.
AFFINE_KEYS = ("affine", "nifti_affine_transform")


def to_channel_first(array: np.ndarray, metadata: Mapping[str, Any], *, spatial_rank: int, model: str) -> MetaTensor:
    """``(D, H, W)`` or ``(D, H, W, C)`` -> ``(C, W, H, D)`` MetaTensor carrying the affine."""
    data = np.asarray(array)
    if data.size == 0:
        raise InputDataError(f"model {model!r}: the input image is empty (shape {list(data.shape)})")
    if data.ndim == spatial_rank:
        data = data.T[np.newaxis]
    elif data.ndim == spatial_rank + 1:
        data = data.T  # the trailing channel becomes the leading one
    else:
        raise InputDataError(
            f"model {model!r} expects {spatial_rank}D images, got an image of shape {list(data.shape)} "
            f"({data.ndim} dims)"
        )
    affine = affine_of(metadata)
    tensor = torch.from_numpy(np.ascontiguousarray(data))
    return MetaTensor(tensor, affine=None if affine is None else torch.as_tensor(affine, dtype=torch.float64))


def from_channel_first(result: torch.Tensor | np.ndarray) -> np.ndarray:
    """``(C, W, H, D)`` -> ``(D, H, W)`` when one channel, else ``(D, H, W, C)``: the input's order."""
    data = result.detach().cpu().numpy() if isinstance(result, torch.Tensor) else np.asarray(result)
    if data.shape[0] == 1:
        data = data[0]
    return np.ascontiguousarray(data.T)


def affine_of(metadata: Mapping[str, Any]) -> np.ndarray | None:
    """The 4x4 voxel-to-RAS affine from App SDK image metadata, if present."""
    for key in AFFINE_KEYS:
        value = metadata.get(key)
        if value is not None:
            affine = np.asarray(value, dtype=np.float64)
            if affine.shape == (4, 4):
                return affine
    return None
