"""A picture of a result: axial, coronal and sagittal slices of the input with the labels overlaid, and a legend.

Pillow only (no matplotlib): a PNG of three panels needs no plotting library, Pillow is already
installed with the App SDK's imaging stack, and it adds no import time or font cache to a run.

The volume is brought to RAS order with its affine (``nibabel.orientations``), so the panels look the
same for NIfTI and DICOM input: axial from above (anterior up), coronal and sagittal with superior up,
each panel through the labels' centre (the volume's centre without labels), one voxel per pixel
scaled by the voxel spacing. Intensities are windowed to the 1st-99th percentile. Labels get
distinct colours from ``PALETTE`` in label order, drawn at ``ALPHA`` over the grey image; the legend
below names each label present.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from nibabel.orientations import apply_orientation, axcodes2ornt, io_orientation, ornt_transform

from .pipeline.image import affine_of

logger = logging.getLogger(__name__)

#: Label colours (RGB), in label order: distinct, and none of them grey.
PALETTE: tuple[tuple[int, int, int], ...] = (
    (230, 25, 75),
    (60, 180, 75),
    (0, 130, 200),
    (255, 225, 25),
    (245, 130, 48),
    (145, 30, 180),
    (70, 240, 240),
    (240, 50, 230),
)
ALPHA = 0.45
LEGEND_ROW = 18
MARGIN = 8


def colour_of(index: int) -> tuple[int, int, int]:
    """The colour of the ``index``-th label present (0-based), cycling through ``PALETTE``."""
    return PALETTE[index % len(PALETTE)]


def render_preview(
    image: np.ndarray,
    labels: np.ndarray,
    affine: np.ndarray | None = None,
    *,
    label_names: Mapping[int, str] | None = None,
) -> Any:
    """A ``PIL.Image`` (RGB) of three panels; ``image`` and ``labels`` in the App SDK's ``(D, H, W)`` order."""
    from PIL import Image as PILImage

    volume, label_map, spacing = _to_ras(image, labels, affine)
    present = [int(v) for v in np.unique(label_map) if v != 0]
    centre = _centre(label_map)
    panels = [_panel(volume, label_map, present, axis, centre[axis], spacing) for axis in (2, 1, 0)]
    width = sum(p.width for p in panels) + MARGIN * (len(panels) + 1)
    height = max(p.height for p in panels) + 2 * MARGIN + LEGEND_ROW * max(1, len(present))
    canvas = PILImage.new("RGB", (width, height), (0, 0, 0))
    x = MARGIN
    for panel in panels:
        canvas.paste(panel, (x, MARGIN))
        x += panel.width + MARGIN
    _legend(canvas, present, label_names or {}, top=max(p.height for p in panels) + MARGIN + 4)
    return canvas


def write_preview(image: Any, labels: np.ndarray, path: Path, *, label_names: Mapping[int, str] | None = None) -> Path:
    """Render ``image`` (an App SDK ``Image``) with ``labels`` and write ``path`` atomically."""
    array = np.asarray(image.asnumpy())
    affine = affine_of(image.metadata() or {})
    picture = render_preview(_first_channel(array), _first_channel(np.asarray(labels)), affine, label_names=label_names)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".png")
    os.close(fd)
    os.chmod(tmp, 0o644)
    try:
        picture.save(tmp, format="PNG")
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    logger.info("wrote %s (%dx%d)", path, picture.width, picture.height)
    return path


def _first_channel(array: np.ndarray) -> np.ndarray:
    """``(D, H, W, C)`` -> ``(D, H, W)``: the first channel of a multi-channel image."""
    return array[..., 0] if array.ndim == 4 else array


def _to_ras(
    image: np.ndarray, labels: np.ndarray, affine: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, tuple[float, float, float]]:
    """``(D, H, W)`` arrays -> ``(X, Y, Z)`` in RAS order, with the voxel spacing along each axis."""
    if image.shape != labels.shape:
        raise ValueError(
            f"the image {list(image.shape)} and the labels {list(labels.shape)} differ in shape (post-transforms "
            "that resample need an Invertd back to the input's grid)"
        )
    volume, label_map = image.T.astype(np.float32), labels.T
    if affine is None:
        return volume, label_map, (1.0, 1.0, 1.0)
    transform = ornt_transform(io_orientation(affine), axcodes2ornt(("R", "A", "S")))  # type: ignore[no-untyped-call]
    spacing = np.sqrt((affine[:3, :3] ** 2).sum(axis=0))
    order = [int(axis) for axis in transform[:, 0]]
    ras_spacing = (float(spacing[order.index(0)]), float(spacing[order.index(1)]), float(spacing[order.index(2)]))
    oriented = apply_orientation(volume, transform)  # type: ignore[no-untyped-call]
    oriented_labels = apply_orientation(label_map, transform)  # type: ignore[no-untyped-call]
    return np.asarray(oriented), np.asarray(oriented_labels), ras_spacing


def _centre(label_map: np.ndarray) -> tuple[int, int, int]:
    found = np.argwhere(label_map != 0)
    if found.size == 0:
        return (label_map.shape[0] // 2, label_map.shape[1] // 2, label_map.shape[2] // 2)
    middle = np.round(found.mean(axis=0)).astype(int)
    return (int(middle[0]), int(middle[1]), int(middle[2]))


def _panel(
    volume: np.ndarray, labels: np.ndarray, present: list[int], axis: int, index: int, spacing: tuple[float, ...]
) -> Any:
    """One slice across ``axis`` (2 axial, 1 coronal, 0 sagittal), oriented for display, labels blended in."""
    from PIL import Image as PILImage

    grey, label_slice = np.take(volume, index, axis=axis), np.take(labels, index, axis=axis)
    # The slice's remaining axes are (first, second) in RAS order; display second upwards, first rightwards.
    grey, label_slice = np.flipud(grey.T), np.flipud(label_slice.T)
    rgb = np.repeat(_window(grey)[..., None], 3, axis=2).astype(np.float32)
    for i, value in enumerate(present):
        mask = label_slice == value
        rgb[mask] = (1 - ALPHA) * rgb[mask] + ALPHA * np.asarray(colour_of(i), dtype=np.float32)
    picture = PILImage.fromarray(np.clip(np.round(rgb), 0, 255).astype(np.uint8), mode="RGB")
    across, up = [s for i, s in enumerate(spacing) if i != axis]
    size = (max(1, round(picture.width * across)), max(1, round(picture.height * up)))
    return picture.resize(size, PILImage.Resampling.NEAREST) if size != picture.size else picture


def _window(grey: np.ndarray) -> np.ndarray:
    finite = grey[np.isfinite(grey)]
    if finite.size == 0:
        return np.zeros(grey.shape, dtype=np.float32)
    low, high = np.percentile(finite, [1, 99])
    if high <= low:
        high = low + 1.0
    scaled = (np.nan_to_num(grey, nan=low) - low) / (high - low) * 255.0
    return np.asarray(np.clip(scaled, 0, 255), dtype=np.float32)


def _legend(canvas: Any, present: list[int], names: Mapping[int, str], *, top: int) -> None:
    from PIL import ImageDraw

    draw = ImageDraw.Draw(canvas)
    if not present:
        draw.text((MARGIN, top), "no labels", fill=(255, 255, 255))
        return
    for i, value in enumerate(present):
        y = top + i * LEGEND_ROW
        draw.rectangle((MARGIN, y, MARGIN + 12, y + 12), fill=colour_of(i))
        draw.text((MARGIN + 18, y), f"{value}: {names.get(value, f'label {value}')}", fill=(255, 255, 255))
