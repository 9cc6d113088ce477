"""What one whole-volume request asks for: the model it wraps (from its config) and the request's settings, checked.

Copied with the runner (``volume.py``) into ``<repo>/<name>_volume/1/`` as ``volume_settings.py``; the runner
imports it from there (Triton's stub puts the version folder on ``sys.path``), and from this package when its
pure parts are tested. Pure: torch only for the size check, no Triton, no MONAI.

Each request may override the network's ``inference`` metadata (``roi_size``, ``sw_batch_size``, ``overlap``,
``blend_mode``) through Triton request parameters, and set what MONAI's ``SlidingWindowInferer`` takes besides
(``sigma_scale``, ``padding_mode``, ``cval``: MONAI's defaults when not sent); unknown or bad ones are refused
(``INVALID_ARG``) with the accepted values.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

METADATA_PARAMETER = "monai_metadata"
VOLUME_KEY = "whole_volume"
#: Request parameters this model reads, and what each must be.
PARAMETERS = {
    "inferer": "sliding_window or simple",
    "roi_size": "positive integers, one per spatial dim (e.g. 96,96,96)",
    "sw_batch_size": "an integer >= 1",
    "overlap": "a number in [0, 1)",
    "blend_mode": "constant or gaussian",
    "request_batch_size": "an integer >= 1 (windows per network request)",
    "network_version": "an integer >= 1 (the network model's version; default: the server's choice)",
    "sigma_scale": "a number > 0, or one per spatial dim (e.g. 0.125 or 0.1,0.1,0.2): the gaussian's sigma / roi",
    "padding_mode": "constant, reflect, replicate or circular (how a volume smaller than roi_size is padded)",
    "cval": "a number (the padding value of padding_mode constant)",
}
#: MONAI's ``SlidingWindowInferer`` defaults, used when a request does not send these.
DEFAULT_SIGMA_SCALE = 0.125
DEFAULT_PADDING_MODE = "constant"
PADDING_MODES = ("constant", "reflect", "replicate", "circular")
_MB = 1 << 20


class RequestError(ValueError):
    """The request cannot be served as given: Triton's ``INVALID_ARG``, the message names what and why."""


class Cancelled(Exception):
    """The client gave up on the request (deadline, cancel): the remaining windows are not computed."""


@dataclass(frozen=True)
class Wrapped:
    """What this model wraps, from its config (written by ``monai-triton repo wrap``)."""

    name: str
    network: str
    input: str
    output: str
    labels: str
    channels: int | None
    spatial_rank: int
    batch_axis: bool
    network_max_batch_size: int
    max_volume_mb: int
    max_in_flight: int
    defaults: Mapping[str, Any]

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Wrapped:
        name = str(config["name"])
        raw = config.get("parameters", {}).get(METADATA_PARAMETER, {}).get("string_value", "")
        metadata = json.loads(raw) if raw else {}
        block = metadata.get(VOLUME_KEY)
        if not isinstance(block, Mapping):
            raise ValueError(
                f"model '{name}': parameter {METADATA_PARAMETER!r} has no {VOLUME_KEY!r} block; "
                "write the model with 'monai-triton repo wrap'"
            )
        inference = metadata.get("inference")
        return cls(
            name=name,
            network=str(block["network"]),
            input=str(block["input"]),
            output=str(block["output"]),
            labels=str(block["labels"]),
            channels=None if block.get("channels") is None else int(block["channels"]),
            spatial_rank=int(block["spatial_rank"]),
            batch_axis=bool(block.get("batch_axis", True)),
            network_max_batch_size=int(block.get("network_max_batch_size", 0)),
            max_volume_mb=int(block["max_volume_mb"]),
            max_in_flight=max(1, int(block.get("max_in_flight", 2))),
            defaults=dict(inference) if isinstance(inference, Mapping) else {},
        )


@dataclass(frozen=True)
class Settings:
    """How one volume is cut into windows; the same fields as the client's ``InferenceSettings``."""

    inferer: str
    roi_size: tuple[int, ...] | None
    sw_batch_size: int
    overlap: float
    blend_mode: str
    request_batch_size: int | None
    network_version: int | None
    #: One value for every axis, or one per spatial axis (MONAI takes either).
    sigma_scale: tuple[float, ...] = (DEFAULT_SIGMA_SCALE,)
    padding_mode: str = DEFAULT_PADDING_MODE
    cval: float = 0.0


def settings_for(model: Wrapped, parameters: Mapping[str, Any]) -> Settings:
    """The request's settings: its parameters over the network's ``inference`` metadata, checked."""
    unknown = sorted(set(parameters) - set(PARAMETERS))
    if unknown:
        raise RequestError(
            f"model '{model.name}': unknown request parameter(s) {unknown}; accepted: {', '.join(PARAMETERS)}"
        )
    defaults = model.defaults

    def given(key: str, default_key: str | None = None) -> Any:
        if key in parameters:
            return parameters[key]
        return defaults.get(default_key or key)

    roi = given("roi_size")
    roi_size = None if roi is None else _sizes(model, roi, model.spatial_rank)
    inferer = str(given("inferer") or ("sliding_window" if roi_size else "simple")).strip().lower()
    if inferer not in ("sliding_window", "simple"):
        raise _bad(model, "inferer", given("inferer"))
    if inferer == "sliding_window" and roi_size is None:
        raise RequestError(
            f"model '{model.name}': the sliding window needs roi_size (request parameter 'roi_size'); the "
            "network's metadata gives none"
        )
    overlap = _number(model, "overlap", given("overlap"), 0.25)
    if not 0.0 <= overlap < 1.0:
        raise _bad(model, "overlap", given("overlap"))
    blend = str(given("blend_mode", "mode") or "constant").strip().lower()
    if blend not in ("constant", "gaussian"):
        raise _bad(model, "blend_mode", given("blend_mode", "mode"))
    request_batch = given("request_batch_size")
    version = parameters.get("network_version")
    return Settings(
        inferer=inferer,
        roi_size=roi_size,
        sw_batch_size=_count(model, "sw_batch_size", given("sw_batch_size") or 1),
        overlap=overlap,
        blend_mode=blend,
        request_batch_size=None if request_batch is None else _count(model, "request_batch_size", request_batch),
        network_version=None if version in (None, "", -1, "-1") else _count(model, "network_version", version),
        **_window_weights(model, parameters),
    )


def _window_weights(model: Wrapped, parameters: Mapping[str, Any]) -> dict[str, Any]:
    """``sigma_scale``, ``padding_mode`` and ``cval``: from the request only (MONAI's defaults when not sent), so a
    client that sends them only when they differ from MONAI's gets what it asked for from any server."""
    raw = parameters.get("sigma_scale", DEFAULT_SIGMA_SCALE)
    items = raw.split(",") if isinstance(raw, str) else raw if isinstance(raw, list | tuple) else [raw]
    sigma = tuple(_number(model, "sigma_scale", item, DEFAULT_SIGMA_SCALE) for item in items)
    if len(sigma) not in (1, model.spatial_rank) or any(value <= 0 for value in sigma):
        raise _bad(model, "sigma_scale", raw)
    padding = str(parameters.get("padding_mode", DEFAULT_PADDING_MODE)).strip().lower()
    if padding not in PADDING_MODES:
        raise _bad(model, "padding_mode", parameters.get("padding_mode"))
    return {"sigma_scale": sigma, "padding_mode": padding, "cval": _number(model, "cval", parameters.get("cval"), 0.0)}


def _bad(model: Wrapped, key: str, value: Any) -> RequestError:
    return RequestError(f"model '{model.name}': request parameter {key}={value!r}: expected {PARAMETERS[key]}")


def _sizes(model: Wrapped, value: Any, rank: int) -> tuple[int, ...]:
    items = value.replace("x", ",").split(",") if isinstance(value, str) else value
    try:
        sizes = tuple(int(str(s).strip()) for s in items)
    except (TypeError, ValueError) as exc:
        raise _bad(model, "roi_size", value) from exc
    if len(sizes) != rank or any(s < 1 for s in sizes):
        raise RequestError(
            f"model '{model.name}': request parameter roi_size={value!r}: expected {rank} positive sizes, "
            f"one per spatial dim"
        )
    return sizes


def _number(model: Wrapped, key: str, value: Any, default: float) -> float:
    if value is None:
        return default
    try:
        number = float(value)
    except (TypeError, ValueError) as exc:
        raise _bad(model, key, value) from exc
    if isinstance(value, bool) or not math.isfinite(number):
        raise _bad(model, key, value)
    return number


def _count(model: Wrapped, key: str, value: Any) -> int:
    try:
        number = int(str(value).strip())
    except (TypeError, ValueError) as exc:
        raise _bad(model, key, value) from exc
    if isinstance(value, bool) or number < 1:
        raise _bad(model, key, value)
    return number


def check_volume(model: Wrapped, image: torch.Tensor) -> None:
    """Refuse a volume over the model's limit, before any memory is spent on it (``max_volume_mb``)."""
    megabytes = image.numel() * image.element_size() / _MB
    if megabytes > model.max_volume_mb:
        raise RequestError(
            f"model '{model.name}' input '{model.input}': the volume of shape {list(image.shape)} holds "
            f"{megabytes:.2f} MB, over this model's limit of {model.max_volume_mb} MB (max_volume_mb; raise it "
            f"with 'monai-triton repo wrap REPO --name {model.network} --max-volume-mb N --force' on a server with "
            "the memory for it)"
        )
    if image.dim() != model.spatial_rank + 2:
        raise RequestError(
            f"model '{model.name}' input '{model.input}': expected (batch, channels, {model.spatial_rank} spatial "
            f"dims), got shape {list(image.shape)}"
        )
