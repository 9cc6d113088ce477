"""How an image is fed to the model (``InferenceSettings``): the inferer, its patches, and their requests.

Its own module because the window data flow (``run.py``) and the whole-volume one (``volume.py``) both read it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal

from ..errors import ConfigError

#: ``SlidingWindowInferer``'s defaults (MONAI's), which a whole-volume request leaves out.
DEFAULT_SIGMA_SCALE = 0.125
PADDING_MODES = ("constant", "reflect", "replicate", "circular")


@dataclass(frozen=True, kw_only=True)
class InferenceSettings:
    """How the image is fed to the model: whole (``simple``) or in overlapping patches.

    ``inferer`` defaults to ``sliding_window`` when ``roi_size`` (the patch size in voxels) is
    given, else ``simple``. ``sw_batch_size`` is how many patches the inferer stacks per predictor
    call, ``request_batch_size`` how many of those go in one request (default: the model's
    ``max_batch_size``, or all of them when it has none; the requests of one call are in flight
    together), ``overlap`` the patch overlap fraction, ``mode`` the blending (``constant`` or
    ``gaussian``), ``sigma_scale`` the gaussian's sigma as a fraction of ``roi_size`` (one value, or
    one per spatial axis), ``padding_mode`` and ``cval`` how an image smaller than ``roi_size`` is
    padded (MONAI's ``SlidingWindowInferer`` arguments, with its defaults), ``progress`` a tqdm bar over
    the patches. ``from_metadata`` reads the model's own ``inference`` block, so an app overrides only
    what it must.
    """

    inferer: Literal["simple", "sliding_window"] | None = None
    roi_size: tuple[int, ...] | None = None
    sw_batch_size: int = 1
    request_batch_size: int | None = None
    overlap: float = 0.25
    mode: Literal["constant", "gaussian"] = "constant"
    sigma_scale: float | tuple[float, ...] = DEFAULT_SIGMA_SCALE
    padding_mode: Literal["constant", "reflect", "replicate", "circular"] = "constant"
    cval: float = 0.0
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
        self._check_blending_and_padding()

    def _check_blending_and_padding(self) -> None:
        if isinstance(self.sigma_scale, list | tuple):  # per axis, as a config or JSON gives it
            object.__setattr__(self, "sigma_scale", tuple(float(s) for s in self.sigma_scale))
        sigma = self.sigma_scale if isinstance(self.sigma_scale, tuple) else (self.sigma_scale,)
        if not sigma or any(not math.isfinite(float(s)) or float(s) <= 0 for s in sigma):
            raise ConfigError(f"sigma_scale must be > 0 (one value, or one per spatial axis), got {self.sigma_scale!r}")
        if self.padding_mode not in PADDING_MODES:
            raise ConfigError(f"padding_mode must be one of {', '.join(PADDING_MODES)}, got {self.padding_mode!r}")
        if not math.isfinite(float(self.cval)):
            raise ConfigError(f"cval must be a finite number, got {self.cval!r}")

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
