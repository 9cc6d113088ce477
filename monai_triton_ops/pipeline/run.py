"""The data flow, free of Holoscan: pre-transforms -> inferer(backend) -> post-transforms.

The operator calls ``run_inference``; tests call it directly. The backend is the MONAI predictor,
so every backend gets the same transforms, the same sliding window and the same stitching, and
switching backend cannot change the result beyond the model's own arithmetic.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from monai.inferers import SimpleInferer, SlidingWindowInferer

from ..backends.base import BaseBackend
from ..errors import ConfigError, InputDataError

logger = logging.getLogger(__name__)

Transform = Callable[[Any], Any]


@dataclass(frozen=True, kw_only=True)
class InferenceSettings:
    """How the image is fed to the model: whole (``simple``) or in overlapping patches.

    ``roi_size`` is the patch size in voxels (sliding window only), ``sw_batch_size`` how many
    patches go in one request, ``overlap`` the patch overlap fraction, ``mode`` the blending
    (``constant`` or ``gaussian``), ``progress`` a tqdm bar over the patches.
    """

    inferer: Literal["simple", "sliding_window"] = "sliding_window"
    roi_size: tuple[int, ...] | None = None
    sw_batch_size: int = 1
    overlap: float = 0.25
    mode: Literal["constant", "gaussian"] = "constant"
    progress: bool = False

    def __post_init__(self) -> None:
        if self.inferer not in ("simple", "sliding_window"):
            raise ConfigError(f"inferer must be 'simple' or 'sliding_window', got {self.inferer!r}")
        if self.inferer == "sliding_window":
            if not self.roi_size or any(int(s) < 1 for s in self.roi_size):
                raise ConfigError(f"sliding_window needs roi_size with positive sizes, got {self.roi_size!r}")
            object.__setattr__(self, "roi_size", tuple(int(s) for s in self.roi_size))
        if self.sw_batch_size < 1:
            raise ConfigError(f"sw_batch_size must be >= 1, got {self.sw_batch_size}")
        if not 0.0 <= self.overlap < 1.0:
            raise ConfigError(f"overlap must be in [0, 1), got {self.overlap}")
        if self.mode not in ("constant", "gaussian"):
            raise ConfigError(f"mode must be 'constant' or 'gaussian', got {self.mode!r}")


def run_inference(
    image: np.ndarray | torch.Tensor,
    backend: BaseBackend,
    settings: InferenceSettings,
    *,
    pre_transforms: Transform | None = None,
    post_transforms: Transform | None = None,
) -> torch.Tensor:
    """Segment one channel-first image ``(C, *spatial)`` and return the post-processed result.

    Raises ``InputDataError`` when the image's spatial rank is not the model's (a 2D image for a
    3D model); channel count and dtype are checked by the backend against its signature.
    """
    data = pre_transforms(image) if pre_transforms else image
    tensor = data if isinstance(data, torch.Tensor) else torch.as_tensor(np.asarray(data))
    check_spatial_rank(tensor, backend)
    batch = tensor.unsqueeze(0)
    logger.info("inferring %s image of shape %s with %r", settings.inferer, tuple(tensor.shape), backend)
    prediction = _inferer(settings)(batch, backend)
    if not isinstance(prediction, torch.Tensor):
        raise ConfigError("the inferer returned several outputs; pick one with the backend's output_name option")
    result = prediction[0]
    if isinstance(tensor, torch.Tensor) and hasattr(tensor, "meta") and not hasattr(result, "meta"):
        from monai.data import MetaTensor  # keep the affine for post-transforms that resample

        result = MetaTensor(result, meta=tensor.meta)
    return post_transforms(result) if post_transforms else result


def check_spatial_rank(tensor: torch.Tensor, backend: BaseBackend) -> None:
    """Fail early, with names, when the image rank does not fit the model's first input."""
    signature = backend.signature
    spec = signature.inputs[0]
    full = spec.full_shape(signature.max_batch_size)
    want = len(full) - 2  # minus batch and channel
    got = tensor.dim() - 1  # minus channel
    if got != want:
        raise InputDataError(
            f"model {signature.name!r} input {spec.name!r} expects {want}D images (shape {list(full)}), "
            f"got a {got}D image of shape {list(tensor.shape)} (channel first)"
        )


def _inferer(settings: InferenceSettings) -> SimpleInferer | SlidingWindowInferer:
    if settings.inferer == "simple":
        return SimpleInferer()
    return SlidingWindowInferer(
        roi_size=settings.roi_size or (),
        sw_batch_size=settings.sw_batch_size,
        overlap=settings.overlap,
        mode=settings.mode,
        progress=settings.progress,
    )
