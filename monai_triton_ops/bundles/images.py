"""App SDK ``Image`` <-> the ``MetaTensor`` a bundle's transforms get, as the App SDK's bundle operator does it.

In: an ``Image`` from ``DICOMSeriesToVolumeOperator`` (array ``(D, H, W)``, metadata with
``row_pixel_spacing``, ``col_pixel_spacing``, ``depth_pixel_spacing``, ``nifti_affine_transform``) becomes
the array ``(W, H, D)`` with ``spacing``, ``affine``, ``original_affine``, ``spatial_shape`` and
``original_channel_dim = "no_channel"``; an ``Image`` that already carries ``spacing`` and
``original_affine`` (our NIfTI loader's), or no DICOM metadata, is taken as it is.

Non-square pixels: DICOM's Pixel Spacing (0028,0030) is ``[row spacing, column spacing]`` (between rows, then
between columns), and the position of pixel (column ``i``, row ``j``) is ``S + X * col_spacing * i + Y *
row_spacing * j`` with ``X``, ``Y`` the row and column direction cosines (PS3.3 C.7.6.2.1.1). The App SDK's
``DICOMSeriesToVolumeOperator`` multiplies ``X`` by the row spacing and ``Y`` by the column spacing, and its
bundle operator sets ``spacing = [row, col, depth]`` for the axes ``(i, j, k)``: both swapped. With square
pixels (nearly every CT and MR series) that changes nothing; with non-square ones the image is stretched
along the wrong axis. Here, for an image that came from DICOM (its metadata has the series'
``SeriesInstanceUID``), the affine's first two columns and the spacing are put right, so such a series gives
different (correct) results from the App SDK's (docs/bundles.md, "Differences"). Our NIfTI loader's ``Image``
(``row_pixel_spacing`` is its first axis' spacing, matching its affine) is converted as the App SDK does.

Out: a label map ``(1, W, H, D)`` becomes an ``Image`` ``(D, H, W)`` of uint8 carrying the pre-processed
input's metadata; a 2D ``(1, W, H)`` one stays ``(W, H)``.

A single-instance series (every MG, CR or DX image) arrives without ``nifti_affine_transform``: the App SDK
computes none for one slice. It is placed at the origin with its pixel spacing (``single_instance_affine``).
"""

from __future__ import annotations

import logging
from copy import deepcopy
from typing import Any

import numpy as np
import torch
from monai.data import MetaTensor
from monai.deploy.core import Image
from monai.utils import MetaKeys

from ..errors import InputDataError

logger = logging.getLogger(__name__)

#: A key of every ``Image`` that ``DICOMSeriesToVolumeOperator`` makes (the series' properties).
DICOM_SERIES_KEY = "SeriesInstanceUID"


def image_to_tensor(image: Image, name: str) -> MetaTensor:
    """The App SDK operator's ``_receive_input`` for an ``Image``: the array and metadata as one MetaTensor."""
    array, metadata = _convert(image)
    if not isinstance(metadata, dict):
        raise InputDataError(f"input {name!r}: the image's metadata must be a dict, got {type(metadata).__name__}")
    value = torch.from_numpy(np.ascontiguousarray(array)) if isinstance(array, np.ndarray) else torch.as_tensor(array)
    tensor: MetaTensor = MetaTensor.ensure_torch_and_prune_meta(value, dict(metadata))
    return tensor


def array_to_tensor(array: np.ndarray, spec: dict[str, Any], name: str) -> MetaTensor:
    """A bare array ``(W, H, D)`` or channel-last ``(W, H, D, C)`` / ``(W, H, C)``, as the App SDK takes one."""
    if array.ndim not in (3, 4):
        raise InputDataError(f"input {name!r}: expected (W, H, D) or (W, H, D, C), got shape {list(array.shape)}")
    channels = spec.get("num_channels")
    spatial = len(spec.get("spatial_shape") or ()) or None
    channel_last = array.ndim == 4 or (array.ndim == 3 and spatial == 2)
    if channel_last and channels is not None and array.shape[-1] != channels:
        raise InputDataError(
            f"input {name!r} has {array.shape[-1]} channels (last axis) but the bundle expects {channels}"
        )
    metadata = {MetaKeys.ORIGINAL_CHANNEL_DIM: -1 if channel_last else "no_channel"}
    tensor: MetaTensor = MetaTensor.ensure_torch_and_prune_meta(torch.from_numpy(np.ascontiguousarray(array)), metadata)
    return tensor


def tensor_to_image(value: Any, metadata: dict[str, Any]) -> Image:
    """The App SDK operator's ``_send_output`` for an ``Image`` output: squeeze the channel, swap back, uint8."""
    array = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
    squeezed = np.squeeze(array, 0)
    out = squeezed.astype(np.uint8) if squeezed.ndim == 2 else np.swapaxes(squeezed, 0, 2).astype(np.uint8)
    return Image(out, metadata=metadata)


def _convert(image: Image) -> tuple[Any, Any]:
    metadata = image.metadata()
    if not metadata or ("spacing" in metadata and "original_affine" in metadata) or "row_pixel_spacing" not in metadata:
        return image.asnumpy(), metadata
    return _from_dicom(image)


def _from_dicom(image: Image) -> tuple[np.ndarray, dict[str, Any]]:
    """``DICOMSeriesToVolumeOperator``'s metadata -> MONAI's (the App SDK's ``_convert_from_image_dicom_source``)."""
    source = image.metadata()
    meta = deepcopy(source)
    row, col = float(source["row_pixel_spacing"]), float(source["col_pixel_spacing"])
    depth = float(source.get("depth_pixel_spacing") or 1.0)
    affine = source.get("nifti_affine_transform")
    if affine is None:  # one instance (MG, CR, DX): no second slice to place the volume in space with
        if DICOM_SERIES_KEY in source:  # the column spacing along i, as below
            row, col = col, row
        affine = single_instance_affine(image, (row, col, depth))
    else:
        affine = np.asarray(affine, dtype=np.float64)
        if DICOM_SERIES_KEY in source:  # DICOMSeriesToVolumeOperator's: row and column spacing put right
            affine, row, col = dicom_pixel_spacing(affine, row, col), col, row
    meta["spacing"] = np.asarray([row, col, depth])  # for the axes (i, j, k)
    meta[MetaKeys.ORIGINAL_AFFINE] = affine
    meta[MetaKeys.AFFINE] = meta[MetaKeys.ORIGINAL_AFFINE].copy()
    converted = np.swapaxes(image.asnumpy(), 0, 2)
    meta[MetaKeys.SPATIAL_SHAPE] = np.asarray(converted.shape)
    meta[MetaKeys.ORIGINAL_CHANNEL_DIM] = "no_channel"
    return converted, meta


def single_instance_affine(image: Image, spacing: tuple[float, float, float]) -> np.ndarray:
    """The affine of a single-instance series (``DICOMSeriesToVolumeOperator`` computes none for one slice).

    The spacings of the axes ``(i, j, k)`` on the diagonal: the grid the image's pixels are on,
    at the origin. The App SDK's classifier app runs such an image without any affine; a bundle whose
    transforms only resize and scale it (a classifier's) gets the same result either way.
    """
    if np.asarray(image.asnumpy()).ndim != 3 or np.asarray(image.asnumpy()).shape[0] != 1:
        raise InputDataError(
            f"a DICOM image of shape {list(np.shape(image.asnumpy()))} has no nifti_affine_transform in its "
            "metadata; only a single-instance series (shape [1, rows, columns]) can be placed without one"
        )
    logger.info("a single-instance DICOM series: its affine is its pixel spacing, at the origin")
    return np.diag([*spacing, 1.0])


def dicom_pixel_spacing(affine: np.ndarray, row_spacing: float, col_spacing: float) -> np.ndarray:
    """The App SDK's affine with the in-plane spacings where DICOM puts them (column ``i`` by the column spacing).

    Its column 0 holds ``X * row_spacing`` and column 1 ``Y * col_spacing``; scaling each by the ratio gives
    ``X * col_spacing`` and ``Y * row_spacing``. Square pixels: the affine unchanged.
    """
    fixed = affine.copy()
    if row_spacing > 0 and col_spacing > 0 and row_spacing != col_spacing:
        fixed[:3, 0] *= col_spacing / row_spacing
        fixed[:3, 1] *= row_spacing / col_spacing
    return fixed
