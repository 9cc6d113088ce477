"""Checks on the image itself: what would silently spoil a result, and errors that name the image.

A NaN or Inf voxel survives every transform and spreads: a z-score over a volume with one NaN is
NaN everywhere, and the labels change without an error. So non-finite voxels are refused by
default, with how many there are and where; ``allow=True`` (``--allow-non-finite``) keeps them.

Inside a sliding window the backend only sees patches, so a shape error names a patch. The
operator wraps inference in ``image_context`` to add the image's own shape to such errors.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from ..errors import InferenceError, InferenceTimeoutError, InputDataError, InputValidationError

logger = logging.getLogger(__name__)


def check_finite(image: torch.Tensor | np.ndarray, *, model: str, allow: bool = False) -> int:
    """Raise ``InputDataError`` when the channel-first ``image`` holds NaN or Inf; returns their count.

    With ``allow`` the count is logged as a warning and the image passes unchanged.
    """
    tensor = torch.as_tensor(image) if isinstance(image, np.ndarray) else image.as_subclass(torch.Tensor)
    if not (tensor.is_floating_point() or tensor.is_complex()):
        return 0
    bad = ~torch.isfinite(tensor)
    count = int(bad.sum())
    if count == 0:
        return 0
    text = _describe(tensor, bad, count, model)
    if allow:
        logger.warning("%s; kept because non-finite voxels are allowed", text)
        return count
    raise InputDataError(f"{text}; fix the image, or pass --allow-non-finite to run on it anyway")


def _describe(tensor: torch.Tensor, bad: torch.Tensor, count: int, model: str) -> str:
    nans = int(torch.isnan(tensor).sum())
    flat = int(torch.argmax(bad.flatten().to(torch.uint8)))
    first = [int(i) for i in np.unravel_index(flat, tuple(bad.shape))]
    box = " x ".join(f"{lo}..{hi}" for lo, hi in _extent(bad)[1:])
    return (
        f"model {model!r}: the input image has {count} non-finite voxel(s) ({nans} NaN, {count - nans} Inf) "
        f"of {tensor.numel()} (shape {list(tensor.shape)}, channel first); first at channel {first[0]}, voxel "
        f"{tuple(first[1:])}, all within voxels {box}"
    )


def _extent(mask: torch.Tensor) -> list[tuple[int, int]]:
    """First and last index along each axis where ``mask`` holds a True (without listing every voxel)."""
    extent = []
    for axis in range(mask.dim()):
        others = [d for d in range(mask.dim()) if d != axis]
        hits = torch.nonzero(mask.any(dim=others) if others else mask).flatten()
        extent.append((int(hits[0]), int(hits[-1])))
    return extent


@contextmanager
def image_context(image: Any, settings: Any, *, model: str) -> Iterator[None]:
    """Re-raise input and model errors with the shape of the whole image and of what each request carries."""
    try:
        yield
    except (InputValidationError, InferenceError) as exc:
        if isinstance(exc, InferenceTimeoutError):
            raise
        raise type(exc)(f"{exc}; {describe_request(image, settings)}") from exc


def describe_request(image: Any, settings: Any) -> str:
    """``"the image is [1, 40, 48, 32] (channel first), sent in patches of [32, 32, 32], 4 per request"``."""
    shape = list(getattr(image, "shape", ()))
    text = f"the image is {shape} (channel first, before pre-transforms)"
    if getattr(settings, "inferer", None) == "sliding_window":
        roi = list(getattr(settings, "roi_size", None) or ())
        per = getattr(settings, "sw_batch_size", 1)
        return f"{text}, sent in sliding-window patches of {roi}, up to {per} per request"
    return f"{text}, sent whole in one request"
