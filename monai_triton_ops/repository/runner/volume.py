"""Whole-volume runner for the Triton Python backend; copied verbatim to ``<repo>/<name>_volume/1/model.py``.

``monai-triton repo wrap`` (or ``repo build --whole-volume``) puts it next to a network's model, with
``volume_settings.py`` beside it. It takes a whole pre-processed volume, runs MONAI's sliding-window
inferer here, beside the server, and calls the network model for each group of windows through BLS, so
the network keeps Triton's dynamic batching and may be a ``pytorch_libtorch`` model on a GPU. The
volume crosses the network once and the label map (uint8) comes back, instead of every window and
every window's scores.

What it wraps is in the config's ``monai_metadata`` parameter: the ``whole_volume`` block (network
name, tensor names, channels, limits) and the network's ``inference`` block (the sliding-window
defaults). Each request may override those, and set every argument of MONAI's ``SlidingWindowInferer``
that changes the result (``sigma_scale``, ``padding_mode``, ``cval``), through Triton request parameters
(``volume_settings.py`` reads and checks them). Windows are grouped into network requests exactly as the
client's ``Predictor`` groups them in window mode, so both modes compute the same windows with the same
arithmetic.

Tensors cross the Triton boundary by DLPack only: the 2.51 stub is built against numpy 1.x, and with
numpy 2 ``pb_utils.Tensor(name, ndarray)`` and ``.as_numpy()`` silently carry 0 bytes. The file needs
torch, MONAI and the backend's ``triton_python_backend_utils``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
import torch.utils.dlpack

try:  # in this package (its pure parts tested without Triton)
    from .volume_settings import PARAMETERS, Cancelled, RequestError, Settings, Wrapped, check_volume, settings_for
except ImportError:  # as model.py in Triton's version folder, with volume_settings.py beside it
    from volume_settings import (  # type: ignore[import-not-found,no-redef]
        PARAMETERS,
        Cancelled,
        RequestError,
        Settings,
        Wrapped,
        check_volume,
        settings_for,
    )

try:
    import triton_python_backend_utils as pb_utils  # type: ignore[import-not-found]
except ImportError:  # imported outside Triton, e.g. to test the pure helpers below
    pb_utils = None

__all__ = [
    "PARAMETERS",
    "Cancelled",
    "RequestError",
    "Settings",
    "TritonPythonModel",
    "Wrapped",
    "accepted_parameters",
    "blend",
    "check_volume",
    "labels_of",
    "request_sizes",
    "settings_for",
    "window_predictor",
]


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
            sigma_scale=settings.sigma_scale[0] if len(settings.sigma_scale) == 1 else settings.sigma_scale,
            padding_mode=settings.padding_mode,
            cval=settings.cval,
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
