"""Volume mode in the data flow: the whole pre-processed image goes to the server once, the labels come back.

A backend whose model is a whole-volume model (the remote backend with ``mode=volume`` opens
``<name>_volume``, ``repository/volume.py``) gets the image in one request, with the inferer settings
as Triton request parameters, and the sliding window runs on the server. What the post-transforms
receive has the shape window mode gives them, ``(C, *spatial)``, so an app's chain runs unchanged:

- ``volume_output=scores``: the network's output blended over the volume: exactly window mode's;
- ``volume_output=labels`` (default): the server's argmax (uint8, 1 byte a voxel on the wire), handed
  on one-hot over the network's ``C`` channels, so the usual chains (``Activations(softmax)``,
  ``AsDiscrete(argmax=True)``) give the server's labels. A chain that needs real scores (thresholds,
  resampling before the argmax as ``Invertd`` with bilinear interpolation does) asks for ``scores``.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from ..backends.base import BaseBackend
from ..backends.requests import Parameter
from ..errors import ConfigError, InputDataError
from ..signature import dtype_to_torch
from ..volume_spec import WRAP_COMMAND, VolumeSpec
from .settings import DEFAULT_SIGMA_SCALE, InferenceSettings

logger = logging.getLogger(__name__)


def volume_spec(backend: BaseBackend) -> VolumeSpec | None:
    """What the backend's model wraps when it is a whole-volume model; ``None`` for any other model."""
    return VolumeSpec.of(backend.signature.metadata)


def request_parameters(settings: InferenceSettings) -> dict[str, Parameter]:
    """The settings as the whole-volume model's request parameters (``runner/volume.py`` reads them)."""
    parameters: dict[str, Parameter] = {
        "inferer": str(settings.inferer),
        "sw_batch_size": str(settings.sw_batch_size),
        "overlap": repr(float(settings.overlap)),
        "blend_mode": settings.mode,
    }
    if settings.roi_size:
        parameters["roi_size"] = ",".join(str(s) for s in settings.roi_size)
    if settings.request_batch_size is not None:
        parameters["request_batch_size"] = str(settings.request_batch_size)
    return parameters | window_weights(settings)


def window_weights(settings: InferenceSettings) -> dict[str, Parameter]:
    """``sigma_scale``, ``padding_mode`` and ``cval`` where they differ from MONAI's defaults, which the server
    uses for what a request leaves out; so a volume model wrapped before they travelled serves the rest as before."""
    parameters: dict[str, Parameter] = {}
    sigma = settings.sigma_scale if isinstance(settings.sigma_scale, tuple) else (settings.sigma_scale,)
    if any(float(s) != DEFAULT_SIGMA_SCALE for s in sigma):
        parameters["sigma_scale"] = ",".join(repr(float(s)) for s in sigma)
    if settings.padding_mode != "constant":
        parameters["padding_mode"] = settings.padding_mode
    if float(settings.cval) != 0.0:
        parameters["cval"] = repr(float(settings.cval))
    return parameters


def check_volume_size(batch: torch.Tensor, backend: BaseBackend, spec: VolumeSpec) -> None:
    """Refuse a volume over the server's limit before sending it (the server would refuse it too)."""
    nbytes = batch.numel() * batch.element_size()
    if nbytes > spec.limit_bytes():
        command = WRAP_COMMAND.format(name=spec.network)
        raise InputDataError(
            f"model {backend.model_name!r} input {spec.input!r}: the volume of shape {list(batch.shape)} holds "
            f"{nbytes / (1 << 20):.2f} MB, over the server's limit of {spec.max_volume_mb} MB for one whole-volume "
            f"request (max_volume_mb; raise it with '{command} --max-volume-mb N --force' where the server has the "
            "memory, see docs/remote.md), or use mode=window"
        )


def infer_volume(batch: torch.Tensor, backend: BaseBackend, settings: InferenceSettings, spec: VolumeSpec) -> Any:
    """The image ``(1, C_in, *spatial)`` through the whole-volume model; ``(1, C, *spatial)`` as window mode's."""
    want = str(getattr(backend.options, "volume_output", "labels"))
    if want == "labels" and spec.channels is None:
        raise ConfigError(
            f"model {backend.model_name!r}: the network's output {spec.output!r} has no fixed channel count, so "
            "labels cannot be handed on as channels; use volume_output=scores"
        )
    check_volume_size(batch, backend, spec)
    output = spec.labels if want == "labels" else spec.output
    parameters = request_parameters(settings)
    logger.info("whole-volume request to %r: %s, returns %s", backend.model_name, parameters, output)
    result = backend.infer({spec.input: batch}, outputs=(output,), parameters=parameters)[output]
    if want == "scores":
        return result
    dtype = dtype_to_torch(backend.signature.output(spec.output).dtype)
    return one_hot(torch.as_tensor(result), spec.channels or 1, dtype)


def one_hot(labels: torch.Tensor, channels: int, dtype: torch.dtype) -> torch.Tensor:
    """``(B, 1, *spatial)`` labels as ``(B, channels, *spatial)`` of 0 and 1: their argmax is the labels again."""
    shape = (labels.shape[0], channels, *labels.shape[2:])
    scores = torch.zeros(shape, dtype=dtype, device=labels.device)
    return scores.scatter_(1, labels.long(), 1)
