"""The data flow, free of Holoscan: pre-transforms -> inferer(backend) -> post-transforms.

The operator calls ``run_inference``; tests call it directly. The backend is the MONAI predictor,
so every backend gets the same transforms, the same sliding window and the same stitching, and
switching backend cannot change the result beyond the model's own arithmetic.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from monai.inferers import SimpleInferer, SlidingWindowInferer

from ..backends.base import BaseBackend
from ..errors import ConfigError, InputDataError
from .ensemble import EnsemblePredictor
from .predictor import Predictor
from .settings import InferenceSettings as InferenceSettings  # re-exported: benchmarks import it from here

logger = logging.getLogger(__name__)

Transform = Callable[[Any], Any]


def run_inference(
    image: np.ndarray | torch.Tensor,
    backend: BaseBackend,
    settings: InferenceSettings,
    *,
    pre_transforms: Transform | None = None,
    post_transforms: Transform | None = None,
    predictor: Predictor | EnsemblePredictor | None = None,
) -> torch.Tensor:
    """Segment one channel-first image ``(C, *spatial)`` and return the post-processed result.

    ``predictor`` replaces the backend's own (``Predictor(backend)``) under the inferer: an
    ``EnsemblePredictor`` over several members, whose first is ``backend``.

    Raises ``InputDataError`` when the image's spatial rank is not the model's (a 2D image for a
    3D model); channel count and dtype are checked by the backend against its signature.
    """
    data = pre_transforms(image) if pre_transforms else image
    tensor = data if isinstance(data, torch.Tensor) else torch.as_tensor(np.asarray(data))
    check_spatial_rank(tensor, backend)
    batch = tensor.unsqueeze(0)
    logger.info("inferring %s image of shape %s with %r", settings.inferer, tuple(tensor.shape), backend)
    prediction = predict(batch, backend, settings, predictor)
    if not isinstance(prediction, torch.Tensor):
        raise ConfigError("the inferer returned several outputs; pick one with the backend's output_name option")
    result = prediction[0]
    if isinstance(tensor, torch.Tensor) and hasattr(tensor, "meta") and not hasattr(result, "meta"):
        from monai.data import MetaTensor  # keep the affine for post-transforms that resample

        result = MetaTensor(result, meta=tensor.meta)
    return post_transforms(result) if post_transforms else result


def predict(
    batch: torch.Tensor,
    backend: BaseBackend,
    settings: InferenceSettings,
    predictor: Predictor | EnsemblePredictor | None = None,
) -> Any:
    """The inferer over the backend: here, window by window, or on the server for a whole-volume model.

    A whole-volume model (``mode=volume`` on a remote backend) gets the image once with the settings as
    request parameters and runs the same inferer beside the server (``pipeline/volume.py``).
    """
    from .volume import infer_volume, volume_spec

    if predictor is not None:
        return make_inferer(settings)(batch, predictor)
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
        sigma_scale=settings.sigma_scale,
        padding_mode=settings.padding_mode,
        cval=settings.cval,
        progress=settings.progress,
    )
