"""Whole-volume runner for the Triton Python backend; copied verbatim to ``<repo>/<name>_volume/1/model.py``.

``monai-triton repo wrap`` (or ``repo build --whole-volume``) puts it next to a network's model. It
takes a whole pre-processed volume, runs MONAI's sliding-window inferer here, beside the server, and
calls the network model for each group of windows through BLS, so the network keeps Triton's dynamic
batching and may be a ``pytorch_libtorch`` model on a GPU. The volume crosses the network once and
the label map (uint8) comes back, instead of every window and every window's scores.

What it wraps is in the config's ``monai_metadata`` parameter: the ``whole_volume`` block (network
name, tensor names, channels, limits) and the network's ``inference`` block (the sliding-window
defaults). Each request may override those through Triton request parameters (``roi_size``,
``sw_batch_size``, ``overlap``, ``blend_mode``, ``request_batch_size``, ``inferer``,
``network_version``); unknown or bad ones are refused (``INVALID_ARG``) with the accepted values.
Windows are grouped into network requests exactly as the client's ``Predictor`` groups them in
window mode, so both modes compute the same windows with the same arithmetic.

Tensors cross the Triton boundary by DLPack only: the 2.51 stub is built against numpy 1.x, and with
numpy 2 ``pb_utils.Tensor(name, ndarray)`` and ``.as_numpy()`` silently carry 0 bytes. The file needs
torch, MONAI and the backend's ``triton_python_backend_utils``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils.dlpack

try:
    import triton_python_backend_utils as pb_utils  # type: ignore[import-not-found]
except ImportError:  # imported outside Triton, e.g. to test the pure helpers below
    pb_utils = None

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
}
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
    )


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


def request_sizes(windows: int, settings: Settings, model: Wrapped) -> list[int]:
    """How many windows go in each network request: the rule of the client's ``Predictor._request_size``."""
    if windows == 0:
        return [0]
    if not model.batch_axis:
        size = windows
    else:
        size = min(settings.request_batch_size or model.network_max_batch_size or windows, windows)
    return [min(size, windows - start) for start in range(0, windows, size)]


Infer = Callable[[torch.Tensor], torch.Tensor]


def window_predictor(
    model: Wrapped,
    settings: Settings,
    infer: Infer,
    pool: ThreadPoolExecutor,
    cancelled: Callable[[], bool] = lambda: False,
) -> Infer:
    """MONAI's predictor: a batch of windows cut into network requests, in flight together, joined in order.

    ``cancelled`` is asked before each batch: a client that gave up (its deadline) stops the rest of the volume.
    """

    def predict(windows: torch.Tensor) -> torch.Tensor:
        if cancelled():
            raise Cancelled
        sizes = request_sizes(int(windows.shape[0]), settings, model)
        parts = list(torch.split(windows, sizes)) if len(sizes) > 1 else [windows]
        futures = [pool.submit(infer, part.contiguous()) for part in parts]
        try:
            return torch.cat([future.result() for future in futures])
        finally:
            for future in futures:
                future.cancel()

    return predict


def blend(image: torch.Tensor, settings: Settings, predictor: Infer) -> torch.Tensor:
    """MONAI's inferer, constructed as the client's ``make_inferer`` constructs it."""
    from monai.inferers import SimpleInferer, SlidingWindowInferer

    result: Any
    if settings.inferer == "simple":
        result = SimpleInferer()(image, predictor)
    else:
        inferer = SlidingWindowInferer(
            roi_size=settings.roi_size or (),
            sw_batch_size=settings.sw_batch_size,
            overlap=settings.overlap,
            mode=settings.blend_mode,
        )
        result = inferer(image, predictor)
    if not isinstance(result, torch.Tensor):
        raise TypeError(f"the inferer returned {type(result).__name__}, expected one tensor")
    return result.as_subclass(torch.Tensor) if type(result) is not torch.Tensor else result


def labels_of(scores: torch.Tensor, slab_voxels: int = 1 << 22) -> torch.Tensor:
    """The argmax over channels as uint8 ``(B, 1, *spatial)``: what ``AsDiscrete(argmax=True)`` gives, voxel for voxel.

    Channel by channel, keeping the first maximum as ``torch.argmax`` does (a NaN counts as the largest value,
    the first NaN wins), slab by slab along the first spatial axis: ``torch.argmax`` over the channels of a
    whole volume is a strided reduction (2 s for 3 x 197 x 233 x 189 voxels here) whose int64 result alone
    would be the largest buffer of the request; a slab's temporaries stay small.
    """
    labels = torch.empty((scores.shape[0], 1, *scores.shape[2:]), dtype=torch.uint8, device=scores.device)
    plane = max(1, scores.shape[0] * math.prod(scores.shape[3:]))
    step = max(1, slab_voxels // plane)
    for start in range(0, scores.shape[2], step):
        labels[:, :, start : start + step] = _first_max(scores[:, :, start : start + step])
    return labels


def _first_max(scores: torch.Tensor) -> torch.Tensor:
    best = scores[:, :1].clone()
    labels = torch.zeros(best.shape, dtype=torch.uint8, device=scores.device)
    seen_nan = torch.isnan(best)
    for channel in range(1, scores.shape[1]):
        value = scores[:, channel : channel + 1]
        is_nan = torch.isnan(value)
        wins = ((value > best) | is_nan) & ~seen_nan
        best = torch.where(wins, value, best)
        labels.masked_fill_(wins, channel)
        seen_nan |= is_nan
    return labels


class TritonPythonModel:
    """One instance per Triton model instance: one volume per request, windows to the network by BLS."""

    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        self.model = Wrapped.from_config(config)
        try:
            import monai.inferers  # noqa: F401 - fail at load, not at the first request
        except ImportError as exc:
            raise ImportError(
                f"model '{self.model.name}' runs MONAI's sliding window on the server: install monai in the "
                f"server's Python environment (pip install monai): {exc}"
            ) from exc
        gpu = args.get("model_instance_kind") == "GPU"
        self.device = torch.device(f"cuda:{args.get('model_instance_device_id', '0')}" if gpu else "cpu")
        self.pool = ThreadPoolExecutor(self.model.max_in_flight, thread_name_prefix="bls")

    def execute(self, requests: list[Any]) -> list[Any]:
        return [self._execute_one(request) for request in requests]

    def finalize(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)

    def _execute_one(self, request: Any) -> Any:
        try:
            outputs = self._run(request)
            return pb_utils.InferenceResponse(output_tensors=[_to_triton(n, t) for n, t in outputs.items()])
        except RequestError as exc:
            return _error(str(exc), pb_utils.TritonError.INVALID_ARG)
        except Cancelled:
            return _error(f"model '{self.model.name}': cancelled by the client", pb_utils.TritonError.CANCELLED)
        except Exception as exc:  # every failure goes back to its caller as that request's error
            lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
            message = f"model '{self.model.name}': {lines[-1] if lines else type(exc).__name__}"
            pb_utils.Logger.log_error(f"{message}\n{exc!r}")
            return _error(message, pb_utils.TritonError.INTERNAL)

    def _run(self, request: Any) -> dict[str, torch.Tensor]:
        model = self.model
        tensor = pb_utils.get_input_tensor_by_name(request, model.input)
        if tensor is None:
            raise RequestError(f"model '{model.name}': input '{model.input}' is missing")
        image = torch.utils.dlpack.from_dlpack(tensor.to_dlpack())
        check_volume(model, image)
        settings = settings_for(model, json.loads(request.parameters() or "{}"))
        wanted = list(request.requested_output_names()) or [model.labels]
        cancelled = getattr(request, "is_cancelled", lambda: False)
        predictor = window_predictor(
            model, settings, lambda part: self._network(part, settings), self.pool, cancelled=cancelled
        )
        with torch.inference_mode():
            scores = blend(image.to(self.device), settings, predictor)
            outputs = {}
            if model.labels in wanted:
                outputs[model.labels] = labels_of(scores)
            if model.output in wanted:
                outputs[model.output] = scores
        return outputs

    def _network(self, windows: torch.Tensor, settings: Settings) -> torch.Tensor:
        """One BLS request to the network with a group of windows; its output on this instance's device."""
        model = self.model
        bls = pb_utils.InferenceRequest(
            model_name=model.network,
            model_version=settings.network_version or -1,
            requested_output_names=[model.output],
            inputs=[pb_utils.Tensor.from_dlpack(model.input, torch.utils.dlpack.to_dlpack(windows))],  # type: ignore[attr-defined]
        )
        response = bls.exec()
        if response.has_error():
            raise RuntimeError(f"its network model '{model.network}' failed: {response.error().message()}")
        output = pb_utils.get_output_tensor_by_name(response, model.output)
        return torch.utils.dlpack.from_dlpack(output.to_dlpack()).to(self.device)


def _to_triton(name: str, tensor: torch.Tensor) -> Any:
    capsule = torch.utils.dlpack.to_dlpack(tensor.contiguous())  # type: ignore[attr-defined]
    return pb_utils.Tensor.from_dlpack(name, capsule)


def _error(message: str, code: Any) -> Any:
    return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message, code))


def accepted_parameters() -> Sequence[str]:
    """The request parameters this model reads (the client sends these names)."""
    return tuple(PARAMETERS)
