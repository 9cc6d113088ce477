"""A bundle in volume mode: the bundle's own sliding window runs beside the server, in one request per image.

With ``mode=volume`` a remote backend's model is ``<name>_volume`` (``repository/volume.py``), which runs MONAI's
``SlidingWindowInferer`` on the server and calls the network there. The bundle's inferer is then not run in the
app: what it would do travels with the whole pre-processed image as request parameters (``pipeline/volume.py``),
and the server's result goes to the post-processing as the inferer's would, a ``MetaTensor`` with the image's
metadata (``MetaNetwork``), so ``Invertd`` works as in window mode.

Taken from the bundle's ``SlidingWindowInferer``, every argument that changes the result: ``roi_size`` (sizes
below 1 fall back to the image's, as MONAI does), ``sw_batch_size``, ``overlap``, ``mode`` (blending),
``sigma_scale``, ``padding_mode`` and ``cval``. A ``SimpleInferer`` sends the image whole. Any other inferer
(``SliceInferer``, one that passes coordinates to the network), and an overlap that differs per axis, are refused
with the config item named: the server's sliding window would not be the bundle's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from monai.inferers import SimpleInferer, SliceInferer, SlidingWindowInferer
from monai.utils import fall_back_tuple

from ..backends.base import BaseBackend
from ..bundles import Bundle
from ..errors import BundleError, ConfigError
from ..pipeline.settings import InferenceSettings
from ..pipeline.volume import infer_volume, volume_spec
from ..volume_spec import VolumeSpec


class VolumeNetwork:
    """The whole-volume model as the bundle's network: ``network(batch)`` is the bundle inferer's result over it."""

    def __init__(self, bundle: Bundle, backend: BaseBackend, spec: VolumeSpec) -> None:
        self.bundle = bundle
        self.backend = backend
        self.spec = spec
        inferer_settings(bundle, None)  # an inferer the server cannot run is refused at open, not per image

    def __call__(self, batch: torch.Tensor) -> torch.Tensor:
        settings = inferer_settings(self.bundle, tuple(int(s) for s in batch.shape[2:]))
        return torch.as_tensor(infer_volume(batch, self.backend, settings, self.spec))


def volume_network(bundle: Bundle, backend: BaseBackend) -> VolumeNetwork | None:
    """The bundle's network in volume mode, or ``None`` when the backend's model is not a whole-volume model."""
    spec = volume_spec(backend)
    return None if spec is None else VolumeNetwork(bundle, backend, spec)


#: What replaces the bundle's inferer in volume mode: the network takes the whole image.
WHOLE_IMAGE = SimpleInferer()


def inferer_settings(bundle: Bundle, spatial_shape: Sequence[int] | None) -> InferenceSettings:
    """The bundle's inferer as the settings of a whole-volume request; ``spatial_shape`` resolves a ``roi_size``
    with sizes below 1 (``None``: only check that the inferer can run on the server)."""
    inferer, item = bundle.inferer, bundle.items.inferer
    if type(inferer) is SimpleInferer:
        return InferenceSettings(inferer="simple")
    refused = _refusal(inferer)
    if refused:
        raise BundleError(
            f"{refused}; mode=volume runs MONAI's SlidingWindowInferer (or SimpleInferer) on the server: use "
            "mode=window (the default), where the bundle's own inferer runs in the app",
            file=bundle.config.file_of(item),
            item=item,
        )
    roi = inferer.roi_size
    if spatial_shape is not None:
        roi = fall_back_tuple(roi, spatial_shape)
    elif not isinstance(roi, Sequence) or any(int(s) < 1 for s in roi):
        roi = (1,)  # resolved per image
    try:
        return InferenceSettings(
            inferer="sliding_window",
            roi_size=tuple(int(s) for s in roi),
            sw_batch_size=int(inferer.sw_batch_size),
            overlap=_one_overlap(inferer.overlap),
            mode=str(getattr(inferer.mode, "value", inferer.mode)),  # type: ignore[arg-type]
            sigma_scale=_floats(inferer.sigma_scale),
            padding_mode=str(getattr(inferer.padding_mode, "value", inferer.padding_mode)),  # type: ignore[arg-type]
            cval=float(inferer.cval),
        )
    except (ConfigError, TypeError, ValueError) as exc:
        raise BundleError(f"cannot run on the server: {exc}", file=bundle.config.file_of(item), item=item) from exc


def _refusal(inferer: Any) -> str:
    """Why the server's sliding window would not be this inferer's (empty: it would be)."""
    if isinstance(inferer, SliceInferer) or not isinstance(inferer, SlidingWindowInferer):
        return f"{type(inferer).__name__} is not a SlidingWindowInferer"
    if getattr(inferer, "with_coord", False):
        return "with_coord=True passes each window's coordinates to the network, which a served network does not take"
    overlap = inferer.overlap
    if isinstance(overlap, Sequence) and len({float(o) for o in overlap}) > 1:
        return f"overlap {list(overlap)} differs per axis; the server's sliding window takes one overlap"
    return ""


def _one_overlap(overlap: Any) -> float:
    return float(overlap[0]) if isinstance(overlap, Sequence) else float(overlap)


def _floats(value: Any) -> float | tuple[float, ...]:
    return tuple(float(v) for v in value) if isinstance(value, Sequence) else float(value)
