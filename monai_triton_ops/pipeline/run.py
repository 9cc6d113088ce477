"""The data flow, free of Holoscan: pre-transforms -> inferer(backend) -> post-transforms.

The operator calls ``run_inference``; tests call it directly. The backend is the MONAI predictor,
so every backend gets the same transforms, the same sliding window and the same stitching, and
switching backend cannot change the result beyond the model's own arithmetic.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal

import numpy as np
import torch
from monai.inferers import SimpleInferer, SlidingWindowInferer

from ..backends.base import BaseBackend
from ..errors import ConfigError, InputDataError
from .predictor import Predictor

logger = logging.getLogger(__name__)

Transform = Callable[[Any], Any]


@dataclass(frozen=True, kw_only=True)
class InferenceSettings:
    """How the image is fed to the model: whole (``simple``) or in overlapping patches.

    ``inferer`` defaults to ``sliding_window`` when ``roi_size`` (the patch size in voxels) is
    given, else ``simple``. ``sw_batch_size`` is how many patches the inferer stacks per predictor
    call, ``request_batch_size`` how many of those go in one request (default: the model's
    ``max_batch_size``, or all of them when it has none; the requests of one call are in flight
    together), ``overlap`` the patch overlap fraction, ``mode`` the blending (``constant`` or
    ``gaussian``), ``progress`` a tqdm bar over the patches. ``from_metadata`` reads the model's
    own ``inference`` block, so an app overrides only what it must.
    """

    inferer: Literal["simple", "sliding_window"] | None = None
    roi_size: tuple[int, ...] | None = None
    sw_batch_size: int = 1
    request_batch_size: int | None = None
    overlap: float = 0.25
    mode: Literal["constant", "gaussian"] = "constant"
    progress: bool = False

    def __post_init__(self) -> None:
        if self.inferer is None:
            object.__setattr__(self, "inferer", "sliding_window" if self.roi_size else "simple")
        if self.inferer not in ("simple", "sliding_window"):
            raise ConfigError(f"inferer must be 'simple' or 'sliding_window', got {self.inferer!r}")
        if self.inferer == "sliding_window":
            if not self.roi_size or any(int(s) < 1 for s in self.roi_size):
                raise ConfigError(f"sliding_window needs roi_size with positive sizes, got {self.roi_size!r}")
            object.__setattr__(self, "roi_size", tuple(int(s) for s in self.roi_size))
        if self.sw_batch_size < 1:
            raise ConfigError(f"sw_batch_size must be >= 1, got {self.sw_batch_size}")
        if self.request_batch_size is not None and self.request_batch_size < 1:
            raise ConfigError(f"request_batch_size must be >= 1 or None, got {self.request_batch_size}")
        if not 0.0 <= self.overlap < 1.0:
            raise ConfigError(f"overlap must be in [0, 1), got {self.overlap}")
        if self.mode not in ("constant", "gaussian"):
            raise ConfigError(f"mode must be 'constant' or 'gaussian', got {self.mode!r}")

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any], **overrides: Any) -> InferenceSettings:
        """Settings from MONAI metadata's ``inference`` block (``roi_size``, ``sw_batch_size``,
        ``overlap``, ``mode``), then ``overrides``; no block means ``simple`` unless overridden.
        """
        block = metadata.get("inference") or {}
        if not isinstance(block, Mapping):
            raise ConfigError(f"model metadata 'inference' must be an object, got {type(block).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ConfigError(f"InferenceSettings has no field(s) {unknown}; fields: {sorted(known)}")
        taken = {key: block[key] for key in _METADATA_KEYS if key in block}
        if "roi_size" in taken:
            taken["roi_size"] = tuple(int(s) for s in taken["roi_size"])
        return cls(**{**taken, **overrides})


#: The keys of a MONAI metadata ``inference`` block that map onto ``InferenceSettings``.
_METADATA_KEYS = ("roi_size", "sw_batch_size", "overlap", "mode")


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
    prediction = predict(batch, backend, settings)
    if not isinstance(prediction, torch.Tensor):
        raise ConfigError("the inferer returned several outputs; pick one with the backend's output_name option")
    result = prediction[0]
    if isinstance(tensor, torch.Tensor) and hasattr(tensor, "meta") and not hasattr(result, "meta"):
        from monai.data import MetaTensor  # keep the affine for post-transforms that resample

        result = MetaTensor(result, meta=tensor.meta)
    return post_transforms(result) if post_transforms else result


def predict(batch: torch.Tensor, backend: BaseBackend, settings: InferenceSettings) -> Any:
    """The inferer over the backend: here, window by window, or on the server for a whole-volume model.

    A whole-volume model (``mode=volume`` on a remote backend) gets the image once with the settings as
    request parameters and runs the same inferer beside the server (``pipeline/volume.py``).
    """
    from .volume import infer_volume, volume_spec

    spec = volume_spec(backend)
    if spec is not None:
        return infer_volume(batch, backend, settings, spec)
    return make_inferer(settings)(batch, Predictor(backend, request_batch_size=settings.request_batch_size))


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


def make_inferer(settings: InferenceSettings) -> SimpleInferer | SlidingWindowInferer:
    if settings.inferer == "simple":
        return SimpleInferer()
    return SlidingWindowInferer(
        roi_size=settings.roi_size or (),
        sw_batch_size=settings.sw_batch_size,
        overlap=settings.overlap,
        mode=settings.mode,
        progress=settings.progress,
    )
